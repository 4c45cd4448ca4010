"""retriever_server/precompiled.py: the int8 query encoder compiled ahead of time, kept in the compile cache,
stored beside the index and used only on the machine it fits, fed as transformers feeds the model."""

import json

import numpy as np
import pytest
import tokenizers
import torch
from dense_builds import embeddings_of
from hypothesis import given, settings
from hypothesis import strategies as st

from retriever_server.dense import TorchIndex
from retriever_server.encoders import PAD_MULTIPLE, Encoder, EncoderSpec, LastHiddenState, resolve_spec
from retriever_server.index import Searcher
from retriever_server.options import LoadOptions
from retriever_server.precompiled import cached_package, machine, model_inputs, unfit


def test_a_second_index_of_an_encoder_takes_its_package_from_the_compile_cache(torch_build, flat_build, minilm_dir):
    """The torch index's build found a damaged package in the cache, compiled and replaced it; the flat
    index's build of the same encoder took that package instead of compiling again."""
    planted = cached_package(resolve_spec(minilm_dir))
    assert f"the compile cache's {planted} does not load" in torch_build[1]
    assert f"the int8 query encoder from the compile cache ({planted})" in flat_build[1]
    for index, _ in (torch_build, flat_build):
        assert (index / "query_encoder" / "int8.pt2").read_bytes() == planted.read_bytes()


def test_the_compile_cache_key_follows_the_model_files_and_can_be_turned_off(tmp_path, monkeypatch):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"weights")
    first = cached_package(EncoderSpec(model=str(model)))
    assert first == cached_package(EncoderSpec(model=str(model)))
    assert first != cached_package(EncoderSpec(model=str(model), max_length=256))
    (model / "model.safetensors").write_bytes(b"other weights")
    assert cached_package(EncoderSpec(model=str(model))) != first
    assert cached_package(EncoderSpec(model="intfloat/e5-base-v2")) is None  # a hub name, not files here
    monkeypatch.setenv("RETRIEVER_COMPILE_CACHE", "off")
    assert cached_package(EncoderSpec(model=str(model))) is None


def test_the_index_meta_chooses_the_cpu_query_encoder(minilm_dir, subset, torch_index, int8_encoder):
    """`build --query-quantize` (default int8) is stored in meta.json, and the int8 encoder compiled
    ahead of time beside it; `serve` follows it unless told. The precompiled encoder ranks as the one
    compiled at load: the same top 5 for every question, the scores within int8's roundings."""
    dense = json.loads((torch_index / "meta.json").read_text())["dense"]
    assert dense["query_quantize"] == "int8" and dense["precompiled"]["machine"] == machine()
    texts = [q["question"] for q in subset[1]]
    index = TorchIndex(embeddings_of(torch_index))
    fp32 = Encoder(resolve_spec(minilm_dir), device="cpu")
    expected_rows, expected_scores = index.search(fp32.encode_queries(texts, batch_size=16), 5)
    rows, scores = Searcher(torch_index, LoadOptions(device="cpu", quantize="none")).search(texts, 5)
    np.testing.assert_array_equal(rows, expected_rows)
    np.testing.assert_allclose(scores, expected_scores, rtol=1e-6)
    searcher = Searcher(torch_index, LoadOptions(device="cpu"))
    assert searcher._rows._encoder.runner == "precompiled"
    precompiled, compiled = (e.encode_queries(texts, 16) for e in (searcher._rows._encoder, int8_encoder))
    assert np.sum(precompiled * compiled, axis=1).min() >= 0.999
    expected_rows, _ = index.search(compiled, 5)
    rows, _ = searcher.search(texts, 5)
    assert np.mean((rows == expected_rows).all(axis=1)) >= 0.9


def test_a_precompiled_encoder_runs_only_where_it_was_built_for(torch_index, int8_encoder, subset):
    """Another torch, or a CPU without one of the build machine's vector extensions: the server
    compiles the int8 encoder at load, as for an index built without a package, and warns why."""
    here = machine()
    assert unfit({"machine": here}) is None
    assert "compiled for torch 2.0.0, this is torch" in unfit({"machine": {**here, "torch": "2.0.0"}})
    assert "with avx9000, which this one lacks" in unfit({"machine": {**here, "cpu_flags": ["avx9000"]}})
    meta = json.loads((torch_index / "meta.json").read_text())
    meta["dense"]["precompiled"]["machine"]["torch"] = "2.0.0"
    (torch_index / "meta.json").write_text(json.dumps(meta))
    try:
        with pytest.warns(UserWarning, match="compiled for torch 2.0.0, .*: compiling now"):
            searcher = Searcher(torch_index, LoadOptions(device="cpu"))
    finally:
        meta["dense"]["precompiled"]["machine"]["torch"] = here["torch"]
        (torch_index / "meta.json").write_text(json.dumps(meta))
    assert searcher._rows._encoder.runner == "compiled"
    texts = [q["question"] for q in subset[1][:8]]
    np.testing.assert_allclose(searcher._rows._encoder.encode_queries(texts), int8_encoder.encode_queries(texts))


@pytest.fixture(scope="module")
def eager_int8(minilm_dir) -> Encoder:
    return Encoder(resolve_spec(minilm_dir), device="cpu", quantize="int8", runner="eager")


@pytest.fixture(scope="module")
def light_int8(minilm_dir, eager_int8) -> Encoder:
    """The precompiled encoder's way to the model (`tokenizers` and padding by hand, no transformers),
    in front of the eager model itself."""
    tokenizer = tokenizers.Tokenizer.from_str(eager_int8.tokenizer.backend_tokenizer.to_str())
    model = LastHiddenState(eager_int8.model, eager_int8.input_names)
    return Encoder.precompiled(resolve_spec(minilm_dir), model, tokenizer, model_inputs(eager_int8))


def test_a_precompiled_encoder_feeds_its_model_as_transformers_does(eager_int8, light_int8, subset):
    texts = [q["question"] for q in subset[1]] + ["", "é ü 日本語 🙂", "a long query " * 200]
    np.testing.assert_array_equal(light_int8.encode_queries(texts, 16), eager_int8.encode_queries(texts, 16))


@settings(max_examples=100, deadline=None)
@given(texts=st.lists(st.text(max_size=300), min_size=1, max_size=6), max_length=st.integers(2, 64))
def test_tokens_and_padding_without_transformers_are_transformers(eager_int8, light_int8, texts, max_length):
    tokens = light_int8.tokenize(texts, max_length)
    assert tokens == eager_int8.tokenize(texts, max_length)
    expected = eager_int8.tokenizer.pad(tokens, pad_to_multiple_of=PAD_MULTIPLE, return_tensors="pt")
    padded = light_int8.padding(tokens)
    assert padded.keys() == expected.keys()
    for name in padded:
        torch.testing.assert_close(padded[name], expected[name])
