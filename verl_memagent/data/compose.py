"""verl rows of the agents' tasks: one question per row, or MEM1's multi-objective tasks.

Each row: `prompt` (one user message, the question; the agent renders its own context from
`extra_info.question`), `data_source`, `ability`, `reward_model = {style: rule, ground_truth}`,
`extra_info = {index, id, question, split}` and `agent_name`, which picks the agent loop per row.

A multi-objective task joins N single questions into one whose answer lists N answers. Questions
are drawn without repetition inside a task from seeded shuffles of the pool (each pass over the
pool uses every question once), so the same seed gives the same tasks. Ground truth is the list of
the N gold-answer lists, which `reward.scores.multi_objective_em` sums EM over.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from typing import Any

from verl_memagent.data.flashrag import QARecord

AGENTS = ("memsearcher", "mem1", "react")

TASK_PREFIX = "Answer the following questions: "


def to_verl_rows(records: Sequence[QARecord], agent: str, split: str) -> list[dict[str, Any]]:
    """verl rows for single-question tasks (ground truth: the list of gold answers)."""
    if agent not in AGENTS:
        raise ValueError(f"agent: expected one of {AGENTS}, got {agent!r}")
    return [
        {
            "data_source": record.source,
            "prompt": [{"role": "user", "content": record.question}],
            "ability": "fact-reasoning",
            "reward_model": {"style": "rule", "ground_truth": list(record.golden_answers)},
            "extra_info": {"index": index, "id": record.id, "question": record.question, "split": split},
            "agent_name": agent,
        }
        for index, record in enumerate(records)
    ]


def _draws(size: int, rng: random.Random) -> Iterator[int]:
    """Pool positions, one seeded shuffle of the whole pool after another."""
    while True:
        order = list(range(size))
        rng.shuffle(order)
        yield from order


def compose_multi_objective(
    records: Sequence[QARecord],
    objectives: int,
    agent: str = "mem1",
    split: str = "train",
    seed: int = 0,
    num_tasks: int | None = None,
) -> list[dict[str, Any]]:
    """verl rows of `num_tasks` tasks (default: one pass over the pool) of `objectives` questions each."""
    if agent not in AGENTS:
        raise ValueError(f"agent: expected one of {AGENTS}, got {agent!r}")
    if objectives < 1 or objectives > len(records):
        raise ValueError(f"objectives: expected 1..{len(records)} (the pool size), got {objectives}")
    num_tasks = len(records) // objectives if num_tasks is None else num_tasks
    if num_tasks < 1:
        raise ValueError(f"num_tasks: expected a positive integer, got {num_tasks}")
    rng = random.Random(seed)
    draws = _draws(len(records), rng)
    rows = []
    for index in range(num_tasks):
        positions: list[int] = []
        while len(positions) < objectives:
            position = next(draws)
            if position not in positions:
                positions.append(position)
        task = [records[position] for position in positions]
        question = TASK_PREFIX + "; ".join(record.question.rstrip("?;") + "?" for record in task)
        rows.append(
            {
                "data_source": f"multi_objective_{objectives}",
                "prompt": [{"role": "user", "content": question}],
                "ability": "fact-reasoning",
                "reward_model": {"style": "rule", "ground_truth": [list(record.golden_answers) for record in task]},
                "extra_info": {
                    "index": index,
                    "id": "+".join(record.id for record in task),
                    "question": question,
                    "split": split,
                    "objectives": objectives,
                    "sources": [record.source for record in task],
                },
                "agent_name": agent,
            }
        )
    return rows


def task_rows(
    records: Sequence[QARecord],
    agent: str,
    split: str,
    objectives: int = 1,
    num_tasks: int | None = None,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """verl rows of plain questions, or of composed tasks when `objectives` > 1 or `num_tasks` is given.

    `prepare` and `eval` both build their rows here, so the same flags give the same tasks;
    `objectives=1` with `num_tasks` gives seeded one-question tasks worded as the N-objective ones.
    """
    if objectives < 1:
        raise ValueError(f"objectives: expected a positive number of questions per task, got {objectives}")
    if objectives > 1 or num_tasks is not None:
        return compose_multi_objective(records, objectives, agent=agent, split=split, seed=seed, num_tasks=num_tasks)
    return to_verl_rows(records, agent, split)
