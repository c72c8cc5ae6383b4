"""Long randomized-config oracle run: thousands of drawn configs per architecture.

Draws configs from tests/differential/randcfg/<arch>.py (the same strategies as the CI
slice, but not derandomized), checks each against transformers, and saves every failing
draw as a regression case (tests/differential/regressions/ by default) that CI replays.

    python benchmarks/random_configs.py --examples 1000                  # every arch
    python benchmarks/random_configs.py --arch glm5_next --examples 200 --seed 7
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
sys.path[:0] = [str(ROOT / "tests" / "differential"), str(ROOT / "tests")]

import randcfg  # noqa: E402
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import seed as hseed  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


def run_arch(arch: str, examples: int, seed: int, out: Path) -> dict:
    """Checks `examples` draws of one architecture; returns counts and failure files."""
    checked, failures, t0 = 0, [], time.perf_counter()

    @hseed(seed)
    @settings(max_examples=examples, database=None, deadline=None,
              phases=(Phase.generate,), suppress_health_check=list(HealthCheck))
    @given(st.data())
    def run(data):
        nonlocal checked
        draw = data.draw(randcfg.draws(arch))
        checked += 1
        with tempfile.TemporaryDirectory() as d:
            try:
                randcfg.check(draw, Path(d))
            except Exception as e:  # every failure is kept, the run goes on
                path = randcfg.save(draw, out)
                failures.append({"file": str(path.relative_to(ROOT) if path.is_relative_to(ROOT)
                                              else path),
                                 "error": f"{type(e).__name__}: {str(e)[:300]}"})
                print(f"  FAIL {arch}: {path.name}: {type(e).__name__}: {str(e)[:200]}",
                      file=sys.stderr)
                if not isinstance(e, AssertionError):
                    traceback.print_exc(limit=3)

    run()
    return {"arch": arch, "checked": checked, "failures": failures,
            "seconds": round(time.perf_counter() - t0, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", action="append", choices=randcfg.ARCHES,
                    help="architecture (repeatable); default: every one")
    ap.add_argument("--examples", type=int, default=1000, help="draws per architecture")
    ap.add_argument("--seed", type=int, default=0, help="hypothesis seed of the run")
    ap.add_argument("--out", type=Path, default=randcfg.REGRESSIONS,
                    help="folder for failing draws (default: the CI regressions folder)")
    ap.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = ap.parse_args()
    results = [run_arch(a, args.examples, args.seed, args.out)
               for a in (args.arch or randcfg.ARCHES)]
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for r in results:
            print(f"{r['arch']:12s} checked {r['checked']:6d}  failed {len(r['failures']):4d}"
                  f"  {r['seconds']:8.1f} s")
    sys.exit(1 if any(r["failures"] for r in results) else 0)


if __name__ == "__main__":
    main()
