"""A CPU recipe at two ranks against one, and a killed and resumed run against an uninterrupted one.

`ranks`: the CPU MemSearcher recipe (`recipes/cpu/run.sh`, hf rollout, 2 questions x 2 trajectories)
for `--steps` steps at N_GPUS_PER_NODE=1 (the baseline) and 2: peak resident memory of the whole run
(every process of it, sampled every 0.2 s) and seconds per training step (verl's `timing_s/step`,
steps after the first).

`resume`: the same recipe for 3 steps with a checkpoint every step, uninterrupted, and killed (SIGKILL
to the whole run) as soon as step 2's checkpoint is complete, then started again with the same
command; once with the agent loops as shipped (the rollout's sampling from the servers' random
state) and once with `sampling_seed` set (docs/agents.md). For step 3 it reports whether the
resumed run sampled the uninterrupted run's trajectories (the recorded model outputs), and how far
its losses and gradient norm are from the uninterrupted run's. The last printed line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import yaml
from shared import watch_peak_rss

ROOT = Path(__file__).resolve().parent.parent
RUN = ROOT / "recipes" / "cpu" / "run.sh"
COMPARED = ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "critic/score/mean", "response_length/mean")


def launch(work: Path, cache: Path, env: dict, *overrides: str) -> subprocess.Popen:
    env = {**os.environ, "WORK": str(work), "MEMAGENT_CPU_CACHE": str(cache), **env}
    log = (work / "run.log").open("a")
    command = ["bash", str(RUN), "memsearcher", *overrides]
    return subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def wait(process: subprocess.Popen, work: Path) -> None:
    if process.wait() != 0:
        raise SystemExit(f"run failed in {work}: {(work / 'run.log').read_text()[-4000:]}")


def steps_of(work: Path) -> list[dict]:
    return [json.loads(line) for line in (work / "metrics.jsonl").read_text().splitlines()]


def ranks(ranks_: int, steps: int, root: Path) -> dict:
    work = root / f"ranks_{ranks_}"
    work.mkdir(parents=True)
    process = launch(work, root / "cache", {"N_GPUS_PER_NODE": str(ranks_)}, f"trainer.total_training_steps={steps}")
    peak_rss = watch_peak_rss(process)
    wait(process, work)
    peak = peak_rss()
    timed = [line["data"]["timing_s/step"] for line in steps_of(work)[1:]]
    return {"ranks": ranks_, "peak_rss_gb": round(peak / 1024**3, 2), "s_per_step": round(statistics.median(timed), 1)}


def outputs_of_step(work: Path, step: int) -> dict:
    """The model outputs of each recorded trajectory of `step`, by question and session order."""
    lines = (work / "checkpoints" / "trajectories" / f"step_{step}.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    played = {}
    for record in records:
        calls = tuple(call["output"] for turn in record["turns"] for call in turn["calls"])
        played.setdefault(record["question"], []).append(calls)
    return {question: sorted(calls) for question, calls in played.items()}


def resume(seeded: bool, root: Path) -> dict:
    loops = root / f"agent_loops_{'seeded' if seeded else 'shipped'}.yaml"
    entries = yaml.safe_load((ROOT / "recipes" / "cpu" / "agent_loops.yaml").read_text())
    for entry in entries:
        if seeded:
            entry["sampling_seed"] = 0
    loops.write_text(yaml.safe_dump(entries))
    env = {"AGENT_LOOPS_YAML": str(loops)}
    overrides = ("trainer.total_training_steps=3", "trainer.save_freq=1", "+trainer.trajectories.per_step=64")
    runs = {}
    for name in ("uninterrupted", "resumed"):
        work = root / f"{name}_{'seeded' if seeded else 'shipped'}"
        work.mkdir(parents=True)
        process = launch(work, root / "cache", env, *overrides)
        if name == "resumed":
            tracker = work / "checkpoints" / "latest_checkpointed_iteration.txt"
            while not (tracker.exists() and tracker.read_text().strip() == "2"):
                if process.poll() is not None:
                    raise SystemExit(f"the run ended before step 2's checkpoint: {work / 'run.log'}")
                time.sleep(0.05)
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            process = launch(work, root / "cache", env, *overrides)
        wait(process, work)
        runs[name] = work
    one, two = steps_of(runs["uninterrupted"])[-1]["data"], steps_of(runs["resumed"])[-1]["data"]
    return {
        "sampling_seed": seeded,
        "metrics_lines": [line["step"] for line in steps_of(runs["resumed"])],
        "same_step3_rollouts": outputs_of_step(runs["uninterrupted"], 3) == outputs_of_step(runs["resumed"], 3),
        "step3_relative_difference": {
            name: round(abs(two[name] - one[name]) / max(abs(one[name]), 1e-12), 6) for name in COMPARED if name in one
        },
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--parts", default="ranks,resume", help="comma list of ranks, resume")
    parser.add_argument("--steps", type=int, default=3, help="steps of each `ranks` run")
    parser.add_argument("--work", type=Path, help="output directory (default: a temporary one)")
    args = parser.parse_args()
    root = args.work or Path(tempfile.mkdtemp(prefix="ranks_and_resume_"))
    result: dict = {}
    if "ranks" in args.parts:
        result["ranks"] = [ranks(n, args.steps, root) for n in (1, 2)]
        one, two = result["ranks"]
        result["two_ranks_over_one"] = {
            "peak_rss": round(two["peak_rss_gb"] / one["peak_rss_gb"], 2),
            "s_per_step": round(two["s_per_step"] / one["s_per_step"], 2),
        }
        print(result["ranks"], result["two_ranks_over_one"], flush=True)
    if "resume" in args.parts:
        result["resume"] = [resume(seeded, root) for seeded in (False, True)]
        print(result["resume"], flush=True)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
