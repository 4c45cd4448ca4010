"""Through the batch verl's V1 trainer really builds: verl's agent-loop worker writes the outputs to a
real TransferQueue under `{uid}_{session}_{i}`, verl pads the batch and reorders it for balance, then
verl's own `_compute_advantage` runs with its built-in grpo, and through our trainer with ours, on the
same keys."""

from __future__ import annotations

import random

import pytest
import torch
import transfer_queue as tq
from algo_batches import verl_gae_on_one_sequence
from omegaconf import OmegaConf
from tensordict import TensorDict
from transfer_queue import KVBatchMeta
from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput
from verl.trainer.ppo.core_algos import FixedKLController
from verl.trainer.ppo.padding_utils import upsample_batch_to_divisible_size
from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils.seqlen_balancing import calculate_workload, get_seqlen_balanced_partitions
from verl.workers.utils.padding import response_to_nested

from verl_memagent.algo.trainer import MultiContextTrainerSync

N_SESSIONS = 3
PAD_TO = 8
# uid -> sessions: (reward, response masks per turn); u2 has equal rewards; u3 kept one session of three
ROLLOUTS = {
    "u1": [(1.0, [[1, 1, 0, 0, 1], [1, 1], [1, 0, 1]]), (0.0, [[1, 1, 1]]), (0.5, [[1], [1, 0, 1, 1]])],
    "u2": [(1.0, [[1, 1], [1]]), (1.0, [[1, 1, 1], [1, 0, 1]]), (1.0, [[1, 1]])],
    "u3": [(0.3, [[1, 1, 0, 1]])],
}
# how the trajectories that did not answer ended (the agents' `finish_reason`); the first two broke their format
FINISHED = {("u1", 1): "no_action", ("u2", 2): "no_memory", ("u1", 2): "max_turns"}
BROKEN_TURNS = ["u1_1_0", "u2_2_0"]


def _config(estimator: str, **algorithm):
    return OmegaConf.create(
        {
            "algorithm": {
                "adv_estimator": estimator,
                "gamma": 1.0,
                "lam": 1.0,
                "norm_adv_by_std_in_grpo": True,
                "use_kl_in_reward": False,
                "kl_penalty": "kl",
                "rollout_correction": None,
                **algorithm,
            },
            "actor_rollout_ref": {"rollout": {"n": N_SESSIONS}},
        }
    )


async def _write_rollouts(partition: str):
    """verl's AgentLoopWorkerTQ._agent_loop_postprocess puts each run()'s outputs into TransferQueue."""
    worker = object.__new__(AgentLoopWorkerTQ.__ray_actor_class__)
    worker.processor = None  # text only
    worker.reward_loop_worker_handles = None  # the score is already set, as the reward manager would
    worker.distillation_enabled = False
    for uid, sessions in ROLLOUTS.items():
        for session, (reward, masks) in enumerate(sessions):
            outputs = [
                AgentLoopOutput(
                    prompt_ids=[7, 8, 9 + turn],
                    response_ids=[20 + turn] * len(mask),
                    response_mask=mask,
                    metrics=AgentLoopMetrics(),
                    extra_fields={
                        "trajectory_id": f"traj-{uid}-{session}",
                        "turn_index": turn,
                        "num_contexts": len(masks),
                        "finish_reason": FINISHED.get((uid, session), "answer"),
                    },
                )
                for turn, mask in enumerate(masks)
            ]
            outputs[-1].reward_score = reward
            outputs[-1].extra_fields["reward_extra_info"] = {}
            await worker._agent_loop_postprocess(
                outputs, validate=partition == "val", uid=uid, session_id=session, global_steps=1
            )


def _balanced_batch(partition: str):
    """The batch `_balance_batch` hands on: padded to a multiple, then reordered by sequence length."""
    tags = tq.kv_list(partition)[partition]
    keys = list(tags)
    random.Random(0).shuffle(keys)
    batch = KVBatchMeta(keys=keys, tags=[tags[k] for k in keys], partition_id=partition)
    batch = upsample_batch_to_divisible_size(batch, PAD_TO, eos_token_id=2)
    seqlens = torch.tensor([tag["seq_len"] for tag in batch.tags])
    partitions = get_seqlen_balanced_partitions(calculate_workload(seqlens), k_partitions=2, equal_size=True)
    batch.reorder([j for p in partitions for j in p])
    return batch


def _advantages(batch):
    data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["advantages"])
    return data["advantages"].to_padded_tensor(0)


def _trainer(cls, config):
    trainer = object.__new__(cls)  # _compute_advantage needs only the config, not Ray workers
    trainer.config = config
    return trainer


