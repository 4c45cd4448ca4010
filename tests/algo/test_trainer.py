"""The trainers as verl builds them from its own config: selection, mode semantics, optimizer steps."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
import ray
import torch
import transfer_queue as tq
import verl
from hydra import compose, initialize_config_dir
from tensordict import TensorDict
from transfer_queue import KVBatchMeta
from verl.protocol import DataProto, DataProtoFuture
from verl.trainer.ppo.ray_trainer import compute_advantage
from verl.trainer.ppo.v1 import get_trainer_cls
from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer, ReplayBufferAsync
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils import tensordict_utils as tu

from verl_memagent.algo.config import MultiContextConfig
from verl_memagent.algo.estimators import TrajectoryLayout
from verl_memagent.algo.trainer import MultiContextTrainerSync, check_agent_ids
from verl_memagent.algo.update_steps import NonFiniteUpdateError
from verl_memagent.cpu import GLOO_BACKEND_MODULE, check_checkpoint_engine


def verl_config(*overrides: str):
    """verl's own ppo_trainer.yaml, composed as `main_ppo` would with these command-line overrides."""
    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose("ppo_trainer", overrides=list(overrides))


BASE = [
    "trainer.v1.trainer_mode=memagent_sync",
    "algorithm.adv_estimator=multi_context_grpo",
    "data.train_batch_size=8",
    "actor_rollout_ref.rollout.n=2",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
]


class RecordingActorGroup:
    """Stands in for the FSDP actor worker group (GPU workers): records the keys and mini-batch size each
    update_actor call is given and the configured mini-batch size of the shared config meanwhile, and
    reports `losses` (per optimizer step) as verl's workers report theirs."""

    def __init__(self, shared_config, dp_size: int = 1, losses: list[float] | None = None):
        self.shared_config = shared_config
        self._dispatch_info = {"actor": list(range(dp_size))}
        self.losses = losses
        self.keys: list[list[str]] = []
        self.mini_batch_sizes: list[int] = []
        self.shared_sizes: list[int] = []

    def update_actor(self, batch: KVBatchMeta):
        self.keys.append(list(batch.keys))
        self.mini_batch_sizes.append(batch.extra_info["mini_batch_size"])
        self.shared_sizes.append(self.shared_config.actor_rollout_ref.actor.ppo_mini_batch_size)
        steps = len(batch) // batch.extra_info["mini_batch_size"]
        return {"metrics": {"mfu": 0.0, "pg_loss": self.losses or [0.0] * steps}}


class RecordingCriticGroup:
    """Stands in for the critic worker group: records the mini-batch size train_mini_batch is given."""

    def __init__(self, dp_size: int = 1):
        self._dispatch_info = {"train": list(range(dp_size))}
        self.mini_batch_sizes: list[int] = []

    def train_mini_batch(self, batch: KVBatchMeta):
        """As verl's (non-blocking): a future of the workers' TensorDict."""
        self.mini_batch_sizes.append(batch.extra_info["mini_batch_size"])
        output = tu.get_tensordict(tensor_dict={}, non_tensor_dict={"metrics": {"mfu": 0.0, "vf_loss": [0.1]}})
        return DataProtoFuture(collect_fn=None, futures=[ray.put(output)])


def put_rows(
    partition: str, keys: list[str], masks: list[list[int]], advantages=None, padding=(), prompt_index=None
) -> KVBatchMeta:
    """Rows as verl's V1 trainer holds them before an update, in a real TransferQueue; `advantages`
    (one value per row) on the masked tokens, log-probs, returns and values 0. Rows in `padding` are
    verl's: one token, mask 0. `prompt_index`: each row's dataset index (default: its position)."""
    advantages = advantages if advantages is not None else [1.0] * len(keys)
    rows = [torch.tensor(mask, dtype=torch.int64) for mask in masks]
    fields = {"response_mask": rows, "advantages": [m.float() * a for m, a in zip(rows, advantages, strict=True)]}
    for name in ("old_log_probs", "returns", "values"):
        fields[name] = [torch.zeros(len(m)) for m in rows]
    nested = {name: torch.nested.as_nested_tensor(v, layout=torch.jagged) for name, v in fields.items()}
    # the prompts' dataset index: their order in the data
    nested["index"] = torch.arange(len(keys)) if prompt_index is None else torch.tensor(prompt_index)
    tags = [{"is_padding": i in padding, "seq_len": 8 + len(mask)} for i, mask in enumerate(masks)]
    tq.kv_batch_put(keys=keys, partition_id=partition, fields=TensorDict(nested, batch_size=len(keys)), tags=tags)
    return KVBatchMeta(keys=keys, tags=tags, partition_id=partition)


