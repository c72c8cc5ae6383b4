"""Batch jobs: `warp batch` vs a sequential loop over the transport, Ray vs one process.

Arms, on the same model and the same N short chat requests (max_tokens M, temperature 0):

1. `loop`: the OpenAI SDK over `warp_transport`, one `chat.completions.create` after
   another (what a user's script does).
2. `batch`: the `warp batch` job in this process (`batchfile.run_file`: the jobs
   directory in SQLite, one transaction per answer, output file at the end), at
   `--concurrency` lines in flight (default: the engine's `--max-sequences`), which the
   engine's scheduler decodes together in batched steps.
3. `ray-1` / `ray-2` (with `--ray`): the same job on a local Ray instance with one and
   two actors (each opens its own engine; Ray start-up included in the wall time).
4. `overhead`: the `batch` arm on the scripted engine (tests/fake_engine.py, replies with
   no model work), whose wall time per line is the job machinery's own cost.

Prints the machine, then one row per arm: wall seconds, lines/s, completion tok/s, and
the ratio to `loop`.

    python benchmarks/batch.py [--lines 1000] [--max-tokens 8] [--max-sequences 8]
                               [--concurrency N] [--ray]
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
sys.path[:0] = [str(ROOT / "integrations" / "openai_shim"), str(ROOT / "tests")]


def _requests(n: int, max_tokens: int) -> list[dict[str, Any]]:
    return [{"custom_id": f"q{i}", "method": "POST", "url": "/v1/chat/completions",
             "body": {"messages": [{"role": "user", "content": f"Give me a word for {i}."}],
                      "max_tokens": max_tokens, "temperature": 0}} for i in range(n)]


def _file(work: Path, reqs: list[dict[str, Any]]) -> Path:
    path = work / "in.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in reqs))
    return path


def loop(model: Path, reqs: list[dict[str, Any]]) -> tuple[float, int]:
    from warp_openai import warp_openai_client

    client = warp_openai_client(model)
    t0 = time.perf_counter()
    tokens = 0
    for r in reqs:
        tokens += client.chat.completions.create(model="m", **r["body"]).usage.completion_tokens
    wall = time.perf_counter() - t0
    client.close()
    return wall, tokens


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
    ap.add_argument("--concurrency", type=int, default=0,
                    help="lines in flight (default 0: the engine's sequences)")
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
    rows: list[tuple[str, float, int]] = []
    rows.append(("loop", *loop(model, reqs)))
    engine = shared_engine(model, max_sequences=a.max_sequences)
    rows.append((f"batch ({a.concurrency or a.max_sequences} in flight, "
                 f"{a.max_sequences} sequences)", *batch(engine, src, work, a.concurrency)))
    b = engine.batching()
    print(f"# batch arm: {b['steps']} steps, {b['sequences'] / max(1, b['steps']):.2f} "
          f"sequences per step, widest {b['widest']}")
    if a.ray:
        from warp_openai.ray_batch import ray_runner

        for actors in (1, 2):
            runner = ray_runner(str(model), address=None, actors=actors, engine_options={})
            rows.append((f"ray-{actors}", *batch(engine, src, work, 1, runner)))
            import ray

            ray.shutdown()
    wall, _ = batch(ScriptedEngine(["ok"]), src, work, 1)
    base = rows[0][1]
    print(f"{'arm':28} {'wall s':>8} {'lines/s':>8} {'tok/s':>8} {'vs loop':>8}")
    for name, wall_s, tokens in rows:
        print(f"{name:28} {wall_s:8.2f} {a.lines / wall_s:8.2f} {tokens / wall_s:8.1f} "
              f"{base / wall_s:8.2f}x")
    print(f"overhead per line (scripted engine, no model work): {1000 * wall / a.lines:.2f} ms")


if __name__ == "__main__":
    main()
