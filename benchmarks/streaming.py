"""Expert streaming beyond RAM: warp's bounded expert cache vs llama.cpp (mmap), one script.

On a generated Qwen3-MoE-shaped container (experts >= 90% of its bytes) and a GGUF of the
same weights at the same quant type, it measures:

  disk     O_DIRECT random-read bandwidth over the container's expert banks (aligned
           1-16 MiB preads, queue depth 1, 4 and 8, before and after the runs); the best
           figure is the disk bound's denominator.
  (a)      warp, budget = the whole model (every expert record fits in the cache).
  (b)      warp, budget = floor + 1 working set.
  (c)      warp and llama.cpp, each in its own process under a cgroup memory limit of
           1/4 of the container (cgroup v1 memory.limit_in_bytes, or v2 memory.max);
           warp at the budget the engine resolves from that limit, and at floor + 1
           working set given explicitly when that fits the limit.
  prefill  expert bytes read by a 64-token prompt with prefill_chunk=64 vs 1, at (b).

Every engine run is a subprocess (the cgroup limit applies per process), the page cache
is dropped before each one, the prompt is the same token ids for both engines, and both
decode greedily. Per run: decode tok/s, expert hit rate, bytes read per decode token,
and the disk bound = bandwidth / (bytes of the records each token needed from disk:
demand misses + prefetched records that were then used). Needs root for the cgroup and
drop_caches; without it those runs are reported as skipped.

    python benchmarks/streaming.py --container moe.warp --gguf moe-q8_0.gguf \
        [--decode-tokens 16] [--threads 2] [--json out.json] [--runs disk,a,b,c,prefill]

llama.cpp comes from llama-cpp-python (--llama-python names an interpreter that has it);
set OMP_WAIT_POLICY=PASSIVE on a shared host (its spinning OpenMP threads otherwise
collapse). Model recipe and figures: docs/BENCHMARKS.md, "Expert streaming beyond RAM".
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import platform
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

PROMPT_TOKENS = 64
MIB = 1 << 20
GIB = 1 << 30


# ---- machine and disk ------------------------------------------------------------------

def machine() -> str:
    info = Path("/proc/cpuinfo").read_text()
    cpu = next((ln.split(":", 1)[1].strip() for ln in info.splitlines()
                if ln.startswith("model name")), "?")
    flags = [f for f in ("avx2", "avx512f") if f" {f}" in info]
    mem = next(int(ln.split()[1]) * 1024 for ln in Path("/proc/meminfo").read_text().splitlines()
               if ln.startswith("MemTotal"))
    return (f"{cpu}; {os.cpu_count()} CPUs; {','.join(flags)}; {mem / GIB:.1f} GiB RAM; "
            f"Linux {platform.release()}; Python {platform.python_version()}")


def drop_caches() -> bool:
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def bank_files(container: Path) -> list[Path]:
    man = json.loads((container / "manifest.json").read_text())
    return sorted({container / b["file"] for b in man["experts"]})


def disk_bandwidth(files: list[Path], sizes_mib=(1, 2, 4, 8, 16), depths=(1, 4, 8),
                   seconds: float = 2.0) -> dict[str, float]:
    """O_DIRECT random aligned preads; returns {"<size>MiB_qd<d>": bytes/s}. A size may be
    a fraction of a MiB (a whole number of 4 KiB blocks, such as one expert record)."""
    fds = [os.open(f, os.O_RDONLY | os.O_DIRECT) for f in files]
    lens = [os.fstat(fd).st_size for fd in fds]
    out: dict[str, float] = {}
    try:
        for size_mib in sizes_mib:
            size = int(size_mib * MIB)
            for depth in depths:
                done = [0] * depth
                stop = time.perf_counter() + seconds

                def worker(k: int, size: int = size, stop: float = stop) -> None:
                    buf = mmap.mmap(-1, size)  # page-aligned, as O_DIRECT needs
                    rng = random.Random(k * 7919 + size)
                    while time.perf_counter() < stop:
                        i = rng.randrange(len(fds))
                        blocks = max(1, (lens[i] - size) // 4096)
                        off = rng.randrange(blocks) * 4096
                        n = os.preadv(fds[i], [buf], off)
                        done[k] += n
                    buf.close()

                t0 = time.perf_counter()
                ts = [threading.Thread(target=worker, args=(k,)) for k in range(depth)]
                for t in ts:
                    t.start()
                for t in ts:
                    t.join()
                out[f"{size_mib:g}MiB_qd{depth}"] = sum(done) / (time.perf_counter() - t0)
    finally:
        for fd in fds:
            os.close(fd)
    return out


# ---- cgroup ------------------------------------------------------------------------------

class MemCgroup:
    """A child memory cgroup with a hard limit, removed on exit (v1 or v2)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        v1 = Path("/sys/fs/cgroup/memory")
        name = f"warp-bench-{os.getpid()}"
        if (v1 / "memory.limit_in_bytes").exists():
            self.path = v1 / name
            self.path.mkdir()
            (self.path / "memory.limit_in_bytes").write_text(str(limit))
            self.kind = "v1 memory.limit_in_bytes"
        else:
            self.path = Path("/sys/fs/cgroup") / name
            self.path.mkdir()
            (self.path / "memory.max").write_text(str(limit))
            self.kind = "v2 memory.max"

    def enter(self) -> None:
        """Moves the calling process in (used as preexec_fn)."""
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def peak(self) -> int | None:
        for f in ("memory.max_usage_in_bytes", "memory.peak"):
            try:
                return int((self.path / f).read_text())
            except OSError:
                continue
        return None

    def remove(self) -> None:
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.1)
        print(f"warning: could not remove {self.path}", file=sys.stderr)


