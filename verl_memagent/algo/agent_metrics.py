"""What the agent did during a rollout, as verl metrics: searches, finish reasons, memory, context, time.

The agent loops tag every output (one per context) with per-context counters in `extra_fields`
(named in `output_fields.py`). Here they are grouped back into trajectories by `trajectory_id` and
aggregated per trajectory, so a 5-turn trajectory counts once, whatever its number of samples.
Plain functions over lists of `extra_fields` dicts: the trainers feed them the batch's fields and
merge the result into verl's metrics dict, which verl hands to every `trainer.logger` backend.
docs/agents.md has the table of names, meanings and aggregations.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import astuple, dataclass, fields
from typing import Any

from verl_memagent.output_fields import FinishReason, OutputField
from verl_memagent.trajectories.retention import retention

#: finish reasons with a share of their own; any other reason is malformed output ("format_broken")
FINISH_GROUPS = {
    FinishReason.ANSWER: "answered",
    FinishReason.MAX_TURNS: "out_of_turns",
    FinishReason.CONTEXT_LIMIT: "out_of_tokens",
}
FINISHES = ("answered", "out_of_turns", "out_of_tokens", "format_broken", "penalised")


def finish_group(reason: str, penalised: bool) -> str:
    """One of `FINISHES`: a penalised trajectory (memory overflow in penalty mode) counts as penalised."""
    if penalised:
        return "penalised"
    return FINISH_GROUPS.get(reason, "format_broken")


@dataclass(frozen=True)
class TrajectoryStats:
    """One trajectory's totals; every field becomes `<name>/mean` and `<name>/max` over trajectories."""

    turns: int
    contexts: int
    searches: int
    retriever_errors: int
    memory_tokens: int  # the largest memory (MEM1: state) any of its contexts started from
    peak_context_tokens: int
    prefill_tokens: int
    generate_s: float
    search_s: float


@dataclass(frozen=True)
class TrajectorySummary:
    """One trajectory summarised from its outputs' `extra_fields`: its totals, its finish group (`FINISHES`), its
    memory rewrites and how many hit the cap. (`agent.trajectory.Trajectory` is the record a loop builds.)"""

    stats: TrajectoryStats
    finish: str
    memory_rewrites: int
    memory_capped: int


def summarise_trajectory(contexts: Sequence[Mapping]) -> TrajectorySummary:
    """The totals of one trajectory's contexts (their `extra_fields`, any order)."""
    last = max(contexts, key=lambda c: c[OutputField.TURN_INDEX])
    overflowed = (
        last[OutputField.FINISH_REASON] == FinishReason.MEMORY_OVERFLOW
    )  # the last rewrite ran over and ended it
    stats = TrajectoryStats(
        turns=sum(c[OutputField.TURNS] for c in contexts),
        contexts=len(contexts),
        searches=sum(c[OutputField.SEARCHES] for c in contexts),
        retriever_errors=sum(c[OutputField.RETRIEVER_ERRORS] for c in contexts),
        memory_tokens=max(c[OutputField.MEMORY_TOKENS] for c in contexts),
        peak_context_tokens=max(c[OutputField.CONTEXT_TOKENS] for c in contexts),
        prefill_tokens=sum(c[OutputField.PREFILL_TOKENS] for c in contexts),
        generate_s=sum(c[OutputField.GENERATE_S] for c in contexts),
        search_s=sum(c[OutputField.SEARCH_S] for c in contexts),
    )
    return TrajectorySummary(
        stats=stats,
        finish=finish_group(last[OutputField.FINISH_REASON], bool(last[OutputField.PENALISED])),
        memory_rewrites=sum(bool(c[OutputField.MEMORY_WRITTEN]) for c in contexts),
        memory_capped=sum(bool(c[OutputField.MEMORY_TRUNCATED]) or (overflowed and c is last) for c in contexts),
    )


def group_trajectories(extra_fields: Iterable[Mapping]) -> list[list[Mapping]]:
    """Contexts grouped by `trajectory_id`, in order of first appearance. Outputs of other agent
    loops (no `trajectory_id`, e.g. verl's single-turn loop) are left out."""
    groups: dict[str, list[Mapping]] = defaultdict(list)
    for fields_ in extra_fields:
        if isinstance(fields_, Mapping) and OutputField.TRAJECTORY_ID in fields_:
            groups[str(fields_[OutputField.TRAJECTORY_ID])].append(fields_)
    return list(groups.values())


