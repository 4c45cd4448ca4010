"""The HTTP API (FastAPI): Search-R1's `/retrieve`, MemSearcher's `/search` and `/batch_search`,
`/health` and `/stats`. Each endpoint accepts what the original server accepts and answers in its
shape (the table in docs/retriever.md): their pydantic models are lax, so numbers sent as strings
are coerced and unknown keys ignored (counted in /stats), and out-of-range top-k is clamped to the
server's limits. A body that cannot be read as the endpoint's request is a 4xx that names the
field, never a 500."""

from __future__ import annotations

import hmac
import json
import logging
import time
from collections import Counter, deque
from dataclasses import dataclass

import numpy as np
from fastapi import Depends, FastAPI, HTTPException, Request, Response
from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from retriever_server.engine import Hits, SearchEngine

_log = logging.getLogger("uvicorn.error")  # the server's log, at its --log-level


@dataclass(frozen=True)
class ServerLimits:
    """Request limits and defaults; `topk_max` is also the depth every query is searched to.
    The defaults are the original servers': Search-R1's topk 3, MemSearcher's top_n 10."""

    topk_default: int = 3
    top_n_default: int = 10
    topk_max: int = 50
    max_queries: int = 1024
    max_query_chars: int = 4096
    max_body_bytes: int = 4 * 1024 * 1024
    token: str | None = None


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")  # kept aside to count in /stats, then ignored


class RetrieveRequest(_Body):
    """Search-R1: `{"queries": [...], "topk": k | null, "return_scores": bool}`."""

    queries: list[str]
    topk: int | None = None
    return_scores: bool = False


class SearchRequest(_Body):
    """MemSearcher: `{"query": str, "top_n": k, "return_score": bool}`."""

    query: str
    top_n: int | None = None
    return_score: bool = False


class BatchSearchRequest(_Body):
    """MemSearcher: `{"query": [str, ...], "top_n": k, "return_score": bool}`."""

    query: list[str]
    top_n: int | None = None
    return_score: bool = False


class _Metrics:
    def __init__(self, window: int = 10_000):
        self.requests: dict[str, int] = {}
        self.client_errors = 0
        self.disconnects = 0
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
        p50, p90, p99 = np.percentile(values, [50, 90, 99])
        return {"p50": round(p50, 2), "p90": round(p90, 2), "p99": round(p99, 2)}


def _json(payload, status_code: int = 200) -> Response:
    body = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return Response(body, status_code=status_code, media_type="application/json")


