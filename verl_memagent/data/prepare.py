"""`verl-memagent prepare`: FlashRAG JSON lines to the parquet verl's RLHFDataset reads (rows: `compose`)."""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from verl_memagent.data.compose import AGENTS, task_rows
from verl_memagent.data.flashrag import EVAL_SETS, TRAIN_MIX, parse_input, read_flashrag


def write_parquet(rows: Iterable[dict[str, Any]], out: str | Path) -> Path:
    """Write verl dataset rows to a parquet file (its directory made if missing); returns its path."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(list(rows)), out)
    return out


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
    """`verl-memagent prepare`: write the parquet the arguments ask for and say how many rows."""
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
