"""Optional Lucene BM25 through pyserini (needs `pip install pyserini` and Java 21 on PATH)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from retriever_server.corpus import CorpusStore

INSTALL_HINT = "install it with `pip install 'verl-memagent[pyserini]'` and put a Java 21 JDK on PATH"


def check_pyserini() -> None:
    """Raise RuntimeError with the fix when pyserini or Java 21 is missing."""
    try:
        import pyserini  # noqa: F401
    except ImportError:
        raise RuntimeError(f"--kind pyserini needs the pyserini package: {INSTALL_HINT}") from None
    java = shutil.which("java")
    if java is None:
        raise RuntimeError(f"--kind pyserini needs Java 21 (no `java` on PATH): {INSTALL_HINT}")
    version = subprocess.run([java, "-version"], capture_output=True, text=True).stderr
    match = re.search(r'version "(\d+)', version)
    if not match or int(match.group(1)) < 21:
        raise RuntimeError(f"--kind pyserini needs Java 21 or newer, found: {version.strip()[:200]}")


def build_pyserini(store: CorpusStore, out_dir: Path, *, threads: int = 2) -> dict:
    """Index the store with Lucene; a document's Lucene id is its store row."""
    check_pyserini()
    with tempfile.TemporaryDirectory() as tmp:
        with open(Path(tmp) / "docs.jsonl", "w", encoding="utf-8") as handle:
            for row, contents in enumerate(store.iter_contents()):
                handle.write(json.dumps({"id": str(row), "contents": contents}, ensure_ascii=False) + "\n")
        command = [
            sys.executable,
            "-m",
            "pyserini.index.lucene",
            "--collection",
            "JsonCollection",
            "--input",
            tmp,
            "--index",
            str(out_dir),
            "--generator",
            "DefaultLuceneDocumentGenerator",
            "--threads",
            str(threads),
        ]
        subprocess.run(command, check=True)
    return {"threads": threads}


class PyseriniIndex:
    """Lucene BM25 search (k1 = 0.9, b = 0.4, pyserini's defaults)."""

    def __init__(self, index_dir: Path, *, threads: int = 2):
        check_pyserini()
        from pyserini.search.lucene import LuceneSearcher

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
