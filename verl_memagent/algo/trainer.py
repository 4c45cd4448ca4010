"""verl V1 trainers that give the multi-context estimators each sample's trajectory and turn.

verl stores every output of an agent loop under the key `{uid}_{session_id}_{index}`: the key alone
names the trajectory (`{uid}_{session_id}`), the turn (`index`, the output's position in the list
`run()` returned) and the prompt group (`uid`). verl's `_compute_advantage` drops the keys before
calling an estimator; ours keeps them. Everything else is verl's: the trainers subclass verl's three
V1 trainers and are registered with `register_trainer`, selected by `trainer.v1.trainer_mode`.

Two more overrides keep the number of optimizer steps per training step fixed by configuration
(`algorithm.multi_context.fixed_optimizer_steps`): verl sizes a PPO mini-batch in samples
(`ppo_mini_batch_size * rollout.n`), so trajectories with K turns would make K times the steps.

`AgentMetricsMixin` adds what the agent did (searches, finish reasons, memory, ...) to verl's metrics
of every training step and validation.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np
import transfer_queue as tq
from omegaconf import DictConfig, open_dict
from tensordict import TensorDict
from transfer_queue import KVBatchMeta
from verl.protocol import DataProto
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.ray_trainer import apply_kl_penalty
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_colocate_async import PPOTrainerColocateAsync
from verl.trainer.ppo.v1.trainer_separate_async import PPOTrainerSeparateAsync
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.workers.utils.padding import response_to_nested

from verl_memagent.algo.agent_metrics import agent_metrics, agent_metrics_by_source
from verl_memagent.algo.estimators import TrajectoryLayout
from verl_memagent.algo.register import GAE, GRPO, MultiContextConfig

ESTIMATORS = (GRPO, GAE)
FIELDS = ["response_mask", "rm_scores", "rollout_log_probs", "old_log_probs", "ref_log_prob", "values", "extra_fields"]


def check_agent_ids(layout: TrajectoryLayout, extra_fields: Sequence[dict]) -> None:
    """The agent loops tag each output with `trajectory_id` and `turn_index`; they must tell the same
    story as verl's keys (one trajectory per session, outputs returned in turn order)."""
    valid = layout.valid.numpy()
    tagged = [(i, f) for i, f in enumerate(extra_fields) if valid[i] and isinstance(f, dict) and "trajectory_id" in f]
    if not tagged:
        return
    rows = np.array([i for i, _ in tagged])
    ids = np.unique(np.array([str(f["trajectory_id"]) for _, f in tagged]), return_inverse=True)[1]
    by_key = layout.trajectory.numpy()[rows]
    pairs = np.unique(np.stack([by_key, ids]), axis=1).shape[1]
    if not pairs == np.unique(by_key).size == np.unique(ids).size:
        raise ValueError(
            "extra_fields.trajectory_id does not match verl's sample keys {uid}_{session_id}_{index}: "
            "an agent loop's run() must return exactly the outputs of one trajectory"
        )
    turns = np.array([int(f.get("turn_index", -1)) for _, f in tagged])
    if not np.array_equal(turns, layout.turn.numpy()[rows]):
        raise ValueError("extra_fields.turn_index differs from the output's position: run() must return turns in order")


def compute_multi_context_advantages(
    data: TensorDict,
    keys: Sequence[str],
    tags: Sequence[dict],
    config: DictConfig,
    kl_ctrl: core_algos.AdaptiveKLController | None = None,
) -> tuple[TensorDict, dict[str, float]]:
    """Advantages for one batch as TransferQueue holds it (`FIELDS`, nested), in `keys` order.

    Returns the nested fields to write back and the metrics. Mirrors the steps of verl's
    `PPOTrainer._compute_advantage` (in-reward KL, rollout correction) around our estimator.
    """
    algorithm = config.algorithm
    layout = TrajectoryLayout.from_keys(keys, [tag.get("is_padding", False) for tag in tags])
    if "extra_fields" in data.keys():
        check_agent_ids(layout, list(data["extra_fields"]))
    nested_mask = data["response_mask"]
    tensors = [key for key in FIELDS if key != "extra_fields" and key in data.keys()]
    batch = DataProto(batch=data.select(*tensors).to_padded_tensor())
    batch.batch["token_level_scores"] = batch.batch["rm_scores"]

    metrics: dict[str, float] = {}
    if algorithm.use_kl_in_reward:
        batch, kl_metrics = apply_kl_penalty(batch, kl_ctrl=kl_ctrl, kl_penalty=algorithm.kl_penalty)
        metrics.update(kl_metrics)
    else:
        batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]

    rollout_corr = algorithm.get("rollout_correction", None)
    correction = rollout_corr is not None and "rollout_log_probs" in batch.batch and not rollout_corr.get("bypass_mode")
    if correction:
        batch, is_metrics = compute_rollout_correction_and_add_to_batch(batch, rollout_corr)
        metrics.update(is_metrics)

    estimator = core_algos.get_adv_estimator_fn(algorithm.adv_estimator)
    result = estimator(
        token_level_rewards=batch.batch["token_level_rewards"],
        response_mask=batch.batch["response_mask"],
        config=algorithm,
        layout=layout,
        token_level_scores=batch.batch["token_level_scores"],
        values=batch.batch.get("values", None),
    )
    metrics.update(result.metrics)

    out = {"advantages": result.advantages, "returns": result.returns}
    if algorithm.use_kl_in_reward:
        out["token_level_rewards"] = batch.batch["token_level_rewards"]
    if correction:
        out["response_mask"] = batch.batch["response_mask"]
        if "rollout_is_weights" in batch.batch:
            out["rollout_is_weights"] = batch.batch["rollout_is_weights"]
    nested = {name: response_to_nested(value, nested_mask) for name, value in out.items()}
    return TensorDict(nested, batch_size=len(keys)), metrics


