"""The trainers as verl builds them from its own config: selection, mode semantics, optimizer steps."""

from __future__ import annotations

import math
import os
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import verl
from hydra import compose, initialize_config_dir
from transfer_queue import KVBatchMeta
from verl.protocol import DataProto
from verl.trainer.ppo.ray_trainer import compute_advantage
from verl.trainer.ppo.v1 import get_trainer_cls
from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer, ReplayBufferAsync
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

from verl_memagent.algo.config import MultiContextConfig
from verl_memagent.algo.estimators import TrajectoryLayout
from verl_memagent.algo.trainer import MultiContextTrainerSync, check_agent_ids


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
    """Stands in for the FSDP actor worker group (GPU workers): records what update_actor is given, and
    the configured mini-batch size of the config the trainer was built with, as others read it meanwhile."""

    def __init__(self, shared_config):
        self.shared_config = shared_config
        self.mini_batch_sizes: list[int] = []
        self.shared_sizes: list[int] = []

    def update_actor(self, batch: KVBatchMeta):
        self.mini_batch_sizes.append(batch.extra_info["mini_batch_size"])
        self.shared_sizes.append(self.shared_config.actor_rollout_ref.actor.ppo_mini_batch_size)
        return {"metrics": {"mfu": 0.0}}


class RecordingCriticGroup:
    """Stands in for the critic worker group: records the mini-batch size train_mini_batch is given."""

    def __init__(self):
        self.mini_batch_sizes: list[int] = []

    def train_mini_batch(self, batch: KVBatchMeta):
        self.mini_batch_sizes.append(batch.extra_info["mini_batch_size"])
        return SimpleNamespace(get=lambda: {"metrics": {"mfu": 0.0}})


def _batch(size: int) -> KVBatchMeta:
    return KVBatchMeta(keys=[f"u{i}_0_0" for i in range(size)], tags=[{}] * size, partition_id="train")


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


def test_optimizer_steps_per_update_follow_configuration_not_turn_counts():
    trainer = MultiContextTrainerSync(verl_config(*BASE, "+algorithm.multi_context.fixed_optimizer_steps=true"))
    verl_trainer = PPOTrainerSync(verl_config(*BASE, "trainer.v1.trainer_mode=sync"))
    # train_batch_size / ppo_mini_batch_size = 2 steps; a mini-batch must split over n=2 and dp=2
    assert trainer._get_required_batch_multiple(dp_size=2) == 4
    for trainer_ in (trainer, verl_trainer):
        trainer_.actor_rollout_wg = RecordingActorGroup(trainer_.config)
    for samples in (8, 12, 20):  # 4 prompts x 2 sessions with 1, 1.5, 2.5 turns on average
        trainer._update_actor(_batch(samples), metrics={})
        verl_trainer._update_actor(_batch(samples), metrics={})
    assert trainer.actor_rollout_wg.mini_batch_sizes == [4, 6, 10]  # always 2 steps
    assert verl_trainer.actor_rollout_wg.mini_batch_sizes == [8, 8, 8]  # verl: 1, 1.5, 2.5 steps (after padding 2, 3)
    assert trainer.actor_rollout_wg.shared_sizes == [4, 4, 4]  # the shared config is never changed
    assert trainer.config is trainer.actor_rollout_wg.shared_config


def test_fixed_optimizer_steps_are_off_by_default():
    """verl's count, and the released MemSearcher's: ppo_mini_batch_size x n samples per optimizer step."""
    trainer = MultiContextTrainerSync(verl_config(*BASE))
    trainer.actor_rollout_wg = RecordingActorGroup(trainer.config)
    trainer.global_steps = 1  # fit() sets it
    trainer._update_actor(_batch(16), metrics={})
    assert trainer.actor_rollout_wg.mini_batch_sizes == [8]
    assert trainer._get_required_batch_multiple(dp_size=2) == 8


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


def test_critic_mini_batches_are_fixed_too():
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
    trainer._update_critic(_batch(24), metrics={})
    assert trainer.critic_wg.mini_batch_sizes == [6]  # 4 steps
    assert trainer.config.critic.ppo_mini_batch_size == 2
