"""MemSearcher's answer format as a verdict: the released rule (the default) and ours (`strict`).

The released reward (MemSearcher `verl/utils/reward_score/re_call.py:97-184`) judges the final
context of a trajectory: the decoded sequence must end with the tokenizer's end-of-sequence token,
then in each assistant turn of that context the `<think>` tags and the `<tool_call>` tags must pair up
by count, the first turn must hold a think block and only JSON tool calls that name `"name"` and
`"arguments"`, and the last turn's box (`answers.extract_boxed`) is the answer. Nothing else is
checked: several boxes (the last counts), a second think block, text after the box and an empty box
all pass. `strict` is the project's rule for one answer turn: at most one closed think block, then
exactly one non-empty `\\boxed{}`, and no tool call; it ignores the end of the turn.

The agent loops call these with their own tags and record the verdict (`reward.scores` scores that
record); `reward.scores` applies the released rule itself only to outputs without a record.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from verl_memagent.reward.answers import extract_boxed, tag_spans


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
        thinks = turn.count(f"<{think_tag}>")
        if thinks != turn.count(f"</{think_tag}>") or (index == 0 and thinks == 0):
            return False
        if turn.count(f"<{tool_call_tag}>") != turn.count(f"</{tool_call_tag}>"):
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
    if f"<{tool_call_tag}>" in text or text.count("\\boxed") != 1 or "\\boxed{" not in text or not answer:
        return answer, False
    opening, closing = f"<{think_tag}>", f"</{think_tag}>"
    opened, closed = text.count(opening), text.count(closing)
    if opened != closed or opened > 1:
        return answer, False
    return answer, not opened or text.index(closing) < text.index("\\boxed{")