def aggregate(trajectories: Sequence[TrajectorySummary], prefix: str = "agent") -> dict[str, float]:
    """`{prefix}/...` metrics over some trajectories; empty when there are none."""
    if not trajectories:
        return {}
    n = len(trajectories)
    metrics: dict[str, float] = {f"{prefix}/trajectories": float(n)}
    columns = zip(*(astuple(t.stats) for t in trajectories), strict=True)
    for field, values in zip(fields(TrajectoryStats), columns, strict=True):
        metrics[f"{prefix}/{field.name}/mean"] = sum(values) / n
        metrics[f"{prefix}/{field.name}/max"] = float(max(values))
    for finish in FINISHES:
        metrics[f"{prefix}/finish/{finish}"] = sum(t.finish == finish for t in trajectories) / n
    rewrites = sum(t.memory_rewrites for t in trajectories)
    metrics[f"{prefix}/memory_capped"] = sum(t.memory_capped for t in trajectories) / rewrites if rewrites else 0.0
    generate_s = sum(t.stats.generate_s for t in trajectories)
    search_s = sum(t.stats.search_s for t in trajectories)
    metrics[f"{prefix}/search_time_share"] = search_s / (generate_s + search_s) if generate_s + search_s else 0.0
    return metrics


def retention_metrics(extra_fields: Sequence[Mapping], ground_truths: Sequence[Any], prefix: str = "agent") -> dict:
    """Memory retention (`trajectories/retention.py`): `{prefix}/memory_retention/mean`, the answers the
    memories held over the answers read before they were written, pooled over every memory-writing turn,
    and `.../turn_N`, the same at turn N (from 1); `{prefix}/memory_retention_exact/...` the same by
    statements, where the question tells its objectives apart. `ground_truths[i]` is the row's ground truth of
    `extra_fields[i]`. Empty when no memory was written after an answer was read (ReAct, or no search)."""
    trajectories: dict[str, tuple[list[Mapping], Any]] = {}
    for fields_, truth in zip(extra_fields, ground_truths, strict=True):
        if isinstance(fields_, Mapping) and OutputField.TRAJECTORY_ID in fields_ and truth is not None:
            trajectories.setdefault(str(fields_[OutputField.TRAJECTORY_ID]), ([], truth))[0].append(fields_)
    counts = {name: (defaultdict(int), defaultdict(int)) for name in ("memory_retention", "memory_retention_exact")}
    for contexts, truth in trajectories.values():
        ordered = sorted(contexts, key=lambda c: c[OutputField.TURN_INDEX])
        logs = [log for context in ordered for log in context.get(OutputField.TURN_LOG) or []]
        for turn in retention(logs, truth, ordered[-1].get(OutputField.QUESTION)):
            for name, (read, held) in counts.items():
                exact = name.endswith("exact")
                if not exact or turn.statements_read is not None:
                    read[turn.turn + 1] += turn.statements_read if exact else turn.read
                    held[turn.turn + 1] += turn.statements_held if exact else turn.held
    metrics = {}
    for name, (read, held) in counts.items():
        if sum(read.values()):
            metrics[f"{prefix}/{name}/mean"] = sum(held.values()) / sum(read.values())
            metrics |= {f"{prefix}/{name}/turn_{n}": held[n] / read[n] for n in sorted(read) if read[n]}
    return metrics


def agent_metrics(
    extra_fields: Iterable[Mapping], prefix: str = "agent", ground_truths: Sequence[Any] | None = None
) -> dict[str, float]:
    """The training step's figures: `extra_fields` of every (non-padding) sample of the batch; with the
    samples' `ground_truths`, memory retention too."""
    extra_fields = list(extra_fields)
    metrics = aggregate([summarise_trajectory(group) for group in group_trajectories(extra_fields)], prefix)
    if metrics and ground_truths is not None:
        metrics |= retention_metrics(extra_fields, ground_truths, prefix)
    return metrics


def agent_metrics_by_source(
    extra_fields: Sequence[Mapping],
    data_sources: Sequence[str],
    section: str = "val-aux",
    ground_truths: Sequence[Any] | None = None,
) -> dict[str, float]:
    """Validation's figures per data source, named like verl's per-source scores:
    `{section}/{data_source}/agent/...`. `data_sources[i]` is the source of `extra_fields[i]`."""
    truths = [None] * len(extra_fields) if ground_truths is None else ground_truths
    by_source: dict[str, tuple[list[Mapping], list[Any]]] = defaultdict(lambda: ([], []))
    for fields_, source, truth in zip(extra_fields, data_sources, truths, strict=True):
        by_source[str(source)][0].append(fields_)
        by_source[str(source)][1].append(truth)
    metrics: dict[str, float] = {}
    for source, (source_fields, source_truths) in by_source.items():
        prefix = f"{section}/{source}/agent"
        metrics.update(agent_metrics(source_fields, prefix, None if ground_truths is None else source_truths))
    return metrics
