"""Drives the engine's own C unit tests (engine/tests, `make check`) from pytest.

The engine builds and tests with make alone; this keeps it in the one test command.
A C test prints `SKIP <what>: <why>` for a check this machine cannot run (an AVX-512
kernel on a CPU without AVX-512, a locale that is not installed); each such line becomes
a reported pytest skip of its own, so a check that did not run never passes unseen.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from support import ALLOWED, requires

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
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The C tests' environment, with a comma-decimal locale compiled for them when the
    system has the locale sources but no compiled de_DE (the JSON parser must not follow
    LC_NUMERIC)."""
    env = dict(os.environ)
    localedef = shutil.which("localedef")
    if localedef:
        where = tmp_path_factory.mktemp("locales")
        made = subprocess.run([localedef, "-i", "de_DE", "-f", "UTF-8",
                               str(where / "de_DE.UTF-8")], capture_output=True)
        if made.returncode in (0, 1) and (where / "de_DE.UTF-8").exists():  # 1: warnings
            env["LOCPATH"] = str(where)
    return env


@pytest.fixture(scope="module")
def run_c(built: Path, env: dict[str, str]) -> Callable[[str], subprocess.CompletedProcess[str]]:
    """run_c(name) -> the C test's completed process (each test runs once per module)."""

    @functools.cache
    def run(name: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(built / name)], capture_output=True, text=True,
                              timeout=600, env=env)

    return run


@pytest.mark.parametrize("name", C_TESTS)
def test_c_unit(run_c: Callable, name: str) -> None:
    proc = run_c(name)
    assert proc.returncode == 0, f"{name} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"


@pytest.mark.parametrize("name", C_TESTS)
def test_c_unit_ran_every_check(run_c: Callable, name: str) -> None:
    """The checks a C test could not run here: hardware or locales CI does not promise."""
    skipped = [line[5:].removesuffix(f" {ALLOWED}")
               for line in run_c(name).stdout.splitlines() if line.startswith("SKIP ")]
    requires(not skipped, f"{name}: " + "; ".join(skipped), ci_provides=False)


def test_every_c_test_is_collected() -> None:
    assert len(C_TESTS) >= 1, "engine/tests holds no test_*.c"
