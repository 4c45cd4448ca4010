"""Fixtures of the trajectory-record tests: verl's config for the agent loops and a real BM25 retriever."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def trainer_config():
    from verl_memagent.agent import verl_trainer_config

    return verl_trainer_config(prompt_length=4096, response_length=4096)


@pytest.fixture(scope="session")
def retriever_url(retriever_server, bm25_index_dir):
    return retriever_server(bm25_index_dir).url
