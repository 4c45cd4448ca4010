"""MemSearcher's answer-format verdicts on hand-made turns; tests/agent/test_released_rewards.py checks
the released rule against the released reward itself."""

import pytest

from verl_memagent.grammar import extract_boxed, released_verdict, strict_verdict

CALL = '<tool_call>{"name": "wikipedia_search", "arguments": {"query": "Leda"}}</tool_call>'


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        (r"so \boxed{f(x) = {1, 2}} done", "f(x) = {1, 2}"),
        (r"\boxed{a} then \boxed{b}", "b"),  # the last box
        (r"\boxed Leda $ more", "Leda"),  # the brace-less form wins wherever it is
        (r"\boxed{a} and \boxed b", "b"),
        (r"\boxed{open", None),
        (r"\fbox{Leda}", None),
        (r"\boxed{}", ""),
    ],
)
def test_the_box_is_read_as_the_released_reward_reads_it(text, answer):
    assert extract_boxed(text) == answer


@pytest.mark.parametrize(
    ("turns", "ended", "expected"),
    [
        ([r"<think>t</think> \boxed{Leda}"], True, ("Leda", True)),
        ([r"<think>t</think> \boxed{Leda}"], False, ("Leda", False)),  # no end-of-sequence token
        ([r"\boxed{Leda}"], True, ("Leda", False)),  # the first turn needs a think block
        ([r"<think>a</think><think>b</think>\boxed{x} \boxed{Leda} </think><think>"], True, ("Leda", True)),
        ([r"<think>t</think> \boxed{}"], True, ("", True)),
        ([r"<think>t \boxed{Leda}"], True, ("Leda", False)),  # unpaired think
        ([f"<think>t</think>{CALL}", r"<memory> \boxed{Leda} </memory>"], True, ("Leda", True)),
        ([r"<think>t</think><tool_call>{bad}</tool_call>", r"\boxed{Leda}"], True, ("Leda", False)),
        ([r"<think>t</think>", r"<think>x \boxed{Leda}"], True, ("Leda", False)),  # every turn pairs
        ([r"<think>t</think> \fbox{Leda}"], True, (None, False)),
    ],
)
def test_released_verdict(turns, ended, expected):
    assert released_verdict(turns, ended) == expected


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        (r"<think>it is Paris</think> \boxed{Paris}", True),
        (r"\boxed{Paris}", True),
        (r"<think>a</think><think>b</think>\boxed{Paris}", False),  # two think blocks
        (r"<think>unclosed \boxed{Paris}", False),
        (r"\boxed{Paris} <think>late</think>", False),  # answer before the reasoning closes
        (r"\boxed{a} \boxed{b}", False),
        (r"\boxed Paris", False),
        (r"\boxed{}", False),
        (f"{CALL} \\boxed{{a}}", False),
        ("no answer at all", False),
    ],
)
def test_strict_verdict(text, ok):
    assert strict_verdict(text)[1] is ok


def test_verdicts_use_the_configured_tags():
    assert strict_verdict(r"<r>a</r>\boxed{x}", think_tag="r")[1]
    assert not strict_verdict(r"<r>a</r><r>b</r>\boxed{x}", think_tag="r")[1]
    assert not strict_verdict(r"<call>{}</call>\boxed{x}", tool_call_tag="call")[1]
    assert released_verdict([r"<r>a</r>\boxed{x}"], True, think_tag="r") == ("x", True)
    assert released_verdict([r"<think>a</think><c>x</c>\boxed{x}"], True, tool_call_tag="c") == ("x", False)
