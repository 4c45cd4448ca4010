"""`multi_context_gae`, MEM1's PPO advantage: GAE over a trajectory's generated tokens, turn after turn,
on the rows `estimators.TrajectoryLayout` describes (pure tensor functions, no verl import)."""

from __future__ import annotations

import torch

from verl_memagent.algo.estimators import Advantages, TrajectoryLayout, check_finite, final_rows, layout_metrics


def _masked_whiten(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Zero-mean, unit-variance (unbiased) over the masked entries, as verl whitens GAE advantages."""
    count = mask.sum()
    if count < 2:
        return values * mask
    mean = (values * mask).sum() / count
    var = ((values - mean).square() * mask).sum() / (count - 1)
    return (values - mean) * torch.rsqrt(var + 1e-8) * mask


def _row_gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, gamma_lam: float):
    """GAE inside each row with nothing after it (next value 0, next advantage 0); tokens with mask 0
    are skipped, as in verl's `compute_gae_advantage_return`. Loops over columns, not rows, on
    column-contiguous copies so that each step reads contiguous memory."""
    rewards, values, mask = (x.t().contiguous() for x in (rewards, values, mask))
    advantages = torch.empty_like(values)
    next_value = values.new_zeros(values.shape[1])
    last = values.new_zeros(values.shape[1])
    for t in reversed(range(values.shape[0])):
        delta = rewards[t] + gamma * next_value - values[t]
        last = torch.where(mask[t], delta + gamma_lam * last, last)
        next_value = torch.where(mask[t], values[t], next_value)
        advantages[t] = last
    return advantages.t()


def _generated_from_here(mask: torch.Tensor) -> torch.Tensor:
    """For each token, how many generated tokens lie between it (included) and the row's end."""
    return mask.flip(-1).cumsum(-1).flip(-1)


def _chained_bootstrap(
    layout: TrajectoryLayout,
    local: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float,
    gamma_lam: float,
) -> torch.Tensor:
    """Each row's bootstrap B_t = gamma * V_start(t+1) + gamma*lam * A_start(t+1), chaining the rows of a
    trajectory back to front: it enters at the row's last generated token and decays by gamma*lam per
    generated token before it. Rows with nothing generated pass their successor's start through."""
    rows = layout.trajectory.numel()
    generated = mask.sum(-1)
    first_col = mask.to(torch.uint8).argmax(-1)
    row_ids = torch.arange(rows)
    local_start = local[row_ids, first_col]
    value_start = values[row_ids, first_col]
    order = torch.argsort(layout.trajectory * (int(layout.turn.max()) + 1 if rows else 1) + layout.turn)
    traj_sorted = layout.trajectory[order]
    has_next_sorted = torch.cat([traj_sorted[1:] == traj_sorted[:-1], torch.zeros(1, dtype=torch.bool)])
    next_row = torch.full((rows,), -1, dtype=torch.int64)
    next_row[order[:-1]] = torch.where(has_next_sorted[:-1], order[1:], -1)
    # depth = how many rows of the same trajectory follow this one
    counts = torch.bincount(traj_sorted, minlength=layout.num_trajectories + 1)
    ends = counts.cumsum(0)[traj_sorted]
    depth = torch.empty(rows, dtype=torch.int64)
    depth[order] = ends - 1 - torch.arange(rows)

    start_adv = torch.zeros(rows)  # GAE advantage at the row's first generated token (chain included)
    start_value = torch.zeros(rows)  # critic value there (carried through rows with nothing generated)
    bootstrap = torch.zeros(rows)
    for d in range(int(depth.max()) + 1 if rows else 0):
        at = (depth == d).nonzero().squeeze(1)
        nxt = next_row[at]
        has_next = nxt >= 0
        nxt = nxt.clamp(min=0)
        b = torch.where(has_next, gamma * start_value[nxt] + gamma_lam * start_adv[nxt], torch.zeros(at.numel()))
        n = generated[at]
        decay = gamma_lam ** (n - 1).clamp(min=0).float()
        empty = n == 0
        start_adv[at] = torch.where(empty, torch.where(has_next, start_adv[nxt], 0.0), local_start[at] + decay * b)
        start_value[at] = torch.where(empty, torch.where(has_next, start_value[nxt], 0.0), value_start[at])
        bootstrap[at] = b
    return bootstrap


def multi_context_gae(
    token_level_scores: torch.Tensor,
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    layout: TrajectoryLayout,
    *,
    gamma: float = 1.0,
    lam: float = 1.0,
    whiten: bool = True,
) -> Advantages:
    """MEM1's PPO advantage: GAE over a trajectory's generated tokens, turn after turn.

    The result equals verl's GAE run on one sequence holding all turns' responses in turn order:
    the bootstrap value after the last generated token of turn t is the critic's value at the first
    generated token of turn t+1 (the start of turn t+1), and the trajectory's outcome (its final
    turn's summed `token_level_scores`) sits at the last generated token of its final turn (of the
    last turn that generated anything, should the final one be empty). Per-token
    terms `token_level_rewards - token_level_scores` (verl's in-reward KL penalty) stay where they are.
    Advantages are then whitened over all valid tokens, as verl's GAE does.

    Shapes: `token_level_scores`, `token_level_rewards`, `values` (the critic's) and `response_mask`
    (bs, response_length), one row per context; `advantages` and `returns` (bs, response_length).
    """
    if not (token_level_scores.shape == token_level_rewards.shape == values.shape == response_mask.shape):
        raise ValueError("token_level_scores, token_level_rewards, values and response_mask must have one shape")
    mask = response_mask.bool() & layout.valid.unsqueeze(-1)
    values = values.float() * mask
    final = final_rows(layout)
    outcome = token_level_scores.index_select(0, final).sum(-1).float()
    check_finite("multi_context_gae", outcome, "trajectory rewards")
    dense = (token_level_rewards - token_level_scores).float() * mask
    check_finite("multi_context_gae", dense, "per-token rewards")
    check_finite("multi_context_gae", values, "critic values")

    # the outcome goes to the trajectory's last generated token (in its final turn, unless that is empty)
    target = final_rows(layout, eligible=mask.any(-1))
    last_generated = mask[target] & (_generated_from_here(mask[target]) == 1)
    target_outcome = outcome[layout.trajectory[target]].unsqueeze(-1)
    rewards = dense.index_add(0, target, last_generated.float() * target_outcome)

    gamma_lam = gamma * lam
    local = _row_gae(rewards, values, mask, gamma, gamma_lam)

    bootstrap = _chained_bootstrap(layout, local, values, mask, gamma, gamma_lam)

    if gamma_lam == 1.0:
        advantages = (local + bootstrap.unsqueeze(-1)) * mask
    else:
        decay = gamma_lam ** (_generated_from_here(mask) - 1).clamp(min=0).float()
        advantages = (local + decay * bootstrap.unsqueeze(-1)) * mask
    returns = (advantages + values) * mask
    if whiten:
        advantages = _masked_whiten(advantages, mask)
    return Advantages(advantages=advantages, returns=returns, metrics=layout_metrics(layout))
