"""Advantage estimators for agents whose trajectory spans several LLM contexts.

Each context (turn) of a trajectory is one training row; the learning signal belongs to the
trajectory. These are pure tensor functions (no verl import): rows arrive in any order, with
padding rows mixed in, and `TrajectoryLayout` says which trajectory, turn and prompt group each
row belongs to. Everything is vectorised over rows with scatter/gather; the only Python loops run
over token columns (GAE, as verl's own GAE does) or over turn depth, never over rows.

This module holds the layout, what both estimators share, and `multi_context_grpo`;
`multi_context_gae` is `gae.py`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow.compute as pc
import torch

from verl_memagent.algo.sample_key import SampleKey


@dataclass(frozen=True)
class TrajectoryLayout:
    """Where each row of a batch sits: its trajectory, its turn in it, its trajectory's prompt group.

    Trajectories are numbered 0..num_trajectories-1 and groups 0..num_groups-1. Padding rows
    (`valid` False) point at the spare trajectory slot `num_trajectories`, which no estimator
    reads, so they get zero advantage and count in no statistic.
    """

    trajectory: torch.Tensor  # (rows,) int64
    turn: torch.Tensor  # (rows,) int64, order of the row's context inside its trajectory
    group: torch.Tensor  # (num_trajectories,) int64
    valid: torch.Tensor  # (rows,) bool

    @property
    def num_trajectories(self) -> int:
        """Trajectories of the batch (the padding slot not counted)."""
        return self.group.numel()

    @property
    def num_groups(self) -> int:
        """Prompt groups of the batch."""
        return int(self.group.max()) + 1 if self.group.numel() else 0

    @classmethod
    def from_keys(cls, keys: Sequence[str], is_padding: Sequence[bool]) -> TrajectoryLayout:
        """From verl's V1 sample keys (`SampleKey`): trajectory `{uid}_{session_id}`, turn `index` (the
        position of the output in the list the agent loop returned), group `uid`. Padding rows' keys are not
        interpreted."""
        valid = ~np.asarray(is_padding, dtype=bool)
        if valid.size != len(keys):
            raise ValueError("keys and is_padding must have one entry per row")
        uids, session, turn_valid = SampleKey.columns(keys, valid)
        group_of_row = np.asarray(pc.dictionary_encode(uids).indices, dtype=np.int64)
        codes = group_of_row * (session.max(initial=0) + 1) + session
        trajectory_valid, names = pd.factorize(codes)  # hash-based: no sort
        trajectory = np.full(valid.size, names.size, dtype=np.int64)
        trajectory[valid] = trajectory_valid
        turn = np.zeros(valid.size, dtype=np.int64)
        turn[valid] = turn_valid
        group = np.zeros(names.size, dtype=np.int64)
        group[trajectory_valid] = group_of_row
        if turn_valid.size and np.bincount(trajectory_valid * (turn_valid.max() + 1) + turn_valid).max() > 1:
            raise ValueError("two rows claim the same turn of the same trajectory (duplicate sample keys)")
        return cls(
            trajectory=torch.from_numpy(trajectory),
            turn=torch.from_numpy(turn),
            group=torch.from_numpy(group),
            valid=torch.from_numpy(valid),
        )


@dataclass(frozen=True)
class Advantages:
    """What an estimator returns: per-token advantages and returns of every row, and its `multi_context/*` metrics."""

    advantages: torch.Tensor  # (rows, response_len), zero where the response mask is zero
    returns: torch.Tensor  # (rows, response_len)
    metrics: dict[str, float]


def final_rows(layout: TrajectoryLayout, eligible: torch.Tensor | None = None) -> torch.Tensor:
    """Row index of each trajectory's last turn (among `eligible` rows), ordered by trajectory id."""
    slots = layout.num_trajectories + 1
    eligible = layout.valid if eligible is None else layout.valid & eligible
    turn = torch.where(eligible, layout.turn, -1)
    last_turn = torch.full((slots,), -1, dtype=torch.int64).scatter_reduce(0, layout.trajectory, turn, "amax")
    is_final = eligible & (layout.turn == last_turn[layout.trajectory])
    rows = is_final.nonzero().squeeze(1)
    order = layout.trajectory[rows].argsort()
    return rows[order]


def check_finite(name: str, values: torch.Tensor, what: str) -> None:
    """Raise, naming the estimator and what is not finite, where one NaN or inf would spread silently
    through the group means (or the GAE chain) into every advantage of the batch."""
    bad = ~torch.isfinite(values)
    if bad.any():
        raise ValueError(
            f"{name}: {int(bad.sum())} {what} are not finite (nan or inf), e.g. {values[bad][:3].tolist()}; "
            "the reward function (or critic) must return finite numbers"
        )


