"""The server's HTTP/1.1 connections: uvicorn's httptools protocol with limits on request heads.

uvicorn closes idle keep-alive connections, but it puts no time limit on a request head being sent
(a connection that stops halfway through its headers, or opens and sends nothing, stays open for
good) and no limit on its size or number of fields. Here the head must be complete within
`header_timeout_s` of the connection opening (or of a later request's first byte), else the
connection gets a 408 and is closed; a head over `max_header_bytes` or `max_headers` gets a 431 and
is closed. Bytes of an incomplete head are counted as they arrive, so one that never ends costs at
most the limit and one read. Refusals are counted in /stats, not logged (a flood of slow heads would
flood the log). Bodies are limited where the app reads them (`bodies.py`).
"""

from __future__ import annotations

import asyncio
import http
import json
from dataclasses import dataclass

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from retriever_server.options import ServerLimits


@dataclass
class ConnectionStats:
    """Connections closed for their request head, shown in /stats."""

    head_timeouts: int = 0
    heads_too_large: int = 0


class LimitedHttpProtocol(HttpToolsProtocol):
    """`HttpToolsProtocol` with the head limits of `limits`; `protocol_class` binds them."""

    limits: ServerLimits
    stats: ConnectionStats

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._rejection: tuple[int, str] | None = None
        self._in_head = True
        self._head_bytes = 0  # bytes received while the head was incomplete
        self._head_fields = 0
        self._head_field_bytes = 0
        self._head_timer: asyncio.TimerHandle | None = self.loop.call_later(
            self.limits.header_timeout_s, self._head_timed_out
        )

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._rejection is not None:  # refused: nothing more is read
            return
        super().data_received(data)
        if self._rejection is None and self._in_head and not self.transport.is_closing():
            self._head_bytes += len(data)
            if self._head_bytes > self.limits.max_header_bytes:
                self._rejection = (431, f"request head: over the limit of {self.limits.max_header_bytes} bytes")
        if self._rejection is not None:
            self.stats.heads_too_large += 1
            self._answer_and_close(*self._rejection)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        self._head_bytes = self._head_fields = self._head_field_bytes = 0
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.limits.header_timeout_s, self._head_timed_out)

    # The parser's callbacks. Once a head is refused the parser may still run to the end of the data
    # it was fed; the refused request is never handed to uvicorn (no app runs, nothing is stored).

    def on_url(self, url: bytes) -> None:
        if self._counted(len(url)):
            super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_fields += 1
        if self._head_fields > self.limits.max_headers and self._rejection is None:
            self._rejection = (431, f"request head: more than {self.limits.max_headers} header fields")
        if self._counted(len(name) + len(value)):
            super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._cancel_head_timer()
        if self._rejection is None:
            super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if self._rejection is None:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if self._rejection is None:
            super().on_message_complete()

    def _counted(self, size: int) -> bool:
        """Count `size` head bytes; False once the head is refused."""
        self._head_field_bytes += size
        if self._head_field_bytes > self.limits.max_header_bytes and self._rejection is None:
            self._rejection = (431, f"request head: over the limit of {self.limits.max_header_bytes} bytes")
        return self._rejection is None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._in_head and not self.transport.is_closing():
            self.stats.head_timeouts += 1
            limit = self.limits.header_timeout_s
            self._answer_and_close(408, f"request head: not complete within {limit:g} s; send it at once")

    def _answer_and_close(self, status: int, message: str) -> None:
        self._cancel_head_timer()
        self._in_head = False
        body = json.dumps({"detail": message}).encode()
        head = f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}\r\ncontent-type: application/json\r\n"
        head += f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
        self.transport.write(head.encode() + body)
        self.transport.close()

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None


def protocol_class(limits: ServerLimits, stats: ConnectionStats) -> type[LimitedHttpProtocol]:
    """The protocol class for `uvicorn.Config(http=...)`, bound to these limits and counters."""
    return type("RetrieverHttpProtocol", (LimitedHttpProtocol,), {"limits": limits, "stats": stats})
