"""Randomized-config oracle: every architecture, configs drawn across its config knobs.

Each architecture draws `EXAMPLES` configs (fewer where its module sets its own) (a fixed-seed slice: hypothesis derandomized,
so every CI run checks the same draws) from `randcfg/<arch>.py`, builds each tiny model,
converts it at F32 and compares the engine with transformers at every prompt position and
over 16 incremental decode steps (<= 1e-4). Draws that once failed live as JSON in
`regressions/` and are replayed here. `benchmarks/random_configs.py` runs thousands of
draws on demand and saves every failure there.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
import randcfg
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

EXAMPLES = int(os.environ.get("WARP_RANDOM_EXAMPLES", "15"))


@pytest.mark.oracle
@pytest.mark.parametrize("arch", randcfg.ARCHES)
def test_random_configs_match_transformers(arch, oracle_env):
    seen: list[randcfg.Draw] = []
    examples = min(EXAMPLES, getattr(randcfg.module(arch), "EXAMPLES", EXAMPLES))

    @settings(max_examples=examples, derandomize=True, database=None, deadline=None,
              phases=(Phase.explicit, Phase.generate), print_blob=False,
              suppress_health_check=list(HealthCheck))
    @given(st.data())
    def run(data):
        draw = data.draw(randcfg.draws(arch), label="draw")
        seen.append(draw)
        with tempfile.TemporaryDirectory() as d:
            randcfg.check(draw, Path(d))

    run()
    assert len({d.key() for d in seen}) >= min(examples, 10), "too few distinct draws"


@pytest.mark.oracle
@pytest.mark.parametrize("case", randcfg.regressions(), ids=lambda p: p.stem)
def test_regression_draws_match_transformers(case, oracle_env, tmp_path):
    randcfg.check(randcfg.Draw.from_json(case.read_text()), tmp_path)
