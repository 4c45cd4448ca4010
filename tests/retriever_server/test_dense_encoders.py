"""retriever_server/encoders.py: each family's encoder spec, the encoder against sentence-transformers, fp32
on CPU, its runners (traced only where the trace reproduces the model, compiled or traced), and the
int8 query encoder (one compiled graph, the fp32 rankings kept)."""

import collections
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from dense_builds import embeddings_of

from retriever_server.corpus import CorpusStore
from retriever_server.dense import TorchIndex
from retriever_server.encoders import BGE_QUERY_INSTRUCTION, PAD_MULTIPLE, Encoder, forward_fn, resolve_spec


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
    index, store = TorchIndex(embeddings_of(torch_index)), CorpusStore(torch_index / "corpus")
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
