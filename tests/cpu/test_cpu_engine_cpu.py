"""The CPU engine makes verl's engine's updates: the same rollouts trained by each, compared step by step.

MemSearcher's GPU recipe on CPU (`VERL_PLATFORM=cpu`) with the scripted agent loop (the real agent loops,
retriever and reward; fixed several-turn trajectories whose rewards differ within a group), twice: with
the plugin's `cpu/engine.py` (the head at response positions, log-probs in one call, no attention mask,
micro-batches of rows sorted by length) and with verl's own class (`MEMAGENT_CPU_ENGINE=verl`). Micro-
batches of two rows and no dynamic batch size, so that the sorting changes which rows share one; SGD at a
constant rate, so that a parameter's change is the gradient itself (Adam's first steps move every
parameter by about lr * sign(gradient), whatever the gradient's size).

Every parameter's change after steps 1 and 2 within 1e-4 of the largest change beyond two float32
roundings of the element: the two engines sum the same terms in other orders (another micro-batch
grouping; the head's matrix product over fewer rows), which is float32 rounding (measured: tests/cpu/
test_cpu_engine.py, 4 ulp of the log-probs); a row dropped or its log-prob taken at a shifted position
moves the change by 1e-2 and more. The losses and gradient norms within the ranks test's 3e-4.
Two launches of about 80 s each.
"""

from __future__ import annotations

import json

import pytest
from gpu_recipes import (
    change_excess,
    checkpoint_weights,
    finish,
    launch,
    metrics,
    model_weights,
    prepare_data,
    recipe_env,
    scripted_loops,
)

pytestmark = pytest.mark.slow  # verl's main_ppo runs on CPU, twice

CHANGE_TOLERANCE = 1e-4
METRIC_TOLERANCE = 3e-4
LR = 1e-2
OVERRIDES = [
    "data.train_batch_size=2",
    "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.actor.ppo_mini_batch_size=1",
    "actor_rollout_ref.actor.use_dynamic_bsz=false",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=false",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.ref.log_prob_use_dynamic_bsz=false",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.actor.optim.optimizer=SGD",
    "actor_rollout_ref.actor.optim.weight_decay=0",
    f"actor_rollout_ref.actor.optim.lr={LR}",
    "actor_rollout_ref.actor.checkpoint.save_contents=['model','optimizer','extra','hf_model']",
    "data.dataloader_num_workers=0",
    "actor_rollout_ref.rollout.agent.num_workers=1",
    "reward.num_workers=1",
    "trainer.total_training_steps=2",
    "trainer.save_freq=1",
    "trainer.test_freq=-1",
    "trainer.val_before_train=False",
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_model_dir, retriever_url, data_dir) -> dict:
    root = tmp_path_factory.mktemp("cpu_engine")
    data = prepare_data("memsearcher", data_dir, root / "data", rows=4)
    loops = scripted_loops(root / "agent_loops.yaml")
    done = {}
    for name, engine in (("cpu", {}), ("verl", {"MEMAGENT_CPU_ENGINE": "verl"})):
        work = root / name
        work.mkdir()
        shapes = {"MEMAGENT_CPU_ENGINE_SHAPES": str(work / "shapes.jsonl")}  # only the CPU engine writes them
        env = recipe_env(tiny_model_dir, data, work, retriever_url, loops, ranks=1, **engine, **shapes)
        finish(launch("memsearcher", env, work, *OVERRIDES), work)
        done[name] = work
    return {**done, "initial": model_weights(tiny_model_dir)}


def test_the_engines_were_the_ones_asked_for(runs):
    """Only the CPU engine logs its micro-batches' shapes: two rows each at most, as configured."""
    assert not (runs["verl"] / "shapes.jsonl").exists()
    shapes = [json.loads(line) for line in (runs["cpu"] / "shapes.jsonl").read_text().splitlines()]
    assert shapes and all(1 <= shape["rows"] <= 2 for shape in shapes)
    assert any(shape["trains"] for shape in shapes) and not all(shape["trains"] for shape in shapes)


def test_every_parameter_changes_as_under_verls_engine(runs):
    for step in (1, 2):
        ours, verls = checkpoint_weights(runs["cpu"], step, "actor"), checkpoint_weights(runs["verl"], step, "actor")
        assert ours.keys() == verls.keys()
        largest, excess = change_excess(verls, ours, runs["initial"], runs["initial"])
        assert largest > 100 * LR * 1e-4, "the update moved nothing: the comparison would prove nothing"
        assert excess <= CHANGE_TOLERANCE * largest, (step, excess, largest)


def test_losses_and_gradient_norms_agree(runs):
    ours, verls = metrics(runs["cpu"]), metrics(runs["verl"])
    assert [line["step"] for line in ours] == [line["step"] for line in verls] == [1, 2]
    for a, b in zip(verls, ours, strict=True):
        for name in ("actor/pg_loss", "actor/grad_norm", "actor/kl_loss", "critic/score/mean"):
            assert b["data"][name] == pytest.approx(a["data"][name], rel=METRIC_TOLERANCE, abs=1e-7), (name, a["step"])
        assert a["data"]["actor/grad_norm"] > 0
