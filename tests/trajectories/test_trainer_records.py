"""The trainer's records, read from a real TransferQueue holding what verl's agent-loop worker wrote for
real agent-loop outputs, after verl's `_compute_advantage` ran through our trainer on verl's padded,
reordered batch: the turns reassemble each trajectory and reward and advantage are those of the update."""

from __future__ import annotations

import random

import pytest
import torch
import transfer_queue as tq
from omegaconf import OmegaConf
from scripted_runs import GOLDEN, QUESTION, play, script
from transfer_queue import KVBatchMeta
from verl.trainer.ppo.padding_utils import upsample_batch_to_divisible_size
from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ

from verl_memagent.agent import verl_trainer_config
from verl_memagent.algo.trainer import MultiContextTrainerSync
from verl_memagent.algo.trajectory_records import TrajectoryRecorder, TrajectoryRecordsConfig, groups_of, take_groups
from verl_memagent.trajectories.files import read_records

#: uid -> (agent, searches before the answer, reward) per session
GROUPS = {
    "q-mem": [("memsearcher", 2, 1.0), ("memsearcher", 1, 0.5), ("memsearcher", 0, 0.0)],
    "q-react": [("react", 1, 1.0), ("react", 2, 0.0)],
}
EPS = 1e-6


async def write_rollouts(partition: str, tokenizer, trainer_config, retriever_url) -> dict[str, list]:
    """verl's AgentLoopWorkerTQ._agent_loop_postprocess puts each run()'s outputs into TransferQueue."""
    worker = object.__new__(AgentLoopWorkerTQ.__ray_actor_class__)
    worker.processor = None
    worker.reward_loop_worker_handles = None  # the score is set below, as the reward manager would
    worker.distillation_enabled = False
    played = {}
    for index, (uid, sessions) in enumerate(GROUPS.items()):
        for session, (agent, searches, reward) in enumerate(sessions):
            outputs, _ = await play(agent, script(agent, searches), tokenizer, trainer_config, retriever_url)
            outputs[-1].reward_score = reward
            outputs[-1].extra_fields["reward_extra_info"] = {"f1": reward}
            row = {
                "data_source": f"src-{uid}",
                "reward_model": {"ground_truth": GOLDEN},
                "extra_info": {"question": QUESTION, "index": index, "id": f"row-{index}"},
                "index": index,
            }
            await worker._agent_loop_postprocess(
                outputs, validate=partition == "val", uid=uid, session_id=session, global_steps=1, **row
            )
            played[f"{uid}_{session}"] = outputs
    return played


async def write_broken_rollout(tokenizer, trainer_config, retriever_url) -> None:
    """A trajectory whose turn log is not the agent loops' (a call without its end): no record for it."""
    worker = object.__new__(AgentLoopWorkerTQ.__ray_actor_class__)
    worker.processor, worker.reward_loop_worker_handles, worker.distillation_enabled = None, None, False
    outputs, _ = await play("memsearcher", script("memsearcher", 0), tokenizer, trainer_config, retriever_url)
    outputs[0].extra_fields["turn_log"] = [{"calls": [{"start": 0}], "search": None}]
    outputs[-1].reward_score = 1.0
    outputs[-1].extra_fields["reward_extra_info"] = {}
    row = {"data_source": "src-bad", "reward_model": {"ground_truth": GOLDEN}, "extra_info": {}, "index": 9}
    await worker._agent_loop_postprocess(outputs, validate=False, uid="q-bad", session_id=0, global_steps=1, **row)


def shuffled_padded_batch(partition: str) -> KVBatchMeta:
    tags = tq.kv_list(partition)[partition]
    keys = list(tags)
    random.Random(1).shuffle(keys)
    batch = KVBatchMeta(keys=keys, tags=[tags[k] for k in keys], partition_id=partition)
    return upsample_batch_to_divisible_size(batch, 16, eos_token_id=2)


def grpo_config():
    """verl's full config with multi_context_grpo; no rollout correction (no actor computed old log-probs)."""
    config = verl_trainer_config(n=3)
    config.algorithm.adv_estimator = "multi_context_grpo"
    config.algorithm.rollout_correction = None
    return config


