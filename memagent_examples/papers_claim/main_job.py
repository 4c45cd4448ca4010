"""The main job: MemSearcher trained by RL in the papers' regime on the composed task, and the papers' claim shown.

`python -m memagent_examples.papers_claim.main_job --work DIR [--seed S]` (what `scripts/main_job.sh` runs,
through `recipes/cpu/main_job.sh`): builds the composed task and its BM25 index from the shipped
MemSearcher warm start's seed, starts verl's trainer on fresh RL questions (`recipes/cpu/composed_doors.sh`
with `composed_doors_fresh.yaml`, as the sweep's RL runs) and, while it starts, scores the warm start
on the test split at k = 1, 2, 4, 8; prints one line per RL step (the reward at each k of the batch);
scores the trained policy the same way; and prints the figures labelled, beside ReAct's peak context at
the same k from the committed sweep (`benchmarks/results/papers_claim_fresh.json`, labelled as such).
The last line is one JSON object. docs/main_job.md says what each figure is.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from pathlib import Path

from memagent_examples.composed_doors.warm_start import SHIPPED_STARTS
from memagent_examples.papers_claim.records import OBJECTIVES, TEST_TASKS, record_phase
from memagent_examples.papers_claim.sweep import REPO, Sweep, shipped_seed

AGENT = "memsearcher"
#: the committed sweep whose ReAct figures the job prints beside its own
SWEEP_RECORDS = REPO / "benchmarks" / "results" / "papers_claim_fresh.json"
#: the name the sweep ran the recipe's settings (composed_doors_fresh.yaml's lr and KL) under
RECIPE_SETTINGS = "lr3e-5_kl5e-2_t0.7"


def step_line(record: dict) -> str:
    """One RL step: the reward of each k in its batch (sum-EM, 0 to k), KL and seconds."""
    data = record["data"]
    rewards = sorted(
        (int(key.split("_")[-1].split("/")[0]), value)
        for key, value in data.items()
        if key.startswith("train/multi_objective_") and key.endswith("/reward/mean")
    )
    per_k = "  ".join(f"k={k} {value:.2f}" for k, value in rewards)
    kl, seconds = data.get("actor/kl_loss", float("nan")), data.get("timing_s/step", float("nan"))
    return f"step {record['step']:3d}  reward {per_k}  kl {kl:.4f}  ({seconds:.1f} s)"


def follow(metrics: Path, process: subprocess.Popen) -> None:
    """Print each training step's line as verl logs it, until the trainer exits."""
    printed = 0
    while True:
        done = process.poll() is not None
        lines = metrics.read_text().splitlines() if metrics.is_file() else []
        for line in lines[printed:]:
            record = json.loads(line)
            if "timing_s/step" in record["data"]:
                print(step_line(record), flush=True)
        printed = len(lines)
        if done:
            return
        time.sleep(1)


def figures(records: list[dict], phase: str) -> dict[int, dict]:
    """EM per objective and peak context tokens of `phase`'s test records, by k."""
    mine = [r for r in records if record_phase(r).startswith(phase) and r["door_set"] in TEST_TASKS]
    return {r["objectives"]: {"em": r["em"], "peak": r["peak_context_tokens"]} for r in mine}


def react_peaks() -> dict[int, float]:
    """ReAct's mean peak context at each k after RL in the committed sweep (its test records)."""
    if not SWEEP_RECORDS.is_file():
        return {}
    records = [r for r in json.loads(SWEEP_RECORDS.read_text()) if r["agent"] == "react" and r["door_set"] == "test"]
    after = [r for r in records if record_phase(r) == f"after_rl_fresh_{RECIPE_SETTINGS}"]
    by_k: dict[int, list[float]] = {}
    for r in after:
        by_k.setdefault(r["objectives"], []).append(r["peak_context_tokens"])
    return {k: statistics.mean(values) for k, values in by_k.items()}


