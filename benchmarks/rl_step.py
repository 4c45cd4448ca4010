"""What a CPU RL step costs, phase by phase, beside the time its arithmetic needs: configurations A/B in one run.

Each configuration is a git revision of this repository (its recipes, plugin and agent loops) plus
hydra overrides and environment variables, launched on the learning demo's task exactly as the demo
launches it (`recipes/cpu/learn_codes.sh`: the shipped warm start, `learn_codes.yaml`, 8 questions x 8
trajectories a step, `train_on_cpu` of the revision's own `preamble.sh`), for `--steps` steps with
no checkpoint. The task, its BM25 index and the training data are built once, by this checkout, and
shared by every launch; each launch serves the index with its revision's retriever. Launches run one
after the other, the configurations' order reversed every other round (`--rounds`), so a drift of the
machine's speed falls on all of them.

Per launch, from verl's metrics (`timing_s/*`) and the step's trajectory records: each phase's
seconds per step (`gen`, `old_log_prob`, `ref`, `update_actor`, the rest), the rows (contexts and
verl's padding rows) and their real tokens, and the seconds from verl's launch to its first step.
Beside each phase, its ideal: the floating-point operations the phase must do on the step's real
tokens (forward over every token, attention over each row's causal pairs, the head at response
positions only; a training pass is three forwards, generation one) divided by this CPU's measured
matrix-multiply rate on the model's own shapes, at one thread as the trainer runs. So every figure
reads as a ratio to the arithmetic it does. With a configuration's `MEMAGENT_CPU_ENGINE_SHAPES`
(set for every launch) the CPU engine also logs each micro-batch's padded shape: the padded tokens
the trainer's passes computed.

    python benchmarks/rl_step.py --config today=682b916 --config new=. [--steps 4] [--rounds 1]
    python benchmarks/rl_step.py --config 'bypass=. algorithm.rollout_correction.bypass_mode=true'

A configuration is `NAME=REVISION [override ...] [VARIABLE=value ...]`: `.` is this checkout as it
is (uncommitted changes included), anything else a commit, checked out once under `--work`. Medians
are over the steps after the first (whose `gen` starts verl's agent-loop and reward workers). The
last printed line is one JSON object; `--work/results.json` keeps every launch's steps.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from step_arithmetic import forward_flops, matmul_rate, model_shapes

ROOT = Path(__file__).resolve().parent.parent
START = ROOT / "memagent_examples" / "learn_codes" / "start"
PHASES = ("gen", "old_log_prob", "ref", "update_actor")
#: forward-pass equivalents of each phase: generation reads every token once, a training pass is
#: a forward and a backward (two forwards' work)
PASSES = {"gen": 1, "old_log_prob": 1, "ref": 1, "update_actor": 3}
_ENV = re.compile(r"^[A-Z_][A-Z0-9_]*=")


@dataclass
class Config:
    """One configuration: a revision of the repository, hydra overrides and environment variables."""

    name: str
    revision: str
    overrides: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, spec: str) -> Config:
        name, _, rest = spec.partition("=")
        words = shlex.split(rest)
        if not name or not words:
            raise SystemExit(f"--config {spec!r}: expected NAME=REVISION [override ...] [VARIABLE=value ...]")
        env = dict(w.split("=", 1) for w in words[1:] if _ENV.match(w))
        return cls(name, words[0], [w for w in words[1:] if not _ENV.match(w)], env)


def checkout(revision: str, work: Path) -> Path:
    """The tree a revision runs from: this checkout for `.`, else a detached worktree made once."""
    if revision == ".":
        return ROOT
    sha = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--verify", f"{revision}^{{commit}}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    tree = work / "trees" / sha[:12]
    if not (tree / "recipes").is_dir():
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), sha], check=True, capture_output=True
        )
    return tree


def build_task(work: Path) -> Path:
    """The learning demo's task from the shipped start's seed, its BM25 index and training data; built once."""
    task = work / "task"
    if (task / "complete").is_file():
        return task
    seed = json.loads((START / "build.json").read_text())["inputs"]["seed"]
    steps = [
        [
            "-m",
            "memagent_examples.learn_codes.task",
            "task",
            "--out",
            str(task),
            "--tokenizer",
            str(START),
            "--seed",
            str(seed),
            "--base-corpus",
            str(ROOT / "data" / "corpus.jsonl"),
        ],
        [
            "-m",
            "retriever_server",
            "build",
            "--kind",
            "bm25",
            "--corpus",
            str(task / "corpus.jsonl"),
            "--out",
            str(task / "bm25"),
        ],
        [
            "-m",
            "verl_memagent.cli",
            "prepare",
            "--input",
            str(task / "qa.jsonl"),
            "--agent",
            "memsearcher",
            "--out",
            str(task / "train.parquet"),
        ],
    ]
    for step in steps:
        subprocess.run([sys.executable, *step], check=True, capture_output=True, cwd=ROOT)
    (task / "complete").touch()
    return task


LAUNCH = r"""set -euo pipefail
source "$TREE/recipes/cpu/preamble.sh" rl_step
start_retriever "$TASK/bm25" "$WORK"
cp "$TASK/train.parquet" "$WORK/train.parquet"
date +%s.%N >"$WORK/launched_at"
AGENT_LOOPS_YAML=$TREE/recipes/cpu/learn_codes_agent_loops.yaml train_on_cpu learn_codes "$MODEL" "$@"
"""


def launch(config: Config, tree: Path, task: Path, out: Path, steps: int) -> dict:
    """One verl launch of `config`; returns its steps' metrics, records and timings."""
    out.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "TREE": str(tree),
        "TASK": str(task),
        "WORK": str(out),
        "MODEL": str(START),
        "PYTHONPATH": str(tree),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
        "MEMAGENT_CPU_ENGINE_SHAPES": str(out / "engine_shapes.jsonl"),
        # Ray starts its workers at nice 15: at the launcher's priority, whatever else runs takes no share
        "RAY_worker_niceness": os.environ.get("RAY_worker_niceness", "0"),
        **config.env,
    }
    overrides = [
        f"trainer.total_training_steps={steps}",
        "trainer.save_freq=-1",
        "data.seed=0",
        "actor_rollout_ref.rollout.seed=0",
        "+trainer.trajectories.per_step=100000",  # every trajectory's record: the step's rows and lengths
        *config.overrides,
    ]
    metrics = out / "metrics.jsonl"
    with (out / "train.log").open("w") as log:
        process = subprocess.Popen(
            ["bash", "-c", LAUNCH, "rl_step", *overrides], env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tree
        )
        first_line_at = None  # when verl logged step 1: its start is that less the step's own time
        while process.poll() is None:
            if first_line_at is None and metrics.is_file() and metrics.stat().st_size:
                first_line_at = time.time()
            time.sleep(0.2)
    finished = time.time()
    if process.returncode != 0:
        raise SystemExit(f"{config.name}: the launch failed ({process.returncode}); see {out / 'train.log'}")
    lines = [json.loads(line) for line in metrics.read_text().splitlines()]
    launched = float((out / "launched_at").read_text())
    total = sum(line["data"]["timing_s/step"] for line in lines)
    return {
        "config": config.name,
        "steps": [step_figures(line, out) for line in lines],
        # from verl's launch to the start of step 1 (its agent-loop and reward workers start inside it)
        "to_first_step_s": round(first_line_at - launched - lines[0]["data"]["timing_s/step"], 1),
        # verl's start and end around its steps: the launch's wall time less the steps' own time
        "outside_steps_s": round(finished - launched - total, 1),
    }


