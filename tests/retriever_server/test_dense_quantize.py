"""retriever_server/quantize.py and the choice of the CPU query encoder (dense_searcher.choose_quantize):
the int8 product, and int8 only where this CPU multiplies int8 matrices faster than fp32."""

import time

import numpy as np
import pytest
import torch

from retriever_server.dense_searcher import choose_quantize
from retriever_server.encoders import Encoder, EncoderSpec, resolve_spec
from retriever_server.index import Searcher
from retriever_server.options import LoadOptions
from retriever_server.precompiled import cached_package, machine, unfit
from retriever_server.quantize import Int8Linear, cpu_flags, int8_matmul, int8_slow_here


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
