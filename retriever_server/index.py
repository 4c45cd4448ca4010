"""An index directory: `meta.json` (written last, so a half-built directory never loads), the corpus
store in `corpus/`, and the kind's own files. `build_index` makes one, `Searcher` opens one.
Each kind's module is imported only when needed: a BM25 server never loads torch or faiss."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Protocol

import numpy as np

from retriever_server.corpus import CorpusError, CorpusStore, build_store
from retriever_server.errors import IndexLoadError
from retriever_server.options import DenseOptions, LoadOptions, Quantize
from retriever_server.progress import BuildProgress
from retriever_server.results import search_where

META_FILE = "meta.json"
FORMAT_VERSION = 1
KINDS = ("bm25", "dense", "pyserini")


class RowSearcher(Protocol):
    def search(self, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]: ...


def build_index(
    kind: str,
    corpus: Path,
    out_dir: Path,
    *,
    dense: DenseOptions | None = None,
    threads: int = 2,
    show_progress: bool = True,
    progress_every_s: float = 10.0,
    prebuilt_lucene: Path | None = None,
) -> dict:
    """Build an index of `kind` for the JSON-lines `corpus` in `out_dir`; returns its meta. Its phases
    report progress on stderr (`progress.py`) unless `show_progress` is False. `prebuilt_lucene`:
    a pyserini index of this corpus built by pyserini's own indexer, imported as it is."""
    if kind not in KINDS:
        raise ValueError(f"--kind: expected one of {KINDS}, got {kind!r}")
    if kind == "dense" and dense is None:
        raise ValueError("--kind dense needs --encoder (a local model directory or a hub name)")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / META_FILE).unlink(missing_ok=True)
    started = time.perf_counter()
    progress = BuildProgress(build_phases(kind, dense), enabled=show_progress, every_s=progress_every_s)
    with progress.phase("corpus", Path(corpus).stat().st_size if Path(corpus).is_file() else None, "bytes") as read:
        num_passages = build_store(corpus, out_dir / "corpus", read=read)
    store = CorpusStore(out_dir / "corpus")
    meta: dict = {"format": FORMAT_VERSION, "kind": kind, "num_passages": num_passages, "corpus": str(corpus)}
    if kind == "bm25":
        from retriever_server.bm25 import build_bm25

        meta["bm25"] = build_bm25(store, out_dir / "bm25", progress)
    elif kind == "pyserini":
        from retriever_server.pyserini_index import build_pyserini, import_pyserini

        with progress.phase("lucene"):
            if prebuilt_lucene is not None:
                meta["pyserini"] = import_pyserini(store, Path(prebuilt_lucene), out_dir / "lucene")
            else:
                meta["pyserini"] = build_pyserini(store, out_dir / "lucene", threads=threads)
    else:
        meta["dense"] = _build_dense(store, out_dir, dense, progress)
    meta["build_seconds"] = round(time.perf_counter() - started, 2)
    tmp = out_dir / (META_FILE + ".tmp")
    tmp.write_text(json.dumps(meta, indent=2))
    os.replace(tmp, out_dir / META_FILE)
    return meta


def build_phases(kind: str, dense: DenseOptions | None) -> list[str]:
    """The phases a build of `kind` goes through, in order."""
    if kind == "bm25":
        return ["corpus", "tokenize", "index"]
    if kind == "pyserini":
        return ["corpus", "lucene"]
    check = ["int8 check", "compile"] if dense.query_quantize == Quantize.INT8 else []
    if dense.prebuilt_faiss is not None:
        return ["corpus", *check]
    return ["corpus", "encode", *check, *(["faiss"] if dense.index_type != "torch" else [])]


def _build_dense(store: CorpusStore, out_dir: Path, options: DenseOptions, progress: BuildProgress) -> dict:
    from retriever_server.dense import EMBEDDINGS_FILE, FAISS_FILE, FAISS_KINDS, INDEX_KINDS, FaissIndex, build_faiss
    from retriever_server.encoders import Encoder, encode_corpus, resolve_spec

    if options.index_type not in INDEX_KINDS:
        raise ValueError(f"--index-type: expected one of {INDEX_KINDS}, got {options.index_type!r}")
    if options.query_quantize not in list(Quantize):
        raise ValueError(
            f"--query-quantize: expected one of {[q.value for q in Quantize]}, got {options.query_quantize!r}"
        )
    spec = resolve_spec(options.encoder, options.family)
    meta = {"index_type": options.index_type, "encoder": spec.to_json()}
    if options.prebuilt_faiss is not None:
        prebuilt = FaissIndex(Path(options.prebuilt_faiss).resolve())
        if prebuilt.ntotal != len(store):
            raise IndexLoadError(f"--prebuilt-faiss holds {prebuilt.ntotal} vectors, the corpus {len(store)} passages")
        (out_dir / FAISS_FILE).unlink(missing_ok=True)
        (out_dir / FAISS_FILE).symlink_to(Path(options.prebuilt_faiss).resolve())
        meta.update(index_type="flat", dim=prebuilt.dim, prebuilt=str(options.prebuilt_faiss))
        if options.query_quantize == Quantize.INT8:
            try:
                prebuilt.vectors(np.zeros(1, dtype=np.int64))
            except RuntimeError:  # e.g. IVF-PQ, which keeps codes
                raise IndexLoadError(
                    "--prebuilt-faiss keeps no passage vectors to check the int8 query encoder "
                    "against; pass --query-quantize none"
                ) from None
        return {**meta, **_query_quantize(options, spec, store, prebuilt.vectors, progress, out_dir)}
    encoder = Encoder(spec, device=options.device)
    embeddings_path = out_dir / EMBEDDINGS_FILE
    embeddings = np.lib.format.open_memmap(
        embeddings_path, mode="w+", dtype=np.float32, shape=(len(store), encoder.dim)
    )
    with progress.phase("encode", len(store)) as done:
        encode_corpus(
            encoder,
            lambda start, stop: list(store.iter_contents(start, stop)),
            len(store),
            embeddings,
            batch_size=options.batch_size,
            done=done,
        )
    embeddings.flush()
    meta.update(dim=encoder.dim, **_query_quantize(options, spec, store, embeddings.__getitem__, progress, out_dir))
    if options.index_type in FAISS_KINDS:
        with progress.phase("faiss", len(store)) as done:
            build_faiss(embeddings, options.index_type, out_dir / FAISS_FILE, done=done)
        del embeddings
        embeddings_path.unlink()
    return meta


