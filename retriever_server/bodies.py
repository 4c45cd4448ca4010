"""Request bodies: the original servers' request models, read within the server's limits.

The original servers parse bodies with lax pydantic models, and so does this one: numbers sent as
strings are coerced and unknown keys kept aside (to count in /stats), then ignored. A body over
`--max-body-bytes` is refused while it is read, whether or not it declares its length (a chunked
one too), and one that stalls for `--body-timeout-s` is dropped; either answer closes the
connection, so the rest of such a body is never read. A body that cannot be read as the
endpoint's request is a 4xx that names the field, never a 500.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TypeVar

from fastapi import HTTPException, Request
from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.requests import ClientDisconnect

from retriever_server.metrics import Metrics
from retriever_server.options import ServerLimits

_log = logging.getLogger("uvicorn.error")
CLOSE = {"connection": "close"}  # the answer ends the connection: what is left of the body is not read


class Body(BaseModel):
    model_config = ConfigDict(extra="allow")


class RetrieveRequest(Body):
    """Search-R1: `{"queries": [...], "topk": k | null, "return_scores": bool}`."""

    queries: list[str]
    topk: int | None = None
    return_scores: bool = False


class SearchRequest(Body):
    """MemSearcher: `{"query": str, "top_n": k, "return_score": bool}`."""

    query: str
    top_n: int | None = None
    return_score: bool = False


class BatchSearchRequest(Body):
    """MemSearcher: `{"query": [str, ...], "top_n": k, "return_score": bool}`."""

    query: list[str]
    top_n: int | None = None
    return_score: bool = False


B = TypeVar("B", bound=Body)


async def read_body(request: Request, model: type[B], limits: ServerLimits, metrics: Metrics) -> B:
    """The request's body as `model`, or the HTTPException that says what is wrong with it."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limits.max_body_bytes:
        raise HTTPException(
            413, f"body: {declared} bytes, over the limit of {limits.max_body_bytes} (--max-body-bytes)", headers=CLOSE
        )
    body = await _receive(request, limits, metrics, declared)
    try:  # on the loop: pydantic holds the GIL while it parses, a thread would not free the loop
        parsed = model.model_validate_json(body)
    except ValidationError as exc:
        raise HTTPException(422, field_errors(exc)) from None
    metrics.ignore(parsed.model_extra)
    return parsed


async def _receive(request: Request, limits: ServerLimits, metrics: Metrics, declared: str | None) -> bytes:
    body = bytearray()
    chunks = request.stream()
    try:
        while True:
            try:
                body += await asyncio.wait_for(anext(chunks), limits.body_timeout_s)
            except StopAsyncIteration:
                return bytes(body)
            if len(body) > limits.max_body_bytes:
                raise HTTPException(
                    413, f"body: over the limit of {limits.max_body_bytes} bytes (--max-body-bytes)", headers=CLOSE
                )
    except ClientDisconnect:  # nobody to answer: one line in the log, no traceback
        metrics.disconnects += 1
        _log.warning(
            "retriever_server: %s %s: the client hung up after %d of %s body bytes",
            request.method,
            request.url.path,
            len(body),
            declared,
        )
        raise HTTPException(400, "body: the client hung up before sending all of it") from None
    except asyncio.TimeoutError:
        metrics.slow_bodies += 1
        _log.warning(
            "retriever_server: %s %s: no body byte for %g s after %d of %s; closed",
            request.method,
            request.url.path,
            limits.body_timeout_s,
            len(body),
            declared,
        )
        raise HTTPException(
            408, f"body: no byte for {limits.body_timeout_s:g} s (--body-timeout-s)", headers=CLOSE
        ) from None


def field_errors(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors(include_url=False):
        where = ".".join(str(part) for part in error["loc"]) or "body"
        parts.append(f"{where}: {error['msg']}")
    return "; ".join(parts[:5])
