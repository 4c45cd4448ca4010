"""PNG of context tokens against turn, the agents side by side on one axis (matplotlib, Agg backend)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot_context_tokens(agents: dict[str, Any], path: str | Path) -> dict[str, dict[str, list[float]]]:
    """Plot each agent's mean (solid) and peak (dashed) context tokens per turn from the summary's agents.

    Returns the data of the lines as drawn, read back from the figure: {agent: {turn, mean, peak}}.
    """
    figure, axis = plt.subplots(figsize=(7, 4.5))
    drawn = {}
    for agent, summary in agents.items():
        per_turn = summary["context_tokens_per_turn"]
        turns = [row["turn"] for row in per_turn]
        (mean,) = axis.plot(turns, [row["mean"] for row in per_turn], marker="o", label=f"{agent} mean")
        (peak,) = axis.plot(
            turns, [row["peak"] for row in per_turn], linestyle="--", color=mean.get_color(), label=f"{agent} peak"
        )
        drawn[agent] = {
            "turn": [float(x) for x in mean.get_xdata()],
            "mean": [float(y) for y in mean.get_ydata()],
            "peak": [float(y) for y in peak.get_ydata()],
        }
    axis.set_xlabel("turn")
    axis.set_ylabel("context tokens")
    axis.set_title("Context tokens per turn")
    axis.grid(alpha=0.3)
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return drawn
