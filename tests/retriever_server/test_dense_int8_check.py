"""retriever_server/int8_check.py: the build checks that the int8 query encoder keeps recall on the corpus
it will search (pseudo-queries from the passages), and falls back to fp32 where it does not."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from dense_builds import N_PASSAGES, build_dense

from retriever_server.dense import EMBEDDINGS_FILE, build_faiss
from retriever_server.encoders import Encoder, resolve_spec
from retriever_server.index import Searcher
from retriever_server.int8_check import WINDOW_WORDS, pseudo_query
from retriever_server.options import LoadOptions


def test_the_build_checks_that_int8_keeps_recall(torch_index, flat_index):
    """The default int8 query encoder is checked on the corpus it will search (int8_check.py); an
    imported faiss file is checked on the vectors it holds, which here are the same vectors."""
    check = json.loads((torch_index / "meta.json").read_text())["dense"]["int8_check"]
    assert check["kept"] and check["queries"] == check["pool"] == N_PASSAGES, check
    assert check["recall_at_10"]["int8"] >= check["recall_at_10"]["none"] - 0.01, check
    assert 0.6 <= check["recall_at_10"]["none"] < 1.0, check  # pseudo-queries neither hopeless nor trivial
    assert check["cosine_min"] >= 0.98, check
    imported = json.loads((flat_index / "meta.json").read_text())["dense"]
    assert imported["int8_check"] == check and imported["query_quantize"] == "int8"


def test_pseudo_queries_are_windows_of_the_passage_text():
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(20)]
    for _ in range(50):
        query = pseudo_query('"Title Words"\n' + " ".join(words), rng).split()
        assert len(query) == WINDOW_WORDS and " ".join(query) in " ".join(words)
    assert pseudo_query('"Only A Title"', rng) == '"Only A Title"'  # no text: the title stands in


def _with_outlier_channel(minilm_dir: str, out: Path, factor: float = 1000.0) -> None:
    """MiniLM with one attention-value channel `factor` times larger in every layer and the next layer's
    weights on it `factor` times smaller: the same function in fp32 (attention is linear in the values),
    but the channel sets each row's int8 scale, as outlier features do in real models."""
    from transformers import AutoModel

    shutil.copytree(minilm_dir, out)
    model = AutoModel.from_pretrained(minilm_dir)
    with torch.no_grad():
        for layer in model.encoder.layer:
            layer.attention.self.value.weight[0] *= factor
            layer.attention.self.value.bias[0] *= factor
            layer.attention.output.dense.weight[:, 0] /= factor
    model.save_pretrained(out)


@pytest.mark.slow  # builds a dense index with a checked int8 encoder
def test_an_int8_encoder_that_loses_recall_is_not_used(minilm_dir, subset, tmp_path):
    model = tmp_path / "outlier_minilm"
    _with_outlier_channel(minilm_dir, model)
    texts = [q["question"] for q in subset[1]]
    original, outlier = (Encoder(resolve_spec(str(path)), device="cpu") for path in (minilm_dir, model))
    np.testing.assert_allclose(outlier.encode_queries(texts), original.encode_queries(texts), atol=1e-4)
    args = ["--encoder", str(model), "--corpus", str(subset[0]), "--out", str(tmp_path / "index")]
    result = build_dense(*args, "--index-type", "torch", check=False)
    assert result.returncode == 0, result.stderr
    assert "lost recall: CPU servers encode queries in fp32" in result.stdout
    dense = json.loads((tmp_path / "index" / "meta.json").read_text())["dense"]
    check = dense["int8_check"]
    assert dense["query_quantize"] == "none" and not check["kept"], check
    assert check["recall_at_10"]["int8"] < check["recall_at_10"]["none"] - 0.02, check  # 3 of 300 allowed
    fp32_rows, _ = Searcher(tmp_path / "index", LoadOptions(device="cpu", quantize="none")).search(texts, 5)
    rows, _ = Searcher(tmp_path / "index", LoadOptions(device="cpu")).search(texts, 5)
    np.testing.assert_array_equal(rows, fp32_rows)  # the server follows the meta: fp32


def test_a_prebuilt_faiss_without_vectors_needs_fp32_queries(tmp_path, subset, minilm_dir, torch_index):
    """IVF-PQ keeps codes, not vectors: nothing to check int8 against, so the build says to use fp32."""
    faiss_file = tmp_path / "ivfpq.index"
    build_faiss(np.load(torch_index / EMBEDDINGS_FILE), "ivfpq", faiss_file)
    args = ["--encoder", minilm_dir, "--corpus", str(subset[0]), "--prebuilt-faiss", str(faiss_file)]
    result = build_dense(*args, "--out", str(tmp_path / "a"), check=False)
    assert result.returncode == 2 and "keeps no passage vectors" in result.stderr
    assert "pass --query-quantize none" in result.stderr
    build_dense(*args, "--out", str(tmp_path / "b"), "--query-quantize", "none")
    assert "int8_check" not in json.loads((tmp_path / "b" / "meta.json").read_text())["dense"]
