"""The optimizer steps of an actor or critic update, planned and checked by the trainer: verl's update
runs on the steps of `update_plan` that have something to learn, checked before the workers see them
(non-finite or zero advantages, steps without a loss token) and their losses checked after.

The number of optimizer steps per training step can be fixed by configuration
(`algorithm.multi_context.fixed_optimizer_steps`): verl sizes a PPO mini-batch in samples
(`ppo_mini_batch_size * rollout.n`), so trajectories with K turns would make K times the steps.
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import transfer_queue as tq
from omegaconf import DictConfig, OmegaConf, open_dict
from transfer_queue import KVBatchMeta
from verl.protocol import DataProtoFuture

from verl_memagent.algo.config import GRPO, MultiContextConfig
from verl_memagent.algo.estimators import TrajectoryLayout, rows_off_their_trajectory
from verl_memagent.algo.update_plan import (
    UpdatePlan,
    data_order,
    describe,
    empty_steps,
    nonfinite_steps,
    plan_update,
    zero_advantage_steps,
)

logger = logging.getLogger(__name__)


def check_trajectory_advantages(layout: TrajectoryLayout, advantages, mask, keys: Sequence[str]) -> None:
    """Every row the actor trains on carries its trajectory's one advantage (`multi_context_grpo` without
    `turn_discount`), read back by sample key after verl's advantage step and reordering."""
    rows = rows_off_their_trajectory(layout, advantages, mask)
    if rows.numel():
        shown = ", ".join(keys[row] for row in rows[:4].tolist())
        raise ValueError(
            f"{rows.numel()} rows do not carry their trajectory's advantage ({shown}): the advantages were "
            "written to other rows than they were computed for"
        )


