"""Suite-wide test policy: no silent skips, counts at the end, no network.

A test skips only through `requires(...)`. A skip whose prerequisite CI provides fails
the run (the CI lane treats it as a failure); a skip of something CI cannot provide (for
example an AVX-512 kernel on a CPU without AVX-512) is reported with its reason and allowed.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from support import ALLOWED as _ALLOWED  # noqa: E402
from support import load_torchvision  # noqa: E402

load_torchvision()

_skips: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        reason = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else ""
        _skips.append(f"{report.nodeid}: {reason}")


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:  # type: ignore[no-untyped-def]
    stats = terminalreporter.stats
    passed = len(stats.get("passed", []))
    failed = len(stats.get("failed", [])) + len(stats.get("error", []))
    skipped = len(stats.get("skipped", []))
    bad = [s for s in _skips if _ALLOWED not in s]
    terminalreporter.write_line(f"PASS {passed}  FAIL {failed}  SKIP {skipped}")
    for s in _skips:
        terminalreporter.write_line(f"  SKIP {s}")
    if bad:
        terminalreporter.write_line(
            f"{len(bad)} skip(s) of prerequisites CI provides: the run fails")


def pytest_sessionfinish(session, exitstatus) -> None:  # type: ignore[no-untyped-def]
    if exitstatus == 0 and any(_ALLOWED not in s for s in _skips):
        session.exitstatus = 1


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return ROOT


@pytest.fixture(autouse=True)
def _no_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    # Nothing may download: make every HF library offline.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
