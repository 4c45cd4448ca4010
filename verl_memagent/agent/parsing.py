"""Reading the model's text: which action it took, and what is wrong when it took none.

Two rule sets read MemSearcher's tool-call format (`<tool_call>` JSON, `\\boxed{}` answers), picked by
the agent setting `action_rules`:

- `released` (the default): as the released MemSearcher rollout (`vllm_rollout_spmd.py:342-368,
  430-461, 612-627`). A turn whose `<tool_call>` tags pair up (as many closings as openings, each
  after its opening) runs every call it holds (`released_tool_calls`); a call that cannot run gets
  the released client's (or its retriever's) error text as its result (`released_call`) and the
  trajectory goes on. A turn without a call ends the trajectory, and the released reward judges it
  (`reward.formats.released_verdict`).
- `strict` (ours): `parse_tool_call_action` maps each turn to exactly one `Action`; a malformed one is
  `kind="invalid"` with a reason code the loops report as the trajectory's finish reason.

Search-R1's and MEM1's tag format (`<search>`, `<answer>`) has one rule set, `parse_tag_action`.

| reason | output |
| --- | --- |
| `no_action` | neither a search nor an answer |
| `unclosed_tag` | an action tag (or box) opened and never closed |
| `search_and_answer` | both a search and an answer |
| `several_calls` | (strict) more than one tool call |
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
from typing import Any

from verl_memagent.reward.answers import extract_tag, tag_spans
from verl_memagent.reward.formats import strict_verdict

#: the result texts the released MemSearcher client shows for a call it cannot search with
#: (vllm_rollout_spmd.py:436-445) and the answers of its retriever it shows as `error: <status>`
#: (scripts/serving/retriever_serving.py:42-67: a query that is not a string, a blank query)
CALL_NOT_PARSED = "Parse tool call failed"
ARGUMENTS_NOT_PARSED = "Parse query failed"
EMPTY_QUERY = "invalid query"
QUERY_NOT_TEXT = "error: 422"
BLANK_QUERY = "error: 400"


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


def tags_paired(text: str, tag: str) -> bool:
    """As many closing as opening `tag`s, the i-th closing after the i-th opening (the released check
    of tool calls and memories)."""
    opening, closing = f"<{tag}>", f"</{tag}>"
    if text.count(opening) != text.count(closing):
        return False
    opens = _positions(text, opening)
    return all(start < end for start, end in zip(opens, _positions(text, closing), strict=True))


def _positions(text: str, needle: str) -> list[int]:
    positions, start = [], text.find(needle)
    while start >= 0:
        positions.append(start)
        start = text.find(needle, start + len(needle))
    return positions


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


def released_tool_calls(text: str, tool_call_tag: str = "tool_call") -> list[str]:
    """Every tool call of a turn, each the stripped text between its tags; none unless the tags pair up."""
    return tag_spans(text, tool_call_tag) if tags_paired(text, tool_call_tag) else []


def released_call(call: str) -> tuple[str | None, str]:
    """(query, "") of one released tool call, or (None, the text the model gets as its result).

    The released client reads `arguments.query` without checking the tool's name and sends the
    arguments to its retriever, which rejects a query that is not a string and a blank one.
    """
    try:
        arguments = json.loads(call)["arguments"]
    except (ValueError, KeyError, TypeError, IndexError, RecursionError):
        return None, CALL_NOT_PARSED
    if not isinstance(arguments, dict):
        return None, ARGUMENTS_NOT_PARSED
    query = arguments.get("query", "")
    if query == "":
        return None, EMPTY_QUERY
    if not isinstance(query, str):
        return None, QUERY_NOT_TEXT
    return (query, "") if query.strip() else (None, BLANK_QUERY)


def _strict_query(call: str, tool_name: str) -> str | None:
    """The query of `{"name": tool_name, "arguments": {"query": str}}`, or None."""
    try:
        parsed: Any = json.loads(call)
        query = parsed["arguments"]["query"] if parsed["name"] == tool_name else None
    except (ValueError, KeyError, TypeError, IndexError, RecursionError):
        return None
    return query if isinstance(query, str) else None


def parse_tool_call_action(
    text: str, tool_name: str, tool_call_tag: str = "tool_call", think_tag: str = "think"
) -> Action:
    """MemSearcher actions under the `strict` rules: one `<tool_call>` JSON search, or a `\\boxed{answer}`
    with the strict format verdict (`reward.formats.strict_verdict`)."""
    has_call, has_box = _opened(text, tool_call_tag), "\\boxed{" in text
    if has_call and has_box:
        return Action.invalid("search_and_answer")
    if has_box:
        answer, format_ok = strict_verdict(text, think_tag, tool_call_tag)
        if answer is None:
            return Action.invalid("unclosed_tag")
        if not answer:
            return Action.invalid("empty_answer")
        return Action("answer", answer=answer, format_ok=format_ok)
    if not has_call:
        return Action.invalid("no_action")
    calls = tag_spans(text, tool_call_tag)
    if not calls:
        return Action.invalid("unclosed_tag")
    if len(calls) > 1:
        return Action.invalid("several_calls")
    query = _strict_query(calls[0], tool_name)
    if query is None:
        return Action.invalid("bad_tool_call")
    return Action("search", query=query.strip()) if query.strip() else Action.invalid("empty_query")


def parse_memory(text: str, memory_tag: str = "memory") -> tuple[str | None, bool]:
    """The memory a rewrite produced and whether it was closed, as the released code reads it: the first
    `<memory>` span when the tags pair up. An opening never closed (the call hit its token limit) gives
    the text after it, not closed; any other text (None, False).
    """
    if tags_paired(text, memory_tag):
        spans = tag_spans(text, memory_tag)
        return (spans[0], True) if spans else (None, False)
    opening, closing = f"<{memory_tag}>", f"</{memory_tag}>"
    last = text.rfind(opening)
    if last < 0 or closing in text[last:]:
        return None, False
    return text[last + len(opening) :].strip(), False
