"""multi_context_grpo (and _gae) on a V1-sized batch on CPU, next to verl's built-in estimators.

A batch of `--rows` samples x `--width` response tokens: 5 sessions per prompt, 1-5 turns per
trajectory, tool-response gaps in the masks, padding rows, rows shuffled as after verl's balancing.
`ours_ms` parses verl's sample keys and computes every row's advantage (the estimator); `ours_dense_ms`
adds broadcasting them to a (rows x tokens) tensor, a pure memory write (`mask_to_float_ms` is one
such pass for scale). `verl_builtin_ms` is verl's `compute_advantage_for_multi_trajectories` with
`grpo` on the same batch (it parses the same keys, and also writes the dense tensor); both results
are compared. GAE: ours chained across turns, verl's per row
(a cost baseline: verl's cannot chain turns). Last line: one JSON object.

    python benchmarks/estimator_bench.py [--rows 100000] [--width 512] [--repeats 5] [--no-gae] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch
from verl.protocol import DataProto
from verl.trainer.ppo.core_algos import compute_gae_advantage_return
from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories

from verl_memagent.algo.estimators import TrajectoryLayout, grpo_row_advantages, multi_context_grpo
from verl_memagent.algo.gae import multi_context_gae

SESSIONS = 5


def make_batch(rows: int, width: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    keys, prompt = [], 0
    while len(keys) < rows:
        for session in range(SESSIONS):
            for turn in range(int(rng.integers(1, 6))):
                keys.append(f"{prompt:08x}-uid_{session}_{turn}")
        prompt += 1
    keys = keys[:rows]  # the last trajectory may lose turns: still a valid batch
    padding = (-rows) % 64
    keys += [f"padffff_{i}_0" for i in range(padding)]
    total = len(keys)
    lengths = torch.from_numpy(rng.integers(16, width + 1, total))
    columns = torch.arange(width)
    mask = (columns < lengths[:, None]).to(torch.int64)
    gap_start = torch.from_numpy(rng.integers(0, width, total))
    mask[(columns >= gap_start[:, None]) & (columns < gap_start[:, None] + 64)] = 0  # a tool response
    mask[:, 0] = 1
    mask[rows:] = 0
    scores = torch.zeros(total, width)
    scores[torch.arange(total), lengths - 1] = torch.from_numpy(rng.integers(0, 2, total).astype(np.float32))
    is_padding = [False] * rows + [True] * padding
    perm = torch.from_numpy(rng.permutation(total))
    return [keys[i] for i in perm], [is_padding[i] for i in perm], mask[perm], scores[perm]


def best_ms(fn, repeats: int) -> tuple[float, object]:
    result, times = None, []
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append((time.perf_counter() - start) * 1000)
    return min(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-gae", action="store_true")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    keys, is_padding, mask, scores = make_batch(args.rows, args.width)
    layout = TrajectoryLayout.from_keys(keys, is_padding)
    multi_context_grpo(scores, mask, layout)  # warm-up
    print(
        f"batch: {len(keys)} rows ({sum(is_padding)} padding), {layout.num_trajectories} trajectories, "
        f"{layout.num_groups} prompts, {args.width} tokens, {torch.get_num_threads()} threads"
    )

    layout_ms, _ = best_ms(lambda: TrajectoryLayout.from_keys(keys, is_padding), args.repeats)
    rows_ms, _ = best_ms(lambda: grpo_row_advantages(scores, layout), args.repeats)
    options = dict(weight_trajectories=True, turn_discount=0.9)
    options_ms, _ = best_ms(lambda: grpo_row_advantages(scores, layout, **options), args.repeats)
    dense_ms, ours = best_ms(lambda: multi_context_grpo(scores, mask, layout), args.repeats)
    copy_ms, _ = best_ms(lambda: mask.to(torch.float32), args.repeats)

    def verl_builtin():
        data = DataProto.from_dict(
            tensors={"token_level_rewards": scores, "response_mask": mask},
            non_tensors={"uid": np.array([k.split("_")[0] for k in keys], dtype=object)},
        )
        return compute_advantage_for_multi_trajectories(data, keys, "grpo").batch["advantages"]

    verl_ms, builtin = best_ms(verl_builtin, max(1, args.repeats // 2))
    max_diff = (ours.advantages - builtin).abs().max().item()
    print(
        f"grpo: keys->layout {layout_ms:.1f} ms + per-row advantages {rows_ms:.1f} ms "
        f"(all options {options_ms:.1f} ms); with the (rows x tokens) advantages {dense_ms:.1f} ms "
        f"(one mask.float() alone: {copy_ms:.1f} ms); verl built-in {verl_ms:.1f} ms; "
        f"max |ours - verl| {max_diff:.2e}"
    )
    result = {
        "rows": len(keys),
        "threads": torch.get_num_threads(),
        "width": args.width,
        "trajectories": layout.num_trajectories,
        "ours_ms": round(layout_ms + rows_ms, 1),
        "ours_layout_ms": round(layout_ms, 1),
        "ours_row_advantages_ms": round(rows_ms, 1),
        "ours_all_options_ms": round(layout_ms + options_ms, 1),
        "ours_dense_ms": round(layout_ms + dense_ms, 1),
        "mask_to_float_ms": round(copy_ms, 1),
        "verl_builtin_ms": round(verl_ms, 1),
        "speedup_dense": round(verl_ms / (layout_ms + dense_ms), 1),
        "max_abs_diff_vs_verl": max_diff,
        "target_ms": 50,
    }
    if not args.no_gae:
        values = torch.randn(mask.shape, generator=torch.Generator().manual_seed(1))
        gae_ms, _ = best_ms(lambda: multi_context_gae(scores, scores, values, mask, layout), 1)
        verl_gae_ms, _ = best_ms(lambda: compute_gae_advantage_return(scores, values, mask, 1.0, 1.0), 1)
        print(f"gae: ours (chained over turns) {gae_ms:.0f} ms; verl per-row {verl_gae_ms:.0f} ms")
        result.update(ours_gae_ms=round(gae_ms, 1), verl_gae_ms=round(verl_gae_ms, 1))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