# ---- children ------------------------------------------------------------------------------

def prompt_ids(vocab: int) -> list[int]:
    rng = random.Random(1234)
    return [rng.randrange(100, min(vocab, 32000)) for _ in range(PROMPT_TOKENS)]


def io_read_bytes() -> int:
    for ln in Path("/proc/self/io").read_text().splitlines():
        if ln.startswith("read_bytes:"):
            return int(ln.split()[1])
    return 0


def peak_rss() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def child_warp(a: argparse.Namespace) -> dict:
    import numpy as np

    from warp_providers import Engine

    opts = {}
    if a.reader_threads is not None:
        opts["reader_threads"] = a.reader_threads
    if a.prefill_chunk is not None:
        opts["prefill_chunk"] = a.prefill_chunk
    if a.lookahead is not None:
        opts["lookahead"] = bool(a.lookahead)
    t0 = time.perf_counter()
    eng = Engine.open(a.container, budget=a.budget, threads=a.threads, ctx=512, **opts)
    open_s = time.perf_counter() - t0
    info = eng.info()
    prompt = prompt_ids(eng.vocab_size)
    s0 = eng.stats()
    t0 = time.perf_counter()
    logits = eng.eval(prompt)
    prefill_s = time.perf_counter() - t0
    s1 = eng.stats()
    tok = int(np.argmax(logits))
    toks = []
    t0 = time.perf_counter()
    for _ in range(a.decode_tokens):
        tok = int(np.argmax(eng.eval([tok])))
        toks.append(tok)
    decode_s = time.perf_counter() - t0
    s2 = eng.stats()
    d = {k: s2[k] - s1[k] for k in ("expert_lookups", "expert_hits", "expert_misses",
                                   "prefetch_issued", "prefetch_hits", "bytes_read",
                                   "read_seconds")}
    p = {k: s1[k] - s0[k] for k in ("expert_lookups", "expert_misses", "bytes_read")}
    eng.close()
    return {"engine": "warp", "open_s": open_s, "prefill_s": prefill_s,
            "prefill_tok_s": len(prompt) / prefill_s, "prefill": p,
            "decode_tok_s": a.decode_tokens / decode_s if a.decode_tokens else None,
            "decode": d, "tokens": toks, "budget_bytes": info["plan"]["budget_bytes"],
            "isa": info.get("isa"), "cache_bytes": s2.get("cache_bytes"),
            "cache_slots": s2.get("cache_slots"), "direct_io": s2.get("direct_io"),
            "peak_bytes": s2.get("peak_bytes"), "peak_rss": peak_rss()}


