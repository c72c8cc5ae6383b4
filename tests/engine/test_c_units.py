"""Drives the engine's own C unit tests (engine/tests, `make check`) from pytest.

The engine builds and tests with make alone; this keeps it in the one test command.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from support import requires

ENGINE = Path(__file__).resolve().parents[2] / "engine"
C_TESTS = sorted(p.stem for p in (ENGINE / "tests").glob("test_*.c"))


@pytest.fixture(scope="module")
def built() -> Path:
    requires(shutil.which("make") is not None and shutil.which("cc") is not None,
             "make and a C compiler")
    proc = subprocess.run(["make", "-C", str(ENGINE), "-s", "all"] +
                          [f"build/tests/{t}" for t in C_TESTS],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return ENGINE / "build" / "tests"


@pytest.mark.parametrize("name", C_TESTS)
def test_c_unit(built: Path, name: str) -> None:
    proc = subprocess.run([str(built / name)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{name} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"


def test_every_c_test_is_collected() -> None:
    assert len(C_TESTS) >= 1, "engine/tests holds no test_*.c"
