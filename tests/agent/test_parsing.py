"""Every malformed action maps to one documented reason; well-formed ones to their content."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_memagent.agent.parsing import Action, parse_memory, parse_tag_action, parse_tool_call_action


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<think>x</think><search> who </search>", Action("search", query="who")),
        ("<answer> Paris </answer>", Action("answer", answer="Paris", format_ok=True)),
        ("just words", Action.invalid("no_action")),
        ("<search> who ", Action.invalid("unclosed_tag")),
        ("<answer>Paris", Action.invalid("unclosed_tag")),
        ("<search>q</search><answer>a</answer>", Action.invalid("search_and_answer")),
        ("<search>   </search>", Action.invalid("empty_query")),
        ("<answer></answer>", Action.invalid("empty_answer")),
    ],
)
def test_tag_actions(text, expected):
    assert parse_tag_action(text) == expected


def test_tag_actions_with_renamed_tags():
    assert parse_tag_action("<q>x</q>", search_tag="q", answer_tag="a") == Action("search", query="x")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            '<think>t</think><tool_call>{"name": "wikipedia_search", "arguments": {"query": " Leda "}}</tool_call>',
            Action("search", query="Leda"),
        ),
        (r"<think>t</think>\boxed{Old Frisian}", Action("answer", answer="Old Frisian", format_ok=True)),
        # an answer MemSearcher's format rule rejects (two think blocks): parsed, with the verdict
        (r"<think>a</think><think>b</think>\boxed{Leda}", Action("answer", answer="Leda", format_ok=False)),
        ("<tool_call>{not json}</tool_call>", Action.invalid("bad_tool_call")),
        ('<tool_call>{"name": "other", "arguments": {"query": "x"}}</tool_call>', Action.invalid("bad_tool_call")),
        (
            '<tool_call>{"name": "wikipedia_search", "arguments": {"query": 3}}</tool_call>',
            Action.invalid("bad_tool_call"),
        ),
        ('<tool_call>{"name": "wikipedia_search"}</tool_call>', Action.invalid("bad_tool_call")),
        (
            '<tool_call>{"name": "wikipedia_search", "arguments": {"query": ""}}</tool_call>',
            Action.invalid("empty_query"),
        ),
        ('<tool_call>{"name": "wikipedia_search"', Action.invalid("unclosed_tag")),
        (r"\boxed{a", Action.invalid("unclosed_tag")),
        (r"\boxed{ }", Action.invalid("empty_answer")),
        ("<tool_call>{}</tool_call> \\boxed{a}", Action.invalid("search_and_answer")),
        ("<think>only thoughts</think>", Action.invalid("no_action")),
    ],
)
def test_tool_call_actions(text, expected):
    assert parse_tool_call_action(text, "wikipedia_search") == expected


def test_memory_parsing():
    assert parse_memory("<memory> Leda is a river </memory>") == ("Leda is a river", True)
    assert parse_memory("<memory> cut off mid") == ("cut off mid", False)
    assert parse_memory("no tag here") == (None, False)


REASONS = {
    "no_action",
    "unclosed_tag",
    "search_and_answer",
    "several_calls",
    "empty_query",
    "empty_answer",
    "bad_tool_call",
}
PIECES = st.sampled_from(
    ["<search>", "</search>", "<answer>", "</answer>", "<tool_call>", "</tool_call>", "\\boxed{", "}", "{", '"', ":"]
    + ['{"name": "wikipedia_search", "arguments": {"query": ', '"Leda"', " ", "x", "<think>", "</think>", "\n"]
)


@given(st.lists(st.one_of(PIECES, st.text(max_size=8)), max_size=20).map("".join))
@settings(max_examples=300, deadline=None)
def test_any_text_maps_to_one_defined_action(text):
    for action in (parse_tag_action(text), parse_tool_call_action(text, "wikipedia_search")):
        if action.kind == "invalid":
            assert action.reason in REASONS
        elif action.kind == "search":
            assert action.query and action.query == action.query.strip()
        else:
            assert action.kind == "answer" and action.answer


def test_format_verdict_uses_the_configured_tags():
    text = r"<reason>a</reason><reason>b</reason>\boxed{Leda}"
    assert parse_tool_call_action(text, "wikipedia_search").format_ok  # no <think> block: fine by default
    renamed = parse_tool_call_action(text, "wikipedia_search", tool_call_tag="call", think_tag="reason")
    assert renamed == Action("answer", answer="Leda", format_ok=False)
    assert parse_tool_call_action(r"<call>x</call>\boxed{a}", "s", tool_call_tag="call").reason == "search_and_answer"
