"""retriever_server/dense.py: the exact torch index (sharded as over several GPUs), the faiss kinds and
imported faiss files, where an index is placed, and the dense server end to end."""

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from dense_builds import build_dense, embeddings_of

from retriever_server.dense import (
    EMBEDDINGS_FILE,
    FAISS_FILE,
    GPU_HEADROOM_BYTES,
    FaissIndex,
    FaissVectors,
    TorchIndex,
    build_faiss,
    fits_on_gpus,
)
from retriever_server.index import Searcher
from retriever_server.options import LoadOptions
from retriever_server.quantize import int8_slow_here


def test_faiss_kinds_agree_with_the_exact_torch_index(torch_index, tmp_path):
    embeddings = np.load(torch_index / EMBEDDINGS_FILE)
    queries = embeddings[::7] + 0.05 * np.random.default_rng(0).standard_normal(embeddings[::7].shape, np.float32)
    exact_rows, exact_scores = TorchIndex(embeddings_of(torch_index)).search(queries, 10)
    np.testing.assert_allclose(exact_scores, np.sort(queries @ embeddings.T, axis=1)[:, ::-1][:, :10], rtol=1e-5)
    # the shard-and-merge path that spreads the matrix over several GPUs, here over three CPU shards,
    # each copied in 7-row slices and scored 4 rows at a time (fewer than k: blocks keep what they have)
    sharded = TorchIndex(
        embeddings_of(torch_index), devices=[torch.device("cpu")] * 3, copy_rows=7, block_scores=4 * len(queries)
    )
    sharded_rows, sharded_scores = sharded.search(queries, 10)
    np.testing.assert_array_equal(sharded_rows, exact_rows)
    np.testing.assert_allclose(sharded_scores, exact_scores, rtol=1e-6)
    overlap = {}
    for kind in ("flat", "hnsw", "ivfpq"):
        build_faiss(embeddings, kind, tmp_path / kind)
        rows, _ = FaissIndex(tmp_path / kind).search(queries, 10)
        overlap[kind] = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(rows, exact_rows, strict=True)])
    assert overlap["flat"] == 1.0 and overlap["hnsw"] >= 0.95 and overlap["ivfpq"] >= 0.5, overlap


def test_a_flat_file_loads_as_an_exact_torch_index(torch_index, flat_index):
    """What a GPU server does with a `flat` index such as Search-R1's e5_Flat.index: its vectors, read
    back from the faiss file by row range, become a sharded `TorchIndex` (here over three CPU shards)."""
    embeddings = embeddings_of(torch_index)
    stored = FaissVectors(FaissIndex(flat_index / FAISS_FILE))
    assert stored.shape == embeddings.shape
    np.testing.assert_array_equal(stored[5:17], embeddings[5:17])
    np.testing.assert_array_equal(stored[len(embeddings) - 3 :], embeddings[-3:])
    queries = np.ascontiguousarray(embeddings[::11])
    expected_rows, expected_scores = TorchIndex(embeddings).search(queries, 5)
    from_file = TorchIndex(stored, devices=[torch.device("cpu")] * 3, copy_rows=7)
    rows, scores = from_file.search(queries, 5)
    np.testing.assert_array_equal(rows, expected_rows)
    np.testing.assert_array_equal(scores, expected_scores)
    assert (rows[:, 0] == np.arange(0, len(embeddings), 11)).all()  # each passage finds itself first
    assert from_file.devices == ["cpu"] * 3
    assert Searcher(torch_index, LoadOptions(device="cpu")).description["searched_by"] == "torch on cpu"


