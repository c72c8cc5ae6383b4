"""Container fuzz: >= 10,000 mutations per run, each in a worker process.

The cases (fuzz_cases.py) damage the manifest, one hparam, a routing table, record
headers, bank bytes, tokenizer files or the chat template of two tiny containers (a
Qwen3-MoE and a DeepSeek-V4 with a hash-routed layer). Every case must end in a typed
`WarpError` naming the file, tensor or key concerned, in a `ChatFormatError` (the chat
format refuses a damaged template), or in a model that still runs. Workers run many
cases each; a worker that dies by a signal or stops answering is a crash or a hang of
the case it had begun, reported as a failure, and a fresh worker resumes after it.
"""

from __future__ import annotations

import collections
import copy
import json
import os
import re
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import fuzz_cases
from tiny import tiny_moe
from warp_providers import Engine, ModelFormatError, WarpError
from warp_providers.synth import MoeShape

SEED = 20261201
CASE_TIMEOUT_S = 60  # a case this long without an answer is a hang (10 ms is typical)
SMALL = MoeShape(hidden_size=32, num_hidden_layers=2, num_experts=8, num_experts_per_tok=2,
                 moe_intermediate_size=32, num_attention_heads=2, num_key_value_heads=1,
                 head_dim=16)


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return tiny_moe(tmp_path_factory.mktemp("fuzz"), shape=SMALL)


@pytest.fixture(scope="module")
def v4_model(tmp_path_factory) -> Path:
    from warp_providers.convert import convert
    from warp_providers.synth import DeepseekV4Shape, make_deepseek_v4_checkpoint

    root = tmp_path_factory.mktemp("fuzz-v4")
    shape = DeepseekV4Shape(
        hidden_size=32, num_hidden_layers=2, n_routed_experts=8, num_experts_per_tok=2,
        moe_intermediate_size=32, num_attention_heads=2, head_dim=32, q_lora_rank=16,
        qk_rope_head_dim=8, o_groups=2, o_lora_rank=8, index_n_heads=2, index_head_dim=16,
        index_topk=2, compress_rate_csa=4, compress_rate_hca=8, sliding_window=8,
        hc_mult=2, num_hash_layers=1)
    src = make_deepseek_v4_checkpoint(root / "hf", shape, seed=5)
    return convert(src, root / "v4.warp", experts="q8_0", trunk="f32")


class _Worker:
    """One worker process over cases [start, stop) with its own copy of the containers."""

    def __init__(self, tmp: Path, k: int, model: Path, v4: Path, start: int, stop: int):
        self.dir = tmp / f"w{k}"
        shutil.rmtree(self.dir, ignore_errors=True)
        shutil.copytree(model, self.dir / "moe")
        shutil.copytree(v4, self.dir / "v4")
        job = {"moe": str(model), "v4": str(v4), "work_moe": str(self.dir / "moe"),
               "work_v4": str(self.dir / "v4"), "seed": SEED, "start": start, "stop": stop}
        (self.dir / "job.json").write_text(json.dumps(job))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent),
                                             env.get("PYTHONPATH", "")])
        self.proc = subprocess.Popen(
            [sys.executable, fuzz_cases.__file__, str(self.dir / "job.json")],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True, bufsize=1)
        self.stop, self.current, self.last = stop, start, time.monotonic()
        self.begun = False  # a case has begun and not yet answered