def _turns_per_trajectory(layout: TrajectoryLayout) -> torch.Tensor:
    counts = torch.bincount(layout.trajectory, minlength=layout.num_trajectories + 1)
    return counts[: layout.num_trajectories]


def layout_metrics(layout: TrajectoryLayout) -> dict[str, float]:
    """The batch's shape as `multi_context/*` metrics: trajectories, turns per trajectory (mean, max) and
    the padding rows verl added to balance the batch over the ranks."""
    turns = _turns_per_trajectory(layout).float()
    return {
        "multi_context/trajectories": float(layout.num_trajectories),
        "multi_context/turns_mean": turns.mean().item() if turns.numel() else 0.0,
        "multi_context/turns_max": turns.max().item() if turns.numel() else 0.0,
        "multi_context/padding_rows": float((~layout.valid).sum()),
    }


def multi_context_grpo(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    layout: TrajectoryLayout,
    **options,
) -> Advantages:
    """GRPO with one advantage per trajectory, broadcast to every generated token of all its turns.

    Options as in `grpo_row_advantages`; with the defaults this reproduces verl's built-in
    multi-trajectory `grpo` (trainer/ppo/v1/utils.py).

    Shapes (bs rows, one per context; padding rows included and zeroed): `token_level_rewards` and
    `response_mask` (bs, response_length); `advantages` and `returns` (bs, response_length).
    """
    if response_mask.shape != token_level_rewards.shape:
        raise ValueError("token_level_rewards and response_mask must have the same shape")
    per_row, metrics = grpo_row_advantages(token_level_rewards, layout, **options)
    advantages = response_mask.to(per_row.dtype, copy=True).mul_(per_row.unsqueeze(-1))
    return Advantages(advantages=advantages, returns=advantages, metrics=metrics)


def group_stats(values: torch.Tensor, group: torch.Tensor, num_groups: int) -> tuple[torch.Tensor, ...]:
    """Per group of `values` (group index per value): count, mean and unbiased std (0 for a group of one)."""
    count = torch.bincount(group, minlength=num_groups).to(values.dtype)
    mean = torch.zeros(num_groups, dtype=values.dtype).index_add_(0, group, values) / count
    centred = values - mean[group]
    sq = torch.zeros(num_groups, dtype=values.dtype).index_add_(0, group, centred.square())
    return count, mean, (sq / (count - 1).clamp(min=1)).sqrt()