async def test_grpo_through_verls_batch_equals_verls_builtin_and_zeroes_padding(transfer_queue):
    await _write_rollouts("train")
    batch = _balanced_batch("train")
    rows = sum(len(masks) for sessions in ROLLOUTS.values() for _, masks in sessions)
    padding = [tag.get("is_padding", False) for tag in batch.tags]
    assert sum(padding) == (-rows) % PAD_TO and len(batch) % PAD_TO == 0
    assert [k for k, p in zip(batch.keys, padding, strict=True) if not p] != sorted(batch.keys)[:rows]

    _trainer(PPOTrainerSync, _config("grpo"))._compute_advantage(batch, metrics={})
    builtin = _advantages(batch)

    metrics: dict = {}
    _trainer(MultiContextTrainerSync, _config("multi_context_grpo"))._compute_advantage(batch, metrics)
    ours = _advantages(batch)
    torch.testing.assert_close(ours, builtin)
    assert ours[torch.tensor(padding)].abs().max() == 0
    assert metrics["multi_context/trajectories"] == 7
    assert metrics["multi_context/padding_rows"] == sum(padding)
    assert metrics["multi_context/turns_max"] == 3

    # u1 session 0: three turns, reward 1 in a group with 0 and 0.5 -> (1 - 0.5) / (0.5 + eps) everywhere
    mask = tq.kv_batch_get(keys=batch.keys, partition_id="train", select_fields=["response_mask"])
    mask = mask["response_mask"].to_padded_tensor(0)
    for i, key in enumerate(batch.keys):
        if key.startswith("u1_0_"):
            expected = 0.5 / (0.5 + 1e-6) * mask[i].float()
            torch.testing.assert_close(ours[i], expected)

    assert metrics["multi_context/zero_variance_groups"] == pytest.approx(1 / 3)  # u2 of u1, u2, u3 (alone)

    # the turn that broke its trajectory loses the penalty on its own tokens, even in u2's all-equal group
    metrics = {}
    options = {"multi_context": {"broken_turn_penalty": 0.25}}
    _trainer(MultiContextTrainerSync, _config("multi_context_grpo", **options))._compute_advantage(batch, metrics)
    broken = torch.tensor([key in BROKEN_TURNS for key in batch.keys])
    torch.testing.assert_close(_advantages(batch), ours - 0.25 * broken.unsqueeze(-1) * mask)
    assert metrics["multi_context/broken_turns"] == 2
    # with the baseline, u2's first turns (two well-formed, one broken) are compared: the well-formed gain
    options = {"multi_context": {"broken_turn_penalty": 0.25, "broken_turn_baseline": True}}
    _trainer(MultiContextTrainerSync, _config("multi_context_grpo", **options))._compute_advantage(batch, {})
    baseline = _advantages(batch)
    for i, key in enumerate(batch.keys):
        gain = (baseline[i] - ours[i])[mask[i].bool()]
        if key in ("u2_0_0", "u2_1_0"):
            assert gain.min() > 0
        elif key == "u2_2_0":
            assert gain.max() < 0
        elif key.startswith(("u2_", "u3_")):
            assert gain.abs().max() == 0

    options = {"multi_context": {"weight_trajectories": True}}
    metrics = {}
    _trainer(MultiContextTrainerSync, _config("multi_context_grpo", **options))._compute_advantage(batch, metrics)
    weighted = _advantages(batch)
    mean_turns = rows / 7
    for i, key in enumerate(batch.keys):
        if key.startswith("u2_"):
            assert weighted[i].abs().max() == 0
        if key.startswith("u1_0_"):
            torch.testing.assert_close(weighted[i], ours[i] * mean_turns / 3)


async def test_gae_through_verls_batch_chains_each_trajectorys_turns_with_in_reward_kl(transfer_queue):
    await _write_rollouts("val")
    batch = _balanced_batch("val")
    nested_mask = tq.kv_batch_get(keys=batch.keys, partition_id="val", select_fields=["response_mask"])["response_mask"]
    mask = nested_mask.to_padded_tensor(0)
    gen = torch.Generator().manual_seed(0)
    values, old, ref = (torch.randn(mask.shape, generator=gen) for _ in range(3))
    fields = {"values": values, "old_log_probs": old, "ref_log_prob": ref}
    nested = {name: response_to_nested(value, nested_mask) for name, value in fields.items()}
    tq.kv_batch_put(keys=batch.keys, partition_id="val", fields=TensorDict(nested, batch_size=len(batch)))

    def check(kl_coef: float):
        """Returns equal verl's GAE over each trajectory's turns laid end to end, the outcome at its last
        generated token and verl's in-reward KL penalty (`kl`: old - ref) on every generated token."""
        out = tq.kv_batch_get(keys=batch.keys, partition_id="val", select_fields=["returns"])
        returns = out["returns"].to_padded_tensor(0)
        for uid, sessions in ROLLOUTS.items():
            for session, (reward, masks) in enumerate(sessions):
                order = [batch.keys.index(f"{uid}_{session}_{t}") for t in range(len(masks))]
                dense = [-kl_coef * (old[i] - ref[i]) * mask[i] for i in order]
                expected = verl_gae_on_one_sequence(
                    [mask[i] for i in order], [values[i] for i in order], reward, gamma=0.9, lam=0.95, dense=dense
                )[1]
                got = torch.cat([returns[i][mask[i].bool()] for i in order])
                torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)

    metrics: dict = {}
    _trainer(MultiContextTrainerSync, _config("multi_context_gae", gamma=0.9, lam=0.95))._compute_advantage(
        batch, metrics
    )
    check(kl_coef=0.0)
    assert metrics["multi_context/trajectories"] == 7
    plain = _advantages(batch)

    # the broken turns' advantages lose the penalty; the critic's targets (returns) do not change
    options = {"multi_context": {"broken_turn_penalty": 0.5}}
    _trainer(MultiContextTrainerSync, _config("multi_context_gae", gamma=0.9, lam=0.95, **options))._compute_advantage(
        batch, {}
    )
    check(kl_coef=0.0)
    broken = torch.tensor([key in BROKEN_TURNS for key in batch.keys])
    torch.testing.assert_close(_advantages(batch), plain - 0.5 * broken.unsqueeze(-1) * mask)

    config = _config("multi_context_gae", gamma=0.9, lam=0.95, use_kl_in_reward=True)
    trainer = _trainer(MultiContextTrainerSync, config)
    trainer.kl_ctrl_in_reward = FixedKLController(0.1)
    metrics = {}
    trainer._compute_advantage(batch, metrics)
    assert metrics["actor/reward_kl_penalty_coeff"] == 0.1  # verl's own step ran
    check(kl_coef=0.1)
