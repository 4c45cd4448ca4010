"""Dense index builds of the retriever's tests: `retriever_server build --kind dense` as a user runs it,
offline, and the vectors an index holds. The fixtures built with them are tests/retriever_server/conftest.py's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

#: the dense tests' corpus: the gold passages of the first N_QUESTIONS multi-hop questions plus the first
#: other passages, N_PASSAGES in all (embedding all 14,230 takes several minutes on two cores)
N_QUESTIONS, N_PASSAGES = 40, 300


def build_dense(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """`python -m retriever_server build --kind dense ARGS` with the hub offline; its output captured."""
    command = [sys.executable, "-m", "retriever_server", "build", "--kind", "dense", *args]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run(command, check=check, env=env, capture_output=True, text=True)


def embeddings_of(index_dir: Path) -> np.ndarray:
    """The passage vectors of a built index, memory-mapped."""
    from retriever_server.dense import EMBEDDINGS_FILE  # imports torch: not at collection

    return np.load(index_dir / EMBEDDINGS_FILE, mmap_mode="r")
