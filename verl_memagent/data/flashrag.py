"""FlashRAG-format JSON lines (`id, question, golden_answers`): the questions every job reads.

Users bring the FlashRAG files (NQ + HotpotQA train for the training mix, the seven evaluation sets);
the bundled `data/qa_*.jsonl` files have the same format.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

#: Search-R1 / MemSearcher training mix and evaluation sets (FlashRAG names)
TRAIN_MIX = ("nq", "hotpotqa")
EVAL_SETS = ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle")


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


def parse_input(spec: str) -> tuple[str | None, Path]:
    """`NAME=PATH` (data source NAME) or `PATH`."""
    name, sep, path = spec.partition("=")
    return (name, Path(path)) if sep and name and not Path(spec).exists() else (None, Path(spec))
