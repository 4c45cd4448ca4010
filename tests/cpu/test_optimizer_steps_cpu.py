"""MemSearcher's paper recipe makes the released number of optimizer steps per training step.

The released trainer splits a step's turn rows into mini-batches of ppo_mini_batch_size x n rows
(MemSearcher fsdp_workers.py:117-118, dp_actor.py:256): ceil(rows / (mini x n)) Adam steps, so more
turns make more updates. The recipe (`recipes/memsearcher/config/memsearcher.yaml`, its trainer,
estimator and `algorithm.multi_context`) runs here with verl's real `main_ppo` on CPU, scaled down
(2 questions x 2 trajectories, mini-batches of 1 question), for one step. A tiny model taught first to
search, rewrite its memory and answer makes multi-turn trajectories; the optimizer's own step count in
the saved checkpoint is compared with the rows the step trained on. About 2-3 minutes on 2 cores.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from test_main_ppo_cpu import CPU_OVERRIDES  # what running on CPU needs, as docs/cpu.md documents it

pytestmark = pytest.mark.slow  # verl's main_ppo runs on CPU

REPO = Path(__file__).resolve().parents[2]
SYSTEM = "Answer the question. Search with the tool first."
EOS = "<|im_end|>"
SEARCH = ' t </think>\n<tool_call>\n{"name": "wikipedia_search", "arguments": {"query": "Leda"}}\n</tool_call>' + EOS
MEMORY = "<memory> The Leda is a river. </memory>" + EOS
ANSWER = " t </think> \\boxed{Leda}" + EOS
QUESTIONS, N, MINI = 2, 2, 1


def agent_loops_yaml(path: Path) -> Path:
    """The shipped memsearcher entry (released prompts and rules) with a short system prompt and 2 turns."""
    path.write_text(
        "- name: memsearcher\n"
        "  _target_: verl_memagent.agent.memsearcher.MemSearcherAgentLoop\n"
        "  retriever_urls: ${oc.env:MEMAGENT_RETRIEVER_URL}\n"
        "  topk: 1\n  max_turns: 2\n  max_new_tokens: 48\n"
        f"  prompts: {{system: {json.dumps(SYSTEM)}}}\n"
    )
    return path


def taught_model(tiny_model_dir: Path, out: Path, loops_yaml: Path, retriever_url: str, questions: list[str]) -> Path:
    """The tiny model after supervised steps on the loop's own samples of search, rewrite, answer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from memagent_examples.training import supervised_steps
    from memagent_examples.warm_start import scripted_samples

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    scripts = [(question, [SEARCH, MEMORY, ANSWER]) for question in questions]
    samples = asyncio.run(
        scripted_samples(
            "memsearcher", scripts, tokenizer, str(loops_yaml), 512, 512, "qwen2", retriever_urls=retriever_url
        )
    )
    torch.manual_seed(0)
    losses = supervised_steps(model, samples, steps=80, lr=3e-3, batch_size=8, pad_token_id=tokenizer.pad_token_id)
    assert sum(losses[-5:]) / 5 < 0.1, losses[-5:]  # it writes the three texts (measured: about 0.02)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_model_dir, retriever_url, data_dir):
    work = tmp_path_factory.mktemp("optimizer_steps")
    questions = [json.loads(line)["question"] for line in (data_dir / "qa_multihop.jsonl").read_text().splitlines()]
    loops = agent_loops_yaml(work / "agent_loops.yaml")
    model = taught_model(tiny_model_dir, work / "model", loops, retriever_url, questions[:16])
    train = work / "train.parquet"
    command = [sys.executable, "-m", "verl_memagent.cli", "prepare", "--agent", "memsearcher", "--limit", "8"]
    subprocess.run([*command, "--input", str(data_dir / "qa_multihop.jsonl"), "--out", str(train)], check=True)
    recipe = REPO / "recipes" / "memsearcher" / "config"
    main_ppo = [
        sys.executable,
        "-m",
        "verl.trainer.main_ppo",
        f"--config-path={recipe}",
        "--config-name=memsearcher",
        *CPU_OVERRIDES,
        f"actor_rollout_ref.model.path={model}",
        f"data.train_files={train}",
        f"data.val_files={train}",
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={loops}",
        f"data.train_batch_size={QUESTIONS}",
        f"actor_rollout_ref.rollout.n={N}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={MINI}",
        "data.max_prompt_length=512",
        "data.max_response_length=512",
        "data.dataloader_num_workers=0",
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=2048",
        "actor_rollout_ref.rollout.agent.num_workers=1",
        "reward.num_workers=1",
        "trainer.total_training_steps=1",
        "trainer.save_freq=1",
        "trainer.test_freq=-1",
        "trainer.val_before_train=False",
        "trainer.logger=['console','file']",
        f"trainer.default_local_dir={work / 'checkpoints'}",
    ]
    env = {**os.environ, "VERL_PLATFORM": "cpu", "VERL_FILE_LOGGER_PATH": str(work / "metrics.jsonl")}
    env["MEMAGENT_RETRIEVER_URL"] = retriever_url
    done = subprocess.run(main_ppo, cwd=work, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, (done.stdout + done.stderr)[-8000:]
    return work


def adam_steps(optimizer_file: Path) -> int:
    """The step count Adam keeps for each parameter (all equal), from verl's optimizer checkpoint."""
    state = torch.load(optimizer_file, weights_only=False)
    steps = {int(param_state["step"]) for param_state in state["state"].values()}
    assert len(steps) == 1, steps
    return steps.pop()


def test_released_number_of_optimizer_steps_with_multi_turn_trajectories(run):
    (step,) = [json.loads(line)["data"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    trajectories = step["agent/trajectories"]
    rows = round(step["agent/contexts/mean"] * trajectories)
    assert trajectories == QUESTIONS * N
    assert rows > trajectories, "the trajectories must have several contexts for the count to differ"
    optimizer = run / "checkpoints" / "global_step_1" / "actor" / "optim_world_size_1_rank_0.pt"
    assert adam_steps(optimizer) == math.ceil(rows / (MINI * N))  # released; fixed steps would be 2
    assert math.ceil(rows / (MINI * N)) > QUESTIONS // MINI
    assert pd.read_parquet(run / "train.parquet")["agent_name"].eq("memsearcher").all()
