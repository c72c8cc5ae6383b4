"""Thread scaling of warp: resident decode and 64-token prefill at 1 and 2 threads.

Engines of each thread count are open side by side and measured in interleaved rounds
(ENGINE_LESSONS C10), so the ratio 2 threads / 1 thread comes from one run under one
load. Besides wall-clock tok/s each row gives the process CPU seconds per token (user +
system, all threads): on a quiet machine 2 threads at ~2x speed spend about the same CPU
per token as 1; on a loaded one the wall clock is unreliable and the CPU time shows how
much work the second thread added (spinning included).

    python benchmarks/threads.py CONTAINER [CONTAINER ...] [--repeats 5]
        [--exact yes|no|both|auto]

--exact: yes (float32 activations), no (8-bit wherever a kernel exists), both, or auto
(the engine's default, decided per step and weight type: docs/ENGINE.md).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import numpy as np

from warp_providers import Engine

PROMPT_TOKENS = 64
DECODE_TOKENS = 32


def cpu() -> float:
    t = os.times()
    return t.user + t.system


def one_round(eng: Engine, prompt: list[int]) -> tuple[float, float, float, float]:
    eng.reset()
    c0, t0 = cpu(), time.perf_counter()
    logits = eng.eval(prompt)
    pf, pf_cpu = time.perf_counter() - t0, cpu() - c0
    tok = int(np.argmax(logits))
    c0, t0 = cpu(), time.perf_counter()
    for _ in range(DECODE_TOKENS):
        tok = int(np.argmax(eng.eval([tok])))
    dc, dc_cpu = time.perf_counter() - t0, cpu() - c0
    return (len(prompt) / pf, DECODE_TOKENS / dc, pf_cpu / len(prompt),
            dc_cpu / DECODE_TOKENS)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("containers", type=Path, nargs="+")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--exact", choices=("yes", "no", "both", "auto"), default="both")
    args = ap.parse_args()
    modes = {"yes": [True], "no": [False], "both": [True, False], "auto": [None]}[args.exact]
    labels = {True: "exact", False: "int8", None: "auto"}
    print(f"load average at start: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    print("| model | path | prefill 1t | prefill 2t | prefill 2t/1t | decode 1t | decode 2t "
          "| decode 2t/1t | CPU ms/token prefill 1t / 2t | CPU ms/token decode 1t / 2t |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for c in args.containers:
        size = sum(f.stat().st_size for f in c.iterdir() if f.is_file())
        budget = int(size * 1.25) + (1 << 30)  # every expert resident
        for exact in modes:
            engs = {t: Engine.open(c, threads=t, ctx=512, budget=budget, exact=exact)
                    for t in (1, 2)}
            vocab = engs[1].vocab_size
            prompt = [(31 * i + 7) % (vocab - 3) + 3 for i in range(PROMPT_TOKENS)]
            res: dict[int, list[tuple[float, float, float, float]]] = {1: [], 2: []}
            try:
                for e in engs.values():
                    one_round(e, prompt)  # warm-up
                for r in range(args.repeats):
                    for t in ((1, 2) if r % 2 == 0 else (2, 1)):
                        res[t].append(one_round(engs[t], prompt))
            finally:
                for e in engs.values():
                    e.close()
            med = {t: [statistics.median(x[i] for x in res[t]) for i in range(4)]
                   for t in (1, 2)}
            print(f"| {c.name} | {labels[exact]} | {med[1][0]:.1f} | "
                  f"{med[2][0]:.1f} | **{med[2][0] / med[1][0]:.2f}x** | {med[1][1]:.2f} | "
                  f"{med[2][1]:.2f} | **{med[2][1] / med[1][1]:.2f}x** | "
                  f"{1e3 * med[1][2]:.1f} / {1e3 * med[2][2]:.1f} | "
                  f"{1e3 * med[1][3]:.1f} / {1e3 * med[2][3]:.1f} |", flush=True)
    print(f"load average at end: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
