"""The evaluated tasks: verl dataset rows, from a prepared parquet or a FlashRAG file, and the kwargs `run()` gets.

Both inputs end as the rows `verl-memagent prepare` writes: a parquet's rows are read as they are; a
FlashRAG JSON-lines file goes through the same builder as `prepare` (`data.compose.task_rows`: plain
questions, or MEM1's N-objective tasks). `worker_kwargs` then turns a
row into what verl's worker passes `run()` for it, so every input reaches the agent loop the same way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from verl_memagent.data.compose import task_rows
from verl_memagent.data.flashrag import parse_input, read_flashrag

PARQUET_SUFFIX = ".parquet"
EVAL_SPLIT = "test"


def read_parquet_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a verl parquet, checked for the columns the agents and the scores read."""
    import pyarrow.parquet as pq

    if not path.is_file():
        raise ValueError(f"--data {path}: no such file")
    rows = pq.read_table(path).to_pylist()
    if not rows:
        raise ValueError(f"{path}: no rows")
    for index, row in enumerate(rows):
        where = f"{path}: row {index}"
        if not (row.get("reward_model") or {}).get("ground_truth"):
            raise ValueError(f"{where}: field 'reward_model.ground_truth' missing; see `verl-memagent prepare`")
        if not (row.get("extra_info") or {}).get("question") and not row.get("prompt"):
            raise ValueError(f"{where}: neither 'extra_info.question' nor 'prompt'; see `verl-memagent prepare`")
    return rows


def flashrag_rows(
    path: Path, name: str, objectives: int = 1, num_tasks: int | None = None, seed: int = 0
) -> list[dict[str, Any]]:
    """Rows of a FlashRAG file exactly as `verl-memagent prepare` builds them (plain or composed tasks)."""
    # the agent name is a placeholder: worker_kwargs sets each agent's
    return task_rows(read_flashrag(path, source=name), "mem1", EVAL_SPLIT, objectives, num_tasks, seed)


def load_datasets(
    specs: list[str], limit: int | None = None, *, objectives: int = 1, num_tasks: int | None = None, seed: int = 0
) -> dict[str, list[dict[str, Any]]]:
    """`NAME=PATH` (or `PATH`, named by its stem) -> the first `limit` rows of each dataset.

    A `.parquet` is a prepared verl dataset, used as it is; any other file is FlashRAG JSON lines,
    composed into `objectives`-question tasks (`num_tasks`, `seed`) as `verl-memagent prepare` does.
    `limit` keeps the first tasks, which do not depend on `num_tasks` (the composer draws in order).
    """
    if objectives < 1:
        raise ValueError(f"--objectives: expected a positive number of questions per task, got {objectives}")
    datasets = {}
    for spec in specs:
        name, path = parse_input(spec)
        name = name or path.stem
        if name in datasets:
            raise ValueError(f"--data: dataset name {name!r} given twice; name them NAME=PATH")
        if path.suffix == PARQUET_SUFFIX:
            rows = read_parquet_rows(path)
        else:
            rows = flashrag_rows(path, name, objectives, num_tasks, seed)
        datasets[name] = rows[:limit]
    return datasets


def worker_kwargs(row: dict[str, Any], agent: str) -> dict[str, Any]:
    """The kwargs verl's AgentLoopWorker passes `run()` for a parquet row, with `agent_name` set to `agent`.

    verl's RLHFDataset adds `raw_prompt` (the `prompt` messages), `index`, `tools_kwargs` and
    `interaction_kwargs` (from `extra_info`) to the row; the worker passes every non-tensor field on.
    """
    extra_info = row.get("extra_info") or {}
    return {
        **row,
        "raw_prompt": row.get("prompt"),
        "extra_info": extra_info,
        "index": extra_info.get("index", 0),
        "tools_kwargs": extra_info.get("tools_kwargs", {}),
        "interaction_kwargs": extra_info.get("interaction_kwargs", {}),
        "agent_name": agent,
    }
