"""The search runtime behind the HTTP API: an LRU cache, de-duplication of identical queries in
flight, and coalescing of concurrent queries into shared batches for the search processes.

Everything but the searcher call runs on the event loop, so cache and bookkeeping need no locks;
one worker thread per search process (`search_process.py`) hands it a batch at a time and waits for
its answer without holding the GIL. With several search processes, the queries waiting when some
of them are free are split evenly between those.
Each query is searched to a fixed depth (the server's topk maximum) and cached by its text, so
every topk is served from one entry and a query's answer does not depend on what it was batched with.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from retriever_server.search_process import SearchProcess


@dataclass(frozen=True)
class Hits:
    """Top-`depth` corpus rows of one query (row -1 = no passage) and their scores."""

    rows: np.ndarray
    scores: np.ndarray


@dataclass
class EngineStats:
    queries: int = 0
    cache_hits: int = 0
    joined_in_flight: int = 0
    batches_per_search_process: list[int] = field(default_factory=list)
    searched: int = 0
    search_seconds: float = 0.0

    @property
    def batches(self) -> int:
        return sum(self.batches_per_search_process)


class SearchEngine:
    """Answers query lists with `Hits`, sharing work between concurrent callers."""

    def __init__(
        self,
        searchers: list[SearchProcess],
        *,
        depth: int,
        max_batch: int = 256,
        max_wait_ms: float = 0.0,
        cache_size: int = 100_000,
    ):
        if depth < 1 or max_batch < 1 or max_wait_ms < 0 or cache_size < 0 or not searchers:
            raise ValueError("depth, max_batch and searchers must be positive, max_wait_ms and cache_size non-negative")
        self.searchers = searchers
        self._idle = len(searchers)
        self.stats = EngineStats(batches_per_search_process=[0] * len(searchers))
        self._depth = depth
        self._max_batch = max_batch
        self._max_wait_s = max_wait_ms / 1000
        self._cache_size = cache_size
        self._cache: OrderedDict[str, Hits] = OrderedDict()
        self._in_flight: dict[str, asyncio.Future] = {}
        self._pending: list[str] = []
        self._wakeup = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=len(searchers), thread_name_prefix="search")
        self._workers: list[asyncio.Task] = []

    async def search(self, queries: list[str]) -> list[Hits]:
        """Hits for each query, in order: from the cache, from an identical query in flight, or searched."""
        if not self._workers:
            loop = asyncio.get_running_loop()
            self._workers = [loop.create_task(self._run(i)) for i in range(len(self.searchers))]
        self.stats.queries += len(queries)
        waits: list[Hits | asyncio.Future] = []
        for query in queries:
            if (hits := self._cache.get(query)) is not None:
                self._cache.move_to_end(query)
                self.stats.cache_hits += 1
                waits.append(hits)
            elif (future := self._in_flight.get(query)) is not None:
                self.stats.joined_in_flight += 1
                waits.append(future)
            else:
                future = asyncio.get_running_loop().create_future()
                self._in_flight[query] = future
                self._pending.append(query)
                waits.append(future)
        if self._pending:
            self._wakeup.set()
        # shield: one caller giving up must not cancel the future other callers share
        return [w if isinstance(w, Hits) else await asyncio.shield(w) for w in waits]

    async def _run(self, index: int) -> None:
        """Search process `index`'s loop: take a share of the waiting queries, search them, answer."""
        loop = asyncio.get_running_loop()
        searcher = self.searchers[index]
        while True:
            await self._wakeup.wait()
            if self._max_wait_s and len(self._pending) < self._max_batch:
                await asyncio.sleep(self._max_wait_s)
            if not self._pending:  # another search process took them
                continue
            size = min(self._max_batch, -(-len(self._pending) // self._idle))
            batch, self._pending = self._pending[:size], self._pending[size:]
            if not self._pending:
                self._wakeup.clear()
            self._idle -= 1
            started = time.perf_counter()
            try:
                rows, scores = await loop.run_in_executor(self._executor, searcher.search, batch, self._depth)
            except Exception as exc:  # the searcher failed: every waiter gets the error (a 500)
                for query in batch:
                    _resolve(self._in_flight.pop(query), exception=exc)
                continue
            finally:
                self._idle += 1
            self.stats.batches_per_search_process[index] += 1
            self.stats.searched += len(batch)
            self.stats.search_seconds += time.perf_counter() - started
            for i, query in enumerate(batch):
                hits = Hits(rows[i], scores[i])
                self._remember(query, hits)
                _resolve(self._in_flight.pop(query), result=hits)

    def _remember(self, query: str, hits: Hits) -> None:
        if self._cache_size:
            self._cache[query] = hits
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)

    def close(self) -> None:
        for worker in self._workers:
            worker.cancel()
        self._executor.shutdown(wait=False, cancel_futures=True)


def _resolve(future: asyncio.Future, *, result: Hits | None = None, exception: Exception | None = None) -> None:
    if future.done():
        return
    if exception is not None:
        future.set_exception(exception)
    else:
        future.set_result(result)
