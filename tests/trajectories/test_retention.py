"""Memory retention: what a trajectory's memory still holds of the answers it has read, against hand counts."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from verl_memagent.algo.agent_metrics import retention_metrics
from verl_memagent.output_fields import OutputField
from verl_memagent.trajectories.retention import Retention, mentions, retention

GOLDS = [["album"], ["river", "the river"]]
SPAN = {"start": 0, "end": 1, "finish": "eos"}


def turn(calls: int, shown: str | None, memory: str | None) -> dict:
    search = None if shown is None else {"query": "q", "passages": [], "failed": False, "text": shown}
    return {"calls": [SPAN] * calls, "search": search, "memory_before": "", "memory": memory}


# MemSearcher: each search turn's memory is rewritten after its search (two calls); the answer turn writes none
MEMSEARCHER = [
    turn(2, "Doc 1: The password of station a at gate b is album.", "station a gate b: album"),
    turn(2, "Doc 1: The password of station c at gate d is river.", "station c gate d: River."),
    turn(1, None, None),
]
# MEM1: the state is written in the action, before the turn's search (one call a turn)
MEM1 = [
    turn(1, "The password of station a at gate b is album.", "Nothing known yet."),
    turn(1, "The password of station c at gate d is river.", "a b: album."),
    turn(1, None, "a b: album. c d: river."),
]


def test_memsearcher_counts_the_search_before_its_rewrite():
    assert retention(MEMSEARCHER, GOLDS) == [Retention(0, 1, 1), Retention(1, 2, 1)]  # album dropped at turn 2


def test_mem1_counts_only_earlier_searches():
    assert retention(MEM1, GOLDS) == [Retention(0, 0, 0), Retention(1, 1, 1), Retention(2, 2, 2)]


def test_answers_match_whole_normalised_words():
    assert mentions("The Album.", ["album"]) and mentions("the river runs", ["The River"])
    assert not mentions("albums", ["album"]) and not mentions("anything", [""])
    react = [turn(1, "is album", None), turn(1, None, None)]  # no memory: no row
    assert retention(react, GOLDS) == []


def fields(trajectory: str, contexts: list[list[dict]]) -> list[dict]:
    return [
        {OutputField.TRAJECTORY_ID: trajectory, OutputField.TURN_INDEX: i, OutputField.TURN_LOG: logs}
        for i, logs in enumerate(contexts)
    ]


def test_trainer_metric_pools_turns_and_reports_each_turn():
    samples = fields("ms", [[t] for t in MEMSEARCHER]) + fields("m1", [[t] for t in MEM1])
    samples += fields("react", [[turn(1, "album", None), turn(1, None, None)]])
    samples += fields("no-truth", [[t] for t in MEMSEARCHER])
    truths = [GOLDS] * (len(samples) - 3) + [None] * 3
    reversed_order = list(reversed(list(zip(samples, truths, strict=True))))  # contexts arrive in any order
    metrics = retention_metrics([s for s, _ in reversed_order], [t for _, t in reversed_order])
    # memsearcher: turn 1 holds 1 of 1, turn 2 1 of 2; mem1: turn 2 1 of 1, turn 3 2 of 2 (turn 1 read nothing)
    assert metrics == {
        "agent/memory_retention/mean": (1 + 1 + 1 + 2) / (1 + 2 + 1 + 2),
        "agent/memory_retention/turn_1": 1.0,
        "agent/memory_retention/turn_2": (1 + 1) / (2 + 1),
        "agent/memory_retention/turn_3": 1.0,
    }
    assert retention_metrics(fields("react", [[turn(1, "album", None)]]), [GOLDS]) == {}


@given(st.lists(st.tuples(st.integers(1, 2), st.one_of(st.none(), st.text()), st.one_of(st.none(), st.text()))))
def test_a_memory_never_holds_more_than_was_read(turns):
    logs = [turn(calls, shown, memory) for calls, shown, memory in turns]
    for counted in retention(logs, GOLDS):
        assert 0 <= counted.held <= counted.read <= len(GOLDS)


# Two doors sharing their password, as at k = 8 with 8 passwords: the loose count takes one door's
# statement for the other's; the exact count wants the door and its password in one sentence.
SHARED = [["album"], ["album"]]
QUESTION = (
    "Answer the following questions: What is the password of station a1 at gate b1?; "
    "What is the password of station c1 at gate d1?"
)
STATED = [
    turn(
        2,
        "Doc 1: The password of station a1 at gate b1 is album. Other text.",
        "The password of station a1 at gate b1 is album.",
    ),
    turn(
        2,
        "Doc 1: Nothing about door c1 here, though album is a word.",
        "The password of station a1 at gate b1 is album.",
    ),
    turn(2, "Doc 1: The password of station c1 at gate d1 is album.", "Station c1 and gate d1 matter. The album."),
]


def test_exact_retention_wants_the_door_and_its_password_in_one_sentence():
    counted = retention(STATED, SHARED, QUESTION)
    # loose: both objectives read at turn 1 (album is shown) and held at every turn
    assert [(c.read, c.held) for c in counted] == [(2, 2), (2, 2), (2, 2)]
    # exact: door a1 read at turn 1 and held; turn 2 reads nothing new; turn 3 reads door c1, but the memory
    # splits c1/d1 from album over two sentences and has dropped a1's statement
    assert [(c.statements_read, c.statements_held) for c in counted] == [(1, 1), (1, 1), (2, 0)]


def test_exact_retention_needs_questions_that_tell_objectives_apart():
    assert retention(STATED, SHARED)[0].statements_read is None  # no question
    one_question = "What is the password of station a1 at gate b1?"
    assert retention(STATED, SHARED, one_question)[0].statements_read is None  # 1 question, 2 objectives
    assert retention(STATED, [["album"]], one_question)[0].statements_read == 1


def test_trainer_metric_reports_exact_retention_beside_the_loose_one():
    samples = [{**sample, OutputField.QUESTION: QUESTION} for sample in fields("t", [[t] for t in STATED])]
    metrics = retention_metrics(samples, [SHARED] * len(samples))
    assert metrics["agent/memory_retention/mean"] == 1.0
    assert metrics["agent/memory_retention_exact/mean"] == (1 + 1 + 0) / (1 + 1 + 2)
    assert metrics["agent/memory_retention_exact/turn_3"] == 0.0


@given(st.lists(st.tuples(st.integers(1, 2), st.one_of(st.none(), st.text()), st.one_of(st.none(), st.text()))))
def test_a_statement_is_never_held_more_than_read_nor_more_than_the_answers(turns):
    logs = [turn(calls, shown, memory) for calls, shown, memory in turns]
    for counted in retention(logs, SHARED, QUESTION):
        assert 0 <= counted.statements_held <= counted.statements_read <= counted.read <= len(SHARED)
