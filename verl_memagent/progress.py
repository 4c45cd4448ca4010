"""Progress of long work a user waits for: a tqdm bar on a terminal, a plain line every few seconds in a log.

A tqdm bar redraws itself with carriage returns, which a log file or a pipe keeps as one endless line
shown only at the end; a plain line every `every_s` seconds reads as it comes.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from tqdm import tqdm


def progress(total: int, desc: str, unit: str = "steps", stream: TextIO | None = None, every_s: float = 10.0):
    """A counter of `unit` (a plural noun) with tqdm's `update(n)`, `set_postfix(**values)` and `close()`
    (and `with`)."""
    stream = stream or sys.stderr
    if stream.isatty():
        return tqdm(total=total, desc=desc, unit=unit, file=stream)
    return ProgressLines(total, desc, unit, stream, every_s)


class ProgressLines:
    """`desc: 120/400 steps (30%), loss 1.850, 2.1 steps/s, 2 min 13 s left`, at most every `every_s`
    seconds, and once at the end."""

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
        elapsed = self.last - self.start
        parts = [f"{self.desc}: {self.done}/{self.total} {self.unit} ({self.done / max(self.total, 1):.0%})"]
        parts += [
            f"{name} {value:.3f}" if isinstance(value, float) else f"{name} {value}"
            for name, value in self.postfix.items()
        ]
        if self.done and elapsed > 0:
            rate = self.done / elapsed
            parts.append(f"{rate:.2f} {self.unit}/s")
            if self.done < self.total:
                parts.append(f"{_duration((self.total - self.done) / rate)} left")
            else:
                parts.append(f"{_duration(elapsed)} in all")
        print(", ".join(parts), file=self.stream, flush=True)


def _shown(value: object) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def _duration(seconds: float) -> str:
    minutes, seconds = divmod(int(seconds), 60)
    return f"{minutes} min {seconds} s" if minutes else f"{seconds} s"
