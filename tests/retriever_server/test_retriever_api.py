"""Both HTTP APIs against a real server process serving a BM25 index of the bundled corpus."""

import json

import httpx
import numpy as np
import pytest

from memagent_examples.retriever_process import NUMPY_BM25

# numba scoring (the default) compiles for tens of seconds at start-up; tested once, in-process


@pytest.fixture(scope="module")
def bm25_url(retriever_server, bm25_index_dir):
    return retriever_server(bm25_index_dir, *NUMPY_BM25).url


@pytest.fixture(scope="module")
def corpus(data_dir):
    return [json.loads(line) for line in (data_dir / "corpus.jsonl").read_text(encoding="utf-8").splitlines()]


def test_retrieve_with_scores_is_search_r1_shaped_and_sorted(bm25_url, corpus):
    body = {"queries": ["Jeff Porcaro drummer Toto", "Evan Morris lobbyist"], "topk": 4, "return_scores": True}
    result = httpx.post(f"{bm25_url}/retrieve", json=body).json()["result"]
    assert len(result) == 2 and all(len(hits) == 4 for hits in result)
    by_id = {row["id"]: row["contents"] for row in corpus}
    for hits in result:
        scores = [hit["score"] for hit in hits]
        assert scores == sorted(scores, reverse=True) and scores[0] > 0
        for hit in hits:
            assert set(hit) == {"document", "score"} and set(hit["document"]) == {"id", "contents"}
            assert hit["document"]["contents"] == by_id[hit["document"]["id"]]
    assert result[0][0]["document"]["contents"].startswith('"Jeff Porcaro"\n')


def test_retrieve_without_scores_returns_the_same_documents_bare(bm25_url):
    queries = ["Jeff Porcaro drummer Toto", "director of Harry Potter films"]
    scored = httpx.post(f"{bm25_url}/retrieve", json={"queries": queries, "topk": 3, "return_scores": True}).json()
    bare = httpx.post(f"{bm25_url}/retrieve", json={"queries": queries, "topk": 3, "return_scores": False}).json()
    assert bare["result"] == [[hit["document"] for hit in hits] for hits in scored["result"]]
    default = httpx.post(f"{bm25_url}/retrieve", json={"queries": queries}).json()  # topk null -> server default 3
    assert default == bare


def test_memsearcher_search_and_batch_search(bm25_url):
    retrieve = httpx.post(f"{bm25_url}/retrieve", json={"queries": ["Pietro Germi film director"], "topk": 5}).json()
    docs = retrieve["result"][0]
    single = httpx.post(f"{bm25_url}/search", json={"query": "Pietro Germi film director", "top_n": 5}).json()
    assert single == docs
    scored_docs, scores = httpx.post(
        f"{bm25_url}/search", json={"query": "Pietro Germi film director", "top_n": 5, "return_score": True}
    ).json()
    assert scored_docs == docs and len(scores) == 5 and scores == sorted(scores, reverse=True)
    batch = httpx.post(f"{bm25_url}/batch_search", json={"query": ["Pietro Germi film director", "x"], "top_n": 5})
    assert batch.json()[0] == docs and len(batch.json()) == 2
    scored_batch = {"query": ["Pietro Germi film director"], "top_n": 5, "return_score": True}
    batch_docs, batch_scores = httpx.post(f"{bm25_url}/batch_search", json=scored_batch).json()
    assert batch_docs == [docs] and batch_scores == [scores]


def test_memsearcher_defaults_and_lax_arguments(bm25_url):
    """MemSearcher's server: top_n 10 by default, pydantic's lax coercion, unknown keys ignored (and
    counted), and here top_n clamped to 1..--topk-max (50)."""
    query = "Pietro Germi film director"
    ten = httpx.post(f"{bm25_url}/retrieve", json={"queries": [query], "topk": 50}).json()["result"][0]
    before = httpx.get(f"{bm25_url}/stats").json()["ignored_keys"]
    for body, expected in [
        ({"query": query}, ten[:10]),
        ({"query": query, "top_n": "5", "num_results": 3}, ten[:5]),
        ({"query": query, "top_n": 5.0}, ten[:5]),
        ({"query": query, "top_n": 0}, ten[:1]),
        ({"query": query, "top_n": -4}, ten[:1]),
        ({"query": query, "top_n": 100}, ten[:50]),
        ({"query": query, "top_n": None}, ten[:10]),
        ({"query": "   "}, []),
    ]:
        response = httpx.post(f"{bm25_url}/search", json=body)
        assert response.status_code == 200 and response.json() == expected, body
    assert httpx.post(f"{bm25_url}/batch_search", json={"query": [query, ""], "top_n": "2"}).json() == [ten[:2], []]
    assert httpx.post(f"{bm25_url}/batch_search", json={"query": []}).json() == []
    after = httpx.get(f"{bm25_url}/stats").json()["ignored_keys"]
    assert after.get("num_results", 0) - before.get("num_results", 0) == 1


