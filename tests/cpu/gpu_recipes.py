"""Launch the GPU recipe scripts on CPU, unmodified, the documented way (docs/cpu.md, "The GPU recipes on
CPU"): `VERL_PLATFORM=cpu`, the topology in N_GPUS_PER_NODE / NNODES (or RAY_ADDRESS), the tiny model
and bundled data in MODEL_PATH / DATA_DIR, the agent loops in AGENT_LOOPS_YAML, sizes as hydra
overrides on the command line."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = {
    "memsearcher": REPO / "recipes/memsearcher/run_qwen2.5_3b.sh",
    "mem1": REPO / "recipes/mem1/run_qwen2.5_7b.sh",
    "react": REPO / "recipes/react/run_qwen2.5_3b.sh",
}
#: what a GPU recipe needs on CPU besides the CPU switch: the hf rollout is one process per replica
#: (the 7B recipes set tensor parallel 2), and no wandb
ON_CPU = ["actor_rollout_ref.rollout.tensor_model_parallel_size=1", "trainer.logger=['console','file']"]
#: short instructions in place of the released ones (MemSearcher's system prompt, MEM1's user turn: up to
#: 1,000 of the tiny tokenizer's tokens, most of each context) for the scripted rollouts, where the trainer's
#: arithmetic is what is tested; measured, a MemSearcher step after the first went from 23-25 s to 6-8 s,
#: a MEM1 one from 8-12 s to 5-7 s
SHORT_PROMPTS = {
    "memsearcher": {"system": "Answer the question. Search with the tool first."},
    "mem1": {"user": "Answer the questions. Search first, one query at a time: {{ question }}\n"},
}


def prepare_data(agent: str, data_dir: Path, out: Path, rows: int = 4) -> Path:
    """train.parquet and test.parquet of `rows` bundled questions (MEM1: two-objective tasks)."""
    out.mkdir(parents=True, exist_ok=True)
    size = ["--objectives", "2", "--num-tasks", str(rows)] if agent == "mem1" else ["--limit", str(rows)]
    command = [sys.executable, "-m", "verl_memagent.cli", "prepare", "--agent", agent, *size, "--seed", "0"]
    subprocess.run(
        [*command, "--input", str(data_dir / "qa_multihop.jsonl"), "--out", str(out / "train.parquet")], check=True
    )
    shutil.copy(out / "train.parquet", out / "test.parquet")
    return out


def recipe_env(model: Path, data: Path, work: Path, retriever_url: str, loops: Path, ranks: int, **extra) -> dict:
    return {
        **os.environ,
        "VERL_PLATFORM": "cpu",
        "PYTHON": sys.executable,
        "MODEL_PATH": str(model),
        "DATA_DIR": str(data),
        "AGENT_LOOPS_YAML": str(loops),
        "N_GPUS_PER_NODE": str(ranks),
        "MEMAGENT_RETRIEVER_URL": retriever_url,
        "VERL_FILE_LOGGER_PATH": str(work / "metrics.jsonl"),
        **extra,
    }


def recipe_args(work: Path, *overrides: str) -> list[str]:
    """The recipe script's arguments: what CPU needs, the checkpoints in `work`, then `overrides`."""
    return [*ON_CPU, f"trainer.default_local_dir={work / 'checkpoints'}", *overrides]


def launch(agent: str, env: dict, work: Path, *overrides: str) -> subprocess.Popen:
    """The recipe script in its own session (so that a test can kill the whole run), output to work/log."""
    command = ["bash", str(SCRIPTS[agent]), *recipe_args(work, *overrides)]
    log = (work / "run.log").open("a")
    return subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def finish(process: subprocess.Popen, work: Path, timeout: float = 900) -> None:
    assert process.wait(timeout=timeout) == 0, (work / "run.log").read_text()[-8000:]


def metrics(work: Path) -> list[dict]:
    return [json.loads(line) for line in (work / "metrics.jsonl").read_text().splitlines()]


def step_metrics(work: Path) -> tuple[list[int], dict[int, dict]]:
    """The metric lines' steps in order (a list: a step logged twice shows) and each step's data."""
    lines = metrics(work)
    return [line["step"] for line in lines], {line["step"]: line["data"] for line in lines}


