"""Launch the GPU recipe scripts on CPU, unmodified, the documented way (docs/cpu.md, "The GPU recipes on
CPU"): `VERL_PLATFORM=cpu`, the topology in N_GPUS_PER_NODE / NNODES (or RAY_ADDRESS), the tiny model
and bundled data in MODEL_PATH / DATA_DIR, the agent loops in AGENT_LOOPS_YAML, sizes as hydra
overrides on the command line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
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
