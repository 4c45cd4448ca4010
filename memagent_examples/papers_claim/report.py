"""The sweep's report, from its records alone: a table per evaluation door set (EM per objective, mean and
spread over RL seeds, peak context tokens) and the papers' plot (EM, peak context and prefill against k, a
point per RL seed) on the test split where it was scored, else on the dev doors."""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path

from memagent_examples.papers_claim.records import (
    AGENTS,
    EVAL_TASKS,
    OBJECTIVES,
    TEST_TASKS,
    check_one_warm_start,
    record_phase,
)


def grouped(records: list[dict], door_set: str) -> dict[tuple, list[dict]]:
    groups = defaultdict(list)
    for r in records:
        if r["door_set"] == door_set:
            groups[(r["agent"], record_phase(r), r["objectives"])].append(r)
    return groups


def phases(records: list[dict]) -> list[str]:
    """The phase labels present: before RL, after RL on MEM1's k, then the other RL sets."""
    return sorted({record_phase(r) for r in records}, key=lambda label: (label != "before_rl", label))


def mean_spread(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}"


def table(records: list[dict], door_set: str) -> str:
    groups = grouped(records, door_set)
    head = "| agent | phase | seeds | " + " | ".join(f"EM k={k}" for k in OBJECTIVES)
    head += " | " + " | ".join(f"peak ctx k={k}" for k in OBJECTIVES) + " | answered k=8 | s/question k=8 |"
    lines = [head, "|" + " --- |" * (3 + 2 * len(OBJECTIVES) + 2)]
    for agent in AGENTS:
        for phase in phases(records):
            cells = [groups.get((agent, phase, k), []) for k in OBJECTIVES]
            if not any(cells):
                continue
            seeds = len(cells[0]) if phase != "before_rl" else "-"
            ems = [mean_spread([r["em"] for r in c]) if c else "" for c in cells]
            peaks = [f"{statistics.mean(r['peak_context_tokens'] for r in c):.0f}" if c else "" for c in cells]
            last = cells[-1]
            answered = f"{statistics.mean(r['answered'] for r in last):.2f}" if last else ""
            seconds = f"{statistics.mean(r['seconds_per_question'] for r in last):.1f}" if last else ""
            lines.append(f"| {agent} | {phase} | {seeds} | " + " | ".join(ems + peaks) + f" | {answered} | {seconds} |")
    return "\n".join(lines)


def figure_set(records: list[dict]) -> str:
    """The door set the plot and the summary show: the test split once scored, else the dev doors."""
    return next((name for name in TEST_TASKS if any(r["door_set"] == name for r in records)), "dev")


#: the line styles of an agent's phases after RL, in order (before RL: dotted)
AFTER_RL_STYLES = ("--", "-", "-.")


def plot(records: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    door_set = figure_set(records)
    groups = grouped(records, door_set)
    for color, agent in enumerate(AGENTS):  # a color per agent, a line style per phase of the agent
        drawn_phases = [phase for phase in phases(records) if any(groups.get((agent, phase, k)) for k in OBJECTIVES)]
        after = [phase for phase in drawn_phases if phase != "before_rl"]
        for phase in drawn_phases:
            style = ":" if phase == "before_rl" else AFTER_RL_STYLES[after.index(phase) % len(AFTER_RL_STYLES)]
            drawn = {"color": f"C{color}", "label": f"{agent} ({phase.replace('_', ' ')})"}
            ks = [k for k in OBJECTIVES if groups.get((agent, phase, k))]
            ems = [statistics.mean(r["em"] for r in groups[(agent, phase, k)]) for k in ks]
            peaks = [statistics.mean(r["peak_context_tokens"] for r in groups[(agent, phase, k)]) for k in ks]
            prefill = [statistics.mean(r["prefill_tokens_per_question"] for r in groups[(agent, phase, k)]) for k in ks]
            axes[0].plot(ks, ems, style, **drawn)
            seeds = [(k, r["em"]) for k in ks for r in groups[(agent, phase, k)]]  # every seed: a spread is seen
            axes[0].scatter(*zip(*seeds, strict=True), s=14, color=drawn["color"])
            axes[1].plot(ks, peaks, style, marker="o", **drawn)
            axes[2].plot(ks, prefill, style, marker="o", **drawn)
    titles = (
        f"EM per objective ({door_set} doors; a point per RL seed)",
        "Peak context tokens per trajectory",
        "Tokens prefilled per question",
    )
    for axis, title in zip(axes, titles, strict=True):
        axis.set(xlabel="objectives k", title=title, xscale="log", xticks=list(OBJECTIVES))
        axis.minorticks_off()
        axis.set_xticklabels([str(k) for k in OBJECTIVES])
        axis.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def report(records: list[dict], plot_path: Path) -> dict:
    """Print each door set's table, draw the plot to `plot_path`, print and return the k = 8 summary."""
    check_one_warm_start(records)
    for door_set in [*EVAL_TASKS, *TEST_TASKS]:
        if any(r["door_set"] == door_set for r in records):
            print(f"\n{door_set} doors: EM per objective (mean ± sd over RL seeds) and mean peak context tokens\n")
            print(table(records, door_set))
    plot(records, plot_path)
    print(f"\nplot: {plot_path}")
    groups = grouped(records, figure_set(records))
    k = max(OBJECTIVES)
    summary = {"cpu": records[0]["cpu"] if records else None, "door_set": figure_set(records)}
    for agent in AGENTS:
        after = groups.get((agent, "after_rl", k), [])
        if after:
            summary[f"{agent}_em_k{k}"] = statistics.mean(r["em"] for r in after)
            summary[f"{agent}_peak_k{k}"] = statistics.mean(r["peak_context_tokens"] for r in after)
    for agent in ("memsearcher", "mem1"):
        if f"{agent}_peak_k{k}" in summary and f"react_peak_k{k}" in summary:
            summary[f"react_over_{agent}_peak_k{k}"] = summary[f"react_peak_k{k}"] / summary[f"{agent}_peak_k{k}"]
    print(json.dumps(summary))
    return summary
