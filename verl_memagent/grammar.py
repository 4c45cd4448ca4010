"""The text grammar of the agents' turns: tags, boxes, stop strings and the answer-format verdicts.

One leaf (it imports nothing of ours) that `agent` reads turns with and `reward` scores plain
completions with, so that deciding a turn's calls never leaves `agent` for `reward` and the two read
one grammar. Tags are named by the caller (the agents' `tags` setting renames them); a tag `t` is
written `<t>` and closed `</t>`, and a stop string is a closing tag.

The verdicts judge MemSearcher's answer format, the released rule (the default) and ours (`strict`).
The released reward (MemSearcher `verl/utils/reward_score/re_call.py:97-184`) judges the final
context of a trajectory: the decoded sequence must end with the tokenizer's end-of-sequence token,
then in each assistant turn of that context the `<think>` tags and the `<tool_call>` tags must pair up
by count, the first turn must hold a think block and only JSON tool calls that name `"name"` and
`"arguments"`, and the last turn's box (`extract_boxed`) is the answer. Nothing else is checked:
several boxes (the last counts), a second think block, text after the box and an empty box all pass.
`strict` is the project's rule for one answer turn: at most one closed think block, then exactly one
non-empty `\\boxed{}`, and no tool call; it ignores the end of the turn. The agent loops call these with
their own tags and record the verdict (`reward.scores` scores that record); `reward.scores` applies the
released rule itself only to outputs without a record.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

BOX = "\\boxed"


def opening(tag: str) -> str:
    """`<tag>`."""
    return f"<{tag}>"


def closing(tag: str) -> str:
    """`</tag>`: also the stop string that ends a generate call at that tag."""
    return f"</{tag}>"


def enclosed(tag: str, content: str) -> str:
    """`<tag>content</tag>`."""
    return f"{opening(tag)}{content}{closing(tag)}"


def opened(text: str, tag: str) -> bool:
    """Whether `text` opens `tag` anywhere."""
    return opening(tag) in text


def tag_spans(text: str, tag: str) -> list[str]:
    """Contents of every complete `<tag>...</tag>` span, stripped, left to right; a span ends at the
    first closing tag after its opening."""
    pattern = f"{re.escape(opening(tag))}(.*?){re.escape(closing(tag))}"
    return [match.strip() for match in re.findall(pattern, text, flags=re.DOTALL)]


def extract_tag(text: str, tag: str) -> str | None:
    """Content of the last complete `<tag>...</tag>` span, or None."""
    spans = tag_spans(text, tag)
    return spans[-1] if spans else None


def tags_paired(text: str, tag: str) -> bool:
    """As many closing as opening `tag`s, the i-th closing after the i-th opening (the released check
    of tool calls and memories)."""
    if text.count(opening(tag)) != text.count(closing(tag)):
        return False
    opens = _positions(text, opening(tag))
    return all(start < end for start, end in zip(opens, _positions(text, closing(tag)), strict=True))


def _positions(text: str, needle: str) -> list[int]:
    positions, start = [], text.find(needle)
    while start >= 0:
        positions.append(start)
        start = text.find(needle, start + len(needle))
    return positions


def extract_boxed(text: str) -> str | None:
    """The answer in the last box, read as MemSearcher's released reward reads it, stripped; None without one.

    With `\\boxed ` (a space) anywhere, what follows the last one up to a `$`; otherwise the last
    `\\boxed` must open a brace, and the answer runs to the brace that balances it (None if none does).
    Other box commands (`\\fbox`) give no answer (re_call.py:6-46).
    """
    if f"{BOX} " in text:
        return text.rsplit(f"{BOX} ", 1)[1].split("$", 1)[0].strip()
    start = text.rfind(BOX)
    if start < 0 or not text.startswith(BOX + "{", start):
        return None
    depth, begin = 0, start + len(BOX + "{")
    for i in range(begin, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            if depth == 0:
                return text[begin:i].strip()
            depth -= 1
    return None


def released_verdict(
    turns: Sequence[str], ended: bool, think_tag: str = "think", tool_call_tag: str = "tool_call"
) -> tuple[str | None, bool]:
    """(answer, format ok) of a final context as the released reward reads it.

    `turns` are the context's assistant turns in order, each as the model wrote it after the
    assistant's turn marker (with the `<think>` a released prompt opened it with); `ended`: the
    context ends with the end-of-sequence token the model sampled. The answer is the last turn's box
    whether or not the format holds (the released evaluation reads it so); None without one.
    """
    turns = [turn.strip() for turn in turns]
    answer = extract_boxed(turns[-1]) if turns else None
    return answer, ended and answer is not None and _turns_ok(turns, think_tag, tool_call_tag)


def _turns_ok(turns: list[str], think_tag: str, tool_call_tag: str) -> bool:
    for index, turn in enumerate(turns):
        thinks = turn.count(opening(think_tag))
        if thinks != turn.count(closing(think_tag)) or (index == 0 and thinks == 0):
            return False
        if turn.count(opening(tool_call_tag)) != turn.count(closing(tool_call_tag)):
            return False
    return all(_released_call_ok(call) for call in tag_spans(turns[0], tool_call_tag))


def _released_call_ok(call: str) -> bool:
    """A tool call of the first turn: names both keys and is JSON (of any shape)."""
    if '"name"' not in call or '"arguments"' not in call:
        return False
    try:
        json.loads(call)
    except (ValueError, RecursionError):
        return False
    return True


def strict_verdict(text: str, think_tag: str = "think", tool_call_tag: str = "tool_call") -> tuple[str | None, bool]:
    """(answer, format ok) of one answer turn under the project's rule: at most one closed think
    block, then exactly one non-empty `\\boxed{}`, no tool call."""
    answer = extract_boxed(text)
    if opened(text, tool_call_tag) or text.count(BOX) != 1 or BOX + "{" not in text or not answer:
        return answer, False
    opened_thinks, closed_thinks = text.count(opening(think_tag)), text.count(closing(think_tag))
    if opened_thinks != closed_thinks or opened_thinks > 1:
        return answer, False
    return answer, not opened_thinks or text.index(closing(think_tag)) < text.index(BOX + "{")
