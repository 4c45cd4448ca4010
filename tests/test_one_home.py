"""Things that have one home stay there: the agent settings' choices are compared through their enums
(`agent/settings.py`), and the retriever's query-encoder quantisation through its own (`retriever_server/options.py`),
never as string literals a typo or a renamed value would silently miss; one probe asks `/health`.

Read statically from the source: a literal that comes back in a comparison or as a mapping key fails here.
"""

from __future__ import annotations

import ast
from pathlib import Path

from retriever_server.options import Quantize
from verl_memagent.agent.settings import ActionRules, MemoryOverflow, PromptStyle

REPO = Path(__file__).resolve().parent.parent
#: where the choices' values are written once
SETTINGS = REPO / "verl_memagent" / "agent" / "settings.py"
CHOICES = {
    member.value: f"{type(member).__name__}.{member.name}"
    for enum in (PromptStyle, MemoryOverflow, ActionRules)
    for member in enum
}


#: where the retriever's quantisation values are written once
OPTIONS = REPO / "retriever_server" / "options.py"
QUANTIZE = {member.value: f"Quantize.{member.name}" for member in Quantize}


def choice_literals(source: str, choices: dict[str, str] = CHOICES) -> list[str]:
    """`line: literal (the member to use)` for every value of `choices` written as a string literal in a
    comparison (`==`, `!=`, `in`, against a name or inside a tuple) or as a dict key."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
        elif isinstance(node, ast.Dict):
            operands = [key for key in node.keys if key is not None]
        else:
            continue
        for operand in operands:
            for leaf in ast.walk(operand):
                if isinstance(leaf, ast.Constant) and isinstance(leaf.value, str) and leaf.value in choices:
                    found.append(f"{leaf.lineno}: {leaf.value!r} ({choices[leaf.value]})")
    return found


def test_the_finder_sees_a_literal_in_each_place_it_looks():
    source = (
        'a = style == "ours"\n'
        'b = "penalty" != mode\n'
        'c = rules in ("released", "strict")\n'
        'd = {"released_eval": 1}\n'
        'e = span["end"]\n'  # a subscript is not a choice
        "f = style == PromptStyle.OURS\n"
    )
    assert choice_literals(source) == [
        "1: 'ours' (PromptStyle.OURS)",
        "2: 'penalty' (MemoryOverflow.PENALTY)",
        "3: 'released' (ActionRules.RELEASED)",
        "3: 'strict' (ActionRules.STRICT)",
        "4: 'released_eval' (PromptStyle.RELEASED_EVAL)",
    ]


def test_no_module_compares_a_choice_as_a_string_literal():
    found = {
        str(path.relative_to(REPO)): literals
        for path in sorted((REPO / "verl_memagent").rglob("*.py"))
        if path != SETTINGS and (literals := choice_literals(path.read_text(encoding="utf-8")))
    }
    assert found == {}, f"compare with the enums of agent/settings.py instead: {found}"


def test_no_module_of_the_retriever_compares_a_quantisation_as_a_string_literal():
    assert choice_literals('q = quantize == "int8"\nmeta = {"none": 1}\n', QUANTIZE) == [
        "1: 'int8' (Quantize.INT8)",
        "2: 'none' (Quantize.NONE)",
    ]
    found = {
        str(path.relative_to(REPO)): literals
        for path in sorted((REPO / "retriever_server").rglob("*.py"))
        if path != OPTIONS and (literals := choice_literals(path.read_text(encoding="utf-8"), QUANTIZE))
    }
    assert found == {}, f"compare with retriever_server.options.Quantize instead: {found}"


#: where `/health` is asked: the one probe
PROBE = REPO / "verl_memagent" / "search" / "endpoint.py"


def health_requests(path: Path) -> list[str]:
    """`line: text` of every request for `/health` in a Python or shell source: a string literal (or an
    f-string's piece) that is a URL or path ending in `/health`; a mention in a message or comment is not."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".sh":
        code = ((number, line.split("#")[0]) for number, line in enumerate(text.splitlines(), start=1))
        return [f"{number}: {line.strip()}" for number, line in code if "/health" in line]
    return [
        f"{node.lineno}: {node.value!r}"
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value.endswith("/health")
        and " " not in node.value
    ]


def test_the_finder_sees_a_health_request_and_not_a_mention(tmp_path):
    python, shell = tmp_path / "a.py", tmp_path / "a.sh"
    python.write_text('u = f"{url}/health"\nv = base + "/health"\nmessage = "it does not answer /health: start it"\n')
    shell.write_text('# waits until /health answers\ncurl "$URL/health"\n')
    assert health_requests(python) == ["1: '/health'", "2: '/health'"]
    assert health_requests(shell) == ['2: curl "$URL/health"']


def test_one_health_probe():
    sources = [*(REPO / "verl_memagent").rglob("*.py"), *(REPO / "recipes").rglob("*.sh"), *REPO.glob("scripts/*")]
    found = {
        str(path.relative_to(REPO)): requests
        for path in sorted(sources)
        if path != PROBE and path.suffix in (".py", ".sh") and (requests := health_requests(path))
    }
    assert found == {}, f"ask verl_memagent.search.endpoint (retriever_health, or its command) instead: {found}"


#: the one reader of verl's sample keys `{uid}_{session}_{index}`
SAMPLE_KEY = REPO / "verl_memagent" / "algo" / "sample_key.py"


def underscore_splits(source: str) -> list[str]:
    """`line: call` of every split of a string at "_" (`split`, `rsplit`, `partition`, `rpartition`)."""
    return [
        f"{node.lineno}: {ast.unparse(node)}"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("split", "rsplit", "partition", "rpartition")
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and node.args[0].value == "_"
    ]


def test_only_the_sample_key_reads_verls_sample_keys():
    assert underscore_splits('a = key.rsplit("_", 2)\nb = key.split(" ")\nc = key.partition("_")\n') == [
        "1: key.rsplit('_', 2)",
        "3: key.partition('_')",
    ]
    found = {
        str(path.relative_to(REPO)): splits
        for path in sorted((REPO / "verl_memagent" / "algo").rglob("*.py"))
        if path != SAMPLE_KEY and (splits := underscore_splits(path.read_text(encoding="utf-8")))
    }
    assert found == {}, f"read sample keys with verl_memagent.algo.sample_key.SampleKey: {found}"
