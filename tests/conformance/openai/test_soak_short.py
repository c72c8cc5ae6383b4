"""A short soak (benchmarks/soak.py) in CI: 1,000 mixed requests, no error, no RSS growth.

Sync, async, streamed, cancelled mid-stream, tool-forced and schema-constrained requests,
half through the in-process transport and half over HTTP to the server on 127.0.0.1, 8
in flight on one shared engine (the tiny random MoE with tool markers). Every reply is
checked for what its kind promises (benchmarks/soak.py, `check_reply`).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
from soak import KINDS, PATHS, soak  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.mark.enable_socket
def test_short_soak_has_no_errors_and_no_rss_drift(moe_path: Path) -> None:
    rep = soak(moe_path, requests=1000, concurrency=8, max_tokens=4)
    assert rep["errors"] == 0, rep["error_samples"]
    assert len(rep["deciles"]) == 10
    assert sum(p["requests"] for p in rep["deciles"]) == 1000
    assert all(p["tok_s"] > 0 for p in rep["deciles"])
    assert abs(rep["rss_drift"]) < 0.05, rep["deciles"]
    assert rep["tokens"] > 1000  # every kind produced tokens


def test_every_kind_goes_both_ways() -> None:
    """Request i's kind and path cover each (kind, path) pair in every 12 requests."""
    pairs = {(KINDS[i % 6], PATHS[(i // 6) % 2]) for i in range(12)}
    assert len(pairs) == 12
