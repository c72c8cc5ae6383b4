"""Batch jobs: `warp batch` vs a sequential loop over the transport, Ray vs one process.

Arms, on the same model and the same N short chat requests (max_tokens M, temperature 0):

1. `loop`: the OpenAI SDK over `warp_transport`, one `chat.completions.create` after
   another (what a user's script does).
2. `batch`: the `warp batch` job in this process (`batchfile.run_file`: the jobs
   directory in SQLite, one transaction per answer, output file at the end), at
   `--concurrency` lines in flight (default: what `warp batch` runs,
   `batchfile.default_concurrency`: 1.5x the engine's `--max-sequences`), which the
   engine's scheduler decodes together in batched steps.
3. `ray-1` / `ray-2` (with `--ray`): the same job on a local Ray instance with one and
   two actors (each opens its own engine; Ray start-up included in the wall time).
4. `overhead`: the `batch` arm on the scripted engine (tests/fake_engine.py, replies with
   no model work), whose wall time per line is the job machinery's own cost.

Prints the machine, then one row per arm: wall seconds, lines/s, completion tok/s, the
ratio to the first `loop`, and the load average (1 min) at the arm's start and end. Other
jobs on the machine bias the ratio when their load changes between arms: `--loop-after`
runs the loop again after the batch arms, so both loops bracket them. `--concurrency`
takes a comma list (one batch arm each, on the same engine).

    python benchmarks/batch.py [--lines 1000] [--max-tokens 8] [--max-sequences 8]
                               [--concurrency N[,N...]] [--loop-after] [--ray]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "integrations" / "openai_shim"), str(ROOT / "tests")]


def _requests(n: int, max_tokens: int) -> list[dict[str, Any]]:
    return [{"custom_id": f"q{i}", "method": "POST", "url": "/v1/chat/completions",
             "body": {"messages": [{"role": "user", "content": f"Give me a word for {i}."}],
                      "max_tokens": max_tokens, "temperature": 0}} for i in range(n)]


def _file(work: Path, reqs: list[dict[str, Any]]) -> Path:
    path = work / "in.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in reqs))
    return path


def loop(model: Path, reqs: list[dict[str, Any]],
         replies: dict[str, str] | None = None) -> tuple[float, int]:
    from warp_openai import warp_openai_client

    client = warp_openai_client(model)
    t0 = time.perf_counter()
    tokens = 0
    for r in reqs:
        out = client.chat.completions.create(model="m", **r["body"])
        tokens += out.usage.completion_tokens
        if replies is not None:
            replies[r["custom_id"]] = out.choices[0].message.content
    wall = time.perf_counter() - t0
    client.close()
    return wall, tokens


def _replies(path: Path) -> dict[str, str]:
    """custom_id -> reply text of a batch output file."""
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    return {r["custom_id"]: r["response"]["body"]["choices"][0]["message"]["content"]
            for r in lines}


def batch(engine: Any, src: Path, work: Path, concurrency: int,
          runner: Any = None) -> tuple[float, int]:
    from warp_openai import WarpAPI
    from warp_openai.batchfile import run_file

    api = WarpAPI(engine=engine, jobs_dir=work / f"jobs-{time.monotonic_ns()}",
                  batch_concurrency=concurrency or None)
    t0 = time.perf_counter()
    s = run_file(api, src, work / "out.jsonl", stream=open(os.devnull, "w"), runner=runner)
    wall = time.perf_counter() - t0
    api.close()
    assert s["completed"] == s["total"], s
    return wall, s["completion_tokens"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=1000)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--max-sequences", type=int, default=8,
                    help="sequences of the batch arm's engine (the loop's engine has the default)")
    ap.add_argument("--concurrency", default="0",
                    help="lines in flight, a comma list for several batch arms (default 0: "
                         "`warp batch`'s default for the engine's sequences)")
    ap.add_argument("--loop-after", action="store_true",
                    help="run the loop arm again after the batch arms")
    ap.add_argument("--ray", action="store_true", help="also the Ray arms (ray[data])")
    ap.add_argument("--model", help="a container (default: SmolLM2, converted once)")
    a = ap.parse_args()

    from fake_engine import ScriptedEngine

    from warp_providers import shared_engine
    from warp_providers.demo import default_model

    model = Path(a.model) if a.model else default_model()
    reqs = _requests(a.lines, a.max_tokens)
    work = Path(tempfile.mkdtemp(prefix="warp-batch-bench-"))
    src = _file(work, reqs)
    print(f"# {platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
          f"; model {model.name}; {a.lines} lines, max_tokens {a.max_tokens}")
    rows: list[tuple[str, float, int, str]] = []

    def arm(name: str, run: Any) -> None:
        l0 = os.getloadavg()[0]
        wall_s, tokens = run()
        rows.append((name, wall_s, tokens, f"{l0:.1f}-{os.getloadavg()[0]:.1f}"))
        print(f"# {name}: {wall_s:.2f} s, load {rows[-1][3]}, "
              f"{time.strftime('%H:%M:%S', time.gmtime())} UTC", flush=True)

    want: dict[str, str] = {}
    arm("loop", lambda: loop(model, reqs, want))
    engine = shared_engine(model, max_sequences=a.max_sequences)
    for c in (int(x) for x in a.concurrency.split(",")):
        from warp_openai.batchfile import default_concurrency

        c = c or default_concurrency(a.max_sequences)  # what `warp batch` runs by default
        before = engine.batching()
        arm(f"batch ({c} in flight, {a.max_sequences} sequences)",
            lambda c=c: batch(engine, src, work, c))
        b = {k: v - before[k] if k != "widest" else v for k, v in engine.batching().items()}
        got = _replies(work / "out.jsonl")
        same = sum(got.get(k) == v for k, v in want.items())
        print(f"# batch arm, {c} in flight: {b['steps']} steps, "
              f"{b['sequences'] / max(1, b['steps']):.2f} sequences per step, "
              f"widest {b['widest']}; replies equal to the loop's: {same} of {len(want)}")
    if a.ray:
        from warp_openai.ray_batch import ray_runner

        for actors in (1, 2):
            runner = ray_runner(str(model), address=None, actors=actors, engine_options={})
            arm(f"ray-{actors}", lambda runner=runner: batch(engine, src, work, 1, runner))
            import ray

            ray.shutdown()
    if a.loop_after:
        arm("loop (again)", lambda: loop(model, reqs))
    wall, _ = batch(ScriptedEngine(["ok"]), src, work, 1)
    base = rows[0][1]
    print(f"{'arm':36} {'wall s':>8} {'lines/s':>8} {'tok/s':>8} {'vs loop':>8} {'load':>10}")
    for name, wall_s, tokens, load in rows:
        print(f"{name:36} {wall_s:8.2f} {a.lines / wall_s:8.2f} {tokens / wall_s:8.1f} "
              f"{base / wall_s:8.2f}x {load:>10}")
    print(f"overhead per line (scripted engine, no model work): {1000 * wall / a.lines:.2f} ms")


if __name__ == "__main__":
    main()