def _batch(partition: str, size: int) -> KVBatchMeta:
    return put_rows(partition, [f"u{i}_0_0" for i in range(size)], [[1, 1]] * size)


def test_trainer_mode_selects_our_trainer_which_keeps_verls_sync_semantics():
    trainer = get_trainer_cls("memagent_sync")(verl_config(*BASE))
    assert isinstance(trainer, MultiContextTrainerSync) and isinstance(trainer, PPOTrainerSync)
    assert trainer.trainer_mode == "sync"
    assert type(trainer.replay_buffer) is ReplayBuffer  # verl picks ReplayBufferAsync for any other mode name
    async_trainer = get_trainer_cls("memagent_colocate_async")(
        verl_config(*BASE, "trainer.v1.trainer_mode=memagent_colocate_async")
    )
    assert async_trainer.trainer_mode == "colocate_async"
    assert type(async_trainer.replay_buffer) is ReplayBufferAsync


@pytest.mark.parametrize("mode", ["memagent_colocate_async", "memagent_separate_async"])
def test_the_async_trainers_refuse_the_hf_rollout_naming_vllm_and_the_mode(mode):
    config = verl_config(*BASE, f"trainer.v1.trainer_mode={mode}", "actor_rollout_ref.rollout.name=hf")
    with pytest.raises(ValueError, match=rf"trainer_mode={mode} needs partial rollout.*rollout.name=vllm"):
        get_trainer_cls(mode)(config)
    sync = verl_config(*BASE, "actor_rollout_ref.rollout.name=hf")
    assert get_trainer_cls("memagent_sync")(sync).trainer_mode == "sync"  # the sync trainer runs on hf


ENGINE = "actor_rollout_ref.rollout.checkpoint_engine"


def test_separate_async_on_cpu_asks_for_the_gloo_checkpoint_engine_by_its_settings(monkeypatch):
    """On CPU the weights reach separate_async's rollout replicas only through our gloo engine, which verl
    registers only from the module named in custom_backend_module: a run missing either setting stops at
    once, naming both, instead of when verl first syncs weights (with a list of GPU engines)."""
    mode = "memagent_separate_async"
    separate = [*BASE, f"trainer.v1.trainer_mode={mode}", "trainer.v1.separate_async.parameter_sync_step=2"]
    needed = rf"{ENGINE}.backend=gloo {ENGINE}.custom_backend_module={GLOO_BACKEND_MODULE}"
    gloo_without_module = verl_config(*separate, f"{ENGINE}.backend=gloo")
    with pytest.raises(ValueError, match=rf"backend=gloo is registered by our module: set {needed}"):
        get_trainer_cls(mode)(gloo_without_module)
    monkeypatch.setenv("VERL_PLATFORM", "cpu")
    for backend in ("naive", "nccl"):
        with pytest.raises(ValueError, match=rf"separate_async on CPU .*backend={backend} has no CPU.*: set {needed}"):
            get_trainer_cls(mode)(verl_config(*separate, f"{ENGINE}.backend={backend}"))
    check_checkpoint_engine(
        verl_config(*separate, f"{ENGINE}.backend=gloo", f"{ENGINE}.custom_backend_module={GLOO_BACKEND_MODULE}"),
        "separate_async",
    )
    check_checkpoint_engine(verl_config(*BASE), "sync")  # the colocated trainers sync weights in-process
    monkeypatch.delenv("VERL_PLATFORM")
    check_checkpoint_engine(verl_config(*separate, f"{ENGINE}.backend=nccl"), "separate_async")  # on GPUs


