"""Threads for a lone batch: the idle cores lent to the query encoder when it is the server's only work.

A search process runs `LoadOptions.threads` threads (its share of the cores, one left to the HTTP
side). A dense batch that is the server's only work (no other search process busy, no query waiting:
one client's large request) and large enough to split (`LONE_BATCH_MIN` queries) may run on more,
up to `LoadOptions.lone_threads`, but only on cores that other processes left idle: the cores of this
process's affinity that were busy over the last interval of at least `WINDOW_S`, less this process's
own CPU time. A thread pool wider than the free cores waits at every op for the thread another
process has preempted (docs/retriever.md), so on a shared machine the share stays as it is.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import psutil

LONE_BATCH_MIN = 8  # queries: fewer give a second thread too little to split (one query: a few rows per matmul)
WINDOW_S = 0.25  # shortest interval busy time is read over (the kernel counts it in 10 ms ticks)
FREE_MARGIN = 0.25  # a core counts as free when at most this much of it was busy (the client, the HTTP side)


def threads_for(queries: int, lone: bool, threads: int, lone_threads: int, free_cores: float) -> int:
    """Threads for a batch of `queries`: `threads`, or for a lone batch of at least LONE_BATCH_MIN
    queries the free cores (rounded down, FREE_MARGIN of slack), at least `threads`, at most `lone_threads`."""
    if not lone or queries < LONE_BATCH_MIN:
        return threads
    return max(threads, min(lone_threads, int(free_cores + FREE_MARGIN)))


class FreeCores:
    """Cores of this process's affinity that other processes left idle over the last interval of at
    least WINDOW_S (busy time from the kernel's per-CPU counters, less this process's CPU time)."""

    def __init__(self, cpus: set[int] | None = None):
        self._cpus = sorted(cpus if cpus is not None else os.sched_getaffinity(0))
        self._last = self._reading()
        self._free = 0.0  # none known free before the first interval

    def _reading(self) -> tuple[float, float, float]:
        per_cpu = psutil.cpu_times(percpu=True)
        busy = sum(sum(per_cpu[i]) - per_cpu[i].idle - getattr(per_cpu[i], "iowait", 0.0) for i in self._cpus)
        return time.monotonic(), busy, time.process_time()

    def __call__(self) -> float:
        """The free cores as last measured; a new interval is read once the last is WINDOW_S old."""
        if time.monotonic() - self._last[0] >= WINDOW_S:
            (then, busy_then, own_then), now = self._last, self._reading()
            others = max(0.0, (now[1] - busy_then) - (now[2] - own_then))
            self._free = max(0.0, len(self._cpus) - others / (now[0] - then))
            self._last = now
        return self._free


class LoneThreads:
    """Sets the encoder's threads (`set_threads`, torch's by default) for each batch as `threads_for` says."""

    def __init__(self, threads: int, lone_threads: int | None, set_threads: Callable[[int], None] | None = None):
        if set_threads is None:
            import torch

            set_threads = torch.set_num_threads
        self.threads, self.lone_threads = threads, max(threads, lone_threads or threads)  # None: none lent
        self._set_threads, self._current = set_threads, threads
        self._free = FreeCores() if self.lone_threads > threads else None

    def before(self, queries: int, lone: bool) -> int:
        """Fit the threads to a batch of `queries` (lone: the server's only work); the number set."""
        wanted = self.threads
        if self._free is not None and lone and queries >= LONE_BATCH_MIN:
            wanted = threads_for(queries, lone, self.threads, self.lone_threads, self._free())
        if wanted != self._current:
            self._set_threads(wanted)
            self._current = wanted
        return wanted
