"""One batched decode step of the engine alone: ms per step at 1, 2, 4, 8 sequences.

Per sequence count N, one context opened with max_sequences = N prefills N different
16-token prompts in one `eval_batch`, runs 4 warm-up decode steps, then times --steps
decode steps (one token per sequence, the greedy token of its last logits) with
`time.perf_counter` and `time.process_time` around each `Context.eval_batch`: no
tokenizer, sampler or scheduler in the figure. Reported per N: the median and the best
wall ms per step, the median CPU ms per step (all the process's threads: on a machine
shared with other jobs the steadier figure of work done, with --threads 1 exactly the
step's work), aggregate tok/s (N / median wall step) and its ratio to one sequence. With --resident every expert is read at
open (a hotlist naming them all; give a --budget that holds the container) and the run
waits for that preload, so no expert is read while timing. With --prefill N, also one
N-token prompt on one sequence (`prefill_chunk` N, so one matmul per weight carries all N
rows), timed --steps // 4 times after a warm-up: median wall and CPU ms, and CPU ms per
token against one decode step's. --no-exact runs the 8-bit activation path (the engine's
`exact` option off), --exact (the default) the float32 one.

    python benchmarks/batch_step.py --container model.warp --budget 2G --resident \
        [--streams 1,2,4,8] [--steps 32] [--threads 2] [--prefill 64] [--no-exact]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

PROMPT_TOKENS = 16
WARM_STEPS = 4


def open_ctx(a: argparse.Namespace, n: int, **extra: int):
    """One context for n sequences, its expert preload (--resident) finished."""
    from concurrency import every_expert_hotlist
    from warp_providers import _engine
    from warp_providers.engine import parse_size

    opts: dict = {"n_threads": a.threads, "max_sequences": n, "ctx_tokens": 512,
                  "exact": int(a.exact), **extra}
    if a.budget:
        opts["budget_bytes"] = parse_size(a.budget)
    if a.resident:
        opts["hotlist_path"] = every_expert_hotlist(a.container)
    ctx = _engine.Context(str(a.container), opts)
    if a.resident:  # the hotlist's preload runs in the background: wait for its end
        last, t_end = -1, time.monotonic() + 120
        while ctx.stats()["cache_bytes"] != last and time.monotonic() < t_end:
            last = ctx.stats()["cache_bytes"]
            time.sleep(1.0)
    return ctx


def measure_prefill(a: argparse.Namespace) -> dict:
    """One a.prefill-token prompt on one sequence, timed after a warm-up."""
    ctx = open_ctx(a, 1, prefill_chunk=a.prefill)
    vocab = ctx.vocab_size
    prompt = np.array([(13 * i) % (vocab - 10) + 5 for i in range(a.prefill)], np.int32)
    logits = np.zeros(vocab, np.float32)
    times, cpu = [], []
    for rep in range(1 + max(a.steps // 4, 1)):
        ctx.reset()
        t0, c0 = time.perf_counter(), time.process_time()
        ctx.eval(prompt, logits, False)
        if rep:
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    ctx.close()
    return {"ms_median": statistics.median(times) * 1e3,
            "cpu_ms": statistics.median(cpu) * 1e3}


def measure(a: argparse.Namespace, n: int) -> dict:
    ctx = open_ctx(a, n)
    vocab = ctx.vocab_size
    seqs = [None] + [ctx.seq_open() for _ in range(n - 1)]
    prompts = [np.array([(97 * s + 13 * i) % (vocab - 10) + 5 for i in range(PROMPT_TOKENS)],
                        np.int32) for s in range(n)]
    logits = np.zeros((n, vocab), np.float32)
    ctx.eval_batch(seqs, prompts, logits)
    times, cpu = [], []
    for step in range(WARM_STEPS + a.steps):
        toks = [np.array([int(np.argmax(logits[i]))], np.int32) for i in range(n)]
        t0, c0 = time.perf_counter(), time.process_time()
        ctx.eval_batch(seqs, toks, logits)
        if step >= WARM_STEPS:
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    ctx.close()
    med = statistics.median(times)
    return {"streams": n, "ms_median": med * 1e3, "ms_best": min(times) * 1e3,
            "cpu_ms": statistics.median(cpu) * 1e3, "tok_s": n / med}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--container", required=True, type=Path)
    ap.add_argument("--budget", default=None)
    ap.add_argument("--resident", action="store_true")
    ap.add_argument("--streams", default="1,2,4,8")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prefill", type=int, default=0)
    ap.add_argument("--exact", action=argparse.BooleanOptionalAction, default=True,
                    help="float32 activations (default); --no-exact: 8-bit activations")
    a = ap.parse_args(argv)
    print(f"{a.container.name}; load {os.getloadavg()}; threads {a.threads}; "
          f"exact {a.exact}")
    print("streams  ms/step (median)   best  cpu ms/step  tok/s  vs 1")
    base, one_cpu = None, None
    for n in (int(s) for s in a.streams.split(",")):
        r = measure(a, n)
        base = base or r["tok_s"]
        one_cpu = one_cpu or r["cpu_ms"]
        print(f"{n:7d}  {r['ms_median']:16.2f}  {r['ms_best']:6.2f}  {r['cpu_ms']:11.2f}  "
              f"{r['tok_s']:5.1f}  {r['tok_s'] / base:.2f}x")
    if a.prefill:
        p = measure_prefill(a)
        per_tok = p["cpu_ms"] / a.prefill
        print(f"prefill {a.prefill} tokens: {p['ms_median']:.2f} ms median, {p['cpu_ms']:.2f} "
              f"cpu ms ({per_tok:.3f} cpu ms per token, {per_tok / one_cpu:.3f} of one "
              f"decode step)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
