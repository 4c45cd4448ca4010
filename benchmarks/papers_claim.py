"""The papers' claim in miniature: does a memory agent keep its context flat as the task grows, and still answer?

MemSearcher, MEM1 and ReAct on the composed password task (`memagent_examples.composed_doors`): one
question asks for the passwords of k doors. The three agents start from one tiny model, copy-pretrained
once, then each is warm-started the same way (scripted demonstrations in its own format, the same
supervised steps) and trained with RL through verl's real trainer on the same budget
(`recipes/cpu/composed_doors.yaml`: two-objective questions on the RL doors, as MEM1 trains), under the
same limits (`recipes/cpu/composed_doors_agent_loops.yaml`). Before and after RL each agent is scored
greedily by `verl-memagent eval` on doors that neither the warm start nor RL saw (`held_out`: known
words in new pairs; `unseen`: words no training door used) at k = 1, 2, 4, 8: EM per objective (MEM1's
metric), peak context tokens per trajectory, tokens prefilled and decoded per question, seconds per
question, turns and the share answered.

RL starts from the warm starts shipped in `memagent_examples/composed_doors/starts/` (the ones the committed
records grew from: a warm start built on another CPU is another model, and the three cost ~7 core-hours);
`--start build` builds the tiny model, copy pretraining and warm starts under `--work` instead.

Every piece is cached under `--work` (the build once; each RL run and each scoring once), and each
cell's records go to `--results` as soon as it is scored, so an interrupted sweep resumes where it
stopped, on this machine or from the committed JSON on another (a cell whose records are there is not
run again). `--report` prints the table and draws the plot from the JSON alone.

    python benchmarks/papers_claim.py --seeds 3 --work DIR [--lock FILE] [--start build]
    python benchmarks/papers_claim.py --report
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))  # the launcher the tests start servers with

from retriever_process import ServerProcess, build_command, serve_command  # noqa: E402

from memagent_examples.build_records import cpu, read_record  # noqa: E402
from memagent_examples.composed_doors import task as composed_task  # noqa: E402
from memagent_examples.composed_doors import warm_start as composed_warm_start  # noqa: E402

AGENTS = ("memsearcher", "mem1", "react")
OBJECTIVES = (1, 2, 4, 8)
#: evaluation door sets and the questions composed from each at every k
EVAL_TASKS = {"held_out": 24, "unseen": 16}
#: objectives per RL question: two, as MEM1 trains; `--rl-objectives` mixes others in (a named experiment)
RL_OBJECTIVES = (2,)
#: RL questions composed at each of the RL objectives: one pass over the 96 RL doors at k = 2
RL_TASKS_PER_OBJECTIVE = 48
AGENT_LOOPS = REPO / "recipes" / "cpu" / "composed_doors_agent_loops.yaml"
RESULTS = REPO / "benchmarks" / "results" / "papers_claim.json"
#: the plot beside its records: a sweep with records of its own (`--results`) draws beside them
PLOT = RESULTS.with_suffix(".png")


def run(command: list[str], log: Path, env: dict[str, str] | None = None) -> None:
    """Run `command`, its output to `log`; on failure, raise with the log's tail."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command[:6])} ... failed ({done.returncode}):\n{log.read_text()[-4000:]}")


def once(done_dir: Path, make) -> Path:
    """`make(done_dir)` unless an earlier run finished it (its `complete` marker); returns `done_dir`."""
    if not (done_dir / "complete").is_file():
        done_dir.mkdir(parents=True, exist_ok=True)
        make(done_dir)
        (done_dir / "complete").touch()
    return done_dir