def test_separate_async_without_hybrid_replicas_sets_up_at_verls_default_log_level(monkeypatch, caplog):
    """verl 0.9.1's separate_async `_setup` logs hybrid_engine=False with `logger.info(..., flush=True)`, a
    TypeError at INFO, its default level. verl's own `_setup` runs here, its Ray servers and weight sync
    stood in for (they start in tests/cpu/test_async_cpu.py): verl's raises, ours sets up, says so, and
    leaves the module's level as it was. Fails once verl stops raising: then our workaround can go."""
    import logging

    from verl.trainer.ppo.v1 import trainer_separate_async as verls
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    mode = "memagent_separate_async"
    config = verl_config(
        *BASE,
        f"trainer.v1.trainer_mode={mode}",
        "trainer.v1.separate_async.parameter_sync_step=2",
        "actor_rollout_ref.hybrid_engine=False",
        *(f"actor_rollout_ref.rollout.{size}=1" for size in ("nnodes", "n_gpus_per_node")),
        f"{ENGINE}.backend=nccl",
    )
    trainer = get_trainer_cls(mode)(config)
    trainer.llm_server_manager, trainer.actor_rollout_wg = type("Managers", (), {"rollout_replicas": []})(), None
    replicas = type("Standalone", (), {"server_addresses": [], "get_replicas": lambda self: ["replica"]})()
    monkeypatch.setattr(PPOTrainer, "_setup", lambda self: None)  # the trainer's workers and colocated replicas
    monkeypatch.setattr(verls.LLMServerManager, "create", lambda **_: replicas)
    monkeypatch.setattr(verls, "CheckpointEngineManager", lambda **parts: parts)
    monkeypatch.setattr(verls.logger, "level", logging.INFO)
    with pytest.raises(TypeError, match="flush"):
        verls.PPOTrainerSeparateAsync._setup(trainer)
    with caplog.at_level(logging.INFO, logger="verl_memagent.algo.trainer"):
        trainer._setup()
    assert trainer.standalone_checkpoint_manager["replicas"] == ["replica"]
    assert "rollout served by 1 replicas of their own only" in caplog.text
    assert verls.logger.level == logging.INFO


def test_optimizer_steps_per_update_follow_configuration_not_turn_counts(transfer_queue):
    trainer = MultiContextTrainerSync(verl_config(*BASE, "+algorithm.multi_context.fixed_optimizer_steps=true"))
    verl_trainer = PPOTrainerSync(verl_config(*BASE, "trainer.v1.trainer_mode=sync"))
    trainer.global_steps = verl_trainer.global_steps = 1  # fit() sets it
    # train_batch_size / ppo_mini_batch_size = 2 steps; a mini-batch must split over n=2 and dp=2
    assert trainer._get_required_batch_multiple(dp_size=2) == 4
    for trainer_ in (trainer, verl_trainer):
        trainer_.actor_rollout_wg = RecordingActorGroup(trainer_.config, dp_size=2)
    for samples in (8, 12, 20):  # 4 prompts x 2 sessions with 1, 1.5, 2.5 turns on average
        trainer._update_actor(_batch(f"steps{samples}", samples), metrics={})
        verl_trainer._update_actor(_batch(f"steps{samples}", samples), metrics={})
    assert trainer.actor_rollout_wg.mini_batch_sizes == [4, 6, 10]  # always 2 steps
    assert verl_trainer.actor_rollout_wg.mini_batch_sizes == [8, 8, 8]  # verl: 1, 1.5, 2.5 steps (after padding 2, 3)
    assert trainer.actor_rollout_wg.shared_sizes == [4, 4, 4]  # the shared config is never changed
    assert trainer.config is trainer.actor_rollout_wg.shared_config


def test_fixed_optimizer_steps_are_off_by_default(transfer_queue):
    """verl's count, and the released MemSearcher's: ppo_mini_batch_size x n samples per optimizer step."""
    trainer = MultiContextTrainerSync(verl_config(*BASE))
    trainer.actor_rollout_wg = RecordingActorGroup(trainer.config)
    trainer.global_steps = 1  # fit() sets it
    trainer._update_actor(_batch("verl_steps", 16), metrics={})
    assert trainer.actor_rollout_wg.mini_batch_sizes == [8]
    assert trainer._get_required_batch_multiple(dp_size=2) == 8


