"""Kimi K3's decode lookahead at the floor: placement only, never results.

The latent MoE requests its experts as soon as its routing is known, drops the queued
lookahead reads that routing did not pick (prefetch_cancelled) and runs the experts
already present before the ones still being read. None of it may change a logit: the
floor (every token's experts streamed) with and without the lookahead, with one reader
thread or four, must give byte-equal logits to the whole container cached, and the
counters must account for every byte read.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tiny import tiny_kimi_k3
from warp_providers import Engine, plan_memory

PROMPT = [(13 * i + 5) % 200 + 10 for i in range(12)]
DECODE = 24


@pytest.fixture(scope="module")
def k3(tmp_path_factory) -> Path:
    return tiny_kimi_k3(tmp_path_factory.mktemp("k3la"), experts="mxfp4")


def _decode(path: Path, **opts) -> tuple[np.ndarray, dict]:
    """The prompt's last logits and DECODE greedy steps' (one eval a token), and stats."""
    with Engine.open(path, threads=2, **opts) as eng:
        rows = [eng.eval(PROMPT)]
        tok = int(rows[-1].argmax())
        s0 = eng.stats()
        for _ in range(DECODE):
            rows.append(eng.eval([tok]))
            tok = int(rows[-1].argmax())
        s1 = eng.stats()
    return np.stack(rows), {k: s1[k] - s0[k] for k in s1 if isinstance(s1[k], (int, float))}


@pytest.fixture(scope="module")
def resident(k3) -> np.ndarray:
    plan = plan_memory(k3)
    return _decode(k3, budget=plan["floor_bytes"] + plan["experts_total_bytes"])[0]


@pytest.mark.parametrize("opts", [
    {"lookahead": False},
    {"lookahead": True},
    {"lookahead": True, "reader_threads": 1},
    {"lookahead": True, "reader_threads": 4},
], ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_floor_decode_bit_identical(k3, resident, opts):
    plan = plan_memory(k3)
    got, st = _decode(k3, budget=plan["floor_bytes"], **opts)
    assert np.array_equal(got, resident), f"max |d| = {np.abs(got - resident).max():.3g}"
    # every record read was a demand miss or a prefetch that was not dropped before it
    # started; a dropped one is never half-read into a slot a lookup then serves
    reads = st["expert_misses"] + st["prefetch_issued"] - st["prefetch_cancelled"]
    assert st["bytes_read"] == reads * plan["record_bytes"]
    assert 0 <= st["prefetch_cancelled"] <= st["prefetch_issued"] - st["prefetch_hits"]
    if opts["lookahead"]:
        assert st["prefetch_issued"] > 0 and st["prefetch_hits"] > 0
    else:
        assert st["prefetch_issued"] == 0 and st["prefetch_cancelled"] == 0