class UpdateStepsMixin:
    """verl's actor and critic updates on planned, checked optimizer steps (module docstring); put in front
    of one of verl's V1 trainers (through `trainer.MultiContextTrainerMixin`)."""

    @cached_property
    def multi_context(self) -> MultiContextConfig:
        """`algorithm.multi_context`, parsed and checked once."""
        return MultiContextConfig.from_algorithm(self.config.algorithm)

    def _advantages_per_trajectory(self) -> bool:
        """One advantage per trajectory on all its rows: ours GRPO without a turn discount or a broken-turn
        penalty (either gives turns of one trajectory different advantages, by design)."""
        options = self.multi_context
        return (
            self.config.algorithm.adv_estimator == GRPO
            and options.turn_discount == 1.0
            and options.broken_turn_penalty == 0.0
        )

    def _optimizer_steps(self, section: DictConfig) -> int:
        """Mini-batches per update: the prompts of one local step over the configured mini-batch."""
        prompts = self.config.data.train_batch_size // self.parameter_sync_step
        if prompts % section.ppo_mini_batch_size:
            raise ValueError(
                f"ppo_mini_batch_size ({section.ppo_mini_batch_size}) must divide the prompts of one update "
                f"({prompts} = data.train_batch_size / parameter_sync_step)"
            )
        return prompts // section.ppo_mini_batch_size

    def _sample_unit(self, section: DictConfig, dp_size: int) -> int:
        """A mini-batch must split evenly over dp ranks and micro-batches, and be a whole number of
        `rollout.n` (verl multiplies ppo_mini_batch_size by n)."""
        micro = 1 if section.get("use_dynamic_bsz", False) else section.get("ppo_micro_batch_size_per_gpu") or 1
        return math.lcm(self.config.actor_rollout_ref.rollout.n, dp_size * micro)

    def _updated_sections(self) -> list[str]:
        return ["actor_rollout_ref.actor", "critic"] if self.use_critic else ["actor_rollout_ref.actor"]

    def _get_required_batch_multiple(self, dp_size: int) -> int:
        if not self.multi_context.fixed_optimizer_steps:
            return super()._get_required_batch_multiple(dp_size)
        sections = [OmegaConf.select(self.config, path) for path in self._updated_sections()]
        return math.lcm(*(self._optimizer_steps(s) * self._sample_unit(s, dp_size) for s in sections))

    def _samples_per_step(self, section: DictConfig, samples: int) -> int:
        """Samples of one optimizer step: verl's `ppo_mini_batch_size * n`, or with a fixed number of
        steps the update's samples over that number."""
        if self.multi_context.fixed_optimizer_steps:
            return samples // self._optimizer_steps(section)
        return section.ppo_mini_batch_size * self.config.actor_rollout_ref.rollout.n

    @contextmanager
    def _mini_batches_of(self, section: str, per_step: int) -> Iterator[None]:
        """While the block runs, `self.config` is a copy whose `section.ppo_mini_batch_size` makes
        mini-batches of `per_step` samples; the config verl and the other components share is never changed."""
        shared, sized = self.config, copy.deepcopy(self.config)
        with open_dict(sized):
            OmegaConf.select(sized, section).ppo_mini_batch_size = per_step // sized.actor_rollout_ref.rollout.n
        self.config = sized
        try:
            yield
        finally:
            self.config = shared

    def _dp_size(self, worker_group, mesh: str) -> int:
        """Data-parallel ranks the worker group splits a batch over, as verl's dispatch reads them."""
        if mesh not in worker_group._dispatch_info:
            worker_group._dispatch_info[mesh] = worker_group._query_dispatch_info(mesh)
        return max(worker_group._dispatch_info[mesh]) + 1

    # verl reads the mini-batch size from `self.config` on each update; it counts samples, not prompts
    def _update_actor(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        role = _Role("actor", "actor_rollout_ref.actor", self.actor_rollout_wg, "actor", "update_actor", ["advantages"])
        return self._planned_update(role, batch, metrics, super()._update_actor)

    def _update_critic(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        role = _Role("critic", "critic", self.critic_wg, "train", "train_mini_batch", ["returns"])
        return self._planned_update(role, batch, metrics, super()._update_critic)

    def _planned_update(self, role: _Role, batch: KVBatchMeta, metrics: dict, update) -> KVBatchMeta:
        """verl's update, on the optimizer steps that have something to learn (`update_plan`): checked
        before the workers see them, and their losses checked after."""
        section = OmegaConf.select(self.config, role.section)
        if section.get("shuffle", False):
            raise ValueError(
                f"{role.section}.shuffle: true draws each optimizer step's rows at random inside verl's workers, "
                f"so the trainer cannot check them before the update: set {role.section}.shuffle=false"
            )
        per_step = self._samples_per_step(section, len(batch))
        dp_size = self._dp_size(role.group, role.mesh)
        micro = None if section.get("use_dynamic_bsz", False) else section.ppo_micro_batch_size_per_gpu
        padding = [tag.get("is_padding", False) for tag in batch.tags]
        plan = plan_update(
            padding,
            self._data_order(batch, padding),
            [tag["seq_len"] for tag in batch.tags],
            dp_size,
            per_step // dp_size,
            micro,
            spread_padding=self.multi_context.fixed_optimizer_steps,
        )
        data = tq.kv_batch_get(
            keys=batch.keys, partition_id=batch.partition_id, select_fields=["response_mask", *role.fields]
        ).to_padded_tensor()
        mask = data["response_mask"]
        what = f"step {self.global_steps}, {role.name} update"
        if role.name == "actor" and self._advantages_per_trajectory():
            layout = TrajectoryLayout.from_keys(batch.keys, padding)
            check_trajectory_advantages(layout, data["advantages"], mask, batch.keys)

        dropped = {p.step: p for p in empty_steps(plan, mask)}
        for problem in nonfinite_steps(plan, mask, {name: data[name] for name in role.fields}):
            message = describe(problem, plan, batch.keys, what)
            if self.multi_context.on_nonfinite == "stop":
                raise NonFiniteUpdateError(f"{message}; set +algorithm.multi_context.on_nonfinite=skip to skip it")
            logger.warning("skipped %s", message)
            dropped.setdefault(problem.step, problem)
        if role.name == "actor" and self.multi_context.skip_zero_advantage_steps:
            for problem in zero_advantage_steps(plan, mask, data["advantages"]):
                dropped.setdefault(problem.step, problem)
        reasons = [p.reason for p in dropped.values()]
        metrics[f"multi_context/{role.name}_steps"] = float(plan.steps - len(dropped))
        metrics[f"multi_context/{role.name}_skipped_empty"] = float(reasons.count("no loss token"))
        metrics[f"multi_context/{role.name}_skipped_zero_advantage"] = float(reasons.count("zero advantages"))
        metrics[f"multi_context/{role.name}_skipped_nonfinite"] = float(sum(r.endswith("not finite") for r in reasons))
        kept = [step for step in range(plan.steps) if step not in dropped]
        if not kept:
            return batch
        steps = batch.select_keys([batch.keys[row] for row in plan.keeping(kept)])
        with self._mini_batches_of(role.section, per_step), _outputs_of(role.group, role.method) as outputs:
            update(steps, metrics)
        self._check_losses(role, outputs, plan, kept, batch.keys, what)
        return batch

    def _data_order(self, batch: KVBatchMeta, padding: list[bool]) -> np.ndarray:
        """The rows' rank in the data's order (`update_plan.data_order`), from their sample keys and the
        dataset `index` of their prompt."""
        real = [key for key, pad in zip(batch.keys, padding, strict=True) if not pad]
        data = tq.kv_batch_get(keys=real, partition_id=batch.partition_id, select_fields=["index"])
        index = iter(list(data["index"]))  # a tensor, or TransferQueue's list of a non-tensor column
        return data_order(batch.keys, padding, [0 if pad else int(next(index)) for pad in padding])

    def _check_losses(self, role: _Role, outputs: list, plan: UpdatePlan, kept: list[int], keys, what: str) -> None:
        """A loss the workers report as NaN or infinite came from the model's log-probs or the critic's
        values (advantages, returns and loss tokens were checked before): stop, or with
        `on_nonfinite=skip` log it (verl's engine takes no optimizer step on a non-finite gradient)."""
        for output in outputs:
            output = output.get() if isinstance(output, DataProtoFuture) else output
            for name, values in output["metrics"].items():
                if not ("loss" in name or name == "grad_norm"):
                    continue
                values = np.asarray(getattr(values, "values", values), dtype=float).reshape(-1)
                if np.isfinite(values).all():
                    continue
                at = int(np.flatnonzero(~np.isfinite(values))[0])
                where = ""
                if values.size % len(kept) == 0:  # one value per optimizer step (and epoch)
                    step = kept[at % len(kept)]
                    rows = plan.step_rows(step)
                    shown = ", ".join(keys[row] for row in rows[:4]) + (" ..." if len(rows) > 4 else "")
                    where = f", optimizer step {step + 1} of {plan.steps} (rows {shown})"
                name = name if name.startswith(f"{role.name}/") else f"{role.name}/{name}"
                message = f"{what}{where}: the workers report {name} = {values[at]}"
                if self.multi_context.on_nonfinite == "stop":
                    raise NonFiniteUpdateError(message)
                logger.warning("%s; verl's engine skips an optimizer step whose gradient is not finite", message)


class NonFiniteUpdateError(RuntimeError):
    """An update would train on, or reported, a NaN or infinite value (`algorithm.multi_context.on_nonfinite`)."""


@dataclass(frozen=True)
class _Role:
    """What the trainer checks of one role's update, and where verl's update of it goes."""

    name: str  # actor or critic
    section: str  # its config section
    group: object  # its worker group
    mesh: str  # the dispatch mesh verl splits its batch by
    method: str  # the worker group's method that receives the update
    fields: list[str]  # response-shaped fields checked before the update (the rest show in its losses)


@contextmanager
def _outputs_of(group, method: str) -> Iterator[list]:
    """Collect what `group.method` returns while the block runs (verl's update reads it and drops it)."""
    outputs: list = []
    call = getattr(group, method)
    own = method in vars(group)  # verl's worker groups bind their remote methods per instance

    def recording(*args, **kwargs):
        outputs.append(result := call(*args, **kwargs))
        return result

    setattr(group, method, recording)
    try:
        yield outputs
    finally:
        if own:
            setattr(group, method, call)
        else:
            delattr(group, method)
