"""Names and options shared by the estimators' verl adapters and the trainers that feed them."""

from __future__ import annotations

from dataclasses import dataclass

from verl_memagent.config_sections import require_choice, typed_section

GRPO, GAE = "multi_context_grpo", "multi_context_gae"
TRAINER_MODES = ("sync", "colocate_async", "separate_async")
TRAINERS = tuple(f"memagent_{mode}" for mode in TRAINER_MODES)
ON_NONFINITE = ("stop", "skip")


@dataclass(frozen=True)
class MultiContextConfig:
    """`algorithm.multi_context` (add with `+algorithm.multi_context.<key>=...` on the command line)."""

    #: scale each trajectory's advantage by mean_turns / its_turns (GRPO), see docs/estimators.md
    weight_trajectories: bool = False
    #: gamma in gamma^(T - t): earlier turns get a discounted share of the trajectory advantage (GRPO)
    turn_discount: float = 1.0
    #: optimizer steps per training step = train_batch_size / ppo_mini_batch_size, whatever the turn count;
    #: off (verl's and the released MemSearcher's): ppo_mini_batch_size x rollout.n samples per step
    fixed_optimizer_steps: bool = False
    #: a NaN or infinite advantage, return or loss: "stop" the run, or "skip" that optimizer step
    on_nonfinite: str = "stop"
    #: do not take an actor optimizer step whose advantages are all zero (nothing to learn from)
    skip_zero_advantage_steps: bool = False
    #: subtracted from the advantage of the turn that broke a trajectory's format (malformed output, a
    #: missing memory or state, a penalised overflow), on that turn's tokens alone; 0 (the released
    #: trajectory-level credit): the turn shares its trajectory's advantage as every other turn
    broken_turn_penalty: float = 0.0
    #: with the penalty: compare each turn with its prompt group's turns at the same depth, GRPO's way, so a
    #: well-formed turn where its siblings broke gains (`estimators.broken_turn_shift`)
    broken_turn_baseline: bool = False

    @classmethod
    def from_algorithm(cls, algorithm) -> MultiContextConfig:
        """The section of verl's `algorithm` config, typed and checked (`config_sections.typed_section`)."""
        config = typed_section("algorithm.multi_context", (algorithm or {}).get("multi_context", None) or {}, cls)
        if not 0.0 < config.turn_discount <= 1.0:
            raise ValueError(f"algorithm.multi_context.turn_discount must be in (0, 1], got {config.turn_discount}")
        if not config.broken_turn_penalty >= 0.0:
            raise ValueError(
                f"algorithm.multi_context.broken_turn_penalty must be >= 0 (it is subtracted), got "
                f"{config.broken_turn_penalty}"
            )
        if config.broken_turn_baseline and not config.broken_turn_penalty:
            raise ValueError(
                "algorithm.multi_context.broken_turn_baseline compares broken turns at the penalty's scale: set "
                "algorithm.multi_context.broken_turn_penalty > 0 too"
            )
        require_choice("algorithm.multi_context.on_nonfinite", config.on_nonfinite, ON_NONFINITE)
        return config
