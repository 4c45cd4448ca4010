"""The HTTP API (FastAPI): Search-R1's `/retrieve`, MemSearcher's `/search` and `/batch_search`,
`/health` and `/stats`. Each endpoint accepts what the original server accepts and answers in its
shape (the table in docs/retriever.md): bodies are read as `bodies.py` says, out-of-range top-k is
clamped to the server's limits, a query over `--max-query-chars` is cut (the original servers cut
what their encoder cannot use, they refuse nothing), and answers are built by `answers.py`.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractAsyncContextManager
from dataclasses import asdict, dataclass, field

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from retriever_server.answers import JSON, Answer, docs_only, encode, scored_docs, scores_only
from retriever_server.bodies import BatchSearchRequest, RetrieveRequest, SearchRequest, read_body
from retriever_server.corpus import CorpusStore
from retriever_server.engine import SearchEngine, SearchFailed
from retriever_server.metrics import Metrics
from retriever_server.options import ServerLimits
from retriever_server.protocol import ConnectionStats


@dataclass
class ServerState:
    """What the endpoints read. The server sets `engine`, `store` (the corpus, to read hits) and
    `index` (its description) once the index is loaded; until then /health says loading."""

    limits: ServerLimits
    metrics: Metrics = field(default_factory=Metrics)
    connections: ConnectionStats = field(default_factory=ConnectionStats)
    engine: SearchEngine | None = None
    store: CorpusStore | None = None
    index: dict = field(default_factory=dict)
    started: float = field(default_factory=time.time)


def create_app(state: ServerState, lifespan: Callable[[FastAPI], AbstractAsyncContextManager] | None = None) -> FastAPI:
    app = FastAPI(title="retriever_server", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.state.server = state
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(SearchFailed, _search_failed)
    app.include_router(_searches, dependencies=[Depends(_authorize)])
    app.include_router(_status)
    return app


def _server(request: Request) -> ServerState:
    return request.app.state.server


def _json(payload, status_code: int = 200) -> Response:
    return Response(encode(payload), status_code=status_code, media_type=JSON)


async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
    if 400 <= exc.status_code < 500:
        _server(request).metrics.client_errors += 1
    return Response(encode({"detail": exc.detail}), exc.status_code, headers=exc.headers, media_type=JSON)


async def _search_failed(request: Request, exc: SearchFailed) -> Response:
    """A 500 that says why; the cause is logged once where it happened, not once per request."""
    return _json({"detail": f"search failed: {exc}"}, 500)


async def _authorize(request: Request) -> None:
    token = _server(request).limits.token
    if token is None:
        return
    scheme, _, sent = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(sent.encode(), token.encode()):
        raise HTTPException(401, "Authorization: expected `Bearer <token>` with the server's token")


# ---------------------------------------------------------------- searches


_searches = APIRouter()


async def _search(
    server: ServerState, queries: list[str], topk: int | None, default: int, field: str, endpoint: str
) -> Answer:
    """Search `queries` (named `field` in errors) for `endpoint`. `topk` None means `default`; any topk
    is clamped to 1..topk_max, as deep as every query is searched."""
    limits = server.limits
    if len(queries) > limits.max_queries:
        raise HTTPException(
            422, f"{field}: {len(queries)} queries, over the limit of {limits.max_queries} (--max-queries)"
        )
    if server.engine is None:
        raise HTTPException(503, "index: still loading; retry when GET /health says ready")
    server.metrics.requests[endpoint] += 1
    cut = limits.max_query_chars
    if any(len(query) > cut for query in queries):
        server.metrics.cut_queries += sum(len(query) > cut for query in queries)
        queries = [query[:cut] for query in queries]
    topk = min(max(default if topk is None else topk, 1), limits.topk_max)
    return Answer(server.store, await server.engine.search(queries), topk)


def _on_done(server: ServerState, started: float) -> Callable[[], None]:
    return lambda: server.metrics.latencies_ms.append((time.perf_counter() - started) * 1000)


def _wrapped(prefix: bytes, pieces: Iterable[bytes], suffix: bytes) -> Iterator[bytes]:
    yield prefix
    yield from pieces
    yield suffix


@_searches.post("/retrieve")
async def retrieve(request: Request) -> Response:
    server, started = _server(request), time.perf_counter()
    body = await read_body(request, RetrieveRequest, server.limits, server.metrics)
    # Search-R1 serves its default for any falsy topk (`if not request.topk`)
    answer = await _search(server, body.queries, body.topk or None, server.limits.topk_default, "queries", "retrieve")
    hits = answer.array(scored_docs if body.return_scores else docs_only)
    return answer.respond(_wrapped(b'{"result":', hits, b"}"), _on_done(server, started))


@_searches.post("/search")
async def search(request: Request) -> Response:
    server, started = _server(request), time.perf_counter()
    body = await read_body(request, SearchRequest, server.limits, server.metrics)
    answer = await _search(server, [body.query], body.top_n, server.limits.top_n_default, "query", "search")
    ((docs, scores),) = answer.read(answer.results)
    return answer.respond([encode([docs, scores] if body.return_score else docs)], _on_done(server, started))


@_searches.post("/batch_search")
async def batch_search(request: Request) -> Response:
    server, started = _server(request), time.perf_counter()
    body = await read_body(request, BatchSearchRequest, server.limits, server.metrics)
    answer = await _search(server, body.query, body.top_n, server.limits.top_n_default, "query", "batch_search")
    pieces = _docs_and_scores(answer) if body.return_score else answer.array(docs_only)
    return answer.respond(pieces, _on_done(server, started))


def _docs_and_scores(answer: Answer) -> Iterator[bytes]:
    """MemSearcher's `(documents, scores)`: `[[docs of each query], [scores of each query]]`."""
    yield b"["
    yield from answer.array(docs_only)
    yield b","
    yield from answer.array(scores_only, passages=False)
    yield b"]"


# ---------------------------------------------------------------- status


_status = APIRouter()


@_status.get("/health")
async def health(request: Request) -> Response:
    """200 ready while every search process is live; 200 degraded while some restart, 503 while none
    is live (a search waits for a restart) or the index is loading."""
    server = _server(request)
    if server.engine is None:
        return _json({"status": "loading"}, 503)
    pool = server.engine.pool
    live = pool.live()
    status = "ready" if live == len(pool) else "degraded"
    payload = {"status": status, **server.index, "search_processes": len(pool), "search_processes_live": live}
    return _json(payload, 200 if live else 503)


@_status.get("/stats", dependencies=[Depends(_authorize)])
async def stats(request: Request) -> Response:
    server = _server(request)
    engine, metrics = server.engine, server.metrics
    payload = {
        "ready": engine is not None,
        "uptime_s": round(time.time() - server.started, 1),
        "requests": dict(metrics.requests),
        "client_errors": metrics.client_errors,
        "disconnects": metrics.disconnects,
        "slow_bodies": metrics.slow_bodies,
        "head_timeouts": server.connections.head_timeouts,
        "heads_too_large": server.connections.heads_too_large,
        "cut_queries": metrics.cut_queries,
        "ignored_keys": dict(metrics.ignored_keys),
        "latency_ms": metrics.percentiles(),
        "index": server.index if engine is not None else None,
    }
    if engine is not None:
        counts = engine.stats
        payload.update(asdict(counts), batches=counts.batches, search_seconds=round(counts.search_seconds, 3))
        payload["mean_batch"] = round(counts.searched / counts.batches, 2) if counts.batches else None
        payload["search_process_restarts"] = engine.pool.restarted
    return _json(payload)
