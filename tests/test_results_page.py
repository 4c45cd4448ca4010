"""benchmarks/RESULTS.md stays a results page and the README's benchmark table stays whole.

RESULTS holds one section per benchmark, its latest figures with their command, machine and date, and
nothing of a lab notebook: no dated headings (a dated run under a heading is a run kept beside the
latest), no absolute paths of a development machine, and a length a reader can take in. The README's
table names every benchmark once, each linking to its section; its head reads on a narrow screen.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "RESULTS.md"
README = REPO / "README.md"
MAX_RESULTS_LINES = 700
#: a date in a heading (2026-12-05), or a session's stop number
DATED = re.compile(r"\b\d{4}-\d{2}-\d{2}\b|\bstop \d+\b", re.IGNORECASE)
#: a path from the file system's root: `/work/runs/x`, `/tmp/heavy.lock` (not a URL, `1/N`, `../docs`, `/health`)
ABSOLUTE_PATH = re.compile(r"(?<![\w:/.~-])/(?:[\w.-]+/)+[\w.-]*")
SECTION = re.compile(r"^## .*\(`benchmarks/(\w+)\.py`\)$")


def benchmarks(root: Path = REPO) -> list[str]:
    """The benchmarks: the scripts of benchmarks/ (a `__main__` block), not the modules they import."""
    return sorted(
        path.stem
        for path in (root / "benchmarks").glob("*.py")
        if any(
            isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)
            for node in ast.parse(path.read_text(encoding="utf-8")).body
        )
    )


def prose(text: str) -> list[tuple[int, str]]:
    """(line number, line) of the markdown outside code blocks."""
    lines, inside = [], False
    for number, line in enumerate(text.splitlines(), start=1):
        if line.startswith("```"):
            inside = not inside
        elif not inside:
            lines.append((number, line))
    return lines


def page_problems(text: str, names: list[str]) -> list[str]:
    """What keeps `text` from being the results page of the benchmarks `names`."""
    problems = [f"{len(text.splitlines())} lines (at most {MAX_RESULTS_LINES})"] * (
        len(text.splitlines()) > MAX_RESULTS_LINES
    )
    headings = [(number, line) for number, line in prose(text) if line.startswith("#")]
    problems += [f"line {number}: a dated heading: {line}" for number, line in headings if DATED.search(line)]
    problems += [f"line {number}: a stop number" for number, line in prose(text) if re.search(r"\bstop \d+", line)]
    problems += [
        f"line {number}: an absolute path {match.group()}"
        for number, line in enumerate(text.splitlines(), start=1)
        for match in ABSOLUTE_PATH.finditer(line)
    ]
    sections = [match.group(1) for _, line in headings if (match := SECTION.match(line))]
    problems += [f"{name}: {sections.count(name)} sections" for name in names if sections.count(name) != 1]
    problems += [f"{name}: a section of no benchmark" for name in sections if name not in names]
    return problems


def test_the_finder_sees_what_a_notebook_leaves():
    notebook = (
        "# Benchmark results\n\n## A (`benchmarks/a.py`)\n\n### The sweep at the defaults (2026-12-05, stop 51)\n\n"
        "`python benchmarks/a.py --work /work/runs/a --lock /tmp/heavy.lock`, see ../docs/x.md and /health\n\n"
        "## A again (`benchmarks/a.py`)\n\n```\n# 2026-12-05 in a code block is a comment\n```\n"
    )
    assert page_problems(notebook, ["a", "b"]) == [
        "line 5: a dated heading: ### The sweep at the defaults (2026-12-05, stop 51)",
        "line 5: a stop number",
        "line 7: an absolute path /work/runs/a",
        "line 7: an absolute path /tmp/heavy.lock",
        "a: 2 sections",
        "b: 0 sections",
    ]


def test_results_is_one_section_per_benchmark_and_no_notebook():
    assert len(benchmarks()) >= 16 and "shared" not in benchmarks()
    assert page_problems(RESULTS.read_text(encoding="utf-8"), benchmarks()) == []


def slug(heading: str) -> str:
    """GitHub's anchor of a markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.lstrip("#").strip().lower()).replace(" ", "-")


def test_the_readme_lists_every_benchmark_linking_to_its_section():
    section = README.read_text(encoding="utf-8").split("## Benchmarks", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `benchmarks/(\w+)\.py` \|.*\(benchmarks/RESULTS\.md#([\w-]+)\) \|$", section, re.MULTILINE)
    assert sorted(name for name, _ in rows) == benchmarks()
    anchors = {}
    for _, line in prose(RESULTS.read_text(encoding="utf-8")):
        if match := SECTION.match(line):
            anchors[match.group(1)] = slug(line)
    assert {name: anchor for name, anchor in rows} == anchors


def test_the_readmes_head_fits_a_narrow_screen():
    head = README.read_text(encoding="utf-8").splitlines()[:25]
    assert [f"{number}: {len(line)}" for number, line in enumerate(head, start=1) if len(line) > 120] == []
