"""BM25 over the corpus store with bm25s + PyStemmer (no Java): built once, memory-mapped at load.

Scored as Lucene scores BM25 (bm25s's `lucene` method) with pyserini's parameters k1 = 0.9, b = 0.4,
the BM25 that Search-R1 and MemSearcher searched with (bm25s's own k1 = 1.5, b = 0.75 rank
differently); what still differs is tokenisation (Snowball stemmer and stop words here, Lucene's
English analyser there).

The build streams: bm25s's `index` holds every passage's token ids as Python lists and its score
matrix three times over (4.3 GB of peak memory per million 100-word passages: 90 GB for wiki-18),
so the index is built here instead, in bm25s's saved format and with its arithmetic (the same
files, bit for bit, but for the vocabulary's order). Passages are tokenized by bm25s a chunk at a
time and each chunk's (passage, term, count) triples go to disk; then, with the document
frequencies and lengths known, each chunk's scores are written straight into the memory-mapped
score matrix, column (term) by column in passage order. Memory: a chunk, the vocabulary and a
length per passage."""

from __future__ import annotations

import functools
import importlib.util
import itertools
import json
import math
import tempfile
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
CHUNK = 65_536  # passages tokenized at a time


def build_bm25(store: CorpusStore, out_dir: Path, progress: BuildProgress, *, chunk: int = CHUNK) -> dict:
    """Index every passage's contents (title and text) into bm25s's files in `out_dir`, streaming."""
    out_dir.mkdir(parents=True, exist_ok=True)
    retriever = bm25s.BM25(k1=K1, b=B)  # its scoring method and saved parameters
    if (retriever.method, retriever.idf_method) != ("lucene", "lucene"):
        raise RuntimeError(f"bm25s {bm25s.__version__} no longer scores as Lucene by default")
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        with progress.phase("tokenize", len(store)) as done:
            vocab, lengths, frequencies, chunks = _count_terms(store, Path(tmp), chunk, done)
        with progress.phase("index", len(store)) as done:
            _write_scores(out_dir, vocab, lengths, frequencies, chunks, done)
    vocab[""] = len(vocab)  # as bm25s's `index`: a column-less term for passages with no term
    (out_dir / "vocab.index.json").write_text(json.dumps(vocab, ensure_ascii=False))
    params = {name: getattr(retriever, name) for name in ("k1", "b", "delta", "method", "idf_method", "dtype")}
    params.update(int_dtype=retriever.int_dtype, num_docs=len(store), version=bm25s.__version__)
    params["backend"] = retriever.backend
    (out_dir / "params.index.json").write_text(json.dumps(params, indent=4))
    return {"stemmer": LANGUAGE, "stopwords": STOPWORDS, "k1": K1, "b": B, "vocab_size": len(vocab)}


def _count_terms(store: CorpusStore, tmp: Path, chunk: int, done) -> tuple[dict, np.ndarray, np.ndarray, list]:
    """Tokenize the store a chunk at a time: (vocabulary term -> column, each passage's length in
    terms, each term's document frequency, each chunk's (file of (row, column, count) sorted by
    row, passages))."""
    stemmer = Stemmer.Stemmer(LANGUAGE)
    vocab: dict[str, int] = {}
    lengths = np.zeros(len(store), dtype=np.int64)
    frequencies = np.zeros(0, dtype=np.int64)
    chunks = []
    for first in range(0, len(store), chunk):
        texts = list(store.iter_contents(first, min(first + chunk, len(store))))
        tokens = _tokenize(counted(texts, done), stemmer, ids=True)  # counted as bm25s reads each
        local = sorted(tokens.vocab.items(), key=lambda item: item[1])  # bm25s's ids are 0..n-1
        to_global = np.array([vocab.setdefault(term, len(vocab)) for term, _ in local], dtype=np.int64)
        counts = np.fromiter(map(len, tokens.ids), dtype=np.int64, count=len(texts))
        lengths[first : first + len(texts)] = counts
        flat = np.fromiter(itertools.chain.from_iterable(tokens.ids), dtype=np.int64, count=int(counts.sum()))
        rows = np.repeat(np.arange(first, first + len(texts), dtype=np.int64), counts)
        pairs, tf = np.unique(rows * len(vocab) + to_global[flat], return_counts=True)  # sorted by row, then term
        rows, columns = np.divmod(pairs, len(vocab))
        frequencies = np.concatenate([frequencies, np.zeros(len(vocab) - len(frequencies), dtype=np.int64)])
        frequencies += np.bincount(columns, minlength=len(vocab))
        chunks.append((tmp / f"{len(chunks)}.npz", len(texts)))
        np.savez(chunks[-1][0], rows=rows.astype(np.int32), columns=columns.astype(np.int32), tf=tf.astype(np.int32))
    return vocab, lengths, frequencies, chunks


def _write_scores(out_dir: Path, vocab: dict, lengths: np.ndarray, frequencies: np.ndarray, chunks, done) -> None:
    """bm25s's CSC score matrix (passages x terms), written into its memory-mapped files chunk by
    chunk: each (row, term) pair's Lucene BM25 score at the next free place of its term's column."""
    num_docs, nnz = len(lengths), int(frequencies.sum())
    average_length = lengths.mean()  # as bm25s: the mean of an int64 array, float64
    # idf as bm25s computes it: math.log in float64 per term, stored in float32
    idf = np.array([math.log(1 + (num_docs - df + 0.5) / (df + 0.5)) for df in frequencies.tolist()], np.float32)
    indptr = np.concatenate([[0], np.cumsum(frequencies)])
    np.save(out_dir / "indptr.csc.index.npy", indptr.astype(np.int64))
    data = np.lib.format.open_memmap(out_dir / "data.csc.index.npy", mode="w+", dtype=np.float32, shape=(nnz,))
    indices = np.lib.format.open_memmap(out_dir / "indices.csc.index.npy", mode="w+", dtype=np.int32, shape=(nnz,))
    free = indptr[:-1].copy()  # each column's next free place
    for path, passages in chunks:
        with np.load(path) as arrays:
            rows, columns, tf = arrays["rows"], arrays["columns"], arrays["tf"].astype(np.float64)
        # bm25s's tfc and score, in its order of float64 operations, stored as float32
        tfc = tf / (K1 * ((1 - B) + B * lengths[rows] / average_length) + tf)
        scores = (idf[columns].astype(np.float64) * tfc).astype(np.float32)
        order = np.argsort(columns, kind="stable")  # by term; rows stay ascending within each
        sorted_columns = columns[order]
        starts = np.flatnonzero(np.r_[True, sorted_columns[1:] != sorted_columns[:-1]])
        rank = np.arange(len(order)) - np.repeat(starts, np.diff(np.r_[starts, len(order)]))
        places = free[sorted_columns] + rank
        data[places], indices[places] = scores[order], rows[order]
        free += np.bincount(columns, minlength=len(free))
        done(passages)
    data.flush()
    indices.flush()
    del data, indices


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