def test_search_r1_defaults_and_lax_arguments(bm25_url):
    """Search-R1's server: a falsy topk means its default (3), an empty batch an empty result."""
    query = "Jeff Porcaro drummer Toto"
    ten = httpx.post(f"{bm25_url}/retrieve", json={"queries": [query], "topk": 10}).json()["result"][0]
    for body, expected in [
        ({"queries": [query], "topk": 0}, [ten[:3]]),
        ({"queries": [query], "topk": "4", "unknown": True}, [ten[:4]]),
        ({"queries": [query], "topk": 51}, None),
        ({"queries": [], "topk": 3, "return_scores": True}, []),
        ({"queries": ["the", "", query]}, [[], [], ten[:3]]),
    ]:
        response = httpx.post(f"{bm25_url}/retrieve", json=body)
        assert response.status_code == 200, body
        if expected is not None:
            assert response.json() == {"result": expected}, body
        else:
            assert len(response.json()["result"][0]) == 50


def test_known_item_recall_at_1(bm25_url, corpus):
    """A passage's title plus its opening words find that passage first."""
    rows = [corpus[i] for i in np.random.default_rng(1).choice(len(corpus), size=200, replace=False)]
    queries = []
    for row in rows:
        title, _, text = row["contents"].partition("\n")
        queries.append(f"{title.strip(chr(34))} {' '.join(text.split()[:12])}")
    result = httpx.post(f"{bm25_url}/retrieve", json={"queries": queries, "topk": 1}, timeout=60).json()["result"]
    hits = sum(r[0]["id"] == row["id"] for r, row in zip(result, rows, strict=True))
    assert hits / len(rows) >= 0.95


def test_supporting_passage_recall_on_multihop_questions(bm25_url, multihop_rows):
    queries = [q["question"] for q in multihop_rows]
    result = httpx.post(f"{bm25_url}/retrieve", json={"queries": queries, "topk": 10}, timeout=60).json()["result"]
    recall = {}
    for k in (3, 10):
        found = [
            len(set(q["supporting_ids"]) & {h["id"] for h in r[:k]}) / len(q["supporting_ids"])
            for q, r in zip(multihop_rows, result, strict=True)
        ]
        recall[k] = float(np.mean(found))
    assert recall[3] >= 0.45 and recall[10] >= 0.6, recall
    assert recall[10] > recall[3]


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/retrieve", {"queries": ["a", 3]}, "queries.1: Input should be a valid string"),
        ("/retrieve", {"queries": ["a"], "topk": "three"}, "topk: Input should be a valid integer"),
        ("/retrieve", {"queries": ["a"], "return_scores": "maybe"}, "return_scores: Input should be a valid boolean"),
        ("/retrieve", {"queries": "a"}, "queries: Input should be a valid array"),
        ("/retrieve", {"query": ["a"]}, "queries: Field required"),
        ("/search", {"query": ["a"]}, "query: Input should be a valid string"),
        ("/search", {"query": "a", "top_n": "5.5"}, "top_n: Input should be a valid integer"),
        ("/search", {"top_n": 5}, "query: Field required"),
        ("/batch_search", {"query": "a"}, "query: Input should be a valid array"),
    ],
)
def test_client_mistakes_are_422_naming_the_field(bm25_url, path, body, field):
    response = httpx.post(f"{bm25_url}{path}", json=body)
    assert response.status_code == 422
    assert field in response.json()["detail"]


def test_invalid_json(bm25_url):
    response = httpx.post(f"{bm25_url}/retrieve", content=b"{not json")
    assert response.status_code == 422 and "body: Invalid JSON" in response.json()["detail"]


