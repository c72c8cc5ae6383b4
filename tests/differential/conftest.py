"""Fixtures shared by the oracle tests: the reference implementation must be installed."""

from __future__ import annotations

import pytest
from support import has_module, requires


@pytest.fixture(scope="module")
def oracle_env():
    """oracle_util, once torch and transformers (the reference) are importable."""
    requires(has_module("torch") and has_module("transformers"),
             "torch==2.13.0 and transformers (the oracle)")
    import oracle_util

    return oracle_util
