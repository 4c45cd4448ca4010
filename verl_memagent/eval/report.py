"""Aggregate evaluated questions (records of `eval.records`) into the summary JSON.

Per agent: EM / EM fraction / F1 / acc (and the LLM judge's accuracy when asked), finish reasons and
peak context tokens per dataset and over all tasks (micro average), and context tokens per turn
index: mean and peak over the trajectories that reached that turn. A task's peak context tokens
(MEM1's "peak memory") is the largest context of its trajectory; datasets report the mean and the
maximum over their tasks.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from statistics import fmean
from typing import Any

from verl_memagent.eval.judge import judge_summary

METRICS = ("em", "em_fraction", "f1", "acc", "num_objectives")


def score_summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean scores, counts, outcomes and peak context tokens of some tasks."""
    peaks = [max(r["turn_context_tokens"]) for r in records]
    return {
        "n": len(records),
        **{metric: fmean(r["scores"][metric] for r in records) for metric in METRICS},
        "answered": fmean(r["prediction"] is not None for r in records),
        "mean_turns": fmean(len(r["turn_context_tokens"]) for r in records),
        "mean_searches": fmean(r["searches"] for r in records),
        "retriever_errors": sum(c["retriever_errors"] for r in records for c in r["contexts"]),
        "finish_reasons": dict(sorted(Counter(r["finish_reason"] for r in records).items())),
        "mean_peak_context_tokens": fmean(peaks),
        "peak_context_tokens": max(peaks),
        **(judge_summary(records) if any("llm_judge" in r for r in records) else {}),
    }


def per_turn_context_tokens(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """[{turn (1-based), n, mean, peak}] of context tokens over the trajectories that reached each turn."""
    by_turn: dict[int, list[int]] = defaultdict(list)
    for record in records:
        for index, tokens in enumerate(record["turn_context_tokens"]):
            by_turn[index + 1].append(tokens)
    return [
        {"turn": turn, "n": len(values), "mean": fmean(values), "peak": max(values)}
        for turn, values in sorted(by_turn.items())
    ]


def summarise(records: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """{agent: {datasets: {name: scores}, overall: scores, context_tokens_per_turn, peak_context_tokens}}."""
    by_agent: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        by_agent[record["agent"]].append(record)
    summary = {}
    for agent, agent_records in by_agent.items():
        by_dataset: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for record in agent_records:
            by_dataset[record["dataset"]].append(record)
        overall = score_summary(agent_records)
        summary[agent] = {
            "datasets": {name: score_summary(rs) for name, rs in by_dataset.items()},
            "overall": overall,
            "context_tokens_per_turn": per_turn_context_tokens(agent_records),
            "peak_context_tokens": overall["peak_context_tokens"],
        }
    return summary
