"""The page `verl-memagent show` writes: one self-contained HTML file to read trajectory records.

Everything is inline (`page.html`: CSS and JS; the records as JSON), so the file opens anywhere
without a network. Each step's records sit in their own block (gzip-compressed JSON in base64),
inflated and parsed only when that step is shown; the page renders one page of trajectory cards at a time and a
trajectory's turn cards only when it is opened, so a large run stays responsive. The memory diffs
are computed here (difflib, word level) and shipped with the turns.
"""

from __future__ import annotations

import base64
import gzip
import html
import json
import re
from collections import Counter
from collections.abc import Sequence
from difflib import SequenceMatcher
from pathlib import Path
from typing import Any

from verl_memagent.trajectories.files import read_records, record_files
from verl_memagent.trajectories.schema import TrajectoryRecord

PAGE = Path(__file__).with_name("page.html")
SOURCE_ORDER = {"validation": 0, "train": 1, "eval": 2}  # validation at step N ran before training step N+1
_WORD = re.compile(r"\S+")


def _words(text: str) -> tuple[list[str], list[int]]:
    """The words of `text` and where each word's piece starts (a piece runs to the next word; the text's
    leading spaces go with the first), so that pieces i..j are `text[cuts[i]:cuts[j]]`."""
    starts = [match.start() for match in _WORD.finditer(text)]
    return text.split(), [0, *starts[1:], len(text)]


def memory_diff(before: str | None, after: str | None) -> list[list[str]] | None:
    """The word-level edit from `before` to `after` as [op, text] pieces: "=" kept (with the text as it
    was before as a third item where only the spacing differs), "-" removed, "+" added. None when the
    turn holds no memory; with no new memory written, all of `before` is kept."""
    if before is None:
        return None
    if after is None:
        return [["=", before]]
    (old, old_cuts), (new, new_cuts) = _words(before), _words(after)
    pieces = []
    for tag, i1, i2, j1, j2 in SequenceMatcher(None, old, new, autojunk=False).get_opcodes():
        if tag == "equal":
            kept, was = after[new_cuts[j1] : new_cuts[j2]], before[old_cuts[i1] : old_cuts[i2]]
            pieces.append(["=", kept] if kept == was else ["=", kept, was])  # the same words, other spaces
            continue
        if i2 > i1:
            pieces.append(["-", before[old_cuts[i1] : old_cuts[i2]]])
        if j2 > j1:
            pieces.append(["+", after[new_cuts[j1] : new_cuts[j2]]])
    return pieces


def group_label(source: str, step: int | None) -> str:
    """The heading of a step's records on the page: `train step 3`, `validation step 0`, `eval`."""
    return "eval" if source == "eval" else f"{source} step {step}"


def select_steps(steps: Sequence[int], spec: str) -> set[int]:
    """The steps `spec` names: `all`, or a comma list of step numbers, `first` and `last` (of `steps`)."""
    if spec == "all" or not steps:
        return set(steps)
    chosen = set()
    for part in (p.strip() for p in spec.split(",")):
        if part in ("first", "last"):
            chosen.add(min(steps) if part == "first" else max(steps))
        elif part.isdigit():
            chosen.add(int(part))
        else:
            raise ValueError(f"--steps {spec!r}: expected 'all' or a comma list of step numbers, 'first', 'last'")
    return chosen


def page_records(records: Sequence[TrajectoryRecord]) -> list[dict[str, Any]]:
    """The records as the page reads them: each turn with its memory diff."""
    shown = []
    for record in records:
        data = record.model_dump(mode="json")
        for turn in data["turns"]:
            turn["diff"] = memory_diff(turn["memory_before"], turn["memory"])
        shown.append(data)
    return shown


def _json_block(element_id: str, value: Any) -> str:
    # "<" escaped inside JSON: no text of a record can close the script element or open a comment
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":")).replace("<", "\\u003c")
    return f'<script type="application/json" id="{element_id}">{text}</script>'


def _gzip_block(element_id: str, value: Any) -> str:
    """`value` as gzip-compressed JSON in base64: contexts repeat the system prompt and one another, so a
    step's records shrink several times; the page inflates a step with the browser's DecompressionStream."""
    data = gzip.compress(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode(), mtime=0)
    return f'<script type="application/gzip" id="{element_id}">{base64.b64encode(data).decode()}</script>'


def render_page(records: Sequence[TrajectoryRecord], title: str, files: Sequence[str] = ()) -> str:
    """The HTML of the page: one group (step) per source and step, in the order they ran."""
    groups: dict[tuple[str, int | None], list[TrajectoryRecord]] = {}
    for record in records:
        groups.setdefault((record.source, record.step), []).append(record)
    order = sorted(groups, key=lambda g: (g[1] is None, g[1] or 0, SOURCE_ORDER[g[0]]))  # eval last
    index = {
        "files": list(files),
        "groups": [
            {"id": f"g{i}", "label": group_label(*key), "count": len(groups[key])} for i, key in enumerate(order)
        ],
    }
    blocks = [_json_block("index", index)]
    blocks += [_gzip_block(f"data-g{i}", page_records(groups[key])) for i, key in enumerate(order)]
    page = PAGE.read_text(encoding="utf-8").replace("__TITLE__", html.escape(title))
    return page.replace("__DATA__", "\n".join(blocks))


def write_report(
    records: Sequence[TrajectoryRecord], out: str | Path, title: str = "Trajectories", files: Sequence[str] = ()
) -> Path:
    """Write the self-contained HTML page of `records` (`files`: where they were read from) to `out`."""
    if not records:
        raise ValueError("no trajectory records to show")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_page(records, title, files), encoding="utf-8")
    return out


def show(paths: Sequence[str | Path], out: str | Path, steps: str = "all", max_per_step: int | None = None) -> Path:
    """`verl-memagent show`: the page of the records under `paths` (run dirs, record dirs, .jsonl files).

    `steps` picks steps by number (`first` and `last` are the first and last training steps, or of all
    steps when no training records are there); eval records have no step and are always shown.
    `max_per_step` keeps the first N trajectories of each step.
    """
    files = [file for path in paths for file in record_files(path)]
    records = [record for file in files for record in read_records(file)]
    numbered = {r.step for r in records if r.step is not None}
    trained = {r.step for r in records if r.source == "train"}
    chosen = select_steps(sorted(trained or numbered), steps)
    kept, seen = [], Counter()
    for record in records:
        group = (record.source, record.step)
        if (record.step is None or record.step in chosen) and (max_per_step is None or seen[group] < max_per_step):
            kept.append(record)
            seen[group] += 1
    if not kept:
        raise ValueError(f"no records of steps {steps!r} in {', '.join(map(str, files))}")
    title = f"Trajectories: {', '.join(str(Path(p)) for p in paths)}"
    return write_report(kept, out, title=title, files=[str(file) for file in files])