def child_llama(a: argparse.Namespace) -> dict:
    import numpy as np
    from llama_cpp import Llama

    t0 = time.perf_counter()
    llm = Llama(model_path=a.gguf, n_ctx=512, n_threads=a.threads, n_threads_batch=a.threads,
                n_batch=PROMPT_TOKENS, use_mmap=True, verbose=False)
    open_s = time.perf_counter() - t0
    prompt = prompt_ids(llm.n_vocab())
    r0 = io_read_bytes()
    t0 = time.perf_counter()
    llm.eval(prompt)
    prefill_s = time.perf_counter() - t0
    r1 = io_read_bytes()
    nv = llm.n_vocab()

    def last_logits() -> np.ndarray:
        # llama-cpp-python 0.3.x fills llm.scores only with logits_all=True; read the
        # context's output row (only the last token of each batch asks for logits).
        return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(nv,))

    tok = int(np.argmax(last_logits()))
    toks = []
    t0 = time.perf_counter()
    for _ in range(a.decode_tokens):
        llm.eval([tok])
        tok = int(np.argmax(last_logits()))
        toks.append(tok)
        if time.perf_counter() - t0 > a.llama_max_s:
            break
    decode_s = time.perf_counter() - t0
    r2 = io_read_bytes()
    llm.close()
    return {"engine": "llama.cpp", "open_s": open_s, "prefill_s": prefill_s,
            "prefill_tok_s": len(prompt) / prefill_s, "prefill": {"bytes_read": r1 - r0},
            "decode_tok_s": len(toks) / decode_s, "decode_tokens": len(toks),
            "decode": {"bytes_read": r2 - r1}, "tokens": toks, "peak_rss": peak_rss()}


# ---- parent ------------------------------------------------------------------------------

def run_child(args: argparse.Namespace, engine: str, *, python: str, budget: int | None = None,
              cgroup: MemCgroup | None = None, extra: list[str] | None = None,
              decode_tokens: int | None = None) -> dict:
    n = args.decode_tokens if decode_tokens is None else decode_tokens
    cmd = [python, os.path.abspath(__file__), "--child", engine, "--container",
           str(args.container), "--threads", str(args.threads),
           "--decode-tokens", str(n), "--llama-max-s", str(args.llama_max_s)]
    if args.gguf:
        cmd += ["--gguf", str(args.gguf)]
    if budget is not None:
        cmd += ["--budget", str(budget)]
    cmd += extra or []
    res = run_json_child(cmd, cgroup)
    res.setdefault("engine", engine)
    return res


def run_json_child(cmd: list[str], cgroup: MemCgroup | None) -> dict:
    """Runs a child whose last stdout line is its JSON result, after dropping the page
    cache, inside `cgroup` when given; {"error": ...} when it fails. Adds caches_dropped
    and the cgroup's limit and peak."""
    dropped = drop_caches()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]))
    p = subprocess.run(cmd, capture_output=True, text=True, env=env,
                       preexec_fn=cgroup.enter if cgroup else None)
    if p.returncode != 0:
        res = {"error": f"exit {p.returncode}: {p.stderr[-2000:]}"}
    else:
        res = json.loads(p.stdout.strip().splitlines()[-1])
    res["caches_dropped"] = dropped
    if cgroup:
        res["cgroup_limit"] = cgroup.limit
        res["cgroup_peak"] = cgroup.peak()
    return res


