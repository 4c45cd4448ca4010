"""Batches laid out as verl's V1 trainer holds them: one row per context, keys `{uid}_{session}_{turn}`."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Trajectory:
    uid: str
    session: int
    reward: float
    masks: list[list[int]]  # one response mask per turn; 0 marks tool-response tokens


def build_rows(trajectories: list[Trajectory], width: int | None = None, padding: int = 0):
    """Keys, padding flags, response masks and rm_scores (the reward at every turn's last response
    position, as verl copies the final score to all outputs), right-padded to `width` columns.
    Padding rows look like verl's: one masked token, zero score."""
    width = width or max(len(m) for t in trajectories for m in t.masks)
    keys, masks, scores = [], [], []
    for t in trajectories:
        for turn, mask in enumerate(t.masks):
            keys.append(f"{t.uid}_{t.session}_{turn}")
            row = torch.zeros(width, dtype=torch.int64)
            row[: len(mask)] = torch.tensor(mask)
            masks.append(row)
            score = torch.zeros(width)
            score[len(mask) - 1] = t.reward
            scores.append(score)
    for i in range(padding):
        keys.append(f"padabc_{i}_0")
        masks.append(torch.zeros(width, dtype=torch.int64))
        scores.append(torch.zeros(width))
    is_padding = [False] * (len(keys) - padding) + [True] * padding
    return keys, is_padding, torch.stack(masks), torch.stack(scores)


def verl_gae_on_one_sequence(masks, values, outcome: float, gamma: float, lam: float, dense=None):
    """verl's GAE over a trajectory's turns laid end to end as one sequence, the outcome at its last
    generated token. Returns raw advantages and returns at the generated tokens, in order."""
    from verl.trainer.ppo.core_algos import compute_gae_advantage_return

    mask = torch.cat(list(masks)).unsqueeze(0)
    seq_values = torch.cat(list(values)).unsqueeze(0).float()
    rewards = torch.zeros_like(seq_values) if dense is None else torch.cat(list(dense)).unsqueeze(0).clone()
    rewards[0, mask[0].nonzero().max()] += outcome
    # a second, all-generated row only keeps verl's whitening defined (it needs two tokens)
    two = [torch.cat([x, torch.ones_like(x)]) for x in (rewards, seq_values, mask)]
    returns = compute_gae_advantage_return(*two, gamma, lam)[1][:1]
    generated = mask.bool()
    return (returns - seq_values)[generated], returns[generated]
