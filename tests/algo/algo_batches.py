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
