"""Progress of an index build: its numbered phases and, within each, how much is done of the total.

On a terminal each phase is a tqdm bar. In a log (stderr not a terminal: a batch job, `nohup`, CI)
a bar would be a stream of carriage returns, so instead a plain line is written every `every_s`
seconds and one as each phase ends: a build of 21M passages that runs for hours says where it is
and how long is left. The line is the bar's own text without the bar (`tqdm.format_meter`), durations
tqdm's (`tqdm.format_interval`), as verl_memagent's progress lines (verl_memagent/progress.py). A
phase whose work happens inside a library (bm25s's scoring, Lucene) counts nothing itself; its lines
say how long it has been running.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TextIO, TypeVar

from tqdm import tqdm

T = TypeVar("T")


class BuildProgress:
    """Reports the `phases` of one build, in order; `enabled` False reports nothing."""

    def __init__(self, phases: list[str], *, enabled: bool = True, every_s: float = 10.0, stream: TextIO | None = None):
        self.phases = phases
        self.enabled = enabled
        self.every_s = every_s
        self.stream = stream or sys.stderr
        self.on_terminal = enabled and self.stream.isatty()

    @contextlib.contextmanager
    def phase(self, name: str, total: int | None = None, unit: str = "passages") -> Iterator[Callable[[int], None]]:
        """Within the block, call the yielded `update(n)` as `n` more units of `total` are done."""
        label = f"[{self.phases.index(name) + 1}/{len(self.phases)}] {name}"
        if not self.enabled:
            yield lambda n: None
        elif self.on_terminal:
            with tqdm(total=total, desc=label, unit=f" {unit}", unit_scale=True, file=self.stream) as bar:
                yield bar.update
        else:
            with _LogLines(self.stream, label, total, unit, self.every_s) as lines:
                yield lines.update


def counted(items: Iterable[T], update: Callable[[int], None]) -> Iterator[T]:
    """`items`, counting each one as the consumer takes it (for a library that only iterates)."""
    for item in items:
        yield item
        update(1)


class _LogLines:
    """A line now and then from a thread of its own (the work may sit in one long library call)."""

    def __init__(self, stream: TextIO, label: str, total: int | None, unit: str, every_s: float):
        self.stream, self.label, self.total, self.unit, self.every_s = stream, label, total, unit, every_s
        self.done = 0
        self._ended = threading.Event()
        self._reporter = threading.Thread(target=self._report, name="build-progress", daemon=True)
        self._started = time.monotonic()

    def update(self, count: int) -> None:
        self.done += count

    def __enter__(self) -> _LogLines:
        self._reporter.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._ended.set()
        self._reporter.join()  # its last line written before this phase's end: lines never interleave
        if exc_info[0] is None:
            elapsed = time.monotonic() - self._started
            self._write(f"done, {self._meter(elapsed)}" if self.done else f"done in {tqdm.format_interval(elapsed)}")

    def _report(self) -> None:
        while not self._ended.wait(self.every_s):
            elapsed = time.monotonic() - self._started
            if not self.done:
                self._write(f"running for {tqdm.format_interval(elapsed)}")
            elif self.total and self.done >= self.total:  # all read; the library finishes its part
                self._write(f"{self._meter(elapsed)}, finishing")
            else:
                self._write(self._meter(elapsed))

    def _meter(self, elapsed: float) -> str:
        """`57% 12.0M/21.0M [05:00<03:45, 40.0k passages/s]`: the terminal bar's text without the bar."""
        meter = tqdm.format_meter(self.done, self.total, elapsed, ncols=0, unit=f" {self.unit}", unit_scale=True)
        return meter.strip()

    def _write(self, message: str) -> None:
        print(f"build {self.label}: {message}", file=self.stream, flush=True)
