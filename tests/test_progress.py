"""Progress of long work: plain lines in a log, tqdm on a terminal."""

from __future__ import annotations

import io
import re

from tqdm import tqdm

from verl_memagent.progress import ProgressLines, progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_log_gets_plain_lines_with_rate_and_time_left():
    log = io.StringIO()
    with progress(4, "copy pretraining", stream=log, every_s=0.0) as bar:
        assert isinstance(bar, ProgressLines)
        for loss in (8.0, 6.5, 5.25, 4.0):
            bar.set_postfix(loss=loss)
            bar.update()
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue()
    # tqdm's meter without the bar: percentage, count, [elapsed<left, rate, postfix]
    meter = r"copy pretraining: +{}% {}/4 \[\d\d:\d\d<\d\d:\d\d, +[\d.]+ steps/s, loss={}\]"
    assert re.fullmatch(meter.format(25, 1, 8), lines[0]), lines[0]
    assert re.fullmatch(meter.format(100, 4, 4), lines[-1]), lines[-1]
    assert len(lines) == 5  # one per update, and the closing one


def test_lines_come_at_most_every_few_seconds():
    log = io.StringIO()
    with progress(1000, "eval", unit="tasks", stream=log, every_s=3600.0) as bar:
        for _ in range(1000):
            bar.update()
    assert log.getvalue().splitlines() == [log.getvalue().splitlines()[-1]]  # only the closing line
    assert log.getvalue().startswith("eval: 100% 1000/1000 [")


def test_a_terminal_gets_a_tqdm_bar():
    bar = progress(3, "demonstrations", stream=Terminal())
    assert isinstance(bar, tqdm)
    bar.close()
