"""BM25 over the corpus store with bm25s + PyStemmer (no Java): built once, memory-mapped at load.

Scored as Lucene scores BM25 (bm25s's `lucene` method) with pyserini's parameters k1 = 0.9, b = 0.4,
the BM25 that Search-R1 and MemSearcher searched with (bm25s's own k1 = 1.5, b = 0.75 rank
differently); what still differs is tokenisation (Snowball stemmer and stop words here, Lucene's
English analyser there)."""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Iterable
from pathlib import Path

import bm25s
import numpy as np
import Stemmer

from retriever_server.corpus import CorpusStore
from retriever_server.progress import BuildProgress, counted
from retriever_server.results import pad, search_where

LANGUAGE = "english"
STOPWORDS = "en"
K1, B = 0.9, 0.4  # pyserini's defaults


def _tokenize(texts: Iterable[str], stemmer: Stemmer.Stemmer, *, ids: bool):
    return bm25s.tokenize(texts, stopwords=STOPWORDS, stemmer=stemmer, return_ids=ids, show_progress=False)


def terms(texts: list[str]) -> list[list[str]]:
    """The terms BM25 indexes and matches for each text: lower-cased, stop words dropped, stemmed."""
    return _tokenize(texts, Stemmer.Stemmer(LANGUAGE), ids=False)


BUILD_PHASES = ["tokenize", "index"]


def build_bm25(store: CorpusStore, out_dir: Path, progress: BuildProgress) -> dict:
    """Index every passage's contents (title and text) and save the bm25s files to `out_dir`. bm25s
    reads the passages one by one from the store (not all held as strings at once)."""
    stemmer = Stemmer.Stemmer(LANGUAGE)
    with progress.phase("tokenize", len(store)) as done:
        tokens = _tokenize(counted(store.iter_contents(), done), stemmer, ids=True)
    retriever = bm25s.BM25(k1=K1, b=B)
    with progress.phase("index"):  # bm25s counts and scores: its own bars on a terminal
        retriever.index(tokens, show_progress=progress.on_terminal)
    retriever.save(str(out_dir))
    return {"stemmer": LANGUAGE, "stopwords": STOPWORDS, "k1": K1, "b": B, "vocab_size": len(tokens.vocab)}


BACKENDS = ("auto", "numba", "numpy")


@functools.cache
def cache_jit_compilations() -> None:
    """Keep bm25s's numba compilations in numba's on-disk cache (beside bm25s, or in the user's cache
    folder where that is read-only). bm25s compiles without it, so every search process, a restarted
    one too, compiled the same functions again: 6 s on a quiet core, minutes on a starved machine."""
    from bm25s.numba import retrieve_utils, selection
    from numba.core.dispatcher import Dispatcher

    for module in (retrieve_utils, selection):
        for value in vars(module).values():
            if isinstance(value, Dispatcher):
                value.enable_caching()


class BM25Index:
    """Searches a saved bm25s index; the score matrix stays memory-mapped on disk.

    Backend `auto` scores with numba when it is installed (a dependency of this project): many times
    the queries/s of bm25s's numpy backend, at the price of a JIT compilation the first time a
    machine loads an index (cached on disk for the next processes); `numpy` starts at once.
    """

    def __init__(self, index_dir: Path, num_passages: int, *, backend: str = "auto"):
        if backend not in BACKENDS:
            raise ValueError(f"--bm25-backend: expected one of {BACKENDS}, got {backend!r}")
        if backend == "auto":
            backend = "numba" if importlib.util.find_spec("numba") else "numpy"
        if backend == "numba":
            cache_jit_compilations()
        self._retriever = bm25s.BM25.load(str(index_dir), mmap=True, show_progress=False, backend=backend)
        self._stemmer = Stemmer.Stemmer(LANGUAGE)
        self._num_passages = num_passages

    def search(self, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """Rows and scores of the top k per query; rows are -1 where fewer than k passages match, and
        everywhere for a query left with no term (stop words, punctuation), which bm25s cannot score."""
        tokens = _tokenize(queries, self._stemmer, ids=False)
        return search_where(self._score, tokens, [bool(t) for t in tokens], k)

    def _score(self, tokens: list[list[str]], k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top k of queries that each hold a term (bm25s's numba backend refuses an empty one)."""
        k_eff = min(k, self._num_passages)
        rows, scores = self._retriever.retrieve(tokens, k=k_eff, show_progress=False)
        rows = np.where(scores > 0, rows, -1).astype(np.int64)
        return pad(rows, scores.astype(np.float32), k)
