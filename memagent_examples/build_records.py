"""The record every warm-start build writes beside its weights (`build.json`), and the saver that writes it.

A warm start built from the same inputs on another machine is another model: another CPU's float
arithmetic, amplified over thousands of training steps of a tiny model, moved the learning demo's start from
EM 0.62 to 0.19 (docs/learn_codes.md). So the examples ship their warm starts, and each build records
what it was built from and where: its inputs, the commit, the library versions, the CPU, and a digest
of the first contexts the agent loop built for its demonstrations (`contexts`: which ones it covers,
and their sha256). The digest tells whether today's agent loop still shows the policy exactly what
the start was trained on.
"""

from __future__ import annotations

import hashlib
import json
import platform
import subprocess
from datetime import datetime, timezone
from importlib.metadata import version
from pathlib import Path

RECORD = "build.json"
#: libraries whose numerics or tokens a warm start depends on
LIBRARIES = ("torch", "transformers", "tokenizers", "bm25s", "numpy")
#: CPU features that decide which float kernels torch runs
CPU_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile", "asimd", "sve")


def contexts_digest(samples: list[tuple[list[int], list[int]]]) -> str:
    """sha256 of (input ids, labels) of each sample, in order: equal digests, equal training contexts."""
    return hashlib.sha256(json.dumps(samples, separators=(",", ":")).encode()).hexdigest()


def cpu() -> dict:
    """This machine's CPU: model name, the float-relevant flags it has, and the kernels torch picks."""
    import torch

    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    fields = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
    fields = {key.strip(): value.strip() for key, value in fields.items()}
    flags = set((fields.get("flags") or fields.get("Features") or "").split())
    return {
        "model": fields.get("model name") or platform.processor() or platform.machine(),
        "flags": [flag for flag in CPU_FLAGS if flag in flags],
        "torch_capability": torch.backends.cpu.get_cpu_capability(),
        "torch_threads": torch.get_num_threads(),
    }


def commit() -> str:
    """The repository's commit, with "+changes" when the tree differs from it; "unknown" outside git."""
    repo = Path(__file__).resolve().parents[1]

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout.strip()

    try:
        head = git("rev-parse", "HEAD")
        return head + ("+changes" if git("status", "--porcelain", "--untracked-files=no") else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def build_record(inputs: dict, contexts: dict, samples: int) -> dict:
    """What a warm start was built from and where: `inputs` (seed, step counts, lr, ...), `contexts`
    (which demonstration contexts the digest covers, and their `sha256`), the number of `samples` it
    trained on, and the rest."""
    return {
        "inputs": inputs,
        "commit": commit(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "versions": {lib: version(lib) for lib in LIBRARIES},
        "cpu": cpu(),
        "contexts": contexts,
        "samples": samples,
    }


def read_record(start: Path) -> dict:
    path = Path(start) / RECORD
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no build record; a warm start is a directory a warm-start build wrote")
    return json.loads(path.read_text())


class BuildSaver:
    """Saves a warm start being built with its build record (`RECORD`, the steps done so far): at the end
    (`save`), and every `every` steps to `out/step_N` (`after_step`, for `supervised_steps`), the same
    models as runs of N steps."""

    def __init__(self, model, tokenizer, record: dict, out: Path, every: int = 0):
        self.model, self.tokenizer, self.record, self.out, self.every = model, tokenizer, record, out, every

    def save(self, to: Path, steps_done: int) -> None:
        self.model.save_pretrained(to)
        self.tokenizer.save_pretrained(to)
        inputs = {**self.record["inputs"], "steps": steps_done}
        (to / RECORD).write_text(json.dumps({**self.record, "inputs": inputs}, indent=2) + "\n")

    def after_step(self, step: int) -> None:
        if self.every and step % self.every == 0:
            self.save(self.out / f"step_{step}", step)
