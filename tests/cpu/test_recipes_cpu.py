"""recipes/cpu/run.sh trains each agent recipe for 2 steps with verl's real trainer on CPU.

Each run builds nothing twice (the tiny model and BM25 index are cached for the session), starts the
real retriever server, and goes through the project's agent loop, estimator, trainer and reward.
About 95-120 s per agent on 2 cores.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

RUN = Path(__file__).resolve().parents[2] / "recipes" / "cpu" / "run.sh"


@pytest.fixture(scope="session")
def recipe_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("recipes_cpu_cache")


@pytest.mark.parametrize(
    ("agent", "estimator"),
    [("memsearcher", "multi_context_grpo"), ("mem1", "multi_context_gae"), ("react", "multi_context_grpo")],
)
def test_recipe_trains_two_steps(agent, estimator, recipe_cache, tmp_path):
    env = {**os.environ, "WORK": str(tmp_path), "MEMAGENT_CPU_CACHE": str(recipe_cache)}
    done = subprocess.run(["bash", str(RUN), agent], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, (done.stdout + done.stderr)[-8000:]

    assert (tmp_path / "checkpoints" / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
    assert (tmp_path / "checkpoints" / "global_step_2" / "actor" / "huggingface" / "config.json").exists()
    if estimator == "multi_context_gae":
        assert (tmp_path / "checkpoints" / "global_step_2" / "critic").is_dir()

    steps = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2]
    for step in steps:
        metrics = step["data"]
        assert metrics["actor/grad_norm"] > 0
        assert metrics["multi_context/trajectories"] == 4  # our estimator ran in verl's advantage step: 2 x 2
        assert metrics["training/rollout_probs_diff_max"] < 1e-3
        if estimator == "multi_context_gae":
            assert metrics["critic/vf_loss"] > 0
    assert "ready" in (tmp_path / "retriever.log").read_text()  # the real retriever served the run