def grpo_row_advantages(
    token_level_rewards: torch.Tensor,
    layout: TrajectoryLayout,
    *,
    norm_by_std: bool = True,
    epsilon: float = 1e-6,
    weight_trajectories: bool = False,
    turn_discount: float = 1.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Each row's GRPO advantage (its trajectory's), and metrics over the valid rows.

    A trajectory's reward is the summed token rewards of its last turn's row (verl copies the score
    to every turn). Within a prompt group: A = (r - mean) / (std + epsilon), std unbiased; a group of
    one trajectory gets mean 0 and std 1, as in verl's `compute_grpo_outcome_advantage`. A group of
    several trajectories whose rewards are all equal carries no signal and gets exactly 0 (the formula
    would divide float rounding in `r - mean` by epsilon); `multi_context/zero_variance_groups` is the
    fraction of groups that did.

    - `weight_trajectories`: scale trajectory j's advantage by mean_turns / turns_j, so a trajectory's
      summed per-row weight is the same whatever its number of turns (exact with
      `loss_agg_mode=seq-mean-token-mean`; see docs/estimators.md).
    - `turn_discount` (gamma): turn t of T (final turn t = T) is scaled by gamma^(T - t).

    Shapes: `token_level_rewards` (bs, response_length); returns per-row advantages (bs,).
    """
    num_traj, num_groups = layout.num_trajectories, layout.num_groups
    final = final_rows(layout)
    reward = token_level_rewards.sum(-1)[final]  # summing every row beats gathering the final ones first
    check_finite("multi_context_grpo", reward, "trajectory rewards")

    group = layout.group
    count, mean, std = group_stats(reward, group, num_groups)
    single = count == 1
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(std), std)
    advantage = reward - mean[group]
    if norm_by_std:
        advantage = advantage / (std[group] + epsilon)

    high = torch.full((num_groups,), -torch.inf, dtype=reward.dtype).scatter_reduce(0, group, reward, "amax")
    low = torch.full((num_groups,), torch.inf, dtype=reward.dtype).scatter_reduce(0, group, reward, "amin")
    zero_variance = (~single) & (high == low)
    advantage = torch.where(zero_variance[group], torch.zeros_like(advantage), advantage)

    turns = _turns_per_trajectory(layout).to(reward.dtype)
    if weight_trajectories and num_traj:
        advantage = advantage * (turns.mean() / turns)

    per_row = torch.cat([advantage, advantage.new_zeros(1)])[layout.trajectory]
    if turn_discount != 1.0:
        last_turn = torch.zeros(num_traj + 1, dtype=torch.int64)
        last_turn[layout.trajectory[final]] = layout.turn[final]
        per_row = per_row * turn_discount ** (last_turn[layout.trajectory] - layout.turn).to(per_row.dtype)

    metrics = layout_metrics(layout)
    metrics["multi_context/zero_variance_groups"] = zero_variance.float().mean().item() if num_groups else 0.0
    return per_row, metrics


def broken_turn_shift(
    layout: TrajectoryLayout, broken: torch.Tensor, penalty: float, baseline: bool = False, epsilon: float = 1e-6
) -> torch.Tensor:
    """What each row's advantage moves by (rows,): step-level credit for the turn that broke its trajectory
    (`broken`, bool per row), on top of the trajectory's advantage. Where a whole group broke, its rewards
    are all equal and trajectory-level GRPO gives no signal at all; the turn that broke is still known.

    - `baseline` off: -`penalty` on the broken turns, 0 elsewhere.
    - `baseline` on: each turn is compared with its group's turns at the same depth (turn index), GRPO's
      way: with b = 1 for a broken turn and 0 for a well-formed one, -`penalty` (b - mean) / (std +
      epsilon) over that depth's turns (unbiased std; 0 where they all broke, or none did, or one turn is
      alone there). A well-formed turn where its siblings broke gains, so the update also says what to
      write where the policy breaks, not only what not to.
    Padding rows get 0."""
    if broken.shape != layout.valid.shape:
        raise ValueError(f"broken must have one entry per row: {tuple(broken.shape)} for {layout.valid.numel()} rows")
    bad = (broken & layout.valid).to(torch.float64)
    if not baseline:
        return (-penalty * bad).float()
    valid = layout.valid
    group = torch.cat([layout.group, layout.group.new_full((1,), -1)])[layout.trajectory[valid]]
    depth = layout.turn.max().item() + 1 if layout.turn.numel() else 1
    _, cell = torch.unique(group * depth + layout.turn[valid], return_inverse=True)
    count, mean, std = group_stats(bad[valid], cell, int(cell.max()) + 1 if cell.numel() else 0)
    signal = ((count > 1) & (std > 0))[cell]
    centred = bad[valid] - mean[cell]
    shift = torch.zeros_like(bad)
    shift[valid] = torch.where(signal, -penalty * centred / (std[cell] + epsilon), torch.zeros_like(centred))
    return shift.float()


def shift_advantages(advantages: torch.Tensor, response_mask: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """`advantages` with each row's `shift` (rows,) added on its generated tokens."""
    return advantages + response_mask.to(advantages.dtype) * shift.to(advantages.dtype).unsqueeze(-1)


def rows_off_their_trajectory(layout: TrajectoryLayout, advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Valid rows whose generated tokens do not all carry one advantage shared by every row of their
    trajectory, as `multi_context_grpo` without `turn_discount` gives them; their indices, ascending.

    A check of the batch as trained: advantages read back by sample key must still sit on the rows of
    the trajectory they were computed for, whatever verl did to the batch's order in between."""
    mask = mask.bool() & layout.valid.unsqueeze(-1)
    generated = mask.any(-1)
    first = advantages.gather(-1, mask.to(torch.uint8).argmax(-1, keepdim=True)).squeeze(-1)
    uneven = ((advantages - first.unsqueeze(-1)).abs() * mask).amax(-1) > 0
    slots = layout.num_trajectories + 1
    value = torch.where(generated, first, torch.nan)
    high = torch.full((slots,), -torch.inf).scatter_reduce(0, layout.trajectory, value.nan_to_num(-torch.inf), "amax")
    low = torch.full((slots,), torch.inf).scatter_reduce(0, layout.trajectory, value.nan_to_num(torch.inf), "amin")
    split = (high != low) & torch.isfinite(high) & torch.isfinite(low)
    return ((uneven | split[layout.trajectory]) & generated).nonzero().squeeze(1)
