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

Counting an answer anywhere in the text is loose where answers repeat: on the composed password task
eight passwords serve every door, and at k = 8 about 60% of objectives share theirs with another of
the same question, so a memory holding one door's statement "holds" the other's too. The exact counts
(`statements_read`, `statements_held`) need the objective's statement: its answer together with every
content word of its own question (the door's station and gate: "password", "station", "century",
"gate", "born" for "What is the password of station century at gate born?") in one sentence, of the
searches' text to count as read, of the memory to count as held. Exact for the password task, whose
memories restate the passage's sentence; strict for natural questions, where a memory paraphrases.

The trainer logs the pooled shares and the shares at each turn (`agent/memory_retention/...`,
`agent/memory_retention_exact/...`, `algo/agent_metrics.py`); the trajectory records keep each turn's
counts (`trajectories/build.py`), and the trajectory page shows them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from verl_memagent.data.compose import TASK_PREFIX
from verl_memagent.reward.answers import normalize_answer, objective_golds
from verl_memagent.trajectories.schema import TurnLog

#: question and function words: what is left of a question after them names what it asks about
QUESTION_WORDS = frozenset(
    "what which who whom whose where when why how is are was were be do does did".split()
    + "of at in on to for by with from".split()
)
_SENTENCE_END = re.compile(r"[.!?;\n]+")


@dataclass(frozen=True)
class Retention:
    """One memory-writing turn: `held` of the `read` objectives' answers are in the memory it wrote; the
    same counted by statements (None where the question's objectives could not be told apart)."""

    turn: int  # the turn's index in the trajectory, from 0
    read: int
    held: int
    statements_read: int | None = None
    statements_held: int | None = None


def objective_terms(question: Any, objectives: int) -> list[frozenset[str]] | None:
    """Each objective's content words: its own question (MEM1's composed tasks list them after
    `TASK_PREFIX`, `; `-separated) SQuAD-normalised, less `QUESTION_WORDS`. None when there is no question
    text, or it does not split into `objectives` questions, or one of them names nothing."""
    if not isinstance(question, str) or not question:
        return None
    parts = question.removeprefix(TASK_PREFIX).split("; ") if question.startswith(TASK_PREFIX) else [question]
    terms = [frozenset(normalize_answer(part).split()) - QUESTION_WORDS for part in parts]
    return terms if len(terms) == objectives and all(terms) else None


def states(text: str, answers: Sequence[str], terms: frozenset[str]) -> bool:
    """Whether one sentence of `text` holds one of `answers` and every word of `terms` (SQuAD-normalised)."""
    return any(
        terms <= set(normalize_answer(sentence).split()) and mentions(sentence, answers)
        for sentence in _SENTENCE_END.split(text)
    )


def mentions(text: str, answers: Sequence[str]) -> bool:
    """Whether `text` holds one of `answers` as whole words, after SQuAD normalisation."""
    padded = f" {normalize_answer(text)} "
    return any(f" {normalize_answer(answer)} " in padded for answer in answers if normalize_answer(answer))


def retention(turn_logs: Sequence[TurnLog], ground_truth: Any, question: str | None = None) -> list[Retention]:
    """The counts of every turn of `turn_logs` (a trajectory's, in order) that wrote a memory, against the
    row's `ground_truth` (its answers, or one list per objective: `reward.answers.objective_golds`), and
    with the row's `question` by statements too (`objective_terms`).

    A turn whose memory is written by a call after its search (MemSearcher's rewrite: the turn has a
    call after the action) counts that search as read; otherwise (MEM1's state, written in the action)
    only earlier turns' searches."""
    golds = objective_golds(ground_truth)
    terms = objective_terms(question, len(golds))
    read: set[int] = set()  # the objectives whose answer a search has shown so far
    stated: set[int] = set()  # those whose statement a search has shown

    def show(text: str) -> None:
        read.update(i for i, answers in enumerate(golds) if i not in read and mentions(text, answers))
        if terms is not None:
            stated.update(i for i, answers in enumerate(golds) if i not in stated and states(text, answers, terms[i]))

    found: list[Retention] = []
    for index, log in enumerate(turn_logs):
        search = log["search"]
        text = search.get("text", "") if search else ""
        rewritten_after_search = len(log["calls"]) > 1
        if rewritten_after_search:
            show(text)
        if (memory := log["memory"]) is not None:
            held = sum(mentions(memory, golds[i]) for i in read)
            exact = (
                {}
                if terms is None
                else {
                    "statements_read": len(stated),
                    "statements_held": sum(states(memory, golds[i], terms[i]) for i in stated),
                }
            )
            found.append(Retention(turn=index, read=len(read), held=held, **exact))
        if not rewritten_after_search:
            show(text)
    return found
