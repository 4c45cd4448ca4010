"""Fixtures of the agent-loop tests (the retriever and verl's config are the root conftest's)."""

from __future__ import annotations

from pathlib import Path

import pytest
from agent_helpers import OURS, QUESTION

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def own_retriever(retriever_server, bm25_index_dir):
    """A retriever process of this test alone, so the test may take it down (`.stop()`)."""
    return retriever_server(bm25_index_dir)


@pytest.fixture
def run_agent(trainer_config, tokenizer, retriever_url):
    """Build an agent loop the way verl's worker does (hydra, verl's config) and run it on one row."""
    from verl_memagent.agent import instantiate_agent_loop, verl_sampling_params, verl_worker_row

    async def run(name, policy, question=QUESTION, **settings):
        settings.setdefault("retriever_urls", retriever_url)
        loop = instantiate_agent_loop(name, trainer_config, policy, tokenizer, hf_model_type="qwen2", **settings)
        row = verl_worker_row(question, data_source="test", uid="uid-0", session_id=0, global_steps=1)
        return await loop.run(verl_sampling_params(), **row)

    return run


@pytest.fixture
def run_ours(run_agent):
    """`run_agent` with the project's own format (`prompt_style: ours`); given settings still win."""

    async def run(name, policy, **settings):
        return await run_agent(name, policy, **{**OURS[name], **settings})

    return run


@pytest.fixture(scope="session")
def qwen_tokenizer(tiny_model_dir):
    """The tiny tokenizer with Qwen2.5's chat template, which the released checkpoints use: the
    tokenizer the released code ran with when it rendered fixtures/."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.chat_template = (FIXTURES / "qwen2.5_chat_template.jinja").read_text()
    return tokenizer


@pytest.fixture
def run_released(trainer_config, qwen_tokenizer, retriever_url):
    """`run_agent` on the Qwen2.5 chat template, with the agent's default (released) settings."""
    from verl_memagent.agent import instantiate_agent_loop, verl_sampling_params, verl_worker_row

    async def run(name, policy, question, **settings):
        loop = instantiate_agent_loop(
            name,
            trainer_config,
            policy,
            qwen_tokenizer,
            hf_model_type="qwen2",
            retriever_urls=retriever_url,
            **settings,
        )
        return await loop.run(verl_sampling_params(), **verl_worker_row(question))

    return run


@pytest.fixture(scope="session")
def memsearcher_loop(trainer_config, qwen_tokenizer):
    """A memsearcher loop with its default settings, for its verdict on hand-made contexts."""
    import asyncio

    from memagent_examples.scripted import ScriptedPolicy
    from verl_memagent.agent import instantiate_agent_loop

    async def build():
        return instantiate_agent_loop("memsearcher", trainer_config, ScriptedPolicy(qwen_tokenizer, []), qwen_tokenizer)

    return asyncio.run(build())