class Sweep:
    """The sweep's pieces and cells. `objectives`, `eval_tasks` and `rl_overrides` (hydra overrides of
    composed_doors.yaml) shrink it for a test; the benchmark runs the defaults. `rl_objectives` other
    than MEM1's (2,) trains on questions of each of those k: its cells are phases of their own. `starts`: a
    folder of warm starts, one per agent (`composed_warm_start.SHIPPED_STARTS`), which the build then does not make."""

    def __init__(
        self,
        work: Path,
        results: Path,
        build_seed: int = 0,
        copy_steps: tuple[int, int] = (800, 1500),
        warm_steps: int = composed_warm_start.WARM_STEPS,
        lock: Path | None = None,
        objectives: tuple[int, ...] = OBJECTIVES,
        eval_tasks: dict[str, int] = EVAL_TASKS,
        rl_overrides: tuple[str, ...] = (),
        rl_objectives: tuple[int, ...] = RL_OBJECTIVES,
        starts: Path | None = None,
    ):
        self.work, self.results, self.lock = work, results, lock
        self.build_seed, self.copy_steps, self.warm_steps = build_seed, copy_steps, warm_steps
        self.objectives, self.eval_tasks, self.rl_overrides = objectives, eval_tasks, rl_overrides
        self.rl_objectives, self.starts = rl_objectives, starts
        self.build = work / "build"
        self.records = json.loads(results.read_text()) if results.is_file() else []
        self.machine = cpu()  # read once: every record carries it
        self.retriever: ServerProcess | None = None

    # -- the build: tiny model, task, index, copy pretraining, one warm start per agent (or the task and
    # index alone, for shipped warm starts)
    def prepare(self, agents: tuple[str, ...] = AGENTS) -> None:
        python = sys.executable
        seed = str(self.build_seed)
        doors = [python, "-m", "memagent_examples.composed_doors"]
        if self.starts is None:
            cli = [str(Path(python).parent / "verl-memagent")]
            make_model = [*cli, "tiny-model", "--seed", seed]
            once(self.build / "model", lambda d: run([*make_model, "--out", str(d)], d / "log"))
        task = self.build / "task"
        tokenizer = self.build / "model" if self.starts is None else self.warm_model(agents[0])
        make_task = [*doors, "task", "--tokenizer", str(tokenizer), "--seed", seed]
        make_task += ["--base-corpus", str(REPO / "data" / "corpus.jsonl")]
        once(task, lambda d: run([*make_task, "--out", str(d)], d / "log.txt"))
        once(self.build / "bm25", lambda d: run(build_command("bm25", task / "corpus.jsonl", d / "index"), d / "log"))
        self.retriever = ServerProcess(serve_command(self.build / "bm25" / "index"), timeout_s=120, cwd=REPO)
        if self.starts is None:
            self.build_warm_starts(agents, doors, task)
        once(self.build / "data", self.write_data)

    def build_warm_starts(self, agents: tuple[str, ...], doors: list[str], task: Path) -> None:
        seed = str(self.build_seed)
        adjacent, distant = (str(steps) for steps in self.copy_steps)
        copy = [*doors, "copy-pretrain", "--model", str(self.build / "model"), "--steps", adjacent]
        copy += ["--distant-steps", distant]
        once(self.build / "copy", lambda d: run([*copy, "--out", str(d / "model"), "--seed", seed], d / "log"))
        for agent in agents:
            warm = [*doors, "warm-start", "--agent", agent, "--model", str(self.build / "copy" / "model")]
            warm += ["--task", str(task), "--retriever", self.retriever.url, "--agent-loops", str(AGENT_LOOPS)]
            warm += ["--steps", str(self.warm_steps), "--seed", seed]
            once(self.build / "warm" / agent, lambda d, w=warm: run([*w, "--out", str(d / "model")], d / "log"))

    def write_data(self, out: Path) -> None:
        """The evaluation tasks: the same for every agent and phase."""
        from verl_memagent.data.compose import task_rows
        from verl_memagent.data.prepare import write_parquet

        sets = composed_task.read_door_sets(self.build / "task")
        for name, tasks in self.eval_tasks.items():
            pool = composed_task.records(sets.of(name), name)
            for k in self.objectives:
                rows = task_rows(pool, "memsearcher", "test", objectives=k, num_tasks=tasks, seed=0)
                write_parquet(rows, out / f"{name}_k{k}.parquet")

    def rl_data(self, agent: str) -> Path:
        """`agent`'s RL questions: `RL_TASKS_PER_OBJECTIVE` on the RL doors at each RL k, written once."""
        from verl_memagent.data.compose import task_rows
        from verl_memagent.data.prepare import write_parquet

        path = self.build / "data" / f"rl_{agent}{rl_suffix(self.rl_objectives)}.parquet"
        if not path.is_file():
            pool = composed_task.records(composed_task.read_door_sets(self.build / "task").rl, "rl")
            rows = [
                row
                for k in self.rl_objectives
                for row in task_rows(pool, agent, "train", objectives=k, num_tasks=RL_TASKS_PER_OBJECTIVE)
            ]
            for index, row in enumerate(rows):
                row["extra_info"]["index"] = index
            write_parquet(rows, path)
        return path

    # -- cells
    def phase(self, phase: str) -> str:
        return phase_label(phase, self.rl_objectives)

    def done(self, agent: str, phase: str, seed: int | None) -> bool:
        mine = (agent, self.phase(phase), seed)
        return any((r["agent"], record_phase(r), r["seed"]) == mine for r in self.records)

    def warm_model(self, agent: str) -> Path:
        return self.build / "warm" / agent / "model" if self.starts is None else self.starts / agent

    def rl_command(self, agent: str, seed: int, out: Path) -> tuple[list[str], dict[str, str]]:
        """verl's main_ppo command and environment of RL seed `seed` from `agent`'s warm start, written to `out`
        (metrics.jsonl, checkpoints/); the retriever must be up (`prepare`)."""
        env = {**os.environ, "VERL_PLATFORM": "cpu", "MEMAGENT_RETRIEVER_URL": self.retriever.url}
        env |= {"VERL_FILE_LOGGER_PATH": str(out / "metrics.jsonl"), "OMP_NUM_THREADS": "1"}
        data = self.rl_data(agent)
        command = [sys.executable, "-m", "verl.trainer.main_ppo", f"--config-path={REPO / 'recipes' / 'cpu'}"]
        command += ["--config-name=composed_doors", f"actor_rollout_ref.model.path={self.warm_model(agent)}"]
        command += [f"data.train_files={data}", f"data.val_files={data}", f"data.seed={seed}"]
        command += [f"actor_rollout_ref.rollout.seed={seed}", f"trainer.default_local_dir={out / 'checkpoints'}"]
        command += [f"actor_rollout_ref.rollout.agent.agent_loop_config_path={AGENT_LOOPS}", *self.rl_overrides]
        return command, env

    def train(self, agent: str, seed: int) -> Path:
        """The policy RL seed `seed` trains from `agent`'s warm start (verl's main_ppo, cached)."""
        work = self.work / "rl" / f"{agent}{rl_suffix(self.rl_objectives)}_seed{seed}"

        def train_into(out: Path) -> None:
            command, env = self.rl_command(agent, seed, out)
            with self.holding_lock():
                began = time.perf_counter()
                run(command, out / "train.log", env)
            (out / "wall_s").write_text(f"{time.perf_counter() - began:.1f}\n")

        once(work, train_into)
        step = (work / "checkpoints" / "latest_checkpointed_iteration.txt").read_text().strip()
        return work / "checkpoints" / f"global_step_{step}" / "actor" / "huggingface"

    @contextlib.contextmanager
    def holding_lock(self):
        if self.lock is None:
            yield
            return
        with open(self.lock, "a") as held:
            fcntl.flock(held, fcntl.LOCK_EX)
            yield

    def score(self, agent: str, phase: str, seed: int | None, model: Path) -> None:
        """Score `model` on every evaluation set at every k (one eval process per k, so that each k
        has its own clock) and save the cell's records."""
        start = file_digest(self.warm_model(agent) / "model.safetensors")
        trained_on = list(self.rl_objectives) if phase == "after_rl" else None
        provenance = {"rl_objectives": trained_on, "cpu": self.machine, "warm_start_sha256": start}
        cell = []
        for k in self.objectives:
            out = self.work / "eval" / f"{agent}_{self.phase(phase)}_{seed}" / f"k{k}"
            data = [f"--data={name}_k{k}={self.build / 'data' / f'{name}_k{k}.parquet'}" for name in self.eval_tasks]
            command = [
                str(Path(sys.executable).parent / "verl-memagent"),
                "eval",
                "--agent",
                agent,
                "--model",
                str(model),
            ]
            command += ["--agent-loops", str(AGENT_LOOPS), "--retriever", self.retriever.url, *data, "--out", str(out)]
            lengths = ["--prompt-length", str(composed_task.PROMPT_LENGTH)]
            command += [*lengths, "--response-length", str(composed_task.RESPONSE_LENGTH)]
            began = time.perf_counter()
            run(command, out / "log", {**os.environ, "OMP_NUM_THREADS": "1"})
            wall = time.perf_counter() - began
            records = cell_records(agent, phase, seed, k, list(self.eval_tasks), out, wall)
            cell += [{**record, **provenance} for record in records]
        self.records += cell
        self.save()

    def save(self) -> None:
        self.results.parent.mkdir(parents=True, exist_ok=True)
        self.results.write_text(json.dumps(self.records, indent=1) + "\n")

    def sweep(self, seeds: int, agents: tuple[str, ...] = AGENTS) -> None:
        for agent in agents:
            if not self.done(agent, "before_rl", None):
                self.score(agent, "before_rl", None, self.warm_model(agent))
        for seed in range(seeds):
            for agent in agents:
                if not self.done(agent, "after_rl", seed):
                    self.score(agent, "after_rl", seed, self.train(agent, seed))
                print(report_line(self.records, agent, self.phase("after_rl"), seed), flush=True)


