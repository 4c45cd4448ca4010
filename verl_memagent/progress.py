"""Progress of long work a user waits for: a tqdm bar on a terminal, a plain line every few seconds in a log.

A tqdm bar redraws itself with carriage returns, which a log file or a pipe keeps as one endless line
shown only at the end; a plain line every `every_s` seconds reads as it comes. The line is tqdm's own
meter without the bar (`tqdm.format_meter`), the format the retriever's index build logs too
(retriever_server/progress.py): one line format and one duration format on a terminal and in a log.
"""

from __future__ import annotations

import sys
import time
from numbers import Number
from typing import TextIO

from tqdm import tqdm


def progress(total: int, desc: str, unit: str = "steps", stream: TextIO | None = None, every_s: float = 10.0):
    """A counter of `unit` (a plural noun) with tqdm's `update(n)`, `set_postfix(**values)` and `close()`
    (and `with`)."""
    stream = stream or sys.stderr
    if stream.isatty():
        return tqdm(total=total, desc=desc, unit=f" {unit}", file=stream)
    return ProgressLines(total, desc, unit, stream, every_s)


class ProgressLines:
    """`desc:  30% 120/400 [01:03<02:27,  1.89 steps/s, loss=1.85]` (the tqdm bar's text without the
    bar), at most every `every_s` seconds, and once at the end."""

    def __init__(self, total: int, desc: str, unit: str, stream: TextIO, every_s: float):
        self.total, self.desc, self.unit, self.stream, self.every_s = total, desc, unit, stream, every_s
        self.done = 0
        self.postfix: dict[str, object] = {}
        self.start = self.last = time.monotonic()

    def update(self, n: int = 1) -> None:
        self.done += n
        if time.monotonic() - self.last >= self.every_s:
            self._print()

    def set_postfix(self, **values) -> None:
        self.postfix = values

    def close(self) -> None:
        self._print()

    def __enter__(self) -> ProgressLines:
        return self

    def __exit__(self, *_) -> None:
        self.close()

    def _print(self) -> None:
        self.last = time.monotonic()
        # the postfix as tqdm's `set_postfix` writes it on a terminal
        postfix = ", ".join(
            f"{name}={tqdm.format_num(value) if isinstance(value, Number) else value}"
            for name, value in self.postfix.items()
        )
        meter = tqdm.format_meter(
            self.done,
            self.total,
            self.last - self.start,
            ncols=0,
            prefix=self.desc,
            unit=f" {self.unit}",
            postfix=postfix or None,
        )
        print(meter, file=self.stream, flush=True)
