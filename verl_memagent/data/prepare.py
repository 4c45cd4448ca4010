"""FlashRAG-format JSON lines (`id, question, golden_answers`) to the parquet verl's RLHFDataset reads.

Each output row: `prompt` (one user message, the question; the agent renders its own context from
`extra_info.question`), `data_source`, `ability`, `reward_model = {style: rule, ground_truth}`,
`extra_info = {index, id, question, split}` and `agent_name`, which picks the agent loop per row.
Users bring the FlashRAG files (NQ + HotpotQA train for the training mix, the seven evaluation sets);
the bundled `data/qa_*.jsonl` files have the same format.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Search-R1 / MemSearcher training mix and evaluation sets (FlashRAG names)
TRAIN_MIX = ("nq", "hotpotqa")
EVAL_SETS = ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle")

AGENTS = ("memsearcher", "mem1", "react")


@dataclass(frozen=True)
class QARecord:
    """One question of a FlashRAG file."""

    id: str
    question: str
    golden_answers: tuple[str, ...]
    source: str


def read_flashrag(path: str | Path, source: str | None = None) -> list[QARecord]:
    """Read and validate a FlashRAG JSON-lines file; `source` defaults to each row's `source`, else the file stem."""
    path = Path(path)
    records = []
    with path.open(encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{line_no}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{where}: not a JSON object ({exc.msg}); expected one JSON object per line") from exc
            question, answers = row.get("question"), row.get("golden_answers")
            if not isinstance(question, str) or not question.strip():
                raise ValueError(f"{where}: field 'question' must be a non-empty string")
            if isinstance(answers, str):
                answers = [answers]
            if not isinstance(answers, list) or not answers or not all(isinstance(a, str) for a in answers):
                raise ValueError(f"{where}: field 'golden_answers' must be a non-empty list of strings")
            row_id = str(row.get("id", f"{path.stem}_{line_no}"))
            records.append(QARecord(row_id, question.strip(), tuple(answers), source or row.get("source") or path.stem))
    if not records:
        raise ValueError(f"{path}: no questions found")
    return records


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


def write_parquet(rows: Iterable[dict[str, Any]], out: str | Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(list(rows)), out)
    return out


def parse_input(spec: str) -> tuple[str | None, Path]:
    """`NAME=PATH` (data source NAME) or `PATH`."""
    name, sep, path = spec.partition("=")
    return (name, Path(path)) if sep and name and not Path(spec).exists() else (None, Path(spec))


def prepare(
    inputs: Sequence[str],
    out: str | Path,
    agent: str,
    split: str = "train",
    objectives: int = 1,
    num_tasks: int | None = None,
    seed: int = 0,
    shuffle: bool = False,
    limit: int | None = None,
) -> tuple[Path, int]:
    """The `verl-memagent prepare` job: read inputs, optionally shuffle/limit/compose, write one parquet."""
    from verl_memagent.data.compose import task_rows

    records = []
    for spec in inputs:
        source, path = parse_input(spec)
        records += read_flashrag(path, source)
    if shuffle:
        random.Random(seed).shuffle(records)
    if limit is not None:
        records = records[:limit]
    rows = task_rows(records, agent, split, objectives=objectives, num_tasks=num_tasks, seed=seed)
    return write_parquet(rows, out), len(rows)


def add_arguments(parser) -> None:
    """Arguments of `verl-memagent prepare`."""
    parser.add_argument(
        "--input",
        action="append",
        required=True,
        metavar="[NAME=]PATH",
        help="FlashRAG JSON lines; NAME sets data_source (default: each row's `source`, else the file stem). Repeat "
        f"to mix, e.g. the training mix {'+'.join(TRAIN_MIX)}; evaluation sets: {', '.join(EVAL_SETS)}",
    )
    parser.add_argument("--out", required=True, help="parquet file to write")
    parser.add_argument("--agent", required=True, choices=AGENTS, help="agent loop for every row (column agent_name)")
    parser.add_argument("--split", default="train", help="recorded in extra_info.split")
    parser.add_argument(
        "--objectives",
        type=int,
        default=1,
        help="MEM1: questions per task (tasks are composed when >1 or with --num-tasks)",
    )
    parser.add_argument("--num-tasks", type=int, help="MEM1: tasks to compose (default: one pass over the pool)")
    parser.add_argument("--seed", type=int, default=0, help="seed of --shuffle and of the composer")
    parser.add_argument("--shuffle", action="store_true", help="shuffle the questions (seeded) before --limit")
    parser.add_argument("--limit", type=int, help="keep the first N questions")


def run_cli(args) -> int:
    out, rows = prepare(
        args.input,
        args.out,
        agent=args.agent,
        split=args.split,
        objectives=args.objectives,
        num_tasks=args.num_tasks,
        seed=args.seed,
        shuffle=args.shuffle,
        limit=args.limit,
    )
    print(f"wrote {rows} rows to {out}")
    return 0
