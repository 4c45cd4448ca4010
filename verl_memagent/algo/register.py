"""What verl sees of `algo`: the estimators `multi_context_grpo` and `multi_context_gae`, their options,
and the trainers `memagent_sync`, `memagent_colocate_async`, `memagent_separate_async`.

The plugin imports this module on every `import verl`, so it stays light: verl's estimator registry
(core_algos) and trainer registry (the V1 trainer package, which pulls in Ray workers, TransferQueue
and platform detection) are filled when verl itself first imports them, never earlier.

verl's own trainer calls an estimator with the prompt uid only; these estimators also need each
row's trajectory and turn (`layout`), which only our trainers pass. Called without it they fail
with a message saying which trainer to select.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

import torch

from verl_memagent.import_hooks import when_imported

if TYPE_CHECKING:  # the estimators (pandas, pyarrow) load when verl first calls one, not on `import verl`
    from verl_memagent.algo.estimators import Advantages, TrajectoryLayout

GRPO, GAE = "multi_context_grpo", "multi_context_gae"
TRAINER_MODES = ("sync", "colocate_async", "separate_async")
TRAINERS = tuple(f"memagent_{mode}" for mode in TRAINER_MODES)


@dataclass(frozen=True)
class MultiContextConfig:
    """`algorithm.multi_context` (add with `+algorithm.multi_context.<key>=...` on the command line)."""

    #: scale each trajectory's advantage by mean_turns / its_turns (GRPO), see docs/estimators.md
    weight_trajectories: bool = False
    #: give prompt groups whose rewards are all equal exactly zero advantage, and count them (GRPO)
    drop_zero_variance_groups: bool = False
    #: gamma in gamma^(T - t): earlier turns get a discounted share of the trajectory advantage (GRPO)
    turn_discount: float = 1.0
    #: optimizer steps per training step = train_batch_size / ppo_mini_batch_size, whatever the turn count
    fixed_optimizer_steps: bool = True

    @classmethod
    def from_algorithm(cls, algorithm) -> MultiContextConfig:
        section = dict((algorithm or {}).get("multi_context", None) or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(section) - known)
        if unknown:
            raise ValueError(f"algorithm.multi_context has unknown keys {unknown}; known keys: {sorted(known)}")
        config = cls(**section)
        if not 0.0 < config.turn_discount <= 1.0:
            raise ValueError(f"algorithm.multi_context.turn_discount must be in (0, 1], got {config.turn_discount}")
        return config


def _require_layout(name: str, layout: TrajectoryLayout | None) -> TrajectoryLayout:
    if layout is None:
        raise ValueError(
            f"algorithm.adv_estimator={name} needs each sample's trajectory and turn, which verl's own "
            f"trainers do not pass: set trainer.v1.trainer_mode to one of {list(TRAINERS)}"
        )
    return layout


def grpo_estimator(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    config=None,
    layout: TrajectoryLayout | None = None,
    **_: object,
) -> Advantages:
    """verl-registered `multi_context_grpo`; options from `algorithm` (norm_adv_by_std_in_grpo, multi_context)."""
    from verl_memagent.algo.estimators import multi_context_grpo

    options = MultiContextConfig.from_algorithm(config)
    return multi_context_grpo(
        token_level_rewards,
        response_mask,
        _require_layout(GRPO, layout),
        norm_by_std=(config or {}).get("norm_adv_by_std_in_grpo", True),
        weight_trajectories=options.weight_trajectories,
        drop_zero_variance=options.drop_zero_variance_groups,
        turn_discount=options.turn_discount,
    )


def gae_estimator(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    config=None,
    layout: TrajectoryLayout | None = None,
    token_level_scores: torch.Tensor | None = None,
    values: torch.Tensor | None = None,
    **_: object,
) -> Advantages:
    """verl-registered `multi_context_gae`; gamma and lam from `algorithm`, values from the critic."""
    from verl_memagent.algo.estimators import multi_context_gae

    layout = _require_layout(GAE, layout)
    if values is None:
        raise ValueError(f"algorithm.adv_estimator={GAE} needs critic values: set critic.enable=true")
    config = config or {}
    return multi_context_gae(
        token_level_rewards if token_level_scores is None else token_level_scores,
        token_level_rewards,
        values,
        response_mask,
        layout,
        gamma=float(config.get("gamma", 1.0)),
        lam=float(config.get("lam", 1.0)),
    )


def _register_estimators(core_algos) -> None:
    core_algos.register_adv_est(GRPO)(grpo_estimator)
    core_algos.register_adv_est(GAE)(gae_estimator)


def _register_trainers(_v1) -> None:
    importlib.import_module("verl_memagent.algo.trainer")


when_imported("verl.trainer.ppo.core_algos", _register_estimators)
when_imported("verl.trainer.ppo.v1", _register_trainers)
