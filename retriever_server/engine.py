"""The search runtime behind the HTTP API: an LRU cache, de-duplication of identical queries in
flight, and coalescing of concurrent queries into shared batches for the search processes.

Everything but the search itself runs on the event loop, so cache and bookkeeping need no locks.
Each request's new queries wait in a queue of their own, and a batch takes from every waiting
request in turn: a request of 16,384 queries is searched `max_batch` at a time, and a one-query
request that arrives meanwhile is in the next batch, not behind the whole of it. With several
search processes, the queries waiting when some of them are free are split evenly between those.
A batch whose search process dies is searched again, once, on a live one (`pool.py` restarts the
dead one); a query whose search fails twice fails its requests with `SearchFailed`.
Each query is searched to a fixed depth (the server's topk maximum) and cached by its text, so
every topk is served from one entry and a query's answer does not depend on what it was batched with.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TypeVar

import cachetools
import numpy as np

from retriever_server.pool import SearchPool
from retriever_server.search_process import SearchProcessDied

_log = logging.getLogger("uvicorn.error")
SUBMIT_CHUNK = 1024  # queries of one request looked up, or answers collected, before the loop serves others
T = TypeVar("T")


class SearchFailed(RuntimeError):
    """A query could not be searched; its requests answer 500 with this message."""


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
    retried: int = 0  # queries searched again after their search process died
    failed: int = 0  # queries whose search failed (a searcher error, or a second death)

    @property
    def batches(self) -> int:
        return sum(self.batches_per_search_process)


class SearchEngine:
    """Answers query lists with `Hits`, sharing work between concurrent callers."""

    def __init__(
        self,
        pool: SearchPool,
        *,
        depth: int,
        max_batch: int = 256,
        max_wait_ms: float = 0.0,
        cache_size: int = 100_000,
    ):
        if depth < 1 or max_batch < 1 or max_wait_ms < 0 or cache_size < 0:
            raise ValueError("depth and max_batch must be positive, max_wait_ms and cache_size non-negative")
        self.pool = pool
        self.stats = EngineStats(batches_per_search_process=[0] * len(pool))
        self._depth = depth
        self._max_batch = max_batch
        self._max_wait_s = max_wait_ms / 1000
        self._cache: cachetools.LRUCache[str, Hits] | None = cachetools.LRUCache(cache_size) if cache_size else None
        self._in_flight: dict[str, asyncio.Future[Hits]] = {}
        self._queues: deque[deque[str]] = deque()  # per request, its queries no search process has taken yet
        self._waiting = 0  # queries in `_queues`
        self._retried: set[str] = set()  # queries searched again after a death: a second one fails them
        self._busy: set[int] = set()  # search processes searching a batch
        self._wakeup = asyncio.Event()
        self._workers = [asyncio.get_running_loop().create_task(self._run(i)) for i in range(len(pool))]

    async def search(self, queries: list[str]) -> list[Hits]:
        """Hits for each query, in order: from the cache, from an identical query in flight, or searched."""
        self.stats.queries += len(queries)
        waits: list[Hits | asyncio.Future[Hits]] = []
        queue: deque[str] = deque()
        async for chunk in _in_turns(queries):
            before = len(queue)
            waits += [self._lookup(query, queue) for query in chunk]
            if len(queue) > before:
                if not before:  # a queue waits in `_queues` exactly while it holds queries
                    self._queues.append(queue)
                self._waiting += len(queue) - before
                self._wakeup.set()
        results: list[Hits] = []
        async for chunk in _in_turns(waits):
            # shield: one caller giving up must not cancel the future other callers share
            results += [w if isinstance(w, Hits) else await asyncio.shield(w) for w in chunk]
        return results

    def _lookup(self, query: str, queue: deque[str]) -> Hits | asyncio.Future[Hits]:
        if self._cache is not None and (hits := self._cache.get(query)) is not None:
            self.stats.cache_hits += 1
            return hits
        if (future := self._in_flight.get(query)) is not None:
            self.stats.joined_in_flight += 1
            return future
        future = self._in_flight[query] = asyncio.get_running_loop().create_future()
        queue.append(query)
        return future

    def _take(self, size: int) -> list[str]:
        """Up to `size` waiting queries, a fair share from each waiting request in turn."""
        batch: list[str] = []
        while self._queues and len(batch) < size:
            share = -(-(size - len(batch)) // len(self._queues))
            queue = self._queues.popleft()
            batch += (queue.popleft() for _ in range(min(share, len(queue))))
            if queue:
                self._queues.append(queue)
        self._waiting -= len(batch)
        if not self._waiting:
            self._wakeup.clear()
        return batch

    async def _run(self, index: int) -> None:
        """Search process `index`'s loop: while it is live, take a share of the waiting queries,
        search them, answer."""
        while True:
            await self.pool.wait_live(index)
            await self._wakeup.wait()
            if self._max_wait_s and self._waiting < self._max_batch:
                await asyncio.sleep(self._max_wait_s)
            if not self._waiting or not self.pool.is_live(index):  # taken by another, or died meanwhile
                continue
            idle = sum(self.pool.is_live(i) and i not in self._busy for i in range(len(self.pool)))
            batch = self._take(min(self._max_batch, -(-self._waiting // max(1, idle))))
            lone = not self._busy and not self._waiting  # the server's only work: it may use idle cores
            self._busy.add(index)
            started = time.perf_counter()
            try:
                rows, scores = await self.pool.search(index, batch, self._depth, lone)
            except SearchProcessDied:
                self._search_again(batch)
                continue
            except Exception as exc:  # the searcher raised: this batch's requests answer 500
                _log.warning("retriever_server: a batch of %d queries failed: %s", len(batch), exc)
                self._fail(batch, SearchFailed(str(exc)))
                continue
            finally:
                self._busy.discard(index)
            self.stats.batches_per_search_process[index] += 1
            self.stats.searched += len(batch)
            self.stats.search_seconds += time.perf_counter() - started
            for i, query in enumerate(batch):
                hits = Hits(rows[i], scores[i])
                if self._cache is not None:
                    self._cache[query] = hits
                self._retried.discard(query)
                _settle(self._in_flight.pop(query), result=hits)

    def _search_again(self, batch: list[str]) -> None:
        """A death took `batch`: its queries go first in line for a live process, except those a
        death took once before, which fail."""
        twice = [query for query in batch if query in self._retried]
        again = [query for query in batch if query not in self._retried]
        self._retried.difference_update(twice)
        self._fail(twice, SearchFailed("the search processes died twice while searching this query"))
        if again:
            self._retried.update(again)
            self.stats.retried += len(again)
            self._queues.appendleft(deque(again))
            self._waiting += len(again)
            self._wakeup.set()

    def _fail(self, queries: list[str], error: SearchFailed) -> None:
        self.stats.failed += len(queries)
        for query in queries:
            _settle(self._in_flight.pop(query), error=error)

    def close(self) -> None:
        """A stop: the search processes killed, every query not yet answered failed (its requests
        answer 500 at once instead of holding the stop)."""
        for worker in self._workers:
            worker.cancel()
        self.pool.close()
        self._queues.clear()
        self._waiting = 0
        self._fail(list(self._in_flight), SearchFailed("the server is stopping"))


async def _in_turns(items: list[T]) -> AsyncIterator[list[T]]:
    """`items` SUBMIT_CHUNK at a time, the loop serving other requests between chunks: a 16,384-query
    request, looked up or collected in one step, held the loop for all of it."""
    for start in range(0, len(items), SUBMIT_CHUNK):
        if start:
            await asyncio.sleep(0)
        yield items[start : start + SUBMIT_CHUNK]


def _settle(future: asyncio.Future, *, result: Hits | None = None, error: Exception | None = None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(result)
        return
    future.set_exception(error)
    future.exception()  # retrieved here: a waiter that gave up leaves no "never retrieved" warning
