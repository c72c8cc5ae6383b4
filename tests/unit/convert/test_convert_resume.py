"""An interrupted `convert` resumes where it stopped and writes the uninterrupted bytes.

A conversion of a generated Kimi K3 checkpoint (the released layout: MXFP4 experts
streamed expert by expert) runs in a child process that SIGKILLs itself from its progress
callback after a chosen number of tensors or expert records: in the trunk, in the middle
of an expert bank, and twice in a row. After each kill no container exists at `out` (the
partial directory has no manifest and does not open); `resume=True` then continues the
partial (encoding only what the killed run did not finish) and
the finished container equals an uninterrupted conversion file for file, byte for byte.
A partial of another source is not resumed but removed, and the conversion starts over.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from warp_providers.synth.kimi_k3 import KimiK3Shape, make_kimi_k3_checkpoint

CHILD = """
import json, os, signal, sys
from warp_providers.convert import convert, writer
kill_at, seen, encoded = int(sys.argv[3]), [], [0]
def counted(encode):
    def call(*args):
        encoded[0] += 1
        return encode(*args)
    return call
writer.encode_tensor = counted(writer.encode_tensor)  # expert records
writer.encode_chunks = counted(writer.encode_chunks)  # trunk tensors
def progress(done, total, label):
    seen.append(done)
    if len(seen) == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)
convert(sys.argv[1], sys.argv[2], resume=True, progress=progress)
print(json.dumps({"encoded": encoded[0], "ticks": len(seen)}))
"""


def _convert(src: Path, out: Path, kill_at: int = 0) -> dict | None:
    """The child's report, or None when it was killed as asked."""
    root = Path(__file__).resolve().parents[3]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get(
        "PYTHONPATH", "")]))
    p = subprocess.run([sys.executable, "-c", CHILD, str(src), str(out), str(kill_at)],
                       capture_output=True, text=True, env=env, timeout=600)
    if kill_at:
        assert p.returncode == -signal.SIGKILL, p.stderr
        return None
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def _files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def _partials(out: Path) -> list[Path]:
    return sorted(out.parent.glob(out.name + ".partial-*"))


@pytest.fixture(scope="module")
def k3(tmp_path_factory):
    """(checkpoint, its uninterrupted container, that run's progress report)."""
    d = tmp_path_factory.mktemp("resume")
    src = make_kimi_k3_checkpoint(d / "hf", KimiK3Shape(num_hidden_layers=4), 0)
    report = _convert(src, d / "whole.warp")
    return src, d / "whole.warp", report


def _assert_killed_cleanly(out: Path) -> None:
    from warp_providers import Engine
    from warp_providers.errors import WarpError

    assert not out.exists()
    (partial,) = _partials(out)
    assert not (partial / "manifest.json").exists()
    for path in (out, partial):
        with pytest.raises((WarpError, OSError)):
            Engine.open(path)


def _trunk_ticks(src: Path) -> int:
    from warp_providers.convert.hf import load_hf

    return len(load_hf(src).trunk)


@pytest.mark.parametrize("where", ["trunk", "mid_bank", "twice"])
def test_killed_conversion_resumes_to_identical_bytes(k3, tmp_path, where) -> None:
    src, whole, full = k3
    trunk = _trunk_ticks(src)
    out = tmp_path / "m.warp"
    # progress ticks: one per trunk tensor (kept ones too), one per expert record (one
    # for a bank's kept records); 16 experts a bank
    kills = {"trunk": [trunk // 2], "mid_bank": [trunk + 16 + 7],
             "twice": [trunk + 5, trunk + 16 + 9]}[where]
    for k in kills:
        _convert(src, out, kill_at=k)
        _assert_killed_cleanly(out)
    report = _convert(src, out)
    if where != "trunk":  # the trunk and the first bank were kept, not encoded again
        assert report["encoded"] <= full["encoded"] - trunk - 16 * 3
    assert _partials(out) == []
    assert _files(out) == _files(whole)


def test_a_partial_of_another_source_is_not_resumed(k3, tmp_path) -> None:
    src, whole, full = k3
    other = make_kimi_k3_checkpoint(tmp_path / "hf2", KimiK3Shape(num_hidden_layers=4), 1)
    out = tmp_path / "m.warp"
    _convert(other, out, kill_at=_trunk_ticks(other) + 20)
    report = _convert(src, out)
    assert report["encoded"] == full["encoded"]  # started over
    assert _partials(out) == []
    assert _files(out) == _files(whole)
