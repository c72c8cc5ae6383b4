"""`warp_providers.progress.Progress`: a bar on a terminal, a few plain lines in a log."""

from __future__ import annotations

import io
import re

from warp_providers.progress import Progress


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_log_gets_a_line_per_tenth_not_per_step() -> None:
    out = io.StringIO()  # not a terminal
    with Progress(3000, "convert", stream=out, clock=Clock()) as p:
        for i in range(1, 3001):
            p.update_to(i, label=f"blk.{i}.ffn_up")
    text = out.getvalue()
    lines = text.splitlines()
    assert "\r" not in text and "\x1b" not in text
    assert len(lines) <= 12, lines  # 3,000 steps: one line per 10%, no redraws
    pct = [int(m.group(1)) for m in (re.match(r"convert: +(\d+)%", ln) for ln in lines) if m]
    assert pct == sorted(pct) and pct[-1] == 100 and len(pct) == len(lines)
    assert {10, 50, 90} <= set(pct)
    assert "blk.3000.ffn_up" in lines[-1]


def test_a_slow_job_in_a_log_reports_every_30_seconds() -> None:
    out, clock = io.StringIO(), Clock()
    p = Progress(1000, "convert", stream=out, clock=clock)
    for i in range(1, 40):  # under a tenth in all, but 39 * 3 s = 117 s pass
        clock.t += 3.0
        p.update_to(i)
    lines = out.getvalue().splitlines()
    # the first step prints (0%), then one line per 30 s of silence
    assert 4 <= len(lines) <= 5, lines
    p.close()
    assert len(out.getvalue().splitlines()) == len(lines) + 1  # the closing line


def test_a_terminal_gets_a_bar_redrawn_in_place() -> None:
    out = Tty()
    with Progress(1 << 20, "convert", stream=out) as p:
        for i in range(1, 11):
            p.update_to(i << 17)
    drawn = out.getvalue()
    assert "\r" in drawn and re.search(r"convert: +100%\|", drawn), drawn


def test_the_hook_starts_a_new_display_when_work_restarts() -> None:
    out = io.StringIO()
    hook = Progress.hook("convert", stream=out, clock=Clock())
    for total in (100, 50):  # two conversions through one hook, as the demo runs them
        for done in range(0, total + 1, 5):
            hook(done, total, "t")
    hook.close()
    lines = out.getvalue().splitlines()
    assert sum(" 100% " in ln for ln in lines) == 2, lines
    assert any("of 50 B" in ln for ln in lines) and any("of 100 B" in ln for ln in lines)


def test_odd_counts_never_raise() -> None:
    out = io.StringIO()
    with Progress(0, "work", unit="tok", stream=out) as p:
        p.update_to(5)
        p.update_to(-1)
    assert out.getvalue().startswith("work: 5 tok")
