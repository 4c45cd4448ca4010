"""Fixtures of the agent-loop tests: a real BM25 retriever server over the bundled corpus, verl's config."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from agent_helpers import QUESTION, VERL_SAMPLING

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def bm25_index(tmp_path_factory, data_dir) -> Path:
    """A BM25 index of the bundled corpus, built once by the retriever service's own CLI (about 3 s)."""
    out = tmp_path_factory.mktemp("bm25_index")
    cmd = [sys.executable, "-m", "retriever_server", "build", "--kind", "bm25"]
    cmd += ["--corpus", str(data_dir / "corpus.jsonl"), "--out", str(out)]
    subprocess.run(cmd, check=True, cwd=REPO_ROOT, capture_output=True)
    return out


class RetrieverProcess:
    """`python -m retriever_server serve` on a free loopback port; `stop()` takes it down."""

    def __init__(self, index: Path, workdir: Path):
        port_file = workdir / "port"
        port_file.unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "retriever_server", "serve", "--index", str(index)]
        cmd += ["--port", "0", "--port-file", str(port_file)]
        self.process = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"retriever exited: {self.process.stderr.read().decode()[-2000:]}")
            if port_file.exists() and port_file.read_text().strip():
                self.url = f"http://127.0.0.1:{port_file.read_text().strip()}"
                try:
                    if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError("retriever did not become healthy within 60 s")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@pytest.fixture(scope="session")
def retriever_url(bm25_index, tmp_path_factory):
    server = RetrieverProcess(bm25_index, tmp_path_factory.mktemp("retriever"))
    yield server.url
    server.stop()


@pytest.fixture
def own_retriever(bm25_index, tmp_path):
    """A retriever process of this test alone, so the test may take it down."""
    server = RetrieverProcess(bm25_index, tmp_path)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def trainer_config():
    from verl_memagent.agent import verl_trainer_config

    return verl_trainer_config(prompt_length=4096, response_length=2048)


@pytest.fixture
def run_agent(trainer_config, tokenizer, retriever_url):
    """Build an agent loop the way verl's worker does (hydra, verl's config) and run it on one row."""
    from verl_memagent.agent import instantiate_agent_loop

    async def run(name, policy, question=QUESTION, **settings):
        settings.setdefault("retriever_urls", retriever_url)
        loop = instantiate_agent_loop(name, trainer_config, policy, tokenizer, hf_model_type="qwen2", **settings)
        row = {
            "raw_prompt": [{"role": "user", "content": question}],
            "extra_info": {"question": question},
            "data_source": "test",
            "uid": "uid-0",
            "session_id": 0,
            "global_steps": 1,
        }
        return await loop.run(dict(VERL_SAMPLING), **row)

    return run
