"""The learning demo's figures per training step from verl's file logger (`trainer.logger=[...,'file']`).

`python -m memagent_examples.learn_codes.reward_curve --follow < stream` prints one console line per
step (step, reward, answered share, searches per trajectory, seconds) as verl's JSON lines arrive;
the learning demo pipes `tail -F metrics.jsonl` into it while the trainer runs.

`python -m memagent_examples.learn_codes.reward_curve metrics.jsonl --png curve.png [--eval NAME=summary.json]`
saves the plot (reward, searches per trajectory, answered share per step, and the EM of each
`verl-memagent eval` run given) and ends with one JSON object: the mean of reward, answered share and
searches over the first and last `--window` steps (fewer in a run of less than two windows), the
reward gain, the mean seconds per step after the first (which includes warm-up), and `em_<NAME>` for
each eval run.
"""

from __future__ import annotations

import argparse
import json
import queue
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path

REWARD = "critic/score/mean"
STEP_SECONDS = "timing_s/step"
ANSWERED = "agent/finish/answered"
SEARCHES = "agent/searches/mean"
#: (key in the JSON line, metric, panel title)
CURVES = (
    ("reward", REWARD, "mean reward"),
    ("searches", SEARCHES, "searches per trajectory"),
    ("answered", ANSWERED, "answered share"),
)


def parse_steps(lines: Iterable[str]) -> Iterable[dict]:
    """The training steps among verl's JSON lines (validation-only lines carry no reward)."""
    for line in lines:
        if line.strip():
            record = json.loads(line)
            if REWARD in record["data"]:
                yield {"step": record["step"], **record["data"]}


def read_steps(metrics: Path) -> list[dict]:
    return list(parse_steps(metrics.read_text().splitlines()))


def step_line(step: dict) -> str:
    """A figure missing from the step (another agent loop, no timing) shows as nan: never stop following."""
    answered, searches, seconds = (step.get(key, float("nan")) for key in (ANSWERED, SEARCHES, STEP_SECONDS))
    return (
        f"step {step['step']:3d}  reward {step[REWARD]:.3f}  answered {answered:.2f}  "
        f"searches {searches:.2f}  ({seconds:.1f} s)"
    )


def follow(stream, quiet_s: float = 20.0) -> None:
    """A line per training step as verl logs it, and one every `quiet_s` seconds while a step runs
    (the first waits for Ray and verl's workers to start), so the console never falls silent."""
    lines: queue.Queue = queue.Queue()

    def read():
        for line in stream:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    last_step, since = 0, time.monotonic()
    while True:
        try:
            line = lines.get(timeout=quiet_s)
        except queue.Empty:
            print(f"  training: step {last_step + 1} running ({time.monotonic() - since:.0f} s)", flush=True)
            continue
        if line is None:
            return
        for step in parse_steps([line]):
            print(step_line(step), flush=True)
            last_step, since = step["step"], time.monotonic()


def eval_em(summary_json: Path, dataset: str | None = None) -> float:
    """EM of a `verl-memagent eval` summary.json holding one agent: over all its datasets, or `dataset`'s."""
    (result,) = json.loads(summary_json.read_text())["agents"].values()
    return (result["datasets"][dataset] if dataset else result["overall"])["em"]


#: what each of the learning demo's scorings measures, by the end of its name (`before_rl_greedy`, ...)
SCORED = {
    "held_out_greedy": ("held-out doors", "greedy"),
    "greedy": ("RL questions", "greedy"),
    "sampled": ("RL questions", "sampled"),
}


def em_lines(em: dict[str, float]) -> list[str]:
    """The console's EM lines, one per policy scored (the name's start, e.g. `before_rl`), each figure
    labelled with the questions it scored: `EM before_rl | RL questions: greedy 0.625, sampled 0.391 | ...`."""
    policies: dict[str, dict[str, list[str]]] = {}
    for name, value in em.items():
        end = next((end for end in SCORED if name.endswith("_" + end)), None)
        policy, (questions, mode) = (name[: -len(end) - 1], SCORED[end]) if end else (name, ("", name))
        policies.setdefault(policy, {}).setdefault(questions, []).append(f"{mode} {value:.3f}")
    return [
        f"EM {policy} | "
        + " | ".join(f"{questions}: " * bool(questions) + ", ".join(m) for questions, m in groups.items())
        for policy, groups in policies.items()
    ]


def summary(steps: list[dict], window: int) -> dict:
    """First and last values over `window` steps, fewer when a short run has less than two windows."""
    if not steps:
        raise ValueError("metrics.jsonl holds no training step: did the trainer log with trainer.logger=[...,'file']?")
    window = max(1, min(window, len(steps) // 2))
    result: dict = {"steps": len(steps), "window": window}
    for key, metric, _ in CURVES:
        values = [s[metric] for s in steps]
        result[f"{key}_first"] = sum(values[:window]) / window
        result[f"{key}_last"] = sum(values[-window:]) / window
    result["reward_gain"] = result["reward_last"] - result["reward_first"]
    timed = [s[STEP_SECONDS] for s in steps[1:]] or [steps[0][STEP_SECONDS]]
    result["seconds_per_step"] = sum(timed) / len(timed)
    return result


def save_png(steps: list[dict], png: Path, em: dict[str, float]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = len(CURVES) + bool(em)
    fig, axes = plt.subplots(1, panels, figsize=(4.2 * panels, 3.5))
    x = [s["step"] for s in steps]
    for ax, (_, metric, title) in zip(axes, CURVES, strict=False):
        ax.plot(x, [s[metric] for s in steps], marker="o")
        ax.set_xlabel("training step")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    if em:
        ax = axes[-1]
        bars = ax.bar(list(em), list(em.values()), color="tab:green")
        ax.bar_label(bars, fmt="%.2f")
        ax.set_ylim(0, 1.1)
        ax.set_title("EM on the task's questions")
        ax.tick_params(axis="x", labelrotation=20)
    fig.suptitle("MemSearcher on CPU: password task")
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)


def named_path(text: str) -> tuple[str, Path, str | None]:
    name, sep, path = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(
            f"--eval {text!r}: expected NAME=PATH[#DATASET], e.g. before_greedy=eval/summary.json#codes"
        )
    path, _, dataset = path.partition("#")
    return name, Path(path), dataset or None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m memagent_examples.learn_codes.reward_curve", description=__doc__)
    parser.add_argument("metrics", type=Path, nargs="?", help="JSON lines written by verl's file logger")
    parser.add_argument("--follow", action="store_true", help="print a line per step read from stdin, nothing else")
    parser.add_argument("--print-em", action="store_true", help="print the EM of each --eval run, nothing else")
    parser.add_argument("--png", type=Path)
    parser.add_argument("--window", type=int, default=3, help="steps averaged for the first / last values")
    parser.add_argument(
        "--eval", type=named_path, action="append", default=[], help="NAME=summary.json[#DATASET]; repeat"
    )
    args = parser.parse_args(argv)
    if args.follow:
        follow(sys.stdin)
        return 0
    if args.print_em:
        print("\n".join(em_lines({name: eval_em(path, dataset) for name, path, dataset in args.eval})), flush=True)
        return 0
    if args.metrics is None or args.png is None:
        parser.error("metrics and --png are required unless --follow or --print-em")
    steps = read_steps(args.metrics)
    em = {name: eval_em(path, dataset) for name, path, dataset in args.eval}
    save_png(steps, args.png, em)
    print(f"reward curve: {args.png}")
    print(json.dumps({**summary(steps, args.window), **{f"em_{name}": value for name, value in em.items()}}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
