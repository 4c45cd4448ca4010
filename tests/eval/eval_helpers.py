"""Helpers of the eval tests: the agents and questions every CLI run uses, and reading a run's outputs."""

from __future__ import annotations

import json
from pathlib import Path

AGENTS = ("memsearcher", "react")
DATASETS = {"multihop": "qa_multihop.jsonl", "bamboogle": "qa_bamboogle.jsonl"}
QUESTIONS_PER_DATASET = 2


def eval_argv(data_dir: Path, retriever_url: str, out: Path, *backend: str, concurrency: int) -> list[str]:
    """`verl-memagent eval` arguments: both agents, 2 + 2 bundled questions, 2 turns of at most 16 new tokens."""
    argv = ["eval", *(arg for agent in AGENTS for arg in ("--agent", agent))]
    for name, file in DATASETS.items():
        argv += ["--data", f"{name}={data_dir / file}"]
    argv += ["--limit", str(QUESTIONS_PER_DATASET), "--max-turns", "2", "--max-new-tokens", "16"]
    return [*argv, "--retriever", retriever_url, "--concurrency", str(concurrency), "--out", str(out), *backend]


def read_outputs(out: Path) -> tuple[dict, list[dict]]:
    summary = json.loads((out / "summary.json").read_text())
    examples = [json.loads(line) for line in (out / "examples.jsonl").read_text().splitlines()]
    return summary, examples