@pytest.mark.parametrize("kind", ["flat", "hnsw"])
def test_a_flat_or_hnsw_file_is_mapped_not_read_into_memory(tmp_path, kind):
    """Their vectors are page cache the search processes share (IO_FLAG_MMAP_IFC), not a copy in each
    process's anonymous memory (what IO_FLAG_MMAP alone gives), and they search as the file's own."""
    vectors = np.random.default_rng(0).standard_normal((2000, 32)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    path = tmp_path / f"{kind}.index"
    build_faiss(vectors, kind, path)
    index = FaissIndex(path)
    assert str(path) in Path("/proc/self/maps").read_text()
    rows, _ = index.search(vectors[:50], 1)
    assert (rows[:, 0] == np.arange(50)).all()


def test_a_flat_index_goes_to_the_gpus_only_where_it_fits():
    """fp16 rows split evenly (the last GPU's share rounded up), each GPU keeping GPU_HEADROOM_BYTES."""
    rows, dim, headroom = 1001, 512, GPU_HEADROOM_BYTES
    one_gpu, half = rows * dim * 2, 501 * dim * 2  # 1,025,024 and 513,024 bytes
    assert fits_on_gpus(rows, dim, [headroom + one_gpu])
    assert not fits_on_gpus(rows, dim, [headroom + one_gpu - 1])
    assert fits_on_gpus(rows, dim, [headroom + half, headroom + half])
    assert not fits_on_gpus(rows, dim, [headroom + half, headroom + half - 1])
    assert not fits_on_gpus(rows, dim, [])  # no GPU


def test_a_torch_index_served_on_missing_gpus_is_a_clear_error(torch_index):
    command = [sys.executable, "-m", "retriever_server", "serve", "--index", str(torch_index), "--device", "cuda"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""}  # none, on any machine
    result = subprocess.run([*command, "--port", "0"], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 1, result.stderr
    expected = "the torch index needs a GPU, and none is visible: make more GPUs visible or use --device cpu"
    assert expected in result.stderr, result.stderr


async def test_dense_server_recall_on_the_imported_flat_index(retriever_server, subset, flat_index):
    """Also: the questions sent one per request, concurrently (so batched differently, cache off),
    get the answers they got in one batch; queries with no letter or digit get none, in any batch;
    stopped, it leaves a clean log."""
    _, questions, kept = subset
    server = retriever_server(flat_index, "--cache-size", "0")
    url = server.url
    health = httpx.get(f"{url}/health").json()
    assert health["index_type"] == "flat" and health["searched_by"] == "faiss on cpu"  # on a GPU: torch, if it fits
    expected = {"precision": "int8", "runner": "precompiled"} if int8_slow_here() is None else {"precision": "fp32"}
    assert expected.items() <= health["query_encoder"].items(), health
    ready = next(line for line in server.log.read_text().splitlines() if "retriever_server: ready" in line)
    assert f"'query_encoder': {health['query_encoder']}" in ready, ready
    body = {"queries": [q["question"] for q in questions], "topk": 5}
    result = httpx.post(f"{url}/retrieve", json=body, timeout=120).json()["result"]
    recall = np.mean(
        [
            len(set(q["supporting_ids"]) & {d["id"] for d in r}) / len(q["supporting_ids"])
            for q, r in zip(questions, result, strict=True)
        ]
    )
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
    mixed = {"queries": ["", "?!", "   ", questions[0]["question"]], "topk": 5}  # nothing to search for: no hits
    assert httpx.post(f"{url}/retrieve", json=mixed, timeout=120).json()["result"] == [[], [], [], result[0]]
    items = kept[::15]
    known = [row["contents"].split("\n", 1)[1][:200] for row in items]
    result = httpx.post(f"{url}/retrieve", json={"queries": known, "topk": 1}, timeout=120).json()["result"]
    assert np.mean([r[0]["id"] == row["id"] for r, row in zip(result, items, strict=True)]) >= 0.95
    server.stop()  # a stopped server leaves nothing behind (no leaked semaphores from its search process)
    assert not [line for line in server.log.read_text().splitlines() if "leaked" in line or "Traceback" in line]


def test_prebuilt_faiss_of_another_corpus_is_refused(tmp_path, data_dir, minilm_dir, torch_index):
    faiss_file = tmp_path / "other.index"
    build_faiss(np.load(torch_index / EMBEDDINGS_FILE)[:10], "flat", faiss_file)
    args = ["--encoder", minilm_dir, "--corpus", str(data_dir / "corpus.jsonl"), "--out", str(tmp_path / "o")]
    result = build_dense(*args, "--prebuilt-faiss", str(faiss_file), check=False)
    assert result.returncode == 2 and "holds 10 vectors, the corpus 14230 passages" in result.stderr