def test_a_query_longer_than_the_limit_is_cut_not_refused(bm25_url, corpus):
    """As the original servers answer whatever their analyser or encoder can use: the first
    --max-query-chars (8,192) characters are searched, and /stats counts the cut."""
    head = " ".join(row["contents"] for row in corpus[:40])[:8192]
    long_query = head + " Jeff Porcaro drummer Toto" * 100
    before = httpx.get(f"{bm25_url}/stats").json()["cut_queries"]
    body = {"queries": [long_query, head, "Toto"], "topk": 5, "return_scores": True}
    cut, alone, toto = httpx.post(f"{bm25_url}/retrieve", json=body).json()["result"]
    assert cut == alone and len(cut) == 5 and toto
    assert httpx.get(f"{bm25_url}/stats").json()["cut_queries"] - before == 1


def test_health_and_stats_count_requests_and_cache_hits(bm25_url):
    health = httpx.get(f"{bm25_url}/health").json()
    assert health == {
        "status": "ready",
        "kind": "bm25",
        "num_passages": 14230,
        "search_processes": 1,
        "search_processes_live": 1,
    }
    before = httpx.get(f"{bm25_url}/stats").json()
    for _ in range(3):
        httpx.post(f"{bm25_url}/retrieve", json={"queries": ["a query seen three times"]})
    after = httpx.get(f"{bm25_url}/stats").json()
    assert after["requests"]["retrieve"] - before["requests"].get("retrieve", 0) == 3
    assert after["queries"] - before["queries"] == 3
    assert after["cache_hits"] - before["cache_hits"] >= 2
    assert after["latency_ms"]["p50"] > 0 and after["index"] == {"kind": "bm25", "num_passages": 14230}


def test_bearer_token_is_required_when_configured(retriever_server, bm25_index_dir, monkeypatch):
    monkeypatch.setenv("RETRIEVER_TEST_TOKEN", "s3cret")
    url = retriever_server(bm25_index_dir, *NUMPY_BM25, "--token-env", "RETRIEVER_TEST_TOKEN").url
    body = {"queries": ["Toto band"]}
    assert httpx.post(f"{url}/retrieve", json=body).status_code == 401
    assert httpx.post(f"{url}/retrieve", json=body, headers={"Authorization": "Bearer wrong"}).status_code == 401
    ok = httpx.post(f"{url}/retrieve", json=body, headers={"Authorization": "Bearer s3cret"})
    assert ok.status_code == 200 and len(ok.json()["result"][0]) == 3
    assert httpx.get(f"{url}/health").status_code == 200


def test_bm25_scores_are_lucenes_with_pyserinis_parameters(tmp_path):
    """Lucene's BM25, k1 = 0.9 and b = 0.4, worked by hand: after stop words and stemming the
    passages hold 3, 6, 5 and 2 terms (mean 4), and "cat" is in three of the four."""
    from retriever_server.index import Searcher, build_index
    from retriever_server.options import LoadOptions

    texts = [
        "Cats chase mice",
        "The cat sleeps all day long in the sun",
        "Dogs bark at cats and cats run",
        "Birds sing",
    ]
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"d{i}", "contents": t}) + "\n" for i, t in enumerate(texts)))
    meta = build_index("bm25", corpus, tmp_path / "index", show_progress=False)
    assert (meta["bm25"]["k1"], meta["bm25"]["b"]) == (0.9, 0.4)
    idf = np.log(1 + (4 - 3 + 0.5) / (3 + 0.5))
    expected = {
        row: idf * tf / (tf + 0.9 * (1 - 0.4 + 0.4 * length / 4))
        for row, tf, length in [(0, 1, 3), (1, 1, 6), (2, 2, 5)]
    }
    rows, scores = Searcher(tmp_path / "index", LoadOptions(bm25_backend="numpy")).search(["cat"], 4)
    assert rows[0].tolist() == [2, 0, 1, -1]  # "Birds sing" does not match: no filler
    np.testing.assert_allclose(scores[0][:3], [expected[2], expected[0], expected[1]], rtol=1e-6)


