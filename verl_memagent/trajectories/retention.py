"""Memory retention: of the answers a trajectory has read so far, how many its memory still holds, turn by turn.

A memory agent is only as good as what its memory keeps: MemSearcher's rewrite and MEM1's internal
state may drop a fact read three turns ago, and the final reward cannot tell a dropped fact from one
never found. This reads the turn logs the agent loops write (the text each search showed the model,
the memory each turn wrote) against the row's gold answers (one list per objective for MEM1's
composed tasks): for every turn that wrote a memory, `read` counts the objectives whose gold answer
the searches had shown before the memory was written, and `held` those of them the memory mentions
(SQuAD-normalised, whole words). MemSearcher rewrites its memory after the turn's search, MEM1
writes its state before the turn's action, so a memory is compared with what was read before the
call that wrote it. ReAct writes no memory: it has no rows here.

The trainer logs the pooled share and the share at each turn (`agent/memory_retention/...`,
`algo/agent_metrics.py`); the trajectory records keep each turn's counts (`trajectories/build.py`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from verl_memagent.reward.answers import normalize_answer, objective_golds
from verl_memagent.trajectories.schema import TurnLog


@dataclass(frozen=True)
class Retention:
    """One memory-writing turn: `held` of the `read` objectives' answers are in the memory it wrote."""

    turn: int  # the turn's index in the trajectory, from 0
    read: int
    held: int


def mentions(text: str, answers: Sequence[str]) -> bool:
    """Whether `text` holds one of `answers` as whole words, after SQuAD normalisation."""
    padded = f" {normalize_answer(text)} "
    return any(f" {normalize_answer(answer)} " in padded for answer in answers if normalize_answer(answer))


def retention(turn_logs: Sequence[TurnLog], ground_truth: Any) -> list[Retention]:
    """The counts of every turn of `turn_logs` (a trajectory's, in order) that wrote a memory, against the
    row's `ground_truth` (its answers, or one list per objective: `reward.answers.objective_golds`).

    A turn whose memory is written by a call after its search (MemSearcher's rewrite: the turn has a
    call after the action) counts that search as read; otherwise (MEM1's state, written in the action)
    only earlier turns' searches."""
    golds = objective_golds(ground_truth)
    read: set[int] = set()  # the objectives whose answer a search has shown so far

    def show(text: str) -> None:
        read.update(i for i, answers in enumerate(golds) if i not in read and mentions(text, answers))

    found: list[Retention] = []
    for index, log in enumerate(turn_logs):
        search = log["search"]
        text = search.get("text", "") if search else ""
        rewritten_after_search = len(log["calls"]) > 1
        if rewritten_after_search:
            show(text)
        if log["memory"] is not None:
            held = sum(mentions(log["memory"], golds[i]) for i in read)
            found.append(Retention(turn=index, read=len(read), held=held))
        if not rewritten_after_search:
            show(text)
    return found