def test_a_steps_rows_go_on_in_the_datas_order_whatever_order_verl_listed_them(transfer_queue, tokenizer):
    """Prompt "zz" is the data's first (dataset index 0), "aa" its second: sorted by uid, as by verl's
    random uids, "aa" would come first. Sessions sort as numbers (10 after 2), turns in turn."""
    trainer = MultiContextTrainerSync(verl_config(*BASE))
    trainer.actor_rollout_wg = RecordingActorGroup(trainer.config)
    trainer.global_steps, trainer.tokenizer = 1, tokenizer  # fit() and init() set them
    listed = ["aa_0_1", "zz_10_0", "aa_0_0", "zz_2_1", "aa_1_0", "zz_2_0", "zz_10_1", "aa_0_2"]
    index = [1 if key.startswith("aa") else 0 for key in listed]
    batch = put_rows("data_order", listed, [[1, 1]] * len(listed), prompt_index=index)
    batch = trainer._balance_batch(batch, metrics={})
    assert batch.keys == ["zz_2_0", "zz_2_1", "zz_10_0", "zz_10_1", "aa_0_0", "aa_0_1", "aa_0_2", "aa_1_0"]
    assert [tag["seq_len"] for tag in batch.tags] == [10] * 8  # the tags went with their rows


def test_verls_own_trainer_path_fails_clearly_without_trajectory_layout():
    data = DataProto.from_dict(
        tensors={"token_level_rewards": torch.ones(2, 3), "response_mask": torch.ones(2, 3, dtype=torch.int64)},
        non_tensors={"uid": np.array(["a", "a"], dtype=object)},
    )
    config = verl_config(*BASE).algorithm
    with pytest.raises(ValueError, match="trainer.v1.trainer_mode to one of"):
        compute_advantage(data, adv_estimator="multi_context_grpo", config=config)


def test_multi_context_options_are_validated():
    assert MultiContextConfig.from_algorithm({}) == MultiContextConfig()
    trainer = MultiContextTrainerSync(verl_config(*BASE, "+algorithm.multi_context.turn_discount=0.5"))
    assert trainer.multi_context is trainer.multi_context  # parsed once
    assert trainer.multi_context.turn_discount == 0.5
    with pytest.raises(ValueError, match="unknown keys \\['turn_discout'\\]"):
        MultiContextConfig.from_algorithm({"multi_context": {"turn_discout": 0.9}})
    with pytest.raises(ValueError, match="turn_discount must be in"):
        MultiContextConfig.from_algorithm({"multi_context": {"turn_discount": 1.5}})
    with pytest.raises(ValueError, match=r"on_nonfinite: expected one of \['stop', 'skip'\], got 'warn'"):
        MultiContextConfig.from_algorithm({"multi_context": {"on_nonfinite": "warn"}})


def test_agent_ids_must_agree_with_verls_keys():
    layout = TrajectoryLayout.from_keys(["u_0_0", "u_0_1", "u_1_0", "pad_0_0"], [False, False, False, True])
    good = [{"trajectory_id": "x", "turn_index": 0}, {"trajectory_id": "x", "turn_index": 1}]
    good += [{"trajectory_id": "y", "turn_index": 0}, {"trajectory_id": "x", "turn_index": 0}]  # padding copies a row
    check_agent_ids(layout, good)
    check_agent_ids(layout, [{}, {}, {}, {}])  # agent loops that do not tag: the keys alone decide
    swapped = [dict(good[1]), dict(good[0]), good[2], good[3]]
    with pytest.raises(ValueError, match="turn_index"):
        check_agent_ids(layout, swapped)
    merged = [good[0], good[1], {"trajectory_id": "x", "turn_index": 0}, good[3]]
    with pytest.raises(ValueError, match="trajectory_id"):
        check_agent_ids(layout, merged)


