"""Agent metrics against hand-built trajectories whose turns, searches and finish reasons are known."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from verl_memagent.algo.agent_metrics import FINISHES, agent_metrics, agent_metrics_by_source, finish_group


def context(trajectory: str, turn: int, contexts: int, finish: str, penalised: bool = False, **counts) -> dict:
    """The `extra_fields` an agent loop writes for one context (the counters given, zero otherwise)."""
    fields = {
        "trajectory_id": trajectory,
        "turn_index": turn,
        "num_contexts": contexts,
        "finish_reason": finish,
        "penalised": penalised,
        "turns": 1,
        "searches": 0,
        "retriever_errors": 0,
        "memory_tokens": 0,
        "memory_written": False,
        "memory_truncated": False,
        "context_tokens": 100,
        "prefill_tokens": 100,
        "generate_s": 1.0,
        "search_s": 0.0,
    }
    return fields | counts


# a: 3 memsearcher contexts, 2 searches (one failed), memories of 20 and 48 tokens (the second cut), answered
A = [
    context("a", 0, 3, "answer", searches=1, memory_written=True, context_tokens=300, prefill_tokens=500, search_s=0.5),
    context(
        "a",
        1,
        3,
        "answer",
        searches=1,
        retriever_errors=1,
        memory_tokens=20,
        memory_written=True,
        memory_truncated=True,
        context_tokens=350,
        prefill_tokens=600,
        search_s=0.5,
    ),
    context("a", 2, 3, "answer", memory_tokens=48, context_tokens=150, prefill_tokens=150),
]
# b: 1 context, malformed output
B = [context("b", 0, 1, "bad_tool_call", context_tokens=120, prefill_tokens=120)]
# c: 2 contexts, the second memory rewrite ran over: penalised
C = [
    context(
        "c", 0, 2, "memory_overflow", True, searches=1, memory_written=True, context_tokens=200, prefill_tokens=300
    ),
    context(
        "c",
        1,
        2,
        "memory_overflow",
        True,
        searches=1,
        memory_tokens=30,
        memory_written=True,
        context_tokens=260,
        prefill_tokens=400,
    ),
]
# d: react, one context holding 4 actions (3 searches), out of turns
D = [context("d", 0, 1, "max_turns", turns=4, searches=3, context_tokens=900, prefill_tokens=2000, search_s=3.0)]


def test_aggregates_count_each_trajectory_once():
    rows = [*A, *B, *C, *D]
    metrics = agent_metrics(random.Random(0).sample(rows, len(rows)))  # verl's batch order is arbitrary
    expected = {
        "agent/trajectories": 4,
        "agent/turns/mean": (3 + 1 + 2 + 4) / 4,
        "agent/turns/max": 4,
        "agent/contexts/mean": (3 + 1 + 2 + 1) / 4,
        "agent/contexts/max": 3,
        "agent/searches/mean": (2 + 0 + 2 + 3) / 4,
        "agent/searches/max": 3,
        "agent/retriever_errors/mean": 1 / 4,
        "agent/retriever_errors/max": 1,
        "agent/finish/answered": 1 / 4,
        "agent/finish/out_of_turns": 1 / 4,
        "agent/finish/out_of_tokens": 0.0,
        "agent/finish/format_broken": 1 / 4,
        "agent/finish/penalised": 1 / 4,
        "agent/memory_tokens/mean": (48 + 0 + 30 + 0) / 4,
        "agent/memory_tokens/max": 48,
        "agent/memory_capped": 2 / 4,  # a's second and c's second of 4 rewrites
        "agent/peak_context_tokens/mean": (350 + 120 + 260 + 900) / 4,
        "agent/peak_context_tokens/max": 900,
        "agent/prefill_tokens/mean": (1250 + 120 + 700 + 2000) / 4,
        "agent/prefill_tokens/max": 2000,
        "agent/generate_s/mean": (3 + 1 + 2 + 1) / 4,
        "agent/generate_s/max": 3,
        "agent/search_s/mean": (1 + 0 + 0 + 3) / 4,
        "agent/search_s/max": 3,
        "agent/search_time_share": 4 / (7 + 4),
    }
    assert metrics == pytest.approx(expected)


def test_validation_figures_split_by_data_source_beside_verls_names():
    rows = [*A, *B, *D]
    sources = ["nq"] * len(A) + ["hotpotqa"] * len(B) + ["nq"] * len(D)
    metrics = agent_metrics_by_source(rows, sources)
    assert metrics["val-aux/nq/agent/trajectories"] == 2 and metrics["val-aux/hotpotqa/agent/trajectories"] == 1
    assert metrics["val-aux/nq/agent/searches/mean"] == (2 + 3) / 2
    assert metrics["val-aux/nq/agent/finish/answered"] == 0.5
    assert metrics["val-aux/hotpotqa/agent/finish/format_broken"] == 1.0
    assert metrics["val-aux/hotpotqa/agent/memory_capped"] == 0.0  # no rewrite at all
    with pytest.raises(ValueError):
        agent_metrics_by_source(rows, sources[:-1])


def test_outputs_of_other_loops_are_left_out():
    assert agent_metrics([{"turn_scores": []}, None]) == {}
    assert agent_metrics([*B, {"turn_scores": []}])["agent/trajectories"] == 1


def test_finish_groups():
    assert finish_group("answer", False) == "answered"
    assert finish_group("context_limit", False) == "out_of_tokens"
    assert finish_group("max_turns", False) == "out_of_turns"
    assert finish_group("memory_overflow", True) == "penalised"
    for reason in ("no_action", "unclosed_tag", "no_memory", "no_state", "empty_answer"):
        assert finish_group(reason, False) == "format_broken"


@given(
    st.lists(
        st.tuples(
            st.integers(1, 5),
            st.sampled_from(["answer", "max_turns", "context_limit", "no_action", "memory_overflow"]),
            st.integers(0, 3),
        ),
        min_size=1,
        max_size=12,
    )
)
def test_shares_partition_and_counts_are_per_trajectory(shapes):
    rows = []
    for t, (contexts, finish, searches) in enumerate(shapes):
        rows += [
            context(str(t), i, contexts, finish, finish == "memory_overflow", searches=searches)
            for i in range(contexts)
        ]
    metrics = agent_metrics(rows)
    assert metrics["agent/trajectories"] == len(shapes)
    assert sum(metrics[f"agent/finish/{f}"] for f in FINISHES) == pytest.approx(1.0)
    assert metrics["agent/contexts/mean"] == pytest.approx(sum(c for c, _, _ in shapes) / len(shapes))
    assert metrics["agent/searches/mean"] == pytest.approx(sum(c * s for c, _, s in shapes) / len(shapes))
    assert 0.0 <= metrics["agent/memory_capped"] <= 1.0
