"""Fixtures shared by the oracle tests: the reference implementation must be installed."""

from __future__ import annotations

import pytest
from support import has_module, import_torchvision, requires


@pytest.fixture(scope="module")
def oracle_env():
    """oracle_util, once torch and transformers (the reference) are importable."""
    requires(has_module("torch") and has_module("transformers"),
             "torch==2.13.0 and transformers (the oracle)")
    if has_module("torchvision"):  # transformers imports it when present (image models)
        import_torchvision()
    import oracle_util

    return oracle_util


@pytest.fixture(autouse=True)
def exact_engines(monkeypatch):
    """The differential suite checks the float32-activation path: every engine a test
    opens in-process is exact=True unless the test names `exact` itself (None: the
    engine's default)."""
    try:
        from warp_providers import Engine
    except ImportError:  # the engine is not built: the tests that need it say so
        return
    opened = Engine.open.__func__

    def open_exact(cls, *args, **kw):
        kw.setdefault("exact", True)
        return opened(cls, *args, **kw)

    monkeypatch.setattr(Engine, "open", classmethod(open_exact))
