"""Shared fixtures: a locally built tokenizer and tiny random Qwen2 (no hub), the bundled data."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
DATA_DIR = REPO_ROOT / "data"
# fixtures that start Ray (tens of seconds on 2 cores), compile a model or build dense indexes: their
# tests are `slow`
SLOW_FIXTURES = {"transfer_queue", "local_ray", "int8_encoder", "torch_index", "flat_index"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


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


@pytest.fixture(scope="session")
def retriever_server():
    """Factory `retriever_server(index_dir, *serve_args) -> ServerProcess`; all stopped at session end."""
    from retriever_process import ServerProcess, serve_command

    started: list[ServerProcess] = []

    def start(index_dir: Path, *args: str) -> ServerProcess:
        started.append(ServerProcess(serve_command(index_dir, *args), cwd=REPO_ROOT))
        return started[-1]

    yield start
    for process in started:
        process.stop()


@pytest.fixture(scope="module")
def transfer_queue():
    """A real TransferQueue on a local Ray, as verl's V1 trainer uses it (Ray and TQ imported here only)."""
    import ray
    import transfer_queue as tq

    # Ray counts CPUs as slots; TransferQueue's controller and storage units need more than 2
    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False)
    tq.init()
    yield tq
    tq.close()
    ray.shutdown()


@pytest.fixture(scope="session")
def bm25_index_dir(tmp_path_factory, data_dir) -> Path:
    """A BM25 index of the bundled corpus built with the retriever's CLI (a few seconds)."""
    import subprocess

    out = tmp_path_factory.mktemp("bm25_index")
    from retriever_process import build_command

    subprocess.run(build_command("bm25", data_dir / "corpus.jsonl", out), check=True, cwd=REPO_ROOT)
    return out
