"""Drives the engine's own C unit tests (engine/tests, `make check`) from pytest.

The engine builds and tests with make alone; this keeps it in the one test command.
A C test prints `SKIP <what>: <why>` for a check this machine cannot run (an AVX-512
kernel on a CPU without AVX-512, a locale that is not installed); each such line becomes
a reported pytest skip of its own, so a check that did not run never passes unseen.
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


@pytest.fixture(scope="module")
def outputs(built: Path) -> dict[str, subprocess.CompletedProcess[str]]:
    return {}


def _run(built: Path, outputs: dict[str, subprocess.CompletedProcess[str]],
         name: str) -> subprocess.CompletedProcess[str]:
    if name not in outputs:
        outputs[name] = subprocess.run([str(built / name)], capture_output=True, text=True,
                                       timeout=600)
    return outputs[name]


@pytest.mark.parametrize("name", C_TESTS)
def test_c_unit(built: Path, outputs: dict, name: str) -> None:
    proc = _run(built, outputs, name)
    assert proc.returncode == 0, f"{name} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"


@pytest.mark.parametrize("name", C_TESTS)
def test_c_unit_ran_every_check(built: Path, outputs: dict, name: str) -> None:
    """The checks a C test could not run here: hardware or locales CI does not promise."""
    proc = _run(built, outputs, name)
    skipped = [line[5:] for line in proc.stdout.splitlines() if line.startswith("SKIP ")]
    requires(not skipped, f"{name}: " + "; ".join(skipped), ci_provides=False)


def test_every_c_test_is_collected() -> None:
    assert len(C_TESTS) >= 1, "engine/tests holds no test_*.c"
