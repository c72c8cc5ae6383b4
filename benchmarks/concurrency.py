"""Concurrent streams on one engine: aggregate decode tok/s at 1, 2, 4, 8 streams.

Per stream count N, one child process opens the container once, warms the expert cache
with one short generation, then starts N threads that each call `Engine.generate` on
their own 4-token prompt (greedy, EOS ignored, `--decode-tokens` each) and waits for all
of them. Reported per N: aggregate tok/s (generated tokens of all streams / wall time,
the short prompts included), expert hit rate (lookups the cache served with no read),
the share a prefetch (lookahead) read served, expert bytes read per generated token,
and % of the disk bound (tok/s x bytes read per token / the disk's O_DIRECT random-read
rate, measured in the same run with streaming.disk_bandwidth over the container's banks).

Options:
  --trace FILE     a recorded routing trace (../shared/data/routing-traces/*.jsonl, or
                   any JSONL of that shape) replayed instead of the router
                   (`route_trace=`). Each sequence of the engine carries its own trace
                   cursor, sequence k starting at k x (trace length / max_sequences), so
                   concurrent streams replay different stretches of the trace.
  --cap F          run each child in a cgroup memory limit of F x the container size
                   (v1 /sys/fs/cgroup/memory/<name>, else v2), created and removed
                   here; the engine budget is the limit less 192 MiB for the Python
                   process around it (the engine's own resolver keeps whole working
                   sets and would leave only the minimum cache at 1/4 of a container).
                   Needs root.
  --budget B       an explicit engine budget instead ("6G").
  --resident       warm the cache with every expert at open (a hotlist naming them all;
                   give a --budget that holds the whole container), so no expert is read
                   while decoding.
  --working-sets K1,K2,...
                   run every stream count at each expert cache size of K working sets
                   (one token's experts: top-k x MoE layers x record bytes, from
                   `plan_memory`): the budget is the floor for the stream count less its
                   minimum cache, plus K working sets (inside --cap's cgroup if given).
  --prefill N      also, in each 1-stream run, prefill one N-token prompt (one generated
                   token) after the decode streams, and report its prefill tok/s beside
                   the decode rate.
  --prefill-chunk C  the engine's `prefill_chunk` (rows per prefill step; default 64):
                   a step reads the union of its rows' experts once, so beyond RAM a
                   whole 512-token prompt in one chunk reads each expert about once.
  --warm-tokens N  the warm-up generation's length (default 4). A cache of several working
                   sets starts empty and its memory is first touched as it fills: a longer
                   warm-up times the steady state instead of that start.
  --no-exact       8-bit activations (the engine's exact=False) instead of float32.
  --reader-threads N  the engine's expert reader threads (default: the engine's).

The engine opens with max_sequences = the stream count, so the scheduler behind
`Engine.stream` decodes all the streams together, one batched step at a time.

    python benchmarks/concurrency.py --container moe.warp \
        --trace ../shared/data/routing-traces/olmoe_299.jsonl --cap 0.25 \
        [--streams 1,2,4,8] [--decode-tokens 32] [--threads 2] [--json out.json]
        [--working-sets 1,2,4] [--prefill 512]

"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from streaming import (  # noqa: E402  (benchmarks/ is not a package)
    GIB,
    MemCgroup,
    bank_files,
    disk_bandwidth,
    machine,
    peak_rss,
    run_json_child,
)

PROMPT_TOKENS = 4
CAP_HEADROOM = 192 << 20  # the Python process around the engine, under --cap


def container_bytes(container: Path) -> int:
    return sum(f.stat().st_size for f in container.iterdir() if f.is_file())


def trace_len(path: str | None) -> int:
    if not path:
        return 0
    with open(path, encoding="utf-8") as f:
        return sum(1 for ln in f if ln.strip())


def every_expert_hotlist(container: Path) -> str:
    """A hotlist naming every expert of every layer once (the cache's warm-up list)."""
    hp = json.loads((container / "manifest.json").read_text())["hparams"]
    path = Path(tempfile.mkdtemp(prefix="wp-resident-")) / "hotlist"
    rows = [f"{lay} {e} 1" for lay in range(hp["n_layers"])
            for e in range(hp["n_experts"])]
    path.write_text("warp-hotlist 1\n" + "\n".join(rows) + "\n")
    return str(path)


def working_sets_budget(container: Path, n: int, k: float, ctx: int, chunk: int) -> int:
    """The budget whose expert cache holds k working sets, for n sequences."""
    from warp_providers import plan_memory

    extra = {"prefill_chunk": chunk} if chunk else {}
    p = plan_memory(container, ctx=ctx, max_sequences=n, **extra)
    return max(p["floor_bytes"],
               p["floor_bytes"] - p["min_cache_bytes"] + int(k * p["working_set_bytes"]))


def child(a: argparse.Namespace) -> dict:
    from warp_providers import Engine

    n = a.child
    opts: dict = {"route_trace": a.trace} if a.trace else {}
    if a.resident:
        opts["hotlist_path"] = every_expert_hotlist(a.container)
    ctx = max(512, a.prefill + 64)
    if a.prefill_chunk:
        opts["prefill_chunk"] = a.prefill_chunk
    if a.reader_threads:
        opts["reader_threads"] = a.reader_threads
    eng = Engine.open(a.container, budget=a.budget, threads=a.threads, ctx=ctx,
                      max_sequences=n, exact=a.exact, **opts)
    vocab = eng.vocab_size
    prompts = [[(97 * s + 13 * i) % (vocab - 10) + 5 for i in range(PROMPT_TOKENS)]
               for s in range(n)]
    eng.generate([3, 4, 5], max_tokens=a.warm_tokens, stop_ids=[])  # warm pools and cache
    if a.resident:  # the hotlist's preload runs in the background: wait for its end
        last, t_end = -1, time.monotonic() + 120
        while eng.stats()["cache_bytes"] != last and time.monotonic() < t_end:
            last = eng.stats()["cache_bytes"]
            time.sleep(1.0)
        eng.generate([3, 4, 5], max_tokens=4, stop_ids=[])
    s0 = eng.stats()
    done = [0] * n
    errors: list[str] = []

    def run(s: int) -> None:
        try:
            res = eng.generate(prompts[s], max_tokens=a.decode_tokens, stop_ids=[])
            done[s] = len(res.token_ids)
        except Exception as e:  # reported, and the run counts as failed
            errors.append(f"stream {s}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=run, args=(s,)) for s in range(n)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    s1 = eng.stats()
    info = eng.info()
    prefill = None
    if a.prefill and n == 1:
        long = [(31 * i + 7) % (vocab - 10) + 5 for i in range(a.prefill)]
        st = eng.generate(long, max_tokens=1, stop_ids=[]).stats
        prefill = {"tokens": st["prompt_tokens_evaluated"], "seconds": st["prefill_seconds"],
                   "tok_s": st["prefill_tok_s"], "bytes_read": st["bytes_read"]}
    eng.close()
    d = {k: s1[k] - s0[k] for k in ("expert_lookups", "expert_hits", "expert_misses",
                                   "prefetch_issued", "prefetch_hits", "bytes_read")}
    tokens = sum(done)
    return {"streams": n, "tokens": tokens, "wall_s": wall, "tok_s": tokens / wall,
            "errors": errors, "stats": d, "budget_bytes": info["plan"]["budget_bytes"],
            "cache_bytes": s1["cache_bytes"], "peak_rss": peak_rss(), "prefill": prefill}


def run_child(a: argparse.Namespace, n: int, cgroup: MemCgroup | None) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", str(n), "--container",
           str(a.container), "--threads", str(a.threads), "--decode-tokens",
           str(a.decode_tokens)]
    if a.trace:
        cmd += ["--trace", a.trace]
    if a.budget:
        cmd += ["--budget", str(a.budget)]
    if a.resident:
        cmd.append("--resident")
    if a.prefill:
        cmd += ["--prefill", str(a.prefill)]
    if a.prefill_chunk:
        cmd += ["--prefill-chunk", str(a.prefill_chunk)]
    if a.reader_threads:
        cmd += ["--reader-threads", str(a.reader_threads)]
    cmd += ["--warm-tokens", str(a.warm_tokens)]
    if not a.exact:
        cmd.append("--no-exact")
    r = run_json_child(cmd, cgroup)
    r.setdefault("streams", n)
    return r


def disk_and_cgroup(a: argparse.Namespace, size: int,
                    out: dict) -> tuple[float, MemCgroup | None]:
    """The disk's best random-read rate (0.0 under --no-disk) and, under --cap, the memory
    cgroup of cap x the container (and a budget under it when none was given); both are
    printed and recorded in out."""
    bw = 0.0
    if not a.no_disk:
        out["disk"] = disk_bandwidth(bank_files(a.container), sizes_mib=(1, 4),
                                     depths=(1, 4, 8), seconds=1.5)
        bw = max(out["disk"].values())
        print(f"disk O_DIRECT random read: best {bw / GIB:.2f} GiB/s", flush=True)
    cg = None
    if a.cap and not a.budget:
        a.budget = max(int(size * a.cap) - CAP_HEADROOM, 1)
    if a.cap:
        try:
            cg = MemCgroup(int(size * a.cap))
            out["cgroup"] = {"kind": cg.kind, "limit": cg.limit}
            print(f"cgroup {cg.kind} = {cg.limit / GIB:.2f} GiB ({a.cap} x container)")
        except OSError as e:
            sys.exit(f"cannot create the memory cgroup ({e}); run as root or drop --cap")
    return bw, cg


def summarize(r: dict, bw: float) -> dict:
    if "error" in r:
        return r
    d, n = r["stats"], max(r["tokens"], 1)
    looks = max(d["expert_lookups"], 1)
    # served by the cache with no read of its own; a lookup a prefetch served was a read
    r["hit_rate"] = (d["expert_hits"] - d["prefetch_hits"]) / looks
    r["prefetched"] = d["prefetch_hits"] / looks
    r["bytes_per_token"] = d["bytes_read"] / n
    r["of_disk_bound"] = r["tok_s"] * r["bytes_per_token"] / bw if bw else None
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--container", type=Path, required=True)
    ap.add_argument("--trace", default=None)
    ap.add_argument("--streams", default="1,2,4,8")
    ap.add_argument("--decode-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cap", type=float, default=None)
    ap.add_argument("--budget", default=None)
    ap.add_argument("--resident", action="store_true")
    ap.add_argument("--working-sets", default=None)
    ap.add_argument("--prefill", type=int, default=0)
    ap.add_argument("--prefill-chunk", type=int, default=0)
    ap.add_argument("--no-disk", action="store_true", help="skip the disk measurement")
    ap.add_argument("--warm-tokens", type=int, default=4,
                    help="tokens of the warm-up generation before the timed streams "
                         "(default 4; more fills a large expert cache before timing)")
    ap.add_argument("--reader-threads", type=int, default=0,
                    help="the engine's expert reader threads (default 0: the engine's)")
    ap.add_argument("--exact", action=argparse.BooleanOptionalAction, default=True,
                    help="float32 activations (default); --no-exact: 8-bit activations")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child is not None:
        print(json.dumps(child(a)))
        return
    size = container_bytes(a.container)
    print(machine())
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load {os.getloadavg()}; "
          f"{' '.join(sys.argv)}")
    print(f"container {a.container.name}: {size / GIB:.2f} GiB; trace {a.trace or 'none'} "
          f"({trace_len(a.trace)} tokens)", flush=True)
    out: dict = {"machine": machine(), "argv": sys.argv, "container_bytes": size, "runs": []}
    bw, cg = disk_and_cgroup(a, size, out)
    sizes = [None] if not a.working_sets else [float(k) for k in a.working_sets.split(",")]
    try:
        for k in sizes:
            if k is not None:
                print(f"expert cache of {k:g} working sets")
            base = None
            print("streams  tok/s  vs 1  hit rate  prefetched  bytes/token  of disk bound  "
                  "peak RSS  budget")
            for n in (int(s) for s in a.streams.split(",")):
                if k is not None:
                    a.budget = str(working_sets_budget(a.container, n, k, max(512, a.prefill + 64),
                                                          a.prefill_chunk))
                r = summarize(run_child(a, n, cg), bw)
                r["working_sets"] = k
                out["runs"].append(r)
                if "error" in r:
                    print(f"{n:7d}  error: {r['error']}")
                    continue
                base = base or r["tok_s"]
                bound = f"{r['of_disk_bound']:.0%}" if r["of_disk_bound"] is not None else "-"
                print(f"{n:7d}  {r['tok_s']:5.2f}  {r['tok_s'] / base:4.2f}x  "
                      f"{r['hit_rate']:8.1%}  {r['prefetched']:10.1%}  "
                      f"{r['bytes_per_token'] / (1 << 20):8.2f} MiB  {bound:>13}  "
                      f"{r['peak_rss'] / GIB:.2f} GiB  {r['budget_bytes'] / GIB:.2f} GiB"
                      + (f"  errors {r['errors']}" if r["errors"] else ""), flush=True)
                if r.get("prefill"):
                    p = r["prefill"]
                    print(f"         prefill of {p['tokens']} tokens: {p['tok_s']:.2f} tok/s "
                          f"({p['tok_s'] / r['tok_s']:.1f}x this decode rate), "
                          f"{p['bytes_read'] / GIB:.2f} GiB read", flush=True)
    finally:
        if cg:
            cg.remove()
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))
    if any("error" in r or r["errors"] for r in out["runs"]):
        sys.exit(1)


if __name__ == "__main__":
    main()