def step_figures(line: dict, out: Path) -> dict:
    """One step: phase seconds from verl's timers, rows and tokens from its trajectory records."""
    data = line["data"]
    lengths = []  # (prompt, response) tokens of every context the step trained
    for record in map(json.loads, (out / "checkpoints" / "trajectories" / f"step_{line['step']}.jsonl").open()):
        for turn in record["turns"]:
            prompt = turn["calls"][0]["context_tokens"]
            lengths.append((prompt, turn["context_tokens"] - prompt))
    return {
        "step": line["step"],
        "seconds": {
            key.removeprefix("timing_s/"): round(value, 3) for key, value in data.items() if key.startswith("timing_s/")
        },
        "lengths": lengths,
        "padding_rows": int(data.get("multi_context/padding_rows", 0)),
    }


def engine_padding(path: Path) -> dict:
    """Padded and real tokens the CPU engine's forwards computed (its shapes log), summed over the launch."""
    if not path.is_file():
        return {}
    shapes = [json.loads(line) for line in path.read_text().splitlines()]
    return {
        "padded_tokens": sum(s["rows"] * s["width"] for s in shapes),
        "real_tokens": sum(s["tokens"] for s in shapes),
        "micro_batches": len(shapes),
    }


def summarize(name: str, launches: list[dict], shapes: dict, rate: float) -> dict:
    """Medians over every launch's steps after the first; ideal seconds from the same steps' rows."""
    steps = [s for launched in launches for s in launched["steps"][1:]]
    if not steps:
        raise SystemExit(f"{name}: no step after the first: run --steps 2 or more")
    median = lambda values: round(statistics.median(values), 2)  # noqa: E731
    phases = {p: median([s["seconds"].get(p, 0.0) for s in steps]) for p in (*PHASES, "step")}
    phases["rest"] = round(phases["step"] - sum(phases[p] for p in PHASES), 2)
    forward = median([forward_flops(s["lengths"], shapes) for s in steps])
    ideal = {p: round(PASSES[p] * forward / rate, 2) for p in PHASES}
    ideal["step"] = round(sum(ideal.values()), 2)
    return {
        "config": name,
        "launches": len(launches),
        "median_s": phases,
        "ideal_s": ideal,
        "step_over_ideal": round(phases["step"] / ideal["step"], 1),
        "rows": median([len(s["lengths"]) + s["padding_rows"] for s in steps]),
        "padding_rows": median([s["padding_rows"] for s in steps]),
        "real_tokens": median([sum(p + r for p, r in s["lengths"]) for s in steps]),
        "response_tokens": median([sum(r for _, r in s["lengths"]) for s in steps]),
        "outside_steps_s": median([launched["outside_steps_s"] for launched in launches]),
        "to_first_step_s": median([launched["to_first_step_s"] for launched in launches]),
        "first_step_s": median([launched["steps"][0]["seconds"]["step"] for launched in launches]),
    }