def test_critic_mini_batches_are_fixed_too(transfer_queue):
    trainer = MultiContextTrainerSync(
        verl_config(
            *BASE,
            "+algorithm.multi_context.fixed_optimizer_steps=true",
            "algorithm.adv_estimator=multi_context_gae",
            "critic.enable=true",
            "critic.ppo_mini_batch_size=2",
            "critic.ppo_micro_batch_size_per_gpu=1",
        )
    )
    # actor: 8 / 4 = 2 steps of lcm(n=2, dp=2) samples; critic: 8 / 2 = 4 steps of 2 samples
    assert trainer._get_required_batch_multiple(dp_size=2) == math.lcm(2 * 2, 4 * 2)
    trainer.critic_wg = RecordingCriticGroup()
    trainer.global_steps = 1
    trainer._update_critic(_batch("critic", 24), metrics={})
    assert trainer.critic_wg.mini_batch_sizes == [6]  # 4 steps
    assert trainer.config.critic.ppo_mini_batch_size == 2


def _trainer(*overrides: str, fixed_steps: bool = True, losses: list[float] | None = None) -> MultiContextTrainerSync:
    fixed = f"+algorithm.multi_context.fixed_optimizer_steps={str(fixed_steps).lower()}"
    trainer = MultiContextTrainerSync(verl_config(*BASE, fixed, *overrides))
    trainer.actor_rollout_wg = RecordingActorGroup(trainer.config, losses=losses)
    trainer.global_steps = 6
    return trainer


def _rows(partition: str, real: int, padding: int = 0, advantages=None) -> KVBatchMeta:
    keys = [f"u{i}_0_0" for i in range(real)] + [f"pad{i}_0_0" for i in range(padding)]
    masks = [[1, 1]] * real + [[0]] * padding
    advantages = advantages or [1.0] * real
    return put_rows(partition, keys, masks, advantages + [0.0] * padding, padding=range(real, real + padding))


def test_padding_is_dealt_over_the_steps_so_that_no_step_trains_on_padding_alone(transfer_queue):
    # 2 fixed steps of 4 rows: verl appended 3 padding rows, which would make the second step 1 real + 3 padding
    trainer = _trainer()
    metrics: dict = {}
    trainer._update_actor(_rows("spread", real=5, padding=3), metrics)
    (keys,) = trainer.actor_rollout_wg.keys
    assert keys == ["u0_0_0", "u1_0_0", "u2_0_0", "pad0_0_0", "u3_0_0", "u4_0_0", "pad1_0_0", "pad2_0_0"]
    assert metrics["multi_context/actor_steps"] == 2

    # verl's own split (steps of ppo_mini_batch_size x n = 8 rows): its third step is padding only, loss 0/0
    verl_split = _trainer(fixed_steps=False)
    metrics = {}
    verl_split._update_actor(_rows("verl_split", real=16, padding=8), metrics)
    (keys,) = verl_split.actor_rollout_wg.keys
    assert keys == [f"u{i}_0_0" for i in range(16)]
    assert metrics["multi_context/actor_steps"] == 2 and metrics["multi_context/actor_skipped_empty"] == 1


def test_a_nonfinite_advantage_stops_the_run_naming_the_step_and_rows(transfer_queue):
    trainer = _trainer()
    advantages = [0.5, float("nan"), 0.5, -0.5]
    with pytest.raises(NonFiniteUpdateError) as error:
        trainer._update_actor(_rows("nan_stop", real=4, advantages=advantages), metrics={})
    assert str(error.value) == (
        "step 6, actor update, optimizer step 1 of 2: advantages not finite in 1 rows: u1_0_0 (rank 0, "
        "micro-batch 1); set +algorithm.multi_context.on_nonfinite=skip to skip it"
    )
    assert trainer.actor_rollout_wg.keys == []  # nothing reached the workers

    skipping = _trainer("+algorithm.multi_context.on_nonfinite=skip")
    metrics: dict = {}
    skipping._update_actor(_rows("nan_skip", real=4, advantages=advantages), metrics)
    assert skipping.actor_rollout_wg.keys == [["u2_0_0", "u3_0_0"]]  # the other step still learns
    assert metrics["multi_context/actor_skipped_nonfinite"] == 1


