"""Result matrices as every searcher returns them: [queries, k] corpus rows (-1 = no passage) and
their float32 scores."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

RowsAndScores = tuple[np.ndarray, np.ndarray]


def pad(rows: np.ndarray, scores: np.ndarray, k: int) -> RowsAndScores:
    """Pad result matrices to k columns with row -1 (no passage)."""
    missing = k - rows.shape[1]
    if missing <= 0:
        return rows, scores
    width = ((0, 0), (0, missing))
    return np.pad(rows, width, constant_values=-1), np.pad(scores, width)


def search_where(
    search: Callable[[list, int], RowsAndScores], queries: list, keep: list[bool], k: int
) -> RowsAndScores:
    """`search` run on the kept queries (texts, or their tokens) only; the others match no passage.
    A query with nothing to search for gets an empty answer of its own instead of failing its batch."""
    rows = np.full((len(queries), k), -1, dtype=np.int64)
    scores = np.zeros((len(queries), k), dtype=np.float32)
    kept = [i for i, flag in enumerate(keep) if flag]
    if kept:
        rows[kept], scores[kept] = search([queries[i] for i in kept], k)
    return rows, scores