def table(summaries: list[dict]) -> str:
    header = "| config | step | gen | old_log_prob | ref | update_actor | rest | ideal step | x ideal | rows | tokens |"
    lines = [header, "|" + " --- |" * 11]
    for s in summaries:
        m, i = s["median_s"], s["ideal_s"]
        cells = [f"{m[p]} ({i[p]})" for p in PHASES]
        lines.append(
            f"| {s['config']} | {m['step']} | " + " | ".join(cells) + f" | {m['rest']} | {i['step']} | "
            f"{s['step_over_ideal']} | {s['rows']} | {s['real_tokens']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", action="append", required=True, help="NAME=REVISION [override ...] [VAR=value]")
    parser.add_argument("--steps", type=int, default=4, help="RL steps per launch (the first is left out)")
    parser.add_argument("--rounds", type=int, default=1, help="launches per configuration, order reversed each round")
    parser.add_argument("--work", type=Path, help="output directory (default: a temporary one)")
    parser.add_argument("--lock", type=Path, help="a file to hold an exclusive flock on during the launches")
    args = parser.parse_args(argv)
    configs = [Config.parse(spec) for spec in args.config]
    work = (args.work or Path(tempfile.mkdtemp(prefix="rl_step_"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    task = build_task(work)
    shapes = model_shapes(START)
    launches: dict[str, list[dict]] = {c.name: [] for c in configs}
    with contextlib.ExitStack() as held:
        if args.lock is not None:
            fcntl.flock(held.enter_context(args.lock.open("a")), fcntl.LOCK_EX)
        for round_ in range(args.rounds):
            for config in configs if round_ % 2 == 0 else configs[::-1]:
                out = work / "launches" / f"{config.name}_{round_}"
                result = launch(config, checkout(config.revision, work), task, out, args.steps)
                result["engine"] = engine_padding(out / "engine_shapes.jsonl")
                launches[config.name].append(result)
                print(
                    f"{config.name} round {round_}: steps "
                    + ", ".join(f"{s['seconds']['step']:.1f}" for s in result["steps"])
                    + " s",
                    flush=True,
                )
    rate = matmul_rate(shapes)
    summaries = [summarize(c.name, launches[c.name], shapes, rate) for c in configs]
    for s in summaries:
        s["engine"] = {
            k: sum(r["engine"].get(k, 0) for r in launches[s["config"]])
            for k in ("padded_tokens", "real_tokens", "micro_batches")
        }
    (work / "results.json").write_text(
        json.dumps(
            {
                "configs": [vars(c) for c in configs],
                "launches": launches,
                "summaries": summaries,
                "matmul_gflops": rate / 1e9,
            },
            indent=1,
        )
    )
    print(f"matmul rate {rate / 1e9:.1f} GFLOP/s (one thread); seconds per step, median (ideal in brackets):")
    print(table(summaries))
    print(json.dumps({"matmul_gflops": round(rate / 1e9, 1), "summaries": summaries}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
