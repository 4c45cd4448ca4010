"""The arithmetic of an RL step on a causal LM: what its forward passes must compute, and this CPU's rate.

`benchmarks/rl_step.py` reads each phase's seconds against these: floating-point operations of the
step's real tokens (every token through the layers, causal attention over each row's pairs, the head at
response positions only) over the matrix-multiply rate of one thread on the model's own shapes.
"""

from __future__ import annotations

import json
import time
from pathlib import Path


def model_shapes(model: Path) -> dict:
    config = json.loads((model / "config.json").read_text())
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    hidden = config["hidden_size"]
    kv = hidden // heads * kv_heads
    # per layer: q, k, v, o projections and the gated MLP's three matrices (multiply-adds per token)
    layer = hidden * (hidden + 2 * kv + hidden) + 3 * hidden * config["intermediate_size"]
    return {
        "hidden": hidden,
        "layers": config["num_hidden_layers"],
        "vocab": config["vocab_size"],
        "intermediate": config["intermediate_size"],
        "layer_macs": layer,
        "kv": kv,
    }


def forward_flops(lengths: list[tuple[int, int]], shapes: dict) -> float:
    """Floating-point operations of one forward over the rows: every token through the layers, causal
    attention (scores and weighted sum) over each row's pairs, the head at response positions."""
    flops = 0.0
    for prompt, response in lengths:
        tokens = prompt + response
        flops += 2 * tokens * shapes["layer_macs"] * shapes["layers"]
        flops += 2 * 2 * shapes["hidden"] * tokens * (tokens + 1) / 2 * shapes["layers"]
        flops += 2 * response * shapes["hidden"] * shapes["vocab"]
    return flops


def matmul_rate(shapes: dict, tokens: int = 4096, repeats: int = 20) -> float:
    """Floating-point operations a second of this CPU, one thread, on the model's own matrix shapes."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        x = torch.randn(tokens, shapes["hidden"])
        weights = [
            torch.randn(shapes["hidden"], n)
            for n in (shapes["hidden"], shapes["kv"], shapes["intermediate"], shapes["vocab"])
        ]
        wide = torch.randn(tokens, shapes["intermediate"])
        down = torch.randn(shapes["intermediate"], shapes["hidden"])
        flops = 2 * tokens * shapes["hidden"] * (sum(w.shape[1] for w in weights) + shapes["intermediate"])
        best = float("inf")
        for _ in range(repeats):
            began = time.perf_counter()
            for w in weights:
                x @ w
            wide @ down
            best = min(best, time.perf_counter() - began)
        return flops / best
    finally:
        torch.set_num_threads(threads)