async def test_training_records_carry_the_updates_reward_and_advantage(
    transfer_queue, tokenizer, trainer_config, retriever_url, tmp_path
):
    played = await write_rollouts("train", tokenizer, trainer_config, retriever_url)
    await write_broken_rollout(tokenizer, trainer_config, retriever_url)
    batch = shuffled_padded_batch("train")
    trainer = object.__new__(MultiContextTrainerSync)  # _compute_advantage needs only the config
    trainer.config = grpo_config()
    batch = trainer._compute_advantage(batch, {})

    recorder = TrajectoryRecorder(TrajectoryRecordsConfig(per_step=6), tmp_path, tokenizer, loggers=["console"])
    records = recorder.training_step(batch, step=4)  # all six trajectories sampled; the broken one skipped
    assert read_records(tmp_path / "step_4.jsonl") == records
    assert sorted((r.uid, r.session) for r in records) == [
        (u, s) for u in sorted(GROUPS) for s in range(len(GROUPS[u]))
    ]

    # hand-computed GRPO: q-mem rewards 1, .5, 0 (mean .5, std .5); q-react 1, 0 (mean .5, std .7071)
    expected = {("q-mem", 0): 0.5 / (0.5 + EPS), ("q-mem", 1): 0.0, ("q-mem", 2): -0.5 / (0.5 + EPS)}
    expected |= {("q-react", 0): 0.5 / (2**-0.5 + EPS), ("q-react", 1): -0.5 / (2**-0.5 + EPS)}
    data = tq.kv_batch_get(keys=batch.keys, partition_id="train", select_fields=["advantages", "response_mask"])
    used = {
        k: (a, m)
        for k, a, m in zip(batch.keys, data["advantages"].unbind(), data["response_mask"].unbind(), strict=True)
    }
    for record in records:
        outputs = played[f"{record.uid}_{record.session}"]
        agent, searches, reward = GROUPS[record.uid][record.session]
        assert record.reward == reward and record.reward_info == {"f1": reward}
        assert record.advantage == pytest.approx(expected[(record.uid, record.session)], rel=1e-5)
        assert record.data_source == f"src-{record.uid}" and record.row_id == f"row-{list(GROUPS).index(record.uid)}"
        assert record.golden_answers == GOLDEN and record.question == QUESTION
        assert record.trajectory_id == outputs[0].extra_fields["trajectory_id"]
        # the turns reassemble the trajectory in order, each from the sample verl trained on
        assert len(record.turns) == searches + 1
        for turn in record.turns:
            output = outputs[turn.context_index]
            assert turn.sample_key == f"{record.uid}_{record.session}_{turn.context_index}"
            assert turn.calls[0].context.startswith(tokenizer.decode(output.prompt_ids, skip_special_tokens=False))
            advantages, mask = used[turn.sample_key]
            sampled = advantages[mask.bool()]
            assert turn.advantage == pytest.approx(sampled.mean().item())
            assert torch.allclose(sampled, torch.full_like(sampled, expected[(record.uid, record.session)]))
        assert [t.index for t in record.turns] == list(range(len(record.turns)))
    tq.kv_clear(keys=batch.keys, partition_id="train")


async def test_validation_keeps_the_lowest_dataset_indices(
    transfer_queue, tokenizer, trainer_config, retriever_url, tmp_path
):
    await write_rollouts("val", tokenizer, trainer_config, retriever_url)
    batch = shuffled_padded_batch("val")
    recorder = TrajectoryRecorder(TrajectoryRecordsConfig(per_step=4), tmp_path, tokenizer, loggers=[])
    sample = recorder.validation(step=0)
    react_half = [i for i, k in enumerate(batch.keys) if k.startswith("q-react")]
    mem_half = [i for i, k in enumerate(batch.keys) if not k.startswith("q-react")]
    for rows in (react_half, mem_half):  # two validation batches; the lower index comes second
        part = KVBatchMeta(keys=[batch.keys[i] for i in rows], tags=[batch.tags[i] for i in rows], partition_id="val")
        sample.add(part)
    records = sample.write()
    assert [(r.uid, r.session) for r in records] == [("q-mem", 0), ("q-mem", 1), ("q-mem", 2), ("q-react", 0)]
    assert all(r.source == "validation" and r.step == 0 and r.advantage is None for r in records)
    assert [r.reward for r in records] == [1.0, 0.5, 0.0, 1.0]
    assert read_records(tmp_path / "validation_step_0.jsonl") == records
    tq.kv_clear(keys=batch.keys, partition_id="val")


def test_groups_are_whole_and_in_turn_order():
    keys = ["b_1_0", "a_0_1", "pad", "a_0_0", "b_0_0", "a_1_0", "b_1_1"]
    padding = [key == "pad" for key in keys]
    groups = groups_of(keys, padding)
    assert groups == {"b": [[4], [0, 6]], "a": [[3, 1], [5]]}
    assert take_groups(groups, ["a", "b"], 3) == [[3, 1], [5], [4]]
    assert take_groups(groups, ["b", "a"], 10) == [[4], [0, 6], [3, 1], [5]]
    assert take_groups(groups, ["a"], 0) == []


def test_config_is_checked():
    trainer = OmegaConf.create({"default_local_dir": "/runs/x"})
    config = TrajectoryRecordsConfig.from_trainer(trainer)
    assert config.per_step == 16 and str(config.directory(trainer)) == "/runs/x/trajectories"
    trainer.trajectories = {"per_step": 0, "dir": "/elsewhere"}
    assert str(TrajectoryRecordsConfig.from_trainer(trainer).directory(trainer)) == "/elsewhere"
    trainer.trajectories = {"per_steps": 3}
    with pytest.raises(ValueError, match=r"trainer.trajectories: unknown keys \['per_steps'\]"):
        TrajectoryRecordsConfig.from_trainer(trainer)
    trainer.trajectories = {"per_step": -1}
    with pytest.raises(ValueError, match="per_step must be an integer >= 0"):
        TrajectoryRecordsConfig.from_trainer(trainer)