def rl_suffix(rl_objectives: tuple[int, ...]) -> str:
    """'' for MEM1's RL set (k = 2), whose names predate the option; `_k1-2-4-8` for another."""
    return "" if tuple(rl_objectives) == RL_OBJECTIVES else "_k" + "-".join(str(k) for k in rl_objectives)


def phase_label(phase: str, rl_objectives: Sequence[int] | None) -> str:
    """A cell's phase, its RL set named where it is not MEM1's: `after_rl`, `after_rl_k1-2-4-8`."""
    return phase + rl_suffix(tuple(rl_objectives)) if phase == "after_rl" else phase


def record_phase(record: dict) -> str:
    return phase_label(record["phase"], record.get("rl_objectives"))  # null before RL


def file_digest(path: Path) -> str:
    """The first 16 hex digits of the file's sha256: which warm start a record's policy grew from (a warm
    start built on another CPU is another model, so a sweep resumed elsewhere must not mix them)."""
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def cell_records(
    agent: str, phase: str, seed: int | None, k: int, door_sets: list[str], out: Path, wall_s: float
) -> list[dict]:
    """One record per evaluation set of an eval run at k objectives (its summary and examples)."""
    summary = json.loads((out / "summary.json").read_text())
    examples = [json.loads(line) for line in (out / "examples.jsonl").read_text().splitlines()]
    tasks = sum(summary["datasets"].values())
    records = []
    for name in door_sets:
        scores = summary["agents"][agent]["datasets"][f"{name}_k{k}"]
        mine = [e for e in examples if e["dataset"] == f"{name}_k{k}"]
        contexts = [c for e in mine for c in e["contexts"]]
        records.append(
            {
                "agent": agent,
                "objectives": k,
                "seed": seed,
                "phase": phase,
                "door_set": name,
                "questions": scores["n"],
                "em": scores["em_fraction"],
                "em_all": scores["em"],
                "peak_context_tokens": scores["mean_peak_context_tokens"],
                "max_peak_context_tokens": scores["peak_context_tokens"],
                "prefill_tokens_per_question": sum(c["prefill_tokens"] for c in contexts) / len(mine),
                "decoded_tokens_per_question": sum(c["generated_tokens"] for c in contexts) / len(mine),
                "seconds_per_question": wall_s / tasks,
                "turns": scores["mean_turns"],
                "answered": scores["answered"],
                "finish_reasons": scores["finish_reasons"],
            }
        )
    return records