def _field_errors(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors(include_url=False):
        where = ".".join(str(part) for part in error["loc"]) or "body"
        parts.append(f"{where}: {error['msg']}")
    return "; ".join(parts[:5])


def create_app(limits: ServerLimits) -> FastAPI:
    """The API; `app.state.engine` is None until the index is loaded (then /health says ready), when
    the server also sets `app.state.store` (the corpus, to read hits) and `app.state.index` (its description)."""
    app = FastAPI(title="retriever_server", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.engine = None
    app.state.started = time.time()
    metrics = _Metrics()

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if 400 <= exc.status_code < 500:
            metrics.client_errors += 1
        return _json({"detail": exc.detail}, exc.status_code)

    async def authorize(request: Request) -> None:
        if limits.token is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.encode(), limits.token.encode()):
            raise HTTPException(401, "Authorization: expected `Bearer <token>` with the server's token")

    async def parse(request: Request, model: type[_Body]) -> _Body:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limits.max_body_bytes:
            raise HTTPException(413, f"body: {declared} bytes, the limit is {limits.max_body_bytes}")
        body = bytearray()
        try:
            async for chunk in request.stream():
                body += chunk
                if len(body) > limits.max_body_bytes:
                    raise HTTPException(413, f"body: over the limit of {limits.max_body_bytes} bytes")
        except ClientDisconnect:  # nobody to answer: one line in the log, no traceback
            metrics.disconnects += 1
            _log.warning("retriever_server: %s %s: the client hung up after %d of %s body bytes",
                         request.method, request.url.path, len(body), declared)  # fmt: skip
            raise HTTPException(400, "body: the client hung up before sending all of it") from None
        try:
            parsed = model.model_validate_json(bytes(body))
        except ValidationError as exc:
            raise HTTPException(422, _field_errors(exc)) from None
        metrics.ignore(parsed.model_extra)
        return parsed

    def check(queries: list[str], field: str) -> None:
        if len(queries) > limits.max_queries:
            raise HTTPException(422, f"{field}: {len(queries)} queries, the limit is {limits.max_queries}")
        for i, query in enumerate(queries):
            if len(query) > limits.max_query_chars:
                raise HTTPException(422, f"{field}.{i}: {len(query)} characters, the limit is {limits.max_query_chars}")

    async def run(
        queries: list[str], topk: int | None, default: int, field: str, endpoint: str
    ) -> tuple[int, list[Hits]]:
        """Check the queries (named `field` in errors), then search: (topk, hits per query). `topk` None
        means `default`; any topk is clamped to 1..topk_max, as deep as every query is searched."""
        check(queries, field)
        engine: SearchEngine | None = app.state.engine
        if engine is None:
            raise HTTPException(503, "index: still loading; retry when GET /health says ready")
        metrics.requests[endpoint] = metrics.requests.get(endpoint, 0) + 1
        topk = min(max(default if topk is None else topk, 1), limits.topk_max)
        return topk, await engine.search(queries)

    def respond(started: float, payload) -> Response:
        metrics.latencies_ms.append((time.perf_counter() - started) * 1000)
        return _json(payload)

    def top(hits: Hits, topk: int) -> tuple[list[dict], list[float]]:
        """The first `topk` passages of `hits` as `{"id", "contents"}`, and their scores."""
        store = app.state.store
        docs, scores = [], []
        for row, score in zip(hits.rows[:topk].tolist(), hits.scores[:topk].tolist(), strict=True):
            if row < 0:
                break
            docs.append({"id": store.doc_id(row), "contents": store.contents(row)})
            scores.append(score)
        return docs, scores

    @app.post("/retrieve", dependencies=[Depends(authorize)])
    async def retrieve(request: Request) -> Response:
        started = time.perf_counter()
        body: RetrieveRequest = await parse(request, RetrieveRequest)
        # Search-R1 serves its default for any falsy topk (`if not request.topk`)
        topk, results = await run(body.queries, body.topk or None, limits.topk_default, "queries", "retrieve")
        result = []
        for docs, scores in (top(hits, topk) for hits in results):
            if body.return_scores:
                docs = [{"document": doc, "score": score} for doc, score in zip(docs, scores, strict=True)]
            result.append(docs)
        return respond(started, {"result": result})

    @app.post("/search", dependencies=[Depends(authorize)])
    async def search(request: Request) -> Response:
        started = time.perf_counter()
        body: SearchRequest = await parse(request, SearchRequest)
        topk, (hits,) = await run([body.query], body.top_n, limits.top_n_default, "query", "search")
        docs, scores = top(hits, topk)
        return respond(started, [docs, scores] if body.return_score else docs)  # MemSearcher's (docs, scores)

    @app.post("/batch_search", dependencies=[Depends(authorize)])
    async def batch_search(request: Request) -> Response:
        started = time.perf_counter()
        body: BatchSearchRequest = await parse(request, BatchSearchRequest)
        topk, results = await run(body.query, body.top_n, limits.top_n_default, "query", "batch_search")
        docs, scores = zip(*(top(hits, topk) for hits in results), strict=True) if results else ((), ())
        return respond(started, [list(docs), list(scores)] if body.return_score else list(docs))

    @app.get("/health")
    async def health() -> Response:
        engine: SearchEngine | None = app.state.engine
        if engine is None:
            return _json({"status": "loading"}, 503)
        return _json({"status": "ready", **app.state.index})

    @app.get("/stats", dependencies=[Depends(authorize)])
    async def stats() -> Response:
        engine: SearchEngine | None = app.state.engine
        engine_stats = engine.stats if engine is not None else None
        payload = {
            "ready": engine is not None,
            "uptime_s": round(time.time() - app.state.started, 1),
            "requests": dict(metrics.requests),
            "client_errors": metrics.client_errors,
            "disconnects": metrics.disconnects,
            "ignored_keys": dict(metrics.ignored_keys),
            "latency_ms": metrics.percentiles(),
            "index": app.state.index if engine is not None else None,
        }
        if engine_stats is not None:
            payload.update(
                queries=engine_stats.queries,
                cache_hits=engine_stats.cache_hits,
                joined_in_flight=engine_stats.joined_in_flight,
                batches=engine_stats.batches,
                batches_per_search_process=engine_stats.batches_per_search_process,
                searched=engine_stats.searched,
                mean_batch=round(engine_stats.searched / engine_stats.batches, 2) if engine_stats.batches else None,
                search_seconds=round(engine_stats.search_seconds, 3),
            )
        return _json(payload)

    return app
