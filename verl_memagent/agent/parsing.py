"""Reading the model's text: which action it took, and what is wrong when it took none.

Every output maps to exactly one `Action`. Malformed outputs become `kind="invalid"` with a reason
code the loops report as the trajectory's finish reason:

| reason | output |
| --- | --- |
| `no_action` | neither a search nor an answer |
| `unclosed_tag` | an action tag (or box) opened and never closed |
| `search_and_answer` | both a search and an answer |
| `empty_query` | a search with a blank query |
| `empty_answer` | an answer with blank content |
| `bad_tool_call` | a tool call that is not JSON `{"name": <tool>, "arguments": {"query": str}}` |
| `no_state` | (mem1) an action without the internal state before it |

An answer also carries the agent's format verdict (`format_ok`), which the loops record with the answer
for the rewards (`reward.scores`): they score what the agent parsed with its own tags.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from verl_memagent.reward.answers import extract_boxed, extract_tag
from verl_memagent.reward.scores import memsearcher_format_ok


@dataclass(frozen=True)
class Action:
    """One parsed action: `search` (with query), `answer` (with answer and format verdict) or `invalid`
    (with reason)."""

    kind: str
    query: str = ""
    answer: str = ""
    reason: str = ""
    format_ok: bool = False

    @classmethod
    def invalid(cls, reason: str) -> Action:
        return cls("invalid", reason=reason)


def _opened(text: str, tag: str) -> bool:
    return f"<{tag}>" in text


def parse_tag_action(text: str, search_tag: str = "search", answer_tag: str = "answer") -> Action:
    """Search-R1 / MEM1 actions: `<search> q </search>` or `<answer> a </answer>` (any answer is well formed)."""
    if _opened(text, search_tag) and _opened(text, answer_tag):
        return Action.invalid("search_and_answer")
    for tag, kind in ((answer_tag, "answer"), (search_tag, "search")):
        if not _opened(text, tag):
            continue
        content = extract_tag(text, tag)
        if content is None:
            return Action.invalid("unclosed_tag")
        if not content:
            return Action.invalid("empty_query" if kind == "search" else "empty_answer")
        return Action("search", query=content) if kind == "search" else Action("answer", answer=content, format_ok=True)
    return Action.invalid("no_action")


def parse_tool_call_action(
    text: str, tool_name: str, tool_call_tag: str = "tool_call", think_tag: str = "think"
) -> Action:
    """MemSearcher actions: a `<tool_call>` JSON search, or a `\\boxed{answer}` whose format verdict is
    MemSearcher's rule for an answer turn (`reward.scores.memsearcher_format_ok`)."""
    has_call, has_box = _opened(text, tool_call_tag), "\\boxed{" in text
    if has_call and has_box:
        return Action.invalid("search_and_answer")
    if has_box:
        answer = extract_boxed(text)
        if answer is None:
            return Action.invalid("unclosed_tag")
        if not answer:
            return Action.invalid("empty_answer")
        return Action("answer", answer=answer, format_ok=memsearcher_format_ok(text, think_tag, tool_call_tag))
    if not has_call:
        return Action.invalid("no_action")
    payload = extract_tag(text, tool_call_tag)
    if payload is None:
        return Action.invalid("unclosed_tag")
    try:
        call = json.loads(payload)
        query = call["arguments"]["query"] if call["name"] == tool_name else None
    except (ValueError, KeyError, TypeError):
        query = None
    if not isinstance(query, str):
        return Action.invalid("bad_tool_call")
    return Action("search", query=query.strip()) if query.strip() else Action.invalid("empty_query")


def parse_memory(text: str, memory_tag: str = "memory") -> tuple[str | None, bool]:
    """The memory a rewrite produced and whether its tag was closed; (None, False) without a tag.

    An unclosed memory (generation hit its token limit) keeps the text after the opening tag.
    """
    if not _opened(text, memory_tag):
        return None, False
    closed = extract_tag(text, memory_tag)
    if closed is not None:
        return closed, True
    return text.split(f"<{memory_tag}>", 1)[1].strip(), False