# -- the report: a table of means and spreads over seeds, and the papers' plot
def check_one_warm_start(records: list[dict]) -> None:
    """Refuse an agent's records grown from two warm starts: two builds' policies are different models,
    and a mean over both is of neither."""
    starts = defaultdict(set)
    for r in records:
        starts[r["agent"]].add(r["warm_start_sha256"])
    if mixed := {agent: sorted(shas) for agent, shas in starts.items() if len(shas) > 1}:
        raise ValueError(f"records from more than one warm start {mixed}: keep one build's records in the JSON")


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


def report_line(records: list[dict], agent: str, phase: str, seed: int) -> str:
    mine = [
        r
        for r in records
        if (r["agent"], record_phase(r), r["seed"], r["door_set"]) == (agent, phase, seed, "held_out")
    ]
    ems = " ".join(f"k{r['objectives']} {r['em']:.2f}" for r in sorted(mine, key=lambda r: r["objectives"]))
    return f"{agent} seed {seed} {phase}, held-out EM per objective: {ems}"


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


def plot(records: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    groups = grouped(records, "held_out")
    for agent in AGENTS:
        for phase in phases(records):
            style = {"before_rl": ":", "after_rl": "-"}.get(phase, "--")
            ks = [k for k in OBJECTIVES if groups.get((agent, phase, k))]
            if not ks:
                continue
            label = f"{agent} ({phase.replace('_', ' ')})"
            ems = [statistics.mean(r["em"] for r in groups[(agent, phase, k)]) for k in ks]
            peaks = [statistics.mean(r["peak_context_tokens"] for r in groups[(agent, phase, k)]) for k in ks]
            prefill = [statistics.mean(r["prefill_tokens_per_question"] for r in groups[(agent, phase, k)]) for k in ks]
            axes[0].plot(ks, ems, style, marker="o", label=label)
            axes[1].plot(ks, peaks, style, marker="o", label=label)
            axes[2].plot(ks, prefill, style, marker="o", label=label)
    titles = (
        "EM per objective (held-out doors)",
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


def report(records: list[dict], plot_path: Path = PLOT) -> dict:
    """Print each door set's table, draw the plot to `plot_path`, print and return the k = 8 summary."""
    check_one_warm_start(records)
    for door_set in EVAL_TASKS:
        print(f"\n{door_set} doors: EM per objective (mean ± sd over RL seeds) and mean peak context tokens\n")
        print(table(records, door_set))
    plot(records, plot_path)
    print(f"\nplot: {plot_path}")
    groups = grouped(records, "held_out")
    k = max(OBJECTIVES)
    summary = {"cpu": records[0]["cpu"] if records else None}
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


def shipped_seed(agents: tuple[str, ...]) -> int:
    """The build seed of the shipped warm starts: their doors are the task's of that seed."""
    seeds = {read_record(composed_warm_start.SHIPPED_STARTS / agent)["inputs"]["seed"] for agent in agents}
    if len(seeds) != 1:
        raise SystemExit(f"the shipped warm starts were built from different seeds {sorted(seeds)}")
    return seeds.pop()


def agent_list(text: str) -> tuple[str, ...]:
    agents = tuple(text.split(","))
    if unknown := [agent for agent in agents if agent not in AGENTS]:
        raise argparse.ArgumentTypeError(f"unknown agent(s) {unknown}: choose from {','.join(AGENTS)}")
    return agents


def int_list(text: str) -> tuple[int, ...]:
    return tuple(int(n) for n in text.split(","))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=3, help="RL seeds 0..N-1 for every agent")
    parser.add_argument("--work", type=Path, help="where the build, RL runs and scorings are cached")
    parser.add_argument("--results", type=Path, default=RESULTS, help="the records' JSON (read to resume)")
    parser.add_argument(
        "--start",
        choices=("shipped", "build"),
        default="shipped",
        help="shipped: RL starts from memagent_examples/composed_doors/starts (the committed records' warm starts); "
        "build: build the tiny model, copy pretraining and warm starts under --work (~7 core-hours)",
    )
    parser.add_argument("--build-seed", type=int, help="--start build: the tiny model, the doors and the warm starts")
    parser.add_argument(
        "--copy-steps",
        type=int_list,
        help="--start build: copy pretraining steps on adjacent, then distant repeats (default 800,1500)",
    )
    parser.add_argument(
        "--warm-steps",
        type=int,
        help=f"--start build: supervised steps of every agent's warm start (default {composed_warm_start.WARM_STEPS}, "
        "the last third decaying the lr)",
    )
    parser.add_argument(
        "--agents",
        type=agent_list,
        default=AGENTS,
        help="a comma list of the agents to build and score (the others' cells wait for a later run)",
    )
    parser.add_argument(
        "--rl-objectives",
        type=int_list,
        default=RL_OBJECTIVES,
        help="objectives per RL question, a comma list (default 2, as MEM1 trains; e.g. 1,2,4,8 mixes every k, "
        "the experiment against RL at k = 2 unlearning larger k): its cells are phases of their own",
    )
    parser.add_argument("--lock", type=Path, help="a file to hold an exclusive flock on during each verl run")
    parser.add_argument("--report", action="store_true", help="only print the table and draw the plot")
    args = parser.parse_args(argv)
    if not args.report:
        if args.work is None:
            parser.error("--work is required to run the sweep")
        built = {"build_seed": args.build_seed, "copy_steps": args.copy_steps, "warm_steps": args.warm_steps}
        given = {name: value for name, value in built.items() if value is not None}  # the rest: Sweep's defaults
        starts = composed_warm_start.SHIPPED_STARTS if args.start == "shipped" else None
        if starts and given:
            options = ", ".join("--" + name.replace("_", "-") for name in given)
            parser.error(f"{options}: settings of a build; add --start build, or leave them out")
        if starts:
            given = {"build_seed": shipped_seed(args.agents)}
        sweep = Sweep(args.work, args.results, lock=args.lock, rl_objectives=args.rl_objectives, starts=starts, **given)
        try:
            sweep.prepare(args.agents)
            sweep.sweep(args.seeds, args.agents)
        finally:
            if sweep.retriever is not None:
                sweep.retriever.stop()
    report(json.loads(args.results.read_text()), args.results.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
