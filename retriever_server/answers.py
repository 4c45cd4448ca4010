"""Answers in each endpoint's shape, built and sent piece by piece.

An answer is JSON made from hits and the corpus store a piece at a time, at most `PIECE_DOCS`
passages each (their offsets looked up together, encoded by msgspec: about a millisecond a piece).
A small answer is one piece, sent whole. A large one (a 16,384-query request, or 1,024 queries at
topk 50 with scores: tens of MB) is streamed: each piece is built only once the connection has
taken the previous one, and the event loop serves other requests between pieces, so a large answer
delays no one by more than a piece, and a client that does not read its answer holds one piece and
the socket's buffers, not the whole answer.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable, Iterable, Iterator

import msgspec
from fastapi import Response
from fastapi.responses import StreamingResponse

from retriever_server.corpus import CorpusStore
from retriever_server.engine import Hits
from retriever_server.heap import release_free_memory

PIECE_DOCS = 512  # passages per piece: a few hundred KB of JSON
JSON = "application/json"
encode = msgspec.json.encode  # several times json.dumps's speed; UTF-8, no escapes beyond JSON's own

Docs = list[dict]  # [{"id", "contents"}]
Scores = list[float]


class Answer:
    """One request's hits, read as `topk` passages per query."""

    def __init__(self, store: CorpusStore, results: list[Hits], topk: int):
        self.store, self.results, self.topk = store, results, topk
        self.per_piece = max(1, PIECE_DOCS // topk)  # queries per piece

    def read(self, results: list[Hits], *, passages: bool = True) -> list[tuple[Docs, Scores]]:
        """(docs, scores) of each query's first `topk` hits (no docs unless `passages`)."""
        rows = [hits.rows[: self.topk].tolist() for hits in results]
        rows = [query[: query.index(-1)] if -1 in query else query for query in rows]  # -1: no passage
        found = iter(self.store.read([row for query in rows for row in query]) if passages else ())
        docs = [[{"id": i, "contents": c} for i, c in itertools.islice(found, len(query))] for query in rows]
        return [(d, hits.scores[: len(query)].tolist()) for d, hits, query in zip(docs, results, rows, strict=True)]

    def array(self, item: Callable[[Docs, Scores], object], *, passages: bool = True) -> Iterator[bytes]:
        """`[item(docs, scores) of each query]` as JSON, `per_piece` queries at a time."""
        yield b"["
        for start in range(0, len(self.results), self.per_piece):
            piece = self._piece(start, item, passages)
            yield piece if not start else b"," + piece
        yield b"]"

    def _piece(self, start: int, item: Callable[[Docs, Scores], object], passages: bool) -> bytes:
        """The JSON items of queries [start, start + per_piece), without the brackets. A function of its
        own so that the passages read for it are freed before the piece waits for a slow client."""
        queries = self.read(self.results[start : start + self.per_piece], passages=passages)
        return encode([item(docs, scores) for docs, scores in queries])[1:-1]

    def respond(self, pieces: Iterable[bytes], on_done: Callable[[], None]) -> Response:
        """The answer whole if it is one piece's size, else streamed; `on_done` once it is all built."""
        if len(self.results) <= self.per_piece:
            body = b"".join(pieces)
            on_done()
            return Response(body, media_type=JSON)
        return StreamingResponse(_paced(pieces, on_done), media_type=JSON)


def docs_only(docs: Docs, scores: Scores) -> Docs:
    return docs


def scores_only(docs: Docs, scores: Scores) -> Scores:
    return scores


def scored_docs(docs: Docs, scores: Scores) -> list[dict]:
    """Search-R1's `[{"document": doc, "score": s}]`."""
    return [{"document": doc, "score": score} for doc, score in zip(docs, scores, strict=True)]


_building = asyncio.Lock()  # held while a piece is built and for one turn of the loop after it


async def _paced(pieces: Iterable[bytes], on_done: Callable[[], None]) -> AsyncIterator[bytes]:
    """Yield each piece, built in turn with the other streamed answers' pieces (FIFO), one piece per
    turn of the event loop whatever the number of answers under way: the lock is let go only after
    the loop has gone round, so everything else (/health) is served between any two pieces and waits
    for one piece at most. (Let go at once, 32 answers ready together built 32 pieces in one turn.)"""
    pieces = iter(pieces)
    try:
        while True:
            async with _building:
                piece = next(pieces, None)
                await asyncio.sleep(0)
            if piece is None:
                break
            yield piece
        on_done()
    finally:  # sent, or its client gone
        release_free_memory()
