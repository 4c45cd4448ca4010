"""Async client of the retriever service (Search-R1's `POST /retrieve`), made for agent loops.

One client is shared by all coroutines of a worker: requests run concurrently over one connection
pool, large query lists are split into batches sent in parallel, and several server URLs act as
replicas (least-busy first, failing ones skipped for a cool-down). Connection errors, timeouts and
5xx/429 answers are retried with exponential backoff on another replica; any other 4xx is a client
mistake and raises at once.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence

import httpx

from verl_memagent.search.documents import Document, document_from_json

_RETRYABLE_STATUS = frozenset({429, 500, 502, 503, 504})


class RetrieverError(RuntimeError):
    """A search failed for good: retries exhausted, a 4xx answer, or a malformed response."""


class _Replica:
    """One server URL with its in-flight count and the time until which it is skipped."""

    def __init__(self, url: str):
        self.url = url.rstrip("/")
        self.in_flight = 0
        self.down_until = 0.0


class RetrieverClient:
    """Async, batched, retrying client for one or several retriever replicas.

    Safe to create anywhere (no connection is opened before the first search) and to share between
    coroutines of one event loop; the HTTP pool is bound to the loop that first uses it.
    """

    def __init__(
        self,
        urls: str | Sequence[str],
        *,
        timeout_s: float = 30.0,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        token: str | None = None,
        batch_size: int = 256,
        max_connections: int = 256,
        cooldown_s: float = 5.0,
    ):
        url_list = [urls] if isinstance(urls, str) else list(urls)
        if not url_list or not all(isinstance(u, str) and u.startswith(("http://", "https://")) for u in url_list):
            raise ValueError(f"urls: expected one or more http(s):// URLs, got {urls!r}")
        if max_retries < 0 or timeout_s <= 0 or backoff_s < 0 or batch_size < 1:
            raise ValueError("timeout_s and batch_size must be positive, max_retries and backoff_s non-negative")
        self._replicas = [_Replica(u) for u in url_list]
        self._timeout_s = timeout_s
        self._max_retries = max_retries
        self._backoff_s = backoff_s
        self._batch_size = batch_size
        self._max_connections = max_connections
        self._cooldown_s = cooldown_s
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http: httpx.AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._next = 0

    @property
    def urls(self) -> list[str]:
        """The replicas' URLs, in the order given."""
        return [r.url for r in self._replicas]

    async def search(self, queries: list[str], topk: int) -> list[list[Document]]:
        """Return the top `topk` documents of each query, one list per query, in query order."""
        if isinstance(queries, str) or not all(isinstance(q, str) for q in queries):
            raise TypeError("queries: expected a list of strings")
        if not isinstance(topk, int) or topk < 1:
            raise ValueError(f"topk: expected a positive integer, got {topk!r}")
        if not queries:
            return []
        batches = [queries[i : i + self._batch_size] for i in range(0, len(queries), self._batch_size)]
        results = await asyncio.gather(*(self._search_batch(batch, topk) for batch in batches))
        return [docs for batch in results for docs in batch]

    async def aclose(self) -> None:
        """Close the connection pool; the client may be used again afterwards (a new pool opens)."""
        if self._http is not None:
            http, self._http, self._loop = self._http, None, None
            await http.aclose()

    async def __aenter__(self) -> RetrieverClient:
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.aclose()

    def _client(self) -> httpx.AsyncClient:
        """The pool of the running loop (a pool cannot be shared between event loops)."""
        loop = asyncio.get_running_loop()
        if self._http is None or self._loop is not loop:
            n = self._max_connections
            limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
            self._http = httpx.AsyncClient(timeout=self._timeout_s, limits=limits, headers=self._headers)
            self._loop = loop
        return self._http

    def _pick(self, tried: set[str]) -> _Replica:
        """Least in-flight among healthy, untried replicas; round-robin breaks ties."""
        now = time.monotonic()
        pools = (
            [r for r in self._replicas if r.url not in tried and r.down_until <= now],
            [r for r in self._replicas if r.down_until <= now],
            self._replicas,
        )
        candidates = next(pool for pool in pools if pool)
        self._next += 1
        start = self._next % len(candidates)
        rotated = candidates[start:] + candidates[:start]
        return min(rotated, key=lambda r: r.in_flight)

    async def _search_batch(self, queries: list[str], topk: int) -> list[list[Document]]:
        body = {"queries": queries, "topk": topk, "return_scores": True}
        tried: set[str] = set()
        failure = ""
        for attempt in range(self._max_retries + 1):
            if attempt:
                await asyncio.sleep(self._backoff_s * 2 ** (attempt - 1) * (0.5 + random.random()))
            replica = self._pick(tried)
            tried.add(replica.url)
            replica.in_flight += 1
            try:
                response = await self._client().post(f"{replica.url}/retrieve", json=body)
            except httpx.TransportError as exc:
                replica.down_until = time.monotonic() + self._cooldown_s
                failure = f"{replica.url}: {type(exc).__name__}: {exc}"
                continue
            finally:
                replica.in_flight -= 1
            if response.status_code in _RETRYABLE_STATUS:
                failure = f"{replica.url}: HTTP {response.status_code}: {response.text[:500]}"
                continue
            if response.status_code != 200:
                status, detail = response.status_code, response.text[:500]
                raise RetrieverError(f"{replica.url} rejected the request: HTTP {status}: {detail}")
            return _parse_retrieve(response, len(queries), replica.url)
        raise RetrieverError(f"search failed after {self._max_retries + 1} attempts; last error: {failure}")


def _parse_retrieve(response: httpx.Response, n_queries: int, url: str) -> list[list[Document]]:
    try:
        result = response.json()["result"]
        docs = [[document_from_json(item) for item in per_query] for per_query in result]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise RetrieverError(f"{url} sent a malformed /retrieve response ({exc!r}): {response.text[:500]}") from exc
    if len(docs) != n_queries:
        raise RetrieverError(f"{url} answered {len(docs)} result lists for {n_queries} queries")
    return docs