def test_the_streaming_build_writes_the_files_bm25s_writes(tmp_path, data_dir, questions):
    """`build_bm25` (chunk by chunk, memory-mapped) against bm25s's own `index` and `save`, over the
    bundled corpus and passages left with no term: the same parameters, and every term's column
    the same passages and scores, bit for bit (only the vocabulary's order may differ); searched,
    the same answers."""
    import bm25s
    import Stemmer

    from retriever_server.bm25 import K1, LANGUAGE, B, BM25Index, _tokenize, build_bm25
    from retriever_server.corpus import CorpusStore, build_store
    from retriever_server.progress import BuildProgress

    lines = (data_dir / "corpus.jsonl").read_text(encoding="utf-8").splitlines(True)
    extra = [json.dumps({"id": f"x{i}", "contents": text}) + "\n" for i, text in enumerate(["the of a", "?!", ""])]
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(lines[:5000] + extra + lines[5000:]), encoding="utf-8")
    build_store(corpus, tmp_path / "store")
    store = CorpusStore(tmp_path / "store")
    build_bm25(store, tmp_path / "streamed", BuildProgress(["tokenize", "index"], enabled=False), chunk=1000)
    reference = bm25s.BM25(k1=K1, b=B)
    reference.index(_tokenize(list(store.iter_contents()), Stemmer.Stemmer(LANGUAGE), ids=True), show_progress=False)
    reference.save(str(tmp_path / "reference"))

    def read(directory):
        arrays = {name: np.load(directory / f"{name}.csc.index.npy") for name in ("data", "indices", "indptr")}
        vocab = json.loads((directory / "vocab.index.json").read_text())
        return vocab, arrays, json.loads((directory / "params.index.json").read_text())

    (vocab, streamed, params), (ref_vocab, ref, ref_params) = read(tmp_path / "streamed"), read(tmp_path / "reference")
    assert params == ref_params and vocab.keys() == ref_vocab.keys() and vocab[""] == len(vocab) - 1
    assert {name: a.dtype for name, a in streamed.items()} == {name: a.dtype for name, a in ref.items()}
    for term, column in vocab.items():
        if term:
            ours = slice(*streamed["indptr"][column : column + 2])
            theirs = slice(*ref["indptr"][ref_vocab[term] : ref_vocab[term] + 2])
            np.testing.assert_array_equal(streamed["indices"][ours], ref["indices"][theirs])
            np.testing.assert_array_equal(streamed["data"][ours], ref["data"][theirs])
    queries = questions[:100]
    for backend in ("numpy", "numba"):
        rows, scores = BM25Index(tmp_path / "streamed", len(store), backend=backend).search(queries, 10)
        ref_rows, ref_scores = BM25Index(tmp_path / "reference", len(store), backend=backend).search(queries, 10)
        np.testing.assert_array_equal(scores, ref_scores)
        np.testing.assert_array_equal(rows, ref_rows)


def test_numba_scoring_answers_like_numpy(bm25_index_dir, questions):
    from retriever_server.bm25 import BM25Index

    queries = questions[:50] + ["", "zzqx unknownword"]
    numpy_rows, numpy_scores = BM25Index(bm25_index_dir / "bm25", 14230, backend="numpy").search(queries, 10)
    numba_rows, numba_scores = BM25Index(bm25_index_dir / "bm25", 14230, backend="numba").search(queries, 10)
    np.testing.assert_allclose(numba_scores, numpy_scores, rtol=1e-5)
    for rows_a, rows_b, scores in zip(numba_rows, numpy_rows, numpy_scores, strict=True):
        above_cut = scores > scores[-1] + 1e-4  # equal scores may come in either order
        assert set(rows_a[above_cut]) == set(rows_b[above_cut])
    assert (numpy_rows[-2:] == -1).all()  # nothing matches: no zero-score filler


COMPILE_STATS = """
import json, sys
from pathlib import Path
from bm25s.numba.retrieve_utils import _retrieve_internal_jitted_serial as scorer
from retriever_server.bm25 import BM25Index

BM25Index(Path(sys.argv[1]), 14230, backend="numba").search(["Toto band"], 10)
print(json.dumps({"hits": sum(scorer.stats.cache_hits.values()), "misses": sum(scorer.stats.cache_misses.values())}))
"""


def test_numba_compilations_are_cached_for_the_next_process(bm25_index_dir, tmp_path):
    """bm25s compiles without numba's disk cache; the index turns it on, so a second search process
    (a restart) loads the scorer instead of compiling it for seconds."""
    import subprocess
    import sys

    env = {"NUMBA_CACHE_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    runs = [
        json.loads(
            subprocess.run(
                [sys.executable, "-c", COMPILE_STATS, str(bm25_index_dir / "bm25")],
                env=env,
                capture_output=True,
                text=True,
                check=True,
                timeout=300,
            ).stdout
        )
        for _ in range(2)
    ]
    assert runs == [{"hits": 0, "misses": 1}, {"hits": 1, "misses": 0}]
    assert list(tmp_path.rglob("*.nbi"))  # numba's index files, where NUMBA_CACHE_DIR says