def _run_pool(tmp: Path, model: Path, v4: Path, n: int, workers: int):
    """Runs cases 0..n-1; returns (results, failures as (i, kind, stderr tail))."""
    results: list[dict] = []
    failures: list[tuple[int, str, str]] = []
    per = -(-n // workers)
    pending = [(k * per, min(n, (k + 1) * per)) for k in range(workers) if k * per < n]
    live: list[_Worker] = []
    k = 0
    while pending or live:
        while pending and len(live) < workers:
            start, stop = pending.pop(0)
            live.append(_Worker(tmp, k, model, v4, start, stop))
            k += 1
        ready, _, _ = select.select([w.proc.stdout for w in live], [], [], 1.0)
        for w in list(live):
            line = w.proc.stdout.readline() if w.proc.stdout in ready else None
            if line:
                w.last = time.monotonic()
                if line.startswith("B "):
                    w.current, w.begun = int(line[2:]), True
                elif line.startswith("R "):
                    results.append(json.loads(line[2:]))
                    w.begun = False
                continue
            hung = line is None and time.monotonic() - w.last > CASE_TIMEOUT_S
            if line is None and not hung:
                continue
            if hung:
                w.proc.kill()
            w.proc.wait()
            err = w.proc.stderr.read()[-800:]
            if w.begun:  # it died or hung inside case w.current: resume after it
                kind = "hang" if hung else f"crash (exit {w.proc.returncode})"
                failures.append((w.current, kind, err))
                if w.current + 1 < w.stop:
                    pending.append((w.current + 1, w.stop))
            elif w.proc.returncode != 0:
                failures.append((w.current, f"worker exit {w.proc.returncode}", err))
            live.remove(w)
    return results, failures


def test_container_fuzz(model, v4_model, tmp_path, capsys):
    n = fuzz_cases.total()
    assert n >= 10_000 or fuzz_cases.SHARE < 1
    t0 = time.monotonic()
    results, failures = _run_pool(tmp_path, model, v4_model, n, max(2, min(4, os.cpu_count() or 2)))
    took = time.monotonic() - t0
    by = collections.defaultdict(collections.Counter)
    for r in results:
        by[r["cat"]][r["outcome"]] += 1
    bad = [r for r in results if r["outcome"] in ("unnamed", "untyped")]
    with capsys.disabled():
        sys.stdout.write(f"\ncontainer fuzz: {len(results)} of {n} cases in {took:.0f} s\n")
        for cat in fuzz_cases.COUNTS:
            sys.stdout.write(f"  {cat:10s} {dict(sorted(by[cat].items()))}\n")
        sys.stdout.write(f"  crashes/hangs: {len(failures)}, unnamed/untyped: {len(bad)}\n")
        for r in bad[:40]:
            sys.stdout.write(f"  FAIL case {r['i']} {r['outcome']}: {r['what']} -> "
                             f"{r.get('error', '')[:160]}\n")
    assert not failures, failures[:5]
    assert not bad, [(r["i"], r["what"], r.get("error", "")[:120]) for r in bad[:8]]
    assert len(results) == n
    for cat in ("manifest", "hparams", "records"):  # most damage there must be caught
        assert by[cat]["typed"] >= fuzz_cases.COUNTS[cat] // 2, (cat, by[cat])
    assert by["records"]["ok"] == 0, by["records"]  # every header bit is validated


def test_missing_required_tensor_is_named(model, tmp_path):
    base = json.loads((model / "manifest.json").read_text())
    work = tmp_path / "t.warp"
    shutil.copytree(model, work)
    names = [t["name"] for t in base["trunk"]["tensors"]]
    assert "blk.1.attn_k_norm.weight" in names and "output.weight" in names
    for i, name in enumerate(names):  # qwen3_moe, untied: every trunk tensor is required
        doc = copy.deepcopy(base)
        del doc["trunk"]["tensors"][i]
        (work / "manifest.json").write_text(json.dumps(doc))
        with pytest.raises(ModelFormatError, match=re.escape(f"'{name}' is missing")):
            with Engine.open(work, threads=1) as eng:
                eng.eval([1, 2, 3])


def test_structural_damage_is_named(model, tmp_path):
    work = tmp_path / "d.warp"
    cases = []
    manifest = json.loads((model / "manifest.json").read_text())
    bank = manifest["experts"][0]
    cases.append(("truncated trunk", "trunk.bin", lambda b: b[: len(b) // 2], "trunk"))
    cases.append(("truncated bank", bank["file"], lambda b: b[:-4096], bank["file"]))
    cases.append(("empty manifest", "manifest.json", lambda b: b"", "manifest"))
    cases.append(("not json", "manifest.json", lambda b: b"{\"format\": ", "manifest"))
    cases.append(("version", "manifest.json",
                  lambda b: b.replace(b'"format_version": 1', b'"format_version": 2'),
                  "format_version"))
    for label, name, fn, needle in cases:
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(model, work)
        f = work / name
        f.write_bytes(fn(f.read_bytes()))
        with pytest.raises(WarpError) as e:
            with Engine.open(work, threads=1) as eng:
                eng.eval([1, 2, 3])
        assert needle in str(e.value), (label, str(e.value))
    shutil.rmtree(work)
    shutil.copytree(model, work)
    (work / "trunk.bin").unlink()
    with pytest.raises(WarpError, match="trunk.bin"):
        Engine.open(work)
