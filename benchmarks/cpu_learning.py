"""Does MemSearcher learn on CPU, every time? The learning demo's RL stage on several seeds from one warm start.

Runs `recipes/cpu/learn_codes.sh` once per seed with the same task and warm start (the shipped one,
or with `--start build` one built here from `--build-seed` and cached) and a different
reinforcement-learning seed (`SEED`: question order and rollout sampling). The baseline is each
run's own warm-started policy: its EM on the task's 16 questions before RL, greedy and sampled,
against the same after RL. Reports per seed the EMs, the reward over the first and last steps, and
whether any loss or gradient norm was NaN or infinite in verl's metrics; then how many seeds
improved their greedy EM and the mean gain. About 15 minutes a seed on a quiet 2-core machine (plus
one warm start with `--start build`, if none is cached). The last printed line is one JSON object.

    python benchmarks/cpu_learning.py --seeds 5
    python benchmarks/cpu_learning.py --seeds 5 --work DIR --lock /path/lock   # on a shared machine

With `--work`, a seed whose run finished (its `result.json` is there) is not run again, so an
interrupted series resumes. `--lock FILE` holds an exclusive `flock` on FILE during each run only, so
other heavy jobs sharing the machine run between the seeds, not beside them.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import math
import os
import subprocess
import tempfile
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "recipes" / "cpu" / "learn_codes.sh"
EMS = ("em_before_rl_greedy", "em_after_rl_greedy", "em_before_rl_sampled", "em_after_rl_sampled")
RUN_FIGURES = ("reward_first", "reward_last", "seconds_per_step", "nonfinite", "wall_s")


def nonfinite_losses(metrics: Path) -> list[str]:
    """`step N: name=value` for every loss or gradient norm verl logged as NaN or infinite."""
    found = []
    for line in metrics.read_text().splitlines():
        record = json.loads(line)
        for name, value in record["data"].items():
            losses = "loss" in name or name.endswith("grad_norm")
            if losses and isinstance(value, float) and not math.isfinite(value):
                found.append(f"step {record['step']}: {name}={value}")
    return found


def run_seed(work: Path, start: str, build_seed: int, rl_seed: int, lock: Path | None) -> dict:
    finished = work / "result.json"
    if finished.is_file():
        return json.loads(finished.read_text())
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "WORK": str(work), "START": start, "BUILD_SEED": str(build_seed), "SEED": str(rl_seed)}
    with contextlib.ExitStack() as held:
        if lock is not None:
            fcntl.flock(held.enter_context(lock.open("a")), fcntl.LOCK_EX)
        began = time.perf_counter()
        done = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, check=False)
    (work / "learn_codes.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise SystemExit(f"learn_codes.sh failed for SEED={rl_seed} ({done.returncode}):\n{done.stderr[-4000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    nonfinite = nonfinite_losses(work / "metrics.jsonl")
    run = {"rl_seed": rl_seed, **result, "nonfinite": nonfinite, "wall_s": round(time.perf_counter() - began, 1)}
    finished.write_text(json.dumps(run) + "\n")
    return run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=1, help="reinforcement-learning seeds 0..N-1")
    parser.add_argument("--start", choices=("shipped", "build"), default="shipped", help="the learning demo's START")
    parser.add_argument("--build-seed", type=int, default=0, help="with --start build: the task and warm start's seed")
    parser.add_argument("--work", type=Path, help="output directory (default: a temporary one)")
    parser.add_argument("--lock", type=Path, help="a file to hold an exclusive flock on during each run")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="cpu_learning_"))
    start = time.perf_counter()
    runs = []
    print("rl_seed  EM greedy before -> after  EM sampled before -> after  reward first -> last  NaN  minutes")
    for rl_seed in range(args.seeds):
        run = run_seed(work / f"rl_seed_{rl_seed}", args.start, args.build_seed, rl_seed, args.lock)
        runs.append(run)
        print(
            f"{rl_seed:7d}  {run['em_before_rl_greedy']:6.3f} -> {run['em_after_rl_greedy']:.3f}"
            f"{run['em_before_rl_sampled']:17.3f} -> {run['em_after_rl_sampled']:.3f}"
            f"{run['reward_first']:15.3f} -> {run['reward_last']:.3f}"
            f"  {'yes' if run['nonfinite'] else 'no ':>3}  {run['wall_s'] / 60:7.1f}",
            flush=True,
        )
    gains = [run["em_after_rl_greedy"] - run["em_before_rl_greedy"] for run in runs]
    result = {
        "start": args.start,
        **({"build_seed": args.build_seed} if args.start == "build" else {}),
        "rl_seeds": args.seeds,
        "improved": sum(gain > 0 for gain in gains),
        "mean_gain_greedy": sum(gains) / len(gains),
        "mean_gain_sampled": sum(r["em_after_rl_sampled"] - r["em_before_rl_sampled"] for r in runs) / len(runs),
        "any_nonfinite": any(run["nonfinite"] for run in runs),
        "wall_s": round(time.perf_counter() - start, 1),
        "runs": [{key: run[key] for key in ("rl_seed", *EMS, *RUN_FIGURES)} for run in runs],
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
