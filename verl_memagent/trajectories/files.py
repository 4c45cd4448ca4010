"""Where records live and how they are written and read: `<run dir>/trajectories/*.jsonl`.

| file | written by |
| --- | --- |
| `step_<N>.jsonl` | the trainer, after training step N |
| `validation_step_<N>.jsonl` | the trainer's validation at step N (0: before training) |
| `eval.jsonl` | `verl-memagent eval`, under its `--out` directory |

One JSON line per trajectory (`schema.TrajectoryRecord`). A file is written whole to a temporary
name and renamed, so a reader never sees half a step.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

from pydantic import ValidationError

from verl_memagent.trajectories.schema import Source, TrajectoryRecord

TRAJECTORIES_DIR = "trajectories"
EVAL_FILE = "eval.jsonl"


def records_path(directory: str | Path, source: Source, step: int | None = None) -> Path:
    """The file of one step's records in the records directory (`step` is ignored for eval)."""
    directory = Path(directory)
    if source == "eval":
        return directory / EVAL_FILE
    return directory / (f"step_{step}.jsonl" if source == "train" else f"validation_step_{step}.jsonl")


def step_of_record_file(path: str | Path) -> int | None:
    """The training step a `step_<N>.jsonl` or `validation_step_<N>.jsonl` file belongs to (None for others)."""
    found = re.fullmatch(r"(?:validation_)?step_(\d+)\.jsonl", Path(path).name)
    return int(found.group(1)) if found else None


def write_records(path: str | Path, records: Iterable[TrajectoryRecord]) -> Path:
    """Write records as JSON lines, whole or not at all (a partial file renamed into place); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    with partial.open("w", encoding="utf-8") as out:
        for record in records:
            out.write(record.model_dump_json() + "\n")
    partial.replace(path)
    return path


def read_records(path: str | Path) -> list[TrajectoryRecord]:
    """The records of one file; a line that is not a record fails with the file, line and field."""
    path = Path(path)
    records = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                records.append(TrajectoryRecord.model_validate_json(line))
            except ValidationError as error:
                problem = error.errors()[0]
                field = ".".join(str(part) for part in problem["loc"]) or "(the line)"
                raise ValueError(
                    f"{path}:{number}: field {field!r}: {problem['msg']} ({error.error_count()} problem(s) in "
                    "the line); expected a trajectory record (docs/trajectories.md)"
                ) from None
    return records


def record_files(path: str | Path) -> list[Path]:
    """The record files `path` names: a `.jsonl` file, a directory of them, or a run directory holding
    `trajectories/` (the trainer's run dir, an eval `--out` directory)."""
    path = Path(path)
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise ValueError(f"{path}: no such file or directory")
    directory = path / TRAJECTORIES_DIR if (path / TRAJECTORIES_DIR).is_dir() else path
    files = sorted(directory.glob("*.jsonl"))
    if not files:
        raise ValueError(
            f"{path}: no trajectory records (*.jsonl) in it or in {path / TRAJECTORIES_DIR}; "
            "the trainer writes them to <trainer.default_local_dir>/trajectories (docs/trajectories.md)"
        )
    return files
