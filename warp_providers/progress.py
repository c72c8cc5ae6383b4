"""Progress of long work (conversions, the demo, batches) for a terminal or for a log.

Owns: `Progress`, one display per job. On a terminal it is a tqdm bar redrawn in place;
anywhere else (a CI log, a file, a pipe) it writes a plain line when the work crosses
another tenth of its total or when `every_s` seconds passed since the last line, and
one at the end, so a job that reports thousands of steps leaves about a dozen lines.
`Progress.hook(desc)` adapts it to the `progress(done, total, label)` callback that
`convert` takes, starting a new display when a second conversion begins.
Refuses: nothing; it never raises for odd counts (a total of 0, done past total).
Called by: the CLI (`warp convert`, `warp demo`, and any command with long work). The
library itself never writes progress; it only calls the hook it is given.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import IO, Any

__all__ = ["Progress", "ProgressHook"]

ProgressHook = Callable[[int, int, str], None]
"""The `progress(done, total, label)` callback of `convert` and the demo."""


def _human(n: float, unit: str) -> str:
    if unit != "B":
        return f"{n:.0f} {unit}" if unit else f"{n:.0f}"
    for scale, name in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if n >= scale:
            return f"{n / scale:.1f} {name}"
    return f"{n:.0f} B"


class Progress:
    """One progress display on `stream` (default stderr): a bar on a terminal, lines in a log.

    Args:
        total: units of the whole job (bytes for a conversion); 0 when unknown.
        desc: the job's name, at the start of every line or bar.
        unit: "B" (shown as KiB/MiB/GiB) or a word such as "tok".
        stream: where to write (default: `sys.stderr`, looked up when created).
        tty: force the terminal (True) or the log (False) form; None asks `stream`.
        every_s: in the log form, the most seconds between two lines.
        clock: seconds, monotonic (tests pass a fake one).

    """

    STEP = 0.1
    """In the log form, a line each time the work crosses another tenth of the total."""

    def __init__(self, total: int, desc: str, *, unit: str = "B", stream: IO[str] | None = None,
                 tty: bool | None = None, every_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """Open the display (on a terminal the bar appears at once)."""
        self.stream = stream if stream is not None else sys.stderr
        if tty is None:
            isatty = getattr(self.stream, "isatty", None)
            tty = bool(isatty()) if callable(isatty) else False
        self.tty = tty
        self.total = max(0, int(total))
        self.desc = desc
        self.unit = unit
        self.every_s = every_s
        self.clock = clock
        self.done = 0
        self.label = ""
        self._t0 = clock()
        self._last_t = self._t0
        self._last_step = -1
        self._printed: int | None = None  # `done` as the last line showed it
        self._closed = False
        self._bar: Any = None
        if tty:
            from tqdm import tqdm

            self._bar = tqdm(total=self.total or None, unit=unit, unit_scale=unit == "B",
                             desc=desc, file=self.stream)

    def update_to(self, done: int, total: int | None = None, label: str = "") -> None:
        """Record that `done` units of `total` (default: the total so far) are finished."""
        if self._closed:
            return
        if total is not None:
            self.total = max(0, int(total))
        self.done = max(0, int(done))
        self.label = label
        if self._bar is not None:
            self._bar.total = self.total or None
            self._bar.n = self.done
            self._bar.set_postfix_str(label[-40:], refresh=False)
            self._bar.refresh()
            return
        step = self._step()
        now = self.clock()
        if step > self._last_step or now - self._last_t >= self.every_s:
            self._line(now)
            self._last_step = max(step, self._last_step)

    def _step(self) -> int:
        if not self.total:
            return 0
        return min(10, int(self.done / self.total / self.STEP + 1e-9))

    def _line(self, now: float) -> None:
        self._last_t = now
        self._printed = self.done
        if self.total:
            pct = min(100.0, 100.0 * self.done / self.total)
            of = f"{_human(self.done, self.unit)} of {_human(self.total, self.unit)}"
            amount = f"{pct:3.0f}% {of}"
        else:
            amount = _human(self.done, self.unit)
        tail = f" {self.label[-40:]}" if self.label else ""
        self.stream.write(f"{self.desc}: {amount}, {now - self._t0:.1f} s{tail}\n")
        self.stream.flush()

    def close(self) -> None:
        """End the display: the bar is closed; the log gets a last line unless it is current."""
        if self._closed:
            return
        self._closed = True
        if self._bar is not None:
            self._bar.close()
            return
        if self._printed != self.done or self._printed is None:
            self._line(self.clock())

    def __enter__(self) -> Progress:
        """Use as a context manager: closed on exit."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Close the display."""
        self.close()

    @classmethod
    def hook(cls, desc: str, **options: Any) -> _Hook:
        """A `progress(done, total, label)` callback that opens displays as work starts.

        A call whose `done` goes backwards starts the next job's display (the demo runs
        two conversions through one hook). Close it with `.close()` when the work ends.
        """
        return _Hook(cls, desc, options)


class _Hook:
    """The callback `Progress.hook` returns."""

    def __init__(self, cls: type[Progress], desc: str, options: dict[str, Any]) -> None:
        self._cls = cls
        self._desc = desc
        self._options = options
        self.current: Progress | None = None

    def __call__(self, done: int, total: int, label: str) -> None:
        if self.current is not None and done < self.current.done:
            self.close()
        if self.current is None:
            self.current = self._cls(total, self._desc, **self._options)
        self.current.update_to(done, total, label)

    def close(self) -> None:
        if self.current is not None:
            self.current.close()
            self.current = None
