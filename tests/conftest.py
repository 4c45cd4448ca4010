"""Shared fixtures: a locally built tokenizer and tiny random Qwen2 (no hub), the bundled data."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
DATA_DIR = REPO_ROOT / "data"


@pytest.fixture(scope="session")
def data_dir() -> Path:
    return DATA_DIR


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A saved tiny Qwen2 + tokenizer, built once per test session (about 5 s)."""
    from verl_memagent.tiny_model import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny_qwen2"))


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="session")
def tiny_model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()


class RetrieverProcess:
    """A real `python -m retriever_server serve` process on a free loopback port."""

    def __init__(self, index_dir: Path, *args: str, timeout_s: float = 180.0):
        import os
        import subprocess
        import sys
        import tempfile
        import time

        import httpx

        work = Path(tempfile.mkdtemp())
        self._port_file, self.log = work / "port", work / "server.log"
        command = [sys.executable, "-m", "retriever_server", "serve", "--index", str(index_dir), "--port", "0"]
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [*command, "--port-file", str(self._port_file), *args], env=env, cwd=REPO_ROOT, stderr=log
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"retriever server exited: {self.log.read_text()}")
            if self._port_file.is_file() and self._port_file.read_text():
                self.url = f"http://127.0.0.1:{self._port_file.read_text()}"
                try:
                    if httpx.get(f"{self.url}/health", timeout=5).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"retriever server not ready after {timeout_s} s")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=30)


@pytest.fixture(scope="session")
def retriever_server():
    """Factory `retriever_server(index_dir, *serve_args) -> RetrieverProcess`; all stopped at session end."""
    started: list[RetrieverProcess] = []

    def start(index_dir: Path, *args: str) -> RetrieverProcess:
        started.append(RetrieverProcess(index_dir, *args))
        return started[-1]

    yield start
    for process in started:
        process.stop()


@pytest.fixture(scope="session")
def bm25_index_dir(tmp_path_factory, data_dir) -> Path:
    """A BM25 index of the bundled corpus built with the retriever's CLI (a few seconds)."""
    import subprocess
    import sys

    out = tmp_path_factory.mktemp("bm25_index")
    command = [sys.executable, "-m", "retriever_server", "build", "--kind", "bm25"]
    subprocess.run([*command, "--corpus", str(data_dir / "corpus.jsonl"), "--out", str(out)], check=True, cwd=REPO_ROOT)
    return out
