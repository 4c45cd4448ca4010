"""Fixtures of the trajectory-record tests: verl's config for the agent loops and played records (the
headless Chromium and the retriever are the suite's, tests/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def trainer_config(make_trainer_config):
    """verl's config with the response length (4096) these tests were written for."""
    return make_trainer_config(response_length=4096)


@pytest.fixture(scope="session")
async def played_steps(tokenizer, trainer_config, retriever_url):
    """{step: records} of two training steps of `scripted_runs.PLAYED`, played by the real agent loops."""
    from scripted_runs import played_records

    return {step: await played_records(tokenizer, trainer_config, retriever_url, step) for step in (1, 2)}
