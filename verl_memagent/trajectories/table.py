"""Records as a tracker table: one row per trajectory, its turns as readable text in one cell.

verl's `ValidationGenerationsLogger` logs one row per training sample; for a multi-context agent a
sample is one context, so here a row is a whole trajectory instead. Logged to wandb when the run's
`trainer.logger` includes it (the only tracker of verl's with tables we log to; see docs/trajectories.md).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from verl_memagent.trajectories.schema import TrajectoryRecord, Turn

#: where a wandb run folder keeps logged tables
TABLE_MEDIA = "files/media/table"
COLUMNS = [
    "step",
    "source",
    "agent",
    "data_source",
    "question",
    "golden_answers",
    "answer",
    "finish_reason",
    "reward",
    "advantage",
    "turns",
    "peak_context_tokens",
    "trajectory",
    "trajectory_id",
]


def turn_text(turn: Turn) -> str:
    """A turn as plain text: context size, memory before, each call's output, the search and its passages, the
    memory written."""
    lines = [f"Turn {turn.index + 1} ({turn.context_tokens} context tokens)"]
    if turn.memory_before is not None:
        lines.append(f"  memory before: {turn.memory_before or '(empty)'}")
    for number, call in enumerate(turn.calls):
        lines.append(f"  {'action' if number == 0 else 'then'} [{call.finish}]: {call.output.strip()}")
    if turn.query is not None:
        lines.append(f"  query: {turn.query}" + (" (search failed)" if turn.search_failed else ""))
        lines.extend(f"    [{passage.id}] {passage.title}" for passage in turn.passages)
    if turn.memory is not None:
        lines.append(f"  memory written: {turn.memory}")
    return "\n".join(lines)


def trajectory_text(record: TrajectoryRecord) -> str:
    """The turns, one block each, then how the trajectory ended."""
    ending = f"finished: {record.finish_reason}" + (" (penalised)" if record.penalised else "")
    if record.answer is not None:
        ending += f"; answer: {record.answer}"
    return "\n\n".join([*(turn_text(turn) for turn in record.turns), ending])


def table_rows(records: Sequence[TrajectoryRecord]) -> list[list]:
    """One row of the tracker table (`COLUMNS`) per record."""
    return [
        [
            record.step,
            record.source,
            record.agent,
            record.data_source,
            record.question,
            str(record.golden_answers),
            record.answer,
            record.finish_reason,
            record.reward,
            record.advantage,
            len(record.turns),
            max((turn.context_tokens for turn in record.turns), default=0),
            trajectory_text(record),
            record.trajectory_id,
        ]
        for record in records
    ]


def table_key(source: str) -> str:
    """The tracker key of a source's table: `trajectories/train`, `trajectories/validation`."""
    return f"trajectories/{source}"


def log_to_trackers(loggers: Sequence[str], records: Sequence[TrajectoryRecord], source: str, step: int) -> None:
    """Log the records as a table of step `step` to each tracker of `loggers` that has tables."""
    if "wandb" not in loggers or not records:
        return
    import wandb

    if wandb.run is not None:
        wandb.log({table_key(source): wandb.Table(columns=COLUMNS, data=table_rows(records))}, step=step)


def read_offline_tables(wandb_dir: str | Path, source: str) -> list[dict[str, Any]]:
    """The trajectory tables a wandb run in offline mode logged (`WANDB_MODE=offline`; `wandb_dir` holds
    its `offline-run-*` folders), oldest first, each as `{"columns", "data"}`: wandb writes every
    logged table to `files/media/table/<key>_<n>_<hash>.table.json`, n counting the key's tables."""
    folder, name = table_key(source).rsplit("/", 1)
    tables = []
    for run in sorted(Path(wandb_dir).glob("offline-run-*")):
        files = (run / TABLE_MEDIA / folder).glob(f"{name}_*.table.json")
        for file in sorted(files, key=lambda f: int(f.name.split("_")[-2])):
            tables.append(json.loads(file.read_text(encoding="utf-8")))
    return tables
