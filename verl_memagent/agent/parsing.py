"""Reading the model's text: which action it took, and what is wrong when it took none.

Two rule sets read MemSearcher's tool-call format (`<tool_call>` JSON, `\\boxed{}` answers), picked by
the agent setting `action_rules`:

- `released` (the default): as the released MemSearcher rollout (`vllm_rollout_spmd.py:342-368,
  430-461, 612-627`). A turn whose `<tool_call>` tags pair up (as many closings as openings, each
  after its opening) runs every call it holds (`released_tool_calls`); a call that cannot run gets
  the released client's (or its retriever's) error text as its result (`released_call`) and the
  trajectory goes on. A turn without a call ends the trajectory, and the released reward judges it
  (`grammar.released_verdict`).
- `strict` (ours): `parse_tool_call_action` maps each turn to exactly one `Action`; a malformed one is
  invalid, with the `FinishReason` (output_fields.py: `no_action`, `unclosed_tag`, ...) the loops
  report as the trajectory's finish reason.

Search-R1's and MEM1's tag format (`<search>`, `<answer>`) has one rule set, `parse_tag_action`.

An answer also carries the agent's format verdict (`format_ok`), which the loops record with the answer
for the rewards (`reward.scores`): they score what the agent parsed with its own tags.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from verl_memagent.grammar import BOX, closing, extract_tag, opened, opening, strict_verdict, tag_spans, tags_paired
from verl_memagent.output_fields import FinishReason

#: the result texts the released MemSearcher client shows for a call it cannot search with
#: (vllm_rollout_spmd.py:436-445) and the answers of its retriever it shows as `error: <status>`
#: (scripts/serving/retriever_serving.py:42-67: a query that is not a string, a blank query)
CALL_NOT_PARSED = "Parse tool call failed"
ARGUMENTS_NOT_PARSED = "Parse query failed"
EMPTY_QUERY = "invalid query"
QUERY_NOT_TEXT = "error: 422"
BLANK_QUERY = "error: 400"


class ActionKind:
    """What a turn did: searched, answered, or neither (invalid: the trajectory ends)."""

    SEARCH = "search"
    ANSWER = "answer"
    INVALID = "invalid"


@dataclass(frozen=True)
class Action:
    """One parsed action: a search (with query), an answer (with answer and format verdict) or invalid
    (with the `FinishReason` that ends the trajectory)."""

    kind: str  # an `ActionKind`
    query: str = ""
    answer: str = ""
    reason: str = ""
    format_ok: bool = False

    @classmethod
    def search(cls, query: str) -> Action:
        """A search for `query`."""
        return cls(ActionKind.SEARCH, query=query)

    @classmethod
    def answered(cls, answer: str, format_ok: bool) -> Action:
        """An answer, with the strict format's verdict on it."""
        return cls(ActionKind.ANSWER, answer=answer, format_ok=format_ok)

    @classmethod
    def invalid(cls, reason: str) -> Action:
        """No valid action: `reason` (a `FinishReason`) ends the trajectory."""
        return cls(ActionKind.INVALID, reason=reason)


def parse_tag_action(text: str, search_tag: str = "search", answer_tag: str = "answer") -> Action:
    """Search-R1 / MEM1 actions: `<search> q </search>` or `<answer> a </answer>` (any answer is well formed)."""
    if opened(text, search_tag) and opened(text, answer_tag):
        return Action.invalid(FinishReason.SEARCH_AND_ANSWER)
    for tag, kind in ((answer_tag, ActionKind.ANSWER), (search_tag, ActionKind.SEARCH)):
        if not opened(text, tag):
            continue
        content = extract_tag(text, tag)
        if content is None:
            return Action.invalid(FinishReason.UNCLOSED_TAG)
        if not content:
            return Action.invalid(FinishReason.EMPTY_QUERY if kind == ActionKind.SEARCH else FinishReason.EMPTY_ANSWER)
        return Action.search(content) if kind == ActionKind.SEARCH else Action.answered(content, format_ok=True)
    return Action.invalid(FinishReason.NO_ACTION)


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
    with the strict format verdict (`grammar.strict_verdict`)."""
    has_call, has_box = opened(text, tool_call_tag), BOX + "{" in text
    if has_call and has_box:
        return Action.invalid(FinishReason.SEARCH_AND_ANSWER)
    if has_box:
        answer, format_ok = strict_verdict(text, think_tag, tool_call_tag)
        if answer is None:
            return Action.invalid(FinishReason.UNCLOSED_TAG)
        if not answer:
            return Action.invalid(FinishReason.EMPTY_ANSWER)
        return Action.answered(answer, format_ok=format_ok)
    if not has_call:
        return Action.invalid(FinishReason.NO_ACTION)
    calls = tag_spans(text, tool_call_tag)
    if not calls:
        return Action.invalid(FinishReason.UNCLOSED_TAG)
    if len(calls) > 1:
        return Action.invalid(FinishReason.SEVERAL_CALLS)
    query = _strict_query(calls[0], tool_name)
    if query is None:
        return Action.invalid(FinishReason.BAD_TOOL_CALL)
    return Action.search(query.strip()) if query.strip() else Action.invalid(FinishReason.EMPTY_QUERY)


def parse_memory(text: str, memory_tag: str = "memory") -> tuple[str | None, bool]:
    """The memory a rewrite produced and whether it was closed, as the released code reads it: the first
    `<memory>` span when the tags pair up. An opening never closed (the call hit its token limit) gives
    the text after it, not closed; any other text (None, False).
    """
    if tags_paired(text, memory_tag):
        spans = tag_spans(text, memory_tag)
        return (spans[0], True) if spans else (None, False)
    last = text.rfind(opening(memory_tag))
    if last < 0 or closing(memory_tag) in text[last:]:
        return None, False
    return text[last + len(opening(memory_tag)) :].strip(), False