def report(records: list[dict], rewards: tuple[float, float]) -> dict:
    """The labelled lines and the closing JSON object."""
    before, after, react = figures(records, "before_rl"), figures(records, "after_rl"), react_peaks()
    cells = lambda table, key, fmt: "  ".join(f"k={k} {fmt(table[k][key])}" for k in OBJECTIVES if k in table)  # noqa: E731
    print(f"test EM per objective, before RL | {cells(before, 'em', '{:.2f}'.format)}")
    print(f"test EM per objective, after RL  | {cells(after, 'em', '{:.2f}'.format)}")
    print(f"peak context tokens, before RL   | {cells(before, 'peak', '{:.0f}'.format)}")
    print(f"peak context tokens, after RL    | {cells(after, 'peak', '{:.0f}'.format)}")
    if react:
        shown = "  ".join(f"k={k} {react[k]:.0f}" for k in OBJECTIVES if k in react)
        print(f"ReAct's peak context after RL, from the committed sweep (not run here) | {shown}")
    print(f"RL questions' reward per objective, first -> last steps | {rewards[0]:.2f} -> {rewards[1]:.2f}")
    result = {
        f"em_{phase}_k{k}": table[k]["em"]
        for phase, table in (("before_rl", before), ("after_rl", after))
        for k in table
    }
    result |= {
        f"peak_{phase}_k{k}": table[k]["peak"]
        for phase, table in (("before_rl", before), ("after_rl", after))
        for k in table
    }
    result |= {f"react_peak_k{k}": value for k, value in react.items()}
    result |= {"reward_first": rewards[0], "reward_last": rewards[1]}
    print(json.dumps(result))
    return result


def rl_rewards(metrics: Path, window: int = 3) -> tuple[float, float]:
    """The RL questions' reward per objective (sum-EM over k) over the first and last `window` steps."""
    steps = [json.loads(line)["data"] for line in metrics.read_text().splitlines()]
    per_objective = []
    for data in steps:
        ks = {
            key: int(key.split("_")[-1].split("/")[0])
            for key in data
            if key.startswith("train/multi_objective_") and key.endswith("/reward/mean")
        }
        if ks:
            per_objective.append(statistics.mean(data[key] / k for key, k in ks.items()))
    window = max(1, min(window, len(per_objective) // 2))
    return statistics.mean(per_objective[:window]), statistics.mean(per_objective[-window:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, required=True, help="this run's outputs (the task is built here)")
    parser.add_argument("--seed", type=int, default=0, help="RL's seed: the questions dealt and the sampling")
    parser.add_argument("rl_overrides", nargs="*", help="hydra overrides of composed_doors_fresh.yaml")
    args = parser.parse_args(argv)
    sweep = Sweep(
        args.work,
        args.work / "records.json",
        eval_tasks={},
        test=True,
        regime="fresh",
        starts=SHIPPED_STARTS,
        build_seed=shipped_seed((AGENT,)),
        rl_overrides=tuple(args.rl_overrides),
    )
    print("== building the composed task and its BM25 index", flush=True)
    sweep.prepare((AGENT,))
    try:
        out = args.work / "rl"
        command, env = sweep.rl_launch(AGENT, args.seed, out)
        out.mkdir(parents=True, exist_ok=True)
        print(
            f"== starting verl's trainer (its log: {out / 'train.log'}); scoring the warm start meanwhile", flush=True
        )
        with (out / "train.log").open("w") as log:
            trainer = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
            sweep.score(AGENT, "before_rl", None, sweep.warm_model(AGENT))
            print("== reinforcement learning: one line per step", flush=True)
            follow(out / "metrics.jsonl", trainer)
        if trainer.returncode != 0:
            raise SystemExit(
                f"verl's trainer failed ({trainer.returncode}):\n{(out / 'train.log').read_text()[-3000:]}"
            )
        step = (out / "checkpoints" / "latest_checkpointed_iteration.txt").read_text().strip()
        print("== scoring the trained policy", flush=True)
        sweep.score(AGENT, "after_rl", args.seed, out / "checkpoints" / f"global_step_{step}" / "actor" / "huggingface")
    finally:
        sweep.retriever.stop()
    report(sweep.records, rl_rewards(out / "metrics.jsonl"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
