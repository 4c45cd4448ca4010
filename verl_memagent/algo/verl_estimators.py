"""The multi-context estimators as verl calls them, and the per-batch facts only our trainers know.

verl's `compute_advantage` calls a registered estimator with `token_level_rewards`, `response_mask`,
`config` (the `algorithm` section) and `index` (each row's prompt uid), and expects
`(advantages, returns)`. Ours also need each row's trajectory and turn, and GAE the critic's values
and the scores before verl's in-reward KL. Our trainers hold those in a `TrajectoryBatch` while
verl's own `_compute_advantage` runs (`providing`); the estimators read it and leave their metrics
in it. Called from any other trainer they fail with a message naming the trainers to select.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

import torch

from verl_memagent.algo.agent_metrics import finish_group
from verl_memagent.algo.config import GAE, GRPO, TRAINERS, MultiContextConfig
from verl_memagent.algo.estimators import TrajectoryLayout, broken_turn_shift, multi_context_grpo, shift_advantages
from verl_memagent.algo.gae import multi_context_gae
from verl_memagent.output_fields import OutputField

#: finish groups (`agent_metrics.FINISHES`) that one turn's output caused: that turn ended the trajectory
BROKEN_FINISHES = ("format_broken", "penalised")


@dataclass
class TrajectoryBatch:
    """What the trainer knows about the batch verl is computing advantages for, row for row."""

    layout: TrajectoryLayout
    options: MultiContextConfig
    values: torch.Tensor | None = None  # critic values, padded as verl pads the batch (GAE)
    token_level_scores: torch.Tensor | None = None  # the reward before in-reward KL, padded likewise (GAE)
    metrics: dict[str, float] = field(default_factory=dict)  # filled by the estimator
    broken_turns: torch.Tensor | None = None  # (rows,) bool: the turn that broke its trajectory (`broken_turn_rows`)

    def penalise(self, advantages: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
        """`advantages` with the broken turns' step-level credit (`broken_turn_shift`); unchanged at penalty 0."""
        options = self.options
        if options.broken_turn_penalty == 0.0:
            return advantages
        if self.broken_turns is None:
            raise ValueError(
                "algorithm.multi_context.broken_turn_penalty needs the agent loops' extra_fields "
                "(finish_reason, turn_index, num_contexts) in the batch: use the verl_memagent agent loops"
            )
        self.metrics["multi_context/broken_turns"] = float(self.broken_turns.sum())
        shift = broken_turn_shift(
            self.layout, self.broken_turns, options.broken_turn_penalty, options.broken_turn_baseline
        )
        return shift_advantages(advantages, response_mask, shift)


def broken_turn_rows(extra_fields: Sequence[Mapping | None]) -> torch.Tensor:
    """Each row: is it the final turn of a trajectory that ended on malformed output or a penalty
    (`BROKEN_FINISHES`)? Under every action rule that final turn is the one whose output broke it.
    Rows without the agents' fields (padding, other agent loops) are False."""

    def broke(fields_: Mapping | None) -> bool:
        if not isinstance(fields_, Mapping) or OutputField.FINISH_REASON not in fields_:
            return False
        final = fields_[OutputField.TURN_INDEX] == fields_[OutputField.NUM_CONTEXTS] - 1
        group = finish_group(fields_[OutputField.FINISH_REASON], bool(fields_.get(OutputField.PENALISED, False)))
        return final and group in BROKEN_FINISHES

    return torch.tensor([broke(f) for f in extra_fields], dtype=torch.bool)


_CURRENT: ContextVar[TrajectoryBatch | None] = ContextVar("multi_context_batch", default=None)


@contextmanager
def providing(batch: TrajectoryBatch) -> Iterator[TrajectoryBatch]:
    """Make `batch` what the estimators read until the block ends."""
    token = _CURRENT.set(batch)
    try:
        yield batch
    finally:
        _CURRENT.reset(token)


def _current(name: str, rows: int) -> TrajectoryBatch:
    batch = _CURRENT.get()
    if batch is None:
        raise ValueError(
            f"algorithm.adv_estimator={name} needs each sample's trajectory and turn, which verl's own "
            f"trainers do not pass: set trainer.v1.trainer_mode to one of {list(TRAINERS)}"
        )
    if batch.layout.trajectory.numel() != rows:
        raise ValueError(f"{name}: verl passed {rows} rows for a batch of {batch.layout.trajectory.numel()}")
    return batch


def grpo_estimator(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, config=None, **_: object):
    """verl-registered `multi_context_grpo`: `norm_adv_by_std_in_grpo` from `algorithm`, the rest from
    `algorithm.multi_context`."""
    batch = _current(GRPO, token_level_rewards.shape[0])
    result = multi_context_grpo(
        token_level_rewards,
        response_mask,
        batch.layout,
        norm_by_std=(config or {}).get("norm_adv_by_std_in_grpo", True),
        weight_trajectories=batch.options.weight_trajectories,
        turn_discount=batch.options.turn_discount,
    )
    batch.metrics.update(result.metrics)
    advantages = batch.penalise(result.advantages, response_mask)
    return advantages, advantages  # verl's GRPO: returns are the advantages


def gae_estimator(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, config=None, **_: object):
    """verl-registered `multi_context_gae`: gamma and lam from `algorithm`, values from the critic."""
    batch = _current(GAE, token_level_rewards.shape[0])
    if batch.values is None:
        raise ValueError(f"algorithm.adv_estimator={GAE} needs critic values: set critic.enable=true")
    config = config or {}
    scores = token_level_rewards if batch.token_level_scores is None else batch.token_level_scores
    result = multi_context_gae(
        scores,
        token_level_rewards,
        batch.values,
        response_mask,
        batch.layout,
        gamma=float(config.get("gamma", 1.0)),
        lam=float(config.get("lam", 1.0)),
    )
    batch.metrics.update(result.metrics)
    return batch.penalise(result.advantages, response_mask), result.returns