def scripted_loops(path: Path, agents=("memsearcher", "mem1"), **settings) -> Path:
    """An agent-loop YAML registering `memagent_examples.scripted.ScriptedAgentLoop` under each agent's name,
    with the short prompts and `settings`."""
    entries = [
        {
            "name": agent,
            "_target_": "memagent_examples.scripted.ScriptedAgentLoop",
            "agent": agent,
            "retriever_urls": "${oc.env:MEMAGENT_RETRIEVER_URL}",
            "topk": 1,
            "max_turns": 3,
            "prompts": SHORT_PROMPTS[agent],
            **settings,
        }
        for agent in agents
    ]
    path.write_text(json.dumps(entries))  # JSON is YAML
    return path


def session_processes(session: int) -> list[int]:
    listing = subprocess.run(["ps", "-eo", "pid=,sid="], capture_output=True, text=True).stdout.split()
    return [int(pid) for pid, sid in zip(listing[::2], listing[1::2], strict=True) if int(sid) == session]


def kill_run(process: subprocess.Popen) -> None:
    """SIGKILL the whole run (its session: the script, verl's driver, Ray and its workers), and wait until
    none of its processes is left."""
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    deadline = time.time() + 30
    while session_processes(process.pid) and time.time() < deadline:
        time.sleep(0.5)
    assert session_processes(process.pid) == [], "processes of the killed run are left"


def trained_rows(work: Path, step: int) -> set[str]:
    """The sample keys of the rows the step's update trained: verl's dump (`trainer.rollout_data_dir` set to
    `work/rollouts`), less its padding rows."""
    rows = map(json.loads, (work / "rollouts" / f"{step}.jsonl").read_text().splitlines())
    return {row["uid"] for row in rows if row["input"]}


def model_weights(folder: Path) -> dict:
    """The tensors of a transformers model folder's safetensors files, by name."""
    from safetensors.torch import load_file

    return {name: value for path in sorted(folder.glob("*.safetensors")) for name, value in load_file(path).items()}


def checkpoint_weights(run: Path, step: int, role: str) -> dict:
    """A run's `role` (actor, critic) weights after `step`, from the checkpoint's transformers model."""
    return model_weights(run / "checkpoints" / f"global_step_{step}" / role / "huggingface")


def checkpoint_optimizer_state(run: Path, step: int, role: str = "actor") -> dict:
    """A one-rank run's `role` optimizer state after `step` (its moments FSDP2's DTensors, whole at one rank)."""
    import torch

    path = run / "checkpoints" / f"global_step_{step}" / role / "optim_world_size_1_rank_0.pt"
    return torch.load(path, weights_only=False)


def unequal_tensors(one: dict, two: dict) -> list[str]:
    """The names of two state dicts' tensors that differ in any bit (both must hold the same names)."""
    import torch

    assert one.keys() == two.keys(), sorted(one.keys() ^ two.keys())
    return [name for name, value in one.items() if not torch.equal(value, two[name])]


def unequal_moments(run: Path, other: Path, step: int, role: str = "actor") -> list[tuple[int, str]]:
    """(parameter, field) of two one-rank runs' Adam states after `step` that differ in any bit: the moments
    (FSDP2's DTensors, whole at one rank) and the step counts."""
    import torch

    def whole(value) -> torch.Tensor:
        return value.to_local() if hasattr(value, "to_local") else torch.as_tensor(value)

    mine, theirs = (checkpoint_optimizer_state(folder, step, role)["state"] for folder in (run, other))
    assert mine.keys() == theirs.keys()
    return [
        (index, field)
        for index, state in mine.items()
        for field in ("exp_avg", "exp_avg_sq", "step")
        if not torch.equal(whole(state[field]), whole(theirs[index][field]))
    ]


def change_excess(one: dict, two: dict, base_one: dict, base_two: dict) -> tuple[float, float]:
    """(largest change of run one, largest excess of |change two - change one| over two float32 roundings)."""
    import torch

    largest, excess = 0.0, 0.0
    for name in one.keys() & base_one.keys():
        a, b = one[name] - base_one[name], two[name] - base_two[name]
        rounding = 2 * torch.finfo(torch.float32).eps * torch.maximum(one[name].abs(), two[name].abs())
        largest = max(largest, a.abs().max().item())
        excess = max(excess, ((a - b).abs() - rounding).max().item())
    return largest, excess
