"""Which rows each optimizer step of an actor or critic update trains on, and what must hold first.

verl's workers split the batch of an update contiguously: into `dp` equal chunks, one per
data-parallel rank (the single controller's dispatch), each chunk into mini-batches of
`ppo_mini_batch_size * rollout.n / dp` rows (one optimizer step each, all ranks stepping together;
`actor.shuffle: false`, verl's default), each mini-batch into micro-batches. `UpdatePlan` is that
split, made here so that the trainer decides which rows share an optimizer step and can look at the
rows of every step before the workers do:

- Which rows share a step does not depend on the number of ranks, nor on the order in which the
  rollouts finished: the real rows are taken in the data's order (prompt, trajectory, turn) and cut
  into consecutive steps; only then is each step's share dealt over the ranks, balanced by tokens.
  verl's own split follows its sequence-length balancing over ranks (`_balance_batch`), so one
  batch trained at dp=1 and dp=2 made different optimizer steps.
- A step whose rows hold no loss token (only verl's padding rows, which have none) has the loss
  0 / 0 = NaN with a zero gradient, and the optimizer still moves the policy by Adam's momentum and
  weight decay. verl means padding to be a no-op, so such steps are never sent.
- A step with a non-finite advantage or return would train on NaN: the trainer stops the
  run, or skips that step (`on_nonfinite`), naming the rows.
- A step whose advantages are all zero has nothing to learn: the KL and entropy terms alone, scaled up
  to a full step by Adam, move the policy away from what it had learned (`skip_zero_advantage_steps`).

Pure numpy/torch: no verl import.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from verl_memagent.algo.sample_key import SampleKey


@dataclass(frozen=True)
class UpdatePlan:
    """`order[i]` is the batch row the update receives at position i; positions split as verl splits them."""

    order: np.ndarray  # (rows,) int64, a permutation of the batch's rows
    dp_size: int
    rows_per_step: int  # rows of one optimizer step on one rank
    micro_batch_size: int | None  # None with dynamic batch sizes: micro-batches are then unknown here

    @property
    def steps(self) -> int:
        """Optimizer steps the update takes."""
        return len(self.order) // (self.dp_size * self.rows_per_step)

    def _grid(self) -> np.ndarray:
        return self.order.reshape(self.dp_size, self.steps, self.rows_per_step)

    def step_rows(self, step: int) -> np.ndarray:
        """Batch rows of optimizer step `step` on every rank."""
        return self._grid()[:, step].reshape(-1)

    def position(self, row: int) -> tuple[int, int, int | None]:
        """(rank, optimizer step, micro-batch within the step) at which batch row `row` is trained."""
        at = int(np.flatnonzero(self.order == row)[0])
        rank, rest = divmod(at, self.steps * self.rows_per_step)
        step, offset = divmod(rest, self.rows_per_step)
        return rank, step, None if self.micro_batch_size is None else offset // self.micro_batch_size

    def keeping(self, steps: Sequence[int]) -> np.ndarray:
        """Batch rows of `steps` only, in the order that keeps each rank's chunk and step intact."""
        return self._grid()[:, sorted(steps)].reshape(-1)


