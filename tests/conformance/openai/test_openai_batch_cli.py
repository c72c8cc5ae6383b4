"""`warp batch` as a user runs it, and killed with SIGKILL at each crash point.

The command runs as `python -m warp_providers.cli batch ...` (the core's CLI finds it
through the `warp_providers.cli` entry points that integrations/openai_shim/pyproject.toml
declares; the test puts a dist-info carrying exactly those entry points first on the
path, so a checkout whose installed metadata predates them still runs this checkout's).
A run killed by the test-only hook `WARP_BATCH_CRASH_AT` and resumed with `--resume`
must end with every input line answered exactly once, each answer equal to an
uninterrupted run's at temperature 0, on SmolLM2. With `--ray`, two actors on a local Ray
instance must give that same output, also when one of them is killed mid-job.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support import has_module, requires

try:
    import tomllib
except ImportError:  # Python 3.10
    from pip._vendor import tomli as tomllib

ROOT = Path(__file__).resolve().parents[3]
QUESTIONS = ["Name a colour.", "What is 2 + 2?", "Say hello.", "Name a fruit.",
             "What day follows Monday?"]


@pytest.fixture(scope="module")
def cli_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """PYTHONPATH: a dist-info declaring warp-openai's CLI entry points, then sys.path."""
    project = tomllib.loads((ROOT / "integrations/openai_shim/pyproject.toml").read_text())
    eps = project["project"]["entry-points"]["warp_providers.cli"]
    assert eps["batch"] == "warp_openai.cli:BATCH"
    dist = tmp_path_factory.mktemp("eps") / "warp_openai_cli_eps-0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: warp-openai-cli-eps\n"
                                   "Version: 0\n")
    (dist / "entry_points.txt").write_text(
        "[warp_providers.cli]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()))
    return os.pathsep.join([str(dist.parent), *sys.path])


def batch(cli_path: str, *args: str, crash: str | None = None, once: Path | None = None
          ) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": cli_path}
    env.pop("WARP_BATCH_CRASH_AT", None)
    env.pop("WARP_BATCH_CRASH_ONCE", None)
    if crash:
        env["WARP_BATCH_CRASH_AT"] = crash
    if once:
        env["WARP_BATCH_CRASH_ONCE"] = str(once)
    return subprocess.run([sys.executable, "-m", "warp_providers.cli", "batch", *args],
                          capture_output=True, text=True, timeout=600, env=env)


def write_input(path: Path, extra: list[str] = ()) -> Path:
    lines = [json.dumps({"custom_id": f"q{i}", "method": "POST", "url": "/v1/chat/completions",
                         "body": {"messages": [{"role": "user", "content": q}],
                                  "max_tokens": 6, "temperature": 0}})
             for i, q in enumerate(QUESTIONS)]
    path.write_text("\n".join([*lines, *extra]) + "\n")
    return path


def answers(path: Path) -> dict[str, Any]:
    """custom_id -> (content, finish_reason, usage) of an output file; each id once."""
    out: dict[str, Any] = {}
    for raw in path.read_text().splitlines():
        rec = json.loads(raw)
        assert rec["custom_id"] not in out, f"{rec['custom_id']} answered twice"
        body = rec["response"]["body"]
        choice = body["choices"][0]
        out[rec["custom_id"]] = (choice["message"]["content"], choice["finish_reason"],
                                 body["usage"]["completion_tokens"])
    return out


@pytest.fixture(scope="module")
def reference(smol_path: Path, cli_path: str, tmp_path_factory: pytest.TempPathFactory
              ) -> dict[str, Any]:
    """The uninterrupted run's answers, with its summary and stderr."""
    tmp = tmp_path_factory.mktemp("reference")
    src = write_input(tmp / "in.jsonl")
    p = batch(cli_path, str(smol_path), str(src), "-o", str(tmp / "out.jsonl"),
              "--jobs-dir", str(tmp / "jobs"), "--json")
    assert p.returncode == 0, p.stderr
    return {"answers": answers(tmp / "out.jsonl"), "summary": json.loads(p.stdout),
            "stderr": p.stderr}


def test_a_run_prints_progress_and_a_summary(reference):
    got = reference["answers"]
    assert sorted(got) == [f"q{i}" for i in range(len(QUESTIONS))]
    assert all(content and usage > 0 for content, _, usage in got.values())
    s = reference["summary"]
    assert s["status"] == "completed" and s["total"] == s["completed"] == len(QUESTIONS)
    assert s["failed"] == 0 and s["errors"] is None
    assert s["completion_tokens"] == sum(u for _, _, u in got.values())
    assert s["wall_s"] > 0 and s["tok_s"] > 0
    progress = [x for x in reference["stderr"].splitlines() if x.startswith("batch: ")]
    assert progress and f"{len(QUESTIONS)} lines of {len(QUESTIONS)} lines" in progress[-1]
    assert "tok/s" in progress[-1] and "ETA" in progress[-1]
    summary = reference["stderr"].splitlines()[-1]
    assert summary.startswith(f"warp batch: {len(QUESTIONS)} lines ({len(QUESTIONS)} "
                              "completed, 0 failed")


@pytest.mark.parametrize("point, concurrency", [
    ("validating", 1),
    ("result_written:2", 1),       # mid-write of the second result
    ("result_written:3", 2),       # with another line in flight
    ("result_written:4", 6),       # a line queued beyond the engine's 4 sequences
    ("result_committed:2", 1),
    ("finalizing", 1),
    ("output_half_written", 1),    # mid-write of the output file
    ("output_renamed", 1),         # files in place, the batch not yet marked finished
])
def test_killed_at_a_crash_point_then_resumed_answers_each_line_once(
        smol_path, cli_path, reference, tmp_path, point, concurrency):
    src = write_input(tmp_path / "in.jsonl")
    out = tmp_path / "out.jsonl"
    args = [str(smol_path), str(src), "-o", str(out), "--jobs-dir", str(tmp_path / "jobs"),
            "--max-concurrency", str(concurrency)]
    killed = batch(cli_path, *args, crash=point)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert not out.exists()
    again = batch(cli_path, *args)  # without --resume: refused, naming the flag
    assert again.returncode != 0 and "--resume" in again.stderr.strip().splitlines()[-1]
    resumed = batch(cli_path, *args, "--resume", "--json")
    assert resumed.returncode == 0, resumed.stderr
    assert answers(out) == reference["answers"]
    s = json.loads(resumed.stdout)
    assert s["completed"] == len(QUESTIONS) and s["failed"] == 0
    if point.startswith("result_committed"):
        assert s["lines_this_run"] == len(QUESTIONS) - 2  # the two committed ones kept


def test_bad_lines_go_to_the_errors_file(smol_path, cli_path, tmp_path):
    src = write_input(tmp_path / "in.jsonl", ["{broken", json.dumps(
        {"custom_id": "q0", "method": "POST", "url": "/v1/chat/completions", "body": {}})])
    out, errs = tmp_path / "out.jsonl", tmp_path / "bad.jsonl"
    p = batch(cli_path, str(smol_path), str(src), "-o", str(out), "--errors", str(errs),
              "--jobs-dir", str(tmp_path / "jobs"), "--json")
    assert p.returncode == 0, p.stderr
    assert len(answers(out)) == len(QUESTIONS)
    codes = [json.loads(x)["error"]["code"] for x in errs.read_text().splitlines()]
    assert codes == ["invalid_json_line", "duplicate_custom_id"]
    s = json.loads(p.stdout)
    assert s["failed"] == 2 and s["errors"] == str(errs.resolve())


def _ray_args(smol_path: Path, tmp_path: Path) -> list[str]:
    requires(has_module("ray"), "ray[data] (pip install 'warp-openai[ray]')")
    src = write_input(tmp_path / "in.jsonl")
    return [str(smol_path), str(src), "-o", str(tmp_path / "out.jsonl"), "--jobs-dir",
            str(tmp_path / "jobs"), "--ray", "--ray-actors", "2", "--json"]


def test_ray_two_actors_give_the_single_process_output(smol_path, cli_path, reference,
                                                       tmp_path):
    p = batch(cli_path, *_ray_args(smol_path, tmp_path))
    assert p.returncode == 0, p.stderr
    assert answers(tmp_path / "out.jsonl") == reference["answers"]
    assert json.loads(p.stdout)["completed"] == len(QUESTIONS)


def test_ray_actor_killed_mid_job_has_its_lines_redone(smol_path, cli_path, reference,
                                                       tmp_path):
    killed = tmp_path / "an-actor-was-killed"
    p = batch(cli_path, *_ray_args(smol_path, tmp_path), crash="ray_line:2", once=killed)
    assert p.returncode == 0, p.stderr
    assert killed.exists()  # one actor SIGKILLed itself before answering its second line
    assert answers(tmp_path / "out.jsonl") == reference["answers"]