class MultiContextTrainerMixin:
    """Put in front of one of verl's V1 trainers; `base_mode` is that trainer's `trainer_mode`."""

    base_mode: str

    @property
    def trainer_mode(self) -> str:
        # verl assigns `config.trainer.v1.trainer_mode` (our registered name) here and compares it with
        # "sync" to choose the replay buffer and refill rules; they must see the mode we extend.
        return self.base_mode

    @trainer_mode.setter
    def trainer_mode(self, _registered_name: str) -> None:
        pass

    # ---- advantages ----------------------------------------------------------------------------

    def _compute_advantage(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        if self.config.algorithm.adv_estimator not in ESTIMATORS:
            return super()._compute_advantage(batch, metrics)
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=FIELDS)
        output, adv_metrics = compute_multi_context_advantages(
            data, batch.keys, batch.tags, self.config, getattr(self, "kl_ctrl_in_reward", None)
        )
        metrics.update(adv_metrics)
        return tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=output)

    # ---- a fixed number of optimizer steps -------------------------------------------------------

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

    def _updated_sections(self) -> list[DictConfig]:
        sections = [self.config.actor_rollout_ref.actor]
        if self.use_critic:
            sections.append(self.config.critic)
        return sections

    def _fixed_steps(self) -> bool:
        return MultiContextConfig.from_algorithm(self.config.algorithm).fixed_optimizer_steps

    def _get_required_batch_multiple(self, dp_size: int) -> int:
        if not self._fixed_steps():
            return super()._get_required_batch_multiple(dp_size)
        return math.lcm(*(self._optimizer_steps(s) * self._sample_unit(s, dp_size) for s in self._updated_sections()))

    @contextmanager
    def _mini_batch_for(self, section: DictConfig, batch_size: int) -> Iterator[None]:
        """Size verl's mini-batch so that this padded batch makes exactly the configured steps."""
        if not self._fixed_steps():
            yield
            return
        configured = section.ppo_mini_batch_size
        per_step = batch_size // self._optimizer_steps(section)
        with open_dict(section):
            section.ppo_mini_batch_size = per_step // self.config.actor_rollout_ref.rollout.n
        try:
            yield
        finally:
            with open_dict(section):
                section.ppo_mini_batch_size = configured

    def _update_actor(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        with self._mini_batch_for(self.config.actor_rollout_ref.actor, len(batch)):
            return super()._update_actor(batch, metrics)

    def _update_critic(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        with self._mini_batch_for(self.config.critic, len(batch)):
            return super()._update_critic(batch, metrics)


class AgentMetricsMixin:
    """Adds what the agent did (`verl_memagent.algo.agent_metrics`) to verl's metrics of every training
    step and validation. Reads `extra_fields` from TransferQueue before verl clears the batch."""

    def _compute_metrics(self, batch: KVBatchMeta, metrics, timing_raw, global_steps, epoch):
        super()._compute_metrics(batch, metrics, timing_raw, global_steps, epoch)
        keys = [key for key, tag in zip(batch.keys, batch.tags, strict=True) if not tag.get("is_padding", False)]
        if keys:
            data = tq.kv_batch_get(keys=keys, partition_id=batch.partition_id, select_fields=["extra_fields"])
            metrics.update(agent_metrics(list(data["extra_fields"])))

    def _validate(self) -> dict[str, float]:
        """verl's validation; each validation batch's fields are read as the replay buffer hands it out."""
        fields: list[dict] = []
        sources: list[str] = []
        sample = self.replay_buffer.sample

        def sample_and_read(*args, **kwargs):
            batch, sample_metrics = sample(*args, **kwargs)
            if batch.keys:
                data = tq.kv_batch_get(
                    keys=batch.keys, partition_id=batch.partition_id, select_fields=["extra_fields", "data_source"]
                )
                fields.extend(data["extra_fields"])
                sources.extend(data["data_source"])
            return batch, sample_metrics

        self.replay_buffer.sample = sample_and_read
        try:
            val_metrics = super()._validate()
        finally:
            del self.replay_buffer.sample
        return {**val_metrics, **agent_metrics_by_source(fields, sources)}


@register_trainer("memagent_sync")
class MultiContextTrainerSync(AgentMetricsMixin, MultiContextTrainerMixin, PPOTrainerSync):
    base_mode = "sync"


@register_trainer("memagent_colocate_async")
class MultiContextTrainerColocateAsync(AgentMetricsMixin, MultiContextTrainerMixin, PPOTrainerColocateAsync):
    base_mode = "colocate_async"


@register_trainer("memagent_separate_async")
class MultiContextTrainerSeparateAsync(AgentMetricsMixin, MultiContextTrainerMixin, PPOTrainerSeparateAsync):
    base_mode = "separate_async"
