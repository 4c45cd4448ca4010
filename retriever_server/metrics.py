"""Request counters and latencies of the HTTP side, shown in /stats."""

from __future__ import annotations

from collections import Counter, deque

import numpy as np


class Metrics:
    """Counts per endpoint and of client mistakes; the latest `window` request latencies."""

    def __init__(self, window: int = 10_000):
        self.requests: Counter[str] = Counter()
        self.client_errors = 0
        self.disconnects = 0  # clients that hung up before sending their whole body
        self.slow_bodies = 0  # bodies that stalled past --body-timeout-s
        self.cut_queries = 0  # queries cut to --max-query-chars
        self.ignored_keys: Counter[str] = Counter()
        self.latencies_ms: deque[float] = deque(maxlen=window)

    def ignore(self, keys: dict, *, distinct: int = 100) -> None:
        """Count unknown request keys, by name for the first `distinct` names (a bound on memory)."""
        for key in keys:
            if key in self.ignored_keys or len(self.ignored_keys) < distinct:
                self.ignored_keys[key] += 1

    def percentiles(self) -> dict[str, float | None]:
        values = np.fromiter(self.latencies_ms, dtype=np.float64)
        if not len(values):
            return {"p50": None, "p90": None, "p99": None}
        p50, p90, p99 = np.percentile(values, [50, 90, 99]).tolist()
        return {"p50": round(p50, 2), "p90": round(p90, 2), "p99": round(p99, 2)}