def test_steps_with_nothing_to_learn_are_skipped_when_asked(transfer_queue):
    advantages = [0.0, 0.0, 0.7, -0.7]  # the first step's group is all right (or all wrong)
    trainer = _trainer()
    trainer._update_actor(_rows("zero_kept", real=4, advantages=advantages), metrics={})
    assert trainer.actor_rollout_wg.keys == [["u0_0_0", "u1_0_0", "u2_0_0", "u3_0_0"]]  # verl's behaviour

    skipping = _trainer("+algorithm.multi_context.skip_zero_advantage_steps=true")
    metrics: dict = {}
    skipping._update_actor(_rows("zero_skip", real=4, advantages=advantages), metrics)
    assert skipping.actor_rollout_wg.keys == [["u2_0_0", "u3_0_0"]]
    assert skipping.actor_rollout_wg.mini_batch_sizes == [2]  # still steps of 2 rows: one step taken, not two
    assert metrics["multi_context/actor_skipped_zero_advantage"] == 1

    metrics = {}
    skipping._update_actor(_rows("zero_all", real=4, advantages=[0.0] * 4), metrics)
    assert len(skipping.actor_rollout_wg.keys) == 1  # no update at all: the policy does not move
    assert metrics["multi_context/actor_steps"] == 0


def test_rows_of_one_trajectory_must_carry_one_advantage_unless_a_turn_is_penalised(transfer_queue):
    # u0's second turn broke the trajectory: with the penalty its advantage is the trajectory's less it
    keys, masks, advantages = ["u0_0_0", "u0_0_1", "u1_0_0", "u1_0_1"], [[1, 1]] * 4, [0.5, 0.25, -0.5, -0.5]
    with pytest.raises(ValueError, match=r"2 rows do not carry their trajectory's advantage \(u0_0_0, u0_0_1\)"):
        _trainer()._update_actor(put_rows("one_advantage", keys, masks, advantages), metrics={})
    penalised = _trainer("+algorithm.multi_context.broken_turn_penalty=0.25")
    penalised._update_actor(put_rows("penalised_turn", keys, masks, advantages), metrics={})
    assert sorted(k for step in penalised.actor_rollout_wg.keys for k in step) == sorted(keys)


def test_a_nonfinite_loss_reported_by_the_workers_stops_the_run(transfer_queue, caplog):
    trainer = _trainer(losses=[0.1, float("nan")])
    with pytest.raises(NonFiniteUpdateError) as error:
        trainer._update_actor(_rows("loss_stop", real=4), metrics={})
    assert str(error.value) == (
        "step 6, actor update, optimizer step 2 of 2 (rows u2_0_0, u3_0_0): the workers report actor/pg_loss = nan"
    )
    skipping = _trainer("+algorithm.multi_context.on_nonfinite=skip", losses=[0.1, float("nan")])
    skipping._update_actor(_rows("loss_skip", real=4), metrics={})
    assert "optimizer step 2 of 2 (rows u2_0_0, u3_0_0): the workers report actor/pg_loss = nan" in caplog.text


def test_shuffled_steps_cannot_be_checked_and_are_refused(transfer_queue):
    trainer = _trainer("actor_rollout_ref.actor.shuffle=true")
    with pytest.raises(
        ValueError, match=r"actor_rollout_ref.actor.shuffle: true .* set actor_rollout_ref.actor.shuffle=false"
    ):
        trainer._update_actor(_rows("shuffled", real=4), metrics={})


def test_sequence_level_rollout_correction_is_refused_since_a_row_is_part_of_a_trajectory():
    for option in (
        "algorithm.rollout_correction.rollout_is=sequence",
        "algorithm.rollout_correction.rollout_rs=seq_sum_k1",
    ):
        with pytest.raises(
            ValueError, match=r"rollout_correction: rollout_(is=sequence|rs=seq_sum_k1) .*part of a trajectory"
        ):
            MultiContextTrainerSync(verl_config(*BASE, option))
    token_level = ["algorithm.rollout_correction.rollout_is=token", "algorithm.rollout_correction.rollout_rs=token_k1"]
    assert MultiContextTrainerSync(verl_config(*BASE, *token_level)).trainer_mode == "sync"
    builtin = MultiContextTrainerSync(
        verl_config(*BASE, "algorithm.adv_estimator=grpo", token_level[0][:-5] + "sequence")
    )
    assert builtin.trainer_mode == "sync"  # verl's own estimators: rows are whole sequences, verl's business
