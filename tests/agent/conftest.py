"""Fixtures of the agent-loop tests: a real BM25 retriever server over the bundled corpus, verl's config."""

from __future__ import annotations

import pytest
from agent_helpers import OURS, QUESTION, VERL_SAMPLING


@pytest.fixture(scope="session")
def retriever_url(retriever_server, bm25_index_dir):
    """A real BM25 retriever over the bundled corpus, shared by the agent tests."""
    return retriever_server(bm25_index_dir).url


@pytest.fixture
def own_retriever(retriever_server, bm25_index_dir):
    """A retriever process of this test alone, so the test may take it down (`.stop()`)."""
    return retriever_server(bm25_index_dir)


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


@pytest.fixture
def run_ours(run_agent):
    """`run_agent` with the project's own format (`prompt_style: ours`); given settings still win."""

    async def run(name, policy, **settings):
        return await run_agent(name, policy, **{**OURS[name], **settings})

    return run