def plan_update(
    is_padding: Sequence[bool],
    data_order: Sequence[int],
    lengths: Sequence[int],
    dp_size: int,
    rows_per_step: int,
    micro_batch_size: int | None,
    spread_padding: bool,
) -> UpdatePlan:
    """The split of a padded batch into optimizer steps, and of each step over the ranks.

    `data_order[i]` ranks row i in the data's order (padding rows' values are not read), `lengths[i]`
    its tokens. Real rows fill the steps in that order: consecutively, each step full but the last
    (verl's and the released count), or with `spread_padding` as evenly as they go, every step holding
    as many real rows as the others give or take one (a fixed number of steps never ends in a step of
    one row, or of padding alone). Padding fills each step up. Each step's rows are then dealt over
    the ranks, the longest first to the rank with the fewest tokens, so that the ranks of a step
    finish together; a rank's rows keep the data order.
    """
    padding = np.asarray(is_padding, dtype=bool)
    rows = padding.size
    if rows_per_step < 1 or rows % (dp_size * rows_per_step):
        raise ValueError(f"{rows} rows do not split into steps of {rows_per_step} rows on {dp_size} ranks")
    if micro_batch_size is not None and rows_per_step % micro_batch_size:
        raise ValueError(f"{rows_per_step} rows per step do not split into micro-batches of {micro_batch_size}")
    steps, per_step = rows // (dp_size * rows_per_step), dp_size * rows_per_step
    real = np.flatnonzero(~padding)
    real = real[np.argsort(np.asarray(data_order)[real], kind="stable")]
    if spread_padding:
        real_per_step = np.full(steps, real.size // steps) + (np.arange(steps) < real.size % steps)
    else:
        real_per_step = np.clip(real.size - per_step * np.arange(steps), 0, per_step)
    members = np.split(real, np.cumsum(real_per_step)[:-1])
    fill = np.split(np.flatnonzero(padding), np.cumsum(per_step - real_per_step)[:-1])
    lengths = np.asarray(lengths)
    grid = np.stack([_deal(np.concatenate(part), lengths, dp_size) for part in zip(members, fill, strict=True)])
    order = grid.transpose(1, 0, 2).reshape(-1)  # (step, rank, row) -> rank-major, as verl's dispatch splits
    return UpdatePlan(order=order, dp_size=dp_size, rows_per_step=rows_per_step, micro_batch_size=micro_batch_size)


def data_order(keys: Sequence[str], is_padding: Sequence[bool], prompt_index: Sequence[int]) -> np.ndarray:
    """Each row's rank in the data's order: its prompt (dataset `index`, then verl's uid), its
    trajectory (session) and its turn, from verl's sample keys (`SampleKey`). Padding rows
    (whose `prompt_index` is not read) rank after every real row."""
    ranked = sorted(
        (int(prompt_index[row]), *SampleKey.parse(key), row)
        for row, (key, pad) in enumerate(zip(keys, is_padding, strict=True))
        if not pad
    )
    order = np.empty(len(keys), dtype=np.int64)
    order[[row for *_, row in ranked]] = np.arange(len(ranked))
    order[np.asarray(is_padding, dtype=bool)] = np.arange(len(ranked), len(keys))
    return order


def _deal(step_rows: np.ndarray, lengths: np.ndarray, dp_size: int) -> np.ndarray:
    """(dp_size, rows per rank): the step's rows over the ranks, longest first to the least loaded rank
    with room; each rank's rows in their given order."""
    capacity = step_rows.size // dp_size
    load, taken = np.zeros(dp_size), [[] for _ in range(dp_size)]
    for at in np.argsort(-lengths[step_rows], kind="stable"):
        rank = min((r for r in range(dp_size) if len(taken[r]) < capacity), key=lambda r: (load[r], r))
        taken[rank].append(at)
        load[rank] += lengths[step_rows[at]]
    return np.stack([step_rows[sorted(positions)] for positions in taken])


@dataclass(frozen=True)
class StepProblem:
    """Why optimizer step `step` of an update must not run as it is: `rows` are batch rows."""

    step: int
    reason: str  # "no loss token", "zero advantages", or "<field> not finite"
    rows: np.ndarray


def empty_steps(plan: UpdatePlan, loss_mask: torch.Tensor) -> list[StepProblem]:
    """Steps none of whose rows has a loss token. `loss_mask`: (rows, response_length)."""
    tokens = loss_mask.bool().any(-1).numpy()
    return [
        StepProblem(step, "no loss token", rows)
        for step in range(plan.steps)
        if not tokens[rows := plan.step_rows(step)].any()
    ]


def nonfinite_steps(plan: UpdatePlan, loss_mask: torch.Tensor, fields: dict[str, torch.Tensor]) -> list[StepProblem]:
    """Steps with a NaN or infinite value of a field at a loss token; `rows` are the rows holding one.

    Fields are (rows, response_length) tensors; values outside the mask are never trained on.
    """
    mask = loss_mask.bool()
    problems = []
    for name, values in fields.items():
        bad = (~torch.isfinite(values) & mask).any(-1).numpy()
        for step in range(plan.steps):
            rows = plan.step_rows(step)
            if bad[rows].any():
                problems.append(StepProblem(step, f"{name} not finite", rows[bad[rows]]))
    return problems


def zero_advantage_steps(plan: UpdatePlan, loss_mask: torch.Tensor, advantages: torch.Tensor) -> list[StepProblem]:
    """Steps whose advantages are exactly zero at every loss token (steps without tokens included)."""
    signal = ((advantages != 0) & loss_mask.bool()).any(-1).numpy()
    return [
        StepProblem(step, "zero advantages", rows)
        for step in range(plan.steps)
        if not signal[rows := plan.step_rows(step)].any()
    ]


def describe(problem: StepProblem, plan: UpdatePlan, keys: Sequence[str], what: str, limit: int = 4) -> str:
    """One line naming the update, the optimizer step, and the first rows with their rank and micro-batch."""
    shown = []
    for row in problem.rows[:limit]:
        rank, _, micro = plan.position(int(row))
        where = f"rank {rank}" + ("" if micro is None else f", micro-batch {micro}")
        shown.append(f"{keys[row]} ({where})")
    more = f" and {len(problem.rows) - limit} more" if len(problem.rows) > limit else ""
    return (
        f"{what}, optimizer step {problem.step + 1} of {plan.steps}: {problem.reason} "
        f"in {len(problem.rows)} rows: {', '.join(shown)}{more}"
    )