def _query_quantize(
    options: DenseOptions, spec, store: CorpusStore, vectors, progress: BuildProgress, out_dir: Path
) -> dict:
    """The meta's CPU query encoder: int8 where asked and the check finds it keeps recall
    (`int8_check.py`; its figures are stored too), compiled ahead of time for the servers
    (`precompiled.py`) where int8 is the faster here, else fp32 (`none`). A server still runs fp32
    where int8 is slower on its CPU (`dense_searcher.choose_quantize`)."""
    if options.query_quantize != Quantize.INT8:
        return {"query_quantize": Quantize(options.query_quantize).value}
    from retriever_server.int8_check import check_int8_queries

    with progress.phase("int8 check"):
        check = check_int8_queries(spec, store, vectors)
    if not check["kept"]:
        return {"query_quantize": Quantize.NONE.value, "int8_check": check}
    from retriever_server.precompiled import compile_query_encoder
    from retriever_server.quantize import int8_slow_here

    with progress.phase("compile"):
        compiled, slow = {}, int8_slow_here()
        if slow is not None:  # servers here run fp32; a server on a CPU where int8 is faster compiles at load
            print(f"build: the int8 query encoder was not compiled: {slow}; servers on this CPU run fp32")
        else:
            try:
                compiled = {"precompiled": compile_query_encoder(spec, out_dir)}
            except Exception as exc:  # servers compile at load instead, as for an index built before
                print(f"build: the int8 query encoder was not compiled ahead of time: {type(exc).__name__}: {exc}")
    return {"query_quantize": Quantize.INT8.value, "int8_check": check, **compiled}


def read_meta(index_dir: Path) -> dict:
    """meta.json of a finished index, checked; IndexLoadError with the fix otherwise."""
    index_dir = Path(index_dir)
    if not index_dir.is_dir():
        raise IndexLoadError(
            f"--index {index_dir}: no such directory; build one with `python -m retriever_server build`"
        )
    path = index_dir / META_FILE
    if not path.is_file():
        raise IndexLoadError(f"{path}: missing (not an index, or its build did not finish); rebuild it")
    try:
        meta = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise IndexLoadError(f"{path}: corrupt ({exc}); rebuild the index") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_VERSION or meta.get("kind") not in KINDS:
        raise IndexLoadError(f"{path}: not a format-{FORMAT_VERSION} index of kind {KINDS}; rebuild it")
    return meta


class Searcher:
    """A loaded index: text queries in, corpus rows and scores out, plus the store to read rows."""

    def __init__(self, index_dir: Path, options: LoadOptions | None = None):
        options = options or LoadOptions()
        index_dir = Path(index_dir)
        self.meta = read_meta(index_dir)
        self.kind: str = self.meta["kind"]
        try:
            self.store = CorpusStore(index_dir / "corpus")
        except CorpusError as exc:
            raise IndexLoadError(str(exc)) from None
        if len(self.store) != self.meta["num_passages"]:
            raise IndexLoadError(
                f"{index_dir}: corpus store has {len(self.store)} rows, meta.json says "
                f"{self.meta['num_passages']}; rebuild the index"
            )
        try:
            self._rows = self._open(index_dir, options)
        except (OSError, ValueError, RuntimeError) as exc:
            if isinstance(exc, IndexLoadError):
                raise
            raise IndexLoadError(f"{index_dir}: cannot load the {self.kind} index ({exc}); rebuild it") from None

    def _open(self, index_dir: Path, options: LoadOptions) -> RowSearcher:
        if self.kind == "bm25":
            from retriever_server.bm25 import BM25Index

            return BM25Index(index_dir / "bm25", len(self.store), backend=options.bm25_backend)
        if self.kind == "pyserini":
            from retriever_server.pyserini_index import PyseriniIndex

            return PyseriniIndex(index_dir / "lucene", threads=options.threads)
        from retriever_server.dense_searcher import DenseSearcher

        return DenseSearcher(index_dir, self.meta["dense"], options, len(self.store))

    @property
    def description(self) -> dict:
        info = {"kind": self.kind, "num_passages": len(self.store)}
        if self.kind == "dense":
            dense = self.meta["dense"]
            info.update(
                index_type=dense["index_type"],
                encoder=dense["encoder"]["model"],
                query_encoder=self._rows.query_encoder,
                searched_by=self._rows.searched_by,
            )
        return info

    def search(self, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-k rows and scores per query. A query with no letter or digit has nothing to search for
        and matches no passage, whatever the kind (a dense encoder would embed its prefix alone)."""
        return search_where(self._rows.search, queries, [has_term(query) for query in queries], k)


def has_term(query: str) -> bool:
    return any(char.isalnum() for char in query)
