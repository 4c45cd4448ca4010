"""Reward per training step from verl's file logger (`trainer.logger=[...,'file']`), as text, PNG and JSON.

`python -m memagent_examples.learn_codes.reward_curve metrics.jsonl --png curve.png` prints one line per step,
saves the curve, and ends with one JSON object: mean reward over the first and last `--window` steps,
their difference, and the mean seconds per step after the first (which includes warm-up).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

REWARD = "critic/score/mean"
STEP_SECONDS = "timing_s/step"


def read_steps(metrics: Path) -> list[dict]:
    steps = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    return [{"step": s["step"], **s["data"]} for s in steps if REWARD in s["data"]]


def summary(steps: list[dict], window: int) -> dict:
    if len(steps) < 2 * window:
        raise ValueError(f"need at least {2 * window} logged steps for a window of {window}, got {len(steps)}")
    rewards = [s[REWARD] for s in steps]
    timed = [s[STEP_SECONDS] for s in steps[1:]]
    return {
        "steps": len(steps),
        "reward_first": sum(rewards[:window]) / window,
        "reward_last": sum(rewards[-window:]) / window,
        "reward_gain": (sum(rewards[-window:]) - sum(rewards[:window])) / window,
        "seconds_per_step": sum(timed) / len(timed),
    }


def save_png(steps: list[dict], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot([s["step"] for s in steps], [s[REWARD] for s in steps], marker="o")
    ax.set_xlabel("training step")
    ax.set_ylabel("mean reward")
    ax.set_title("MemSearcher on CPU: password task")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m memagent_examples.learn_codes.reward_curve", description=__doc__)
    parser.add_argument("metrics", type=Path, help="JSON lines written by verl's file logger")
    parser.add_argument("--png", type=Path, required=True)
    parser.add_argument("--window", type=int, default=3, help="steps averaged for reward_first / reward_last")
    args = parser.parse_args(argv)
    steps = read_steps(args.metrics)
    for s in steps:
        print(f"step {s['step']:3d}  reward {s[REWARD]:.3f}  ({s[STEP_SECONDS]:.1f} s)")
    save_png(steps, args.png)
    print(f"reward curve: {args.png}")
    print(json.dumps(summary(steps, args.window)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