def summarize(r: dict, record: int, bw: float) -> dict:
    """Adds hit rate, bytes/token and the disk bound to a warp or llama.cpp row."""
    if "error" in r:
        return r
    n = r.get("decode_tokens", len(r["tokens"]))
    d = r["decode"]
    r["bytes_per_token"] = d["bytes_read"] / max(n, 1)
    if r["engine"] == "warp":
        r["hit_rate"] = d["expert_hits"] / max(d["expert_lookups"], 1)
        needed = (d["expert_misses"] + d["prefetch_hits"]) * record / max(n, 1)
        r["needed_bytes_per_token"] = needed
        # no disk run in this invocation (bw 0): no bound to compare with
        r["disk_bound_tok_s"] = bw / needed if needed and bw else float("inf")
        r["of_disk_bound"] = r["decode_tok_s"] / r["disk_bound_tok_s"] if needed and bw else None
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--container", type=Path, required=True)
    ap.add_argument("--gguf", type=Path)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--decode-tokens", type=int, default=16)
    ap.add_argument("--cap-fraction", type=float, default=0.25)
    ap.add_argument("--llama-python", default=sys.executable,
                    help="interpreter with llama_cpp (may differ from warp's)")
    ap.add_argument("--llama-max-s", type=float, default=180.0,
                    help="stop llama.cpp's decode after this long (tok/s from what ran)")
    ap.add_argument("--runs", default="disk,a,b,c,prefill", help="comma-separated subset")
    ap.add_argument("--engines", default="warp,llama", help="comma-separated subset")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--child", choices=["warp", "llama"], help=argparse.SUPPRESS)
    ap.add_argument("--budget", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--reader-threads", type=int, default=None)
    ap.add_argument("--prefill-chunk", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--lookahead", type=int, default=None)
    a = ap.parse_args()
    if a.child:
        a.container, a.gguf = str(a.container), str(a.gguf) if a.gguf else None
        if a.budget is not None and a.budget.isdigit():
            a.budget = int(a.budget)
        res = child_warp(a) if a.child == "warp" else child_llama(a)
        print(json.dumps(res))
        return

    from warp_providers import plan_memory

    runs = set(a.runs.split(","))
    engines = set(a.engines.split(","))
    if "llama" not in engines:
        a.gguf = None
    size = sum(f.stat().st_size for f in a.container.rglob("*") if f.is_file())
    files = bank_files(a.container)
    experts = sum(f.stat().st_size for f in files)
    plan = plan_memory(a.container, ctx=512, threads=a.threads)
    record = plan["record_bytes"]
    whole = plan["floor_bytes"] - plan["min_cache_bytes"] + plan["experts_total_bytes"] + \
        plan["min_cache_bytes"]
    floor_ws = plan["floor_bytes"] + plan["working_set_bytes"]
    cap = int(size * a.cap_fraction) // 4096 * 4096
    out: dict = {"machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M"),
                 "container": str(a.container), "container_bytes": size,
                 "expert_bytes": experts, "expert_fraction": experts / size,
                 "gguf": str(a.gguf) if a.gguf else None,
                 "gguf_bytes": a.gguf.stat().st_size if a.gguf else None,
                 "plan": plan, "threads": a.threads, "prompt_tokens": PROMPT_TOKENS,
                 "decode_tokens": a.decode_tokens, "cap_bytes": cap, "runs": {}}
    print(f"machine: {out['machine']}")
    print(f"container {size / GIB:.2f} GiB, experts {experts / size:.1%}, record "
          f"{record / MIB:.2f} MiB, floor {plan['floor_bytes'] / GIB:.2f} GiB, "
          f"ws {plan['working_set_bytes'] / GIB:.2f} GiB, cap (c) {cap / GIB:.2f} GiB", flush=True)

    bw = None
    if "disk" in runs:
        drop_caches()
        out["disk"] = disk_bandwidth(files)
        bw = max(out["disk"].values())
        print("disk O_DIRECT random read: " + ", ".join(
            f"{k} {v / GIB:.2f}" for k, v in out["disk"].items()) + " GiB/s", flush=True)
    bw = bw or 1.0
    out["disk_bw"] = bw

    def show(tag: str, r: dict) -> None:
        r = summarize(r, record, bw)
        out["runs"][tag] = r
        if "error" in r:
            print(f"{tag:<22} ERROR {r['error']}", flush=True)
            return
        line = (f"{tag:<22} decode {r['decode_tok_s']:6.3f} tok/s  prefill "
                f"{r['prefill_tok_s']:6.2f} tok/s  bytes/tok {r['bytes_per_token'] / MIB:8.1f} MiB")
        if r["engine"] == "warp":
            line += (f"  hit {r['hit_rate']:.1%}  needed/tok "
                     f"{r['needed_bytes_per_token'] / MIB:.1f} MiB  bound "
                     f"{r['disk_bound_tok_s']:.3f} tok/s ({r['of_disk_bound'] or 0:.0%})  "
                     f"budget {r['budget_bytes'] / GIB:.2f} GiB  direct_io {r['direct_io']}")
        line += f"  peak rss {r['peak_rss'] / GIB:.2f} GiB"
        if r.get("cgroup_peak"):
            line += f"  cgroup peak {r['cgroup_peak'] / GIB:.2f} GiB"
        print(line, flush=True)

    rt = ["--reader-threads", str(a.reader_threads)] if a.reader_threads is not None else []
    if a.lookahead is not None:  # passed on to the warp children (it was read only there)
        rt += ["--lookahead", str(a.lookahead)]
    if "a" in runs and "warp" in engines:
        show("(a) warp whole", run_child(a, "warp", python=sys.executable, budget=whole,
                                         extra=rt))
    if "b" in runs and "warp" in engines:
        show("(b) warp floor+1ws", run_child(a, "warp", python=sys.executable,
                                             budget=floor_ws, extra=rt))
    if "a" in runs and a.gguf:
        show("(a) llama.cpp no cap", run_child(a, "llama", python=a.llama_python))
    if "c" in runs:
        # warp at the budget it resolves from the cgroup limit (3/4 of it, whole working
        # sets), and at floor + 1 working set given explicitly when that fits the limit
        # with 384 MiB to spare for the interpreter.
        arms = [("warp", "cap", None)] if "warp" in engines else []
        if floor_ws + 384 * MIB <= cap and "warp" in engines:
            arms.append(("warp", "cap floor+1ws", floor_ws))
        if a.gguf:
            arms.append(("llama", "cap", None))
        for eng, tag, budget in arms:
            try:
                cg = MemCgroup(cap)
            except OSError as e:
                out["runs"][f"(c) {eng} {tag}"] = {"engine": eng, "error": f"no cgroup: {e}"}
                print(f"(c) {eng}: skipped, cannot create a cgroup ({e})", flush=True)
                continue
            try:
                out["cgroup"] = cg.kind
                py = sys.executable if eng == "warp" else a.llama_python
                show(f"(c) {eng} {tag}", run_child(a, eng, python=py, cgroup=cg, budget=budget,
                                                   extra=rt if eng == "warp" else None))
            finally:
                cg.remove()
    if "prefill" in runs and "warp" in engines:
        for chunk in (64, 1):
            r = run_child(a, "warp", python=sys.executable, budget=floor_ws,
                          extra=rt + ["--prefill-chunk", str(chunk)], decode_tokens=0)
            out["runs"][f"prefill chunk={chunk}"] = r
            if "error" in r:
                print(f"prefill chunk={chunk}: ERROR {r['error']}", flush=True)
                continue
            pf = r["prefill"]
            print(f"prefill chunk={chunk:<3} expert bytes {pf['bytes_read'] / GIB:7.2f} GiB  "
                  f"misses {pf['expert_misses']}  {r['prefill_tok_s']:.2f} tok/s", flush=True)
        c64 = out["runs"].get("prefill chunk=64", {}).get("prefill", {}).get("bytes_read")
        c1 = out["runs"].get("prefill chunk=1", {}).get("prefill", {}).get("bytes_read")
        if c64 and c1:
            out["prefill_read_ratio"] = c64 / c1
            print(f"chunked/token-at-a-time prefill expert bytes: {c64 / c1:.3f}", flush=True)
    if "disk" in runs:
        # Measured again after the runs: the disk is shared, and the bound must use the
        # best bandwidth this disk showed, or a busy minute would flatter the engine.
        drop_caches()
        out["disk_end"] = disk_bandwidth(files)
        bw_end = max(out["disk_end"].values())
        print("disk again after the runs: " + ", ".join(
            f"{k} {v / GIB:.2f}" for k, v in out["disk_end"].items()) + " GiB/s", flush=True)
        if bw_end > bw:
            bw = out["disk_bw"] = bw_end
            for r in out["runs"].values():
                if r.get("engine") == "warp" and "decode" in r and r.get("decode_tok_s"):
                    summarize(r, record, bw)
        print(f"disk bound bandwidth (best of both): {bw / GIB:.2f} GiB/s", flush=True)
        for tag, r in out["runs"].items():
            if r.get("of_disk_bound") is not None:
                print(f"  {tag:<22} {r['decode_tok_s']:.3f} tok/s = {r['of_disk_bound']:.0%} of "
                      f"the bound {r['disk_bound_tok_s']:.3f}", flush=True)
    wc, lc = out["runs"].get("(c) warp cap"), out["runs"].get("(c) llama cap")
    if wc and lc and "error" not in wc and "error" not in lc:
        out["c_speedup"] = wc["decode_tok_s"] / lc["decode_tok_s"]
        print(f"(c) warp / llama.cpp decode: {out['c_speedup']:.2f}x; warp at "
              f"{wc['of_disk_bound']:.0%} of the disk bound", flush=True)
    if a.json:
        a.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
