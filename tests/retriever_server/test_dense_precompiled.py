"""retriever_server/precompiled.py: the int8 query encoder compiled ahead of time, kept in the compile cache,
stored beside the index and used only on the machine it fits, fed as transformers feeds the model."""

import contextlib
import io
import json
import shutil
import warnings
from pathlib import Path

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
from retriever_server.precompiled import cached_package, compile_query_encoder, machine, model_inputs, unfit
from retriever_server.quantize import int8_slow_here


@pytest.fixture(scope="module")
def precompiled_index(tmp_path_factory, torch_index, minilm_dir) -> tuple[Path, str, str]:
    """A copy of the torch index with the int8 query encoder compiled into it, as a build on a VNNI CPU
    leaves it, on whatever CPU runs the tests (compiling runs anywhere; only int8's speed is the CPU's).
    A damaged package lay in the compile cache first; a second compile, into another index, follows.
    The index and the two compiles' output."""
    spec = resolve_spec(minilm_dir)
    planted = cached_package(spec)
    planted.parent.mkdir(parents=True, exist_ok=True)
    planted.write_bytes(b"not a package")
    index = tmp_path_factory.mktemp("precompiled") / "index"
    shutil.copytree(torch_index, index)
    printed = [io.StringIO(), io.StringIO()]
    with contextlib.redirect_stdout(printed[0]):
        stored = compile_query_encoder(spec, index)
    with contextlib.redirect_stdout(printed[1]):
        again = compile_query_encoder(spec, tmp_path_factory.mktemp("precompiled_again"))
    assert again == stored
    meta = json.loads((index / "meta.json").read_text())
    meta["dense"]["precompiled"] = stored
    (index / "meta.json").write_text(json.dumps(meta))
    return index, printed[0].getvalue(), printed[1].getvalue()


def test_a_second_compile_of_an_encoder_takes_its_package_from_the_compile_cache(precompiled_index, minilm_dir):
    """The first compile found a damaged package in the cache, compiled and replaced it; the second
    took that package instead of compiling again."""
    index, first, second = precompiled_index
    planted = cached_package(resolve_spec(minilm_dir))
    assert f"the compile cache's {planted} does not load" in first
    assert f"the int8 query encoder from the compile cache ({planted})" in second
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


def test_a_build_compiles_the_query_encoder_only_where_int8_is_the_faster(torch_build, flat_build):
    """Both builds keep int8 (its check keeps recall); where int8 is faster here the torch build compiles
    the package and the flat build of the same encoder takes it from the cache, elsewhere neither
    compiles and each says why."""
    slow = int8_slow_here()
    for index, printed in (torch_build, flat_build):
        dense = json.loads((index / "meta.json").read_text())["dense"]
        assert dense["query_quantize"] == "int8"
        if slow is None:
            assert dense["precompiled"]["machine"] == machine()
        else:
            assert "precompiled" not in dense and not (index / "query_encoder").exists()
            assert f"the int8 query encoder was not compiled: {slow}; servers on this CPU run fp32" in printed
    if slow is None:
        assert "the int8 query encoder from the compile cache" in flat_build[1]


def int8_searcher(index_dir: Path) -> Searcher:
    """The index's searcher with int8 queries asked for, on any CPU (where int8 is slower than fp32 the
    server warns so; not the point here)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "--quantize int8 on a CPU where int8 is slower")
        return Searcher(index_dir, LoadOptions(device="cpu", quantize="int8"))


def test_the_index_meta_chooses_the_cpu_query_encoder(minilm_dir, subset, precompiled_index, int8_encoder):
    """`serve` follows the meta's int8 (where int8 is the faster here) or `--quantize`: fp32 ranks as
    the fp32 encoder over the index; the precompiled encoder ranks as the one compiled at load, the
    same top 5 for nearly every question, the scores within int8's roundings."""
    index_dir = precompiled_index[0]
    texts = [q["question"] for q in subset[1]]
    index = TorchIndex(embeddings_of(index_dir))
    fp32 = Encoder(resolve_spec(minilm_dir), device="cpu")
    expected_rows, expected_scores = index.search(fp32.encode_queries(texts, batch_size=16), 5)
    rows, scores = Searcher(index_dir, LoadOptions(device="cpu", quantize="none")).search(texts, 5)
    np.testing.assert_array_equal(rows, expected_rows)
    np.testing.assert_allclose(scores, expected_scores, rtol=1e-6)
    by_default = Searcher(index_dir, LoadOptions(device="cpu"))._rows._encoder
    assert by_default.runner == ("precompiled" if int8_slow_here() is None else "traced")
    searcher = int8_searcher(index_dir)
    assert searcher._rows._encoder.runner == "precompiled"
    precompiled, compiled = (e.encode_queries(texts, 16) for e in (searcher._rows._encoder, int8_encoder))
    assert np.sum(precompiled * compiled, axis=1).min() >= 0.999
    expected_rows, _ = index.search(compiled, 5)
    rows, _ = searcher.search(texts, 5)
    assert np.mean((rows == expected_rows).all(axis=1)) >= 0.9


def test_a_precompiled_encoder_runs_only_where_it_was_built_for(precompiled_index, int8_encoder, subset):
    """Another torch, or a CPU without one of the build machine's vector extensions: the server
    compiles the int8 encoder at load, as for an index built without a package, and warns why."""
    here = machine()
    assert unfit({"machine": here}) is None
    assert "compiled for torch 2.0.0, this is torch" in unfit({"machine": {**here, "torch": "2.0.0"}})
    assert "with avx9000, which this one lacks" in unfit({"machine": {**here, "cpu_flags": ["avx9000"]}})
    index_dir = precompiled_index[0]
    meta = json.loads((index_dir / "meta.json").read_text())
    meta["dense"]["precompiled"]["machine"]["torch"] = "2.0.0"
    (index_dir / "meta.json").write_text(json.dumps(meta))
    try:
        with pytest.warns(UserWarning, match="compiled for torch 2.0.0, .*: compiling now"):
            searcher = int8_searcher(index_dir)
    finally:
        meta["dense"]["precompiled"]["machine"]["torch"] = here["torch"]
        (index_dir / "meta.json").write_text(json.dumps(meta))
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
