"""The sweep's machinery: its build, its cells, the RL runs and the scorings that fill them.

A cell is one agent's policy (its warm start before RL, or after RL seed s) scored on both evaluation door
sets at one k. Every piece is cached under the work folder (the build once; each RL run and each scoring
once), and each cell's records are saved as soon as it is scored, so an interrupted sweep resumes where it
stopped, on this machine or from the committed records on another (a cell whose records are there is not
run again). RL is verl's real trainer, started as every CPU run starts it: `recipes/cpu/composed_doors.sh`
(`train_on_cpu`, through `recipes/common/launch.sh`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml
from omegaconf import OmegaConf

from memagent_examples.build_records import cpu, read_record
from memagent_examples.composed_doors.task import (
    PROMPT_LENGTH,
    RESPONSE_LENGTH,
    fresh_rl_rows,
    read_door_sets,
    records,
)
from memagent_examples.composed_doors.warm_start import SHIPPED_STARTS, WARM_STEPS
from memagent_examples.papers_claim.curves import save_curve
from memagent_examples.papers_claim.records import (
    AGENTS,
    EVAL_TASKS,
    OBJECTIVES,
    RL_OBJECTIVES,
    TEST_TASKS,
    cell_records,
    file_digest,
    phase_label,
    record_phase,
    report_line,
    rl_suffix,
)
from memagent_examples.retriever_process import ServerProcess, build_command, serve_command

REPO = Path(__file__).resolve().parents[2]
#: RL questions composed at each of the RL objectives: one pass over the 96 RL doors at k = 2
RL_TASKS_PER_OBJECTIVE = 48
#: the papers' regime: the k of its RL questions, in turn, and its validation questions per dev set and k
FRESH_OBJECTIVES = (1, 2, 4, 8)
VAL_TASKS = 8
AGENT_LOOPS = REPO / "recipes" / "cpu" / "composed_doors_agent_loops.yaml"
#: the launcher of one RL run (`train_on_cpu composed_doors`)
RL_LAUNCHER = REPO / "recipes" / "cpu" / "composed_doors.sh"


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
    """The sweep's pieces and cells. `objectives`, `eval_tasks` and `rl_overrides` (hydra overrides of the
    regime's recipe) shrink it for a test; the benchmark runs the defaults. `rl_objectives` other than
    MEM1's (2,) trains on questions of each of those k: its cells are phases of their own. `regime`:
    `mem1` (recipes/cpu/composed_doors.yaml) or `fresh`, the papers' regime (composed_doors_fresh.yaml:
    fresh rl_pool doors at k = 1, 2, 4, 8, validated on the dev split), whose `settings` name a variant of
    its `rl_overrides` and `rl_agent_settings` (a phase of its own, both in its records). `test` also scores the test
    split. `starts`: a folder of warm starts, one per agent (the shipped `SHIPPED_STARTS`), which the build
    then does not make. `curves`: where each RL run's curves are kept (`curves.save_curve`)."""

    def __init__(
        self,
        work: Path,
        results: Path,
        build_seed: int = 0,
        copy_steps: tuple[int, int] = (800, 1500),
        warm_steps: int = WARM_STEPS,
        lock: Path | None = None,
        objectives: tuple[int, ...] = OBJECTIVES,
        eval_tasks: dict[str, int] = EVAL_TASKS,
        rl_overrides: tuple[str, ...] = (),
        rl_agent_settings: tuple[str, ...] = (),
        rl_objectives: tuple[int, ...] = RL_OBJECTIVES,
        starts: Path | None = None,
        regime: str = "mem1",
        settings: str = "",
        test: bool = False,
        curves: Path | None = None,
    ):
        self.work, self.results, self.lock = work, results, lock
        self.build_seed, self.copy_steps, self.warm_steps = build_seed, copy_steps, warm_steps
        self.objectives, self.rl_overrides, self.rl_agent_settings = objectives, rl_overrides, rl_agent_settings
        self.eval_tasks = {**eval_tasks, **(TEST_TASKS if test else {})}
        self.rl_objectives, self.starts = (FRESH_OBJECTIVES if regime == "fresh" else rl_objectives), starts
        self.regime, self.settings, self.curves = regime, settings, curves
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

        sets = read_door_sets(self.build / "task")
        for name, tasks in {**EVAL_TASKS, **TEST_TASKS, **self.eval_tasks}.items():
            pool = records(sets.of(name), name)
            for k in self.objectives:
                rows = task_rows(pool, "memsearcher", "test", objectives=k, num_tasks=tasks, seed=0)
                write_parquet(rows, out / f"{name}_k{k}.parquet")

    def val_data(self, agent: str) -> Path:
        """The papers' regime's validation questions: `VAL_TASKS` on each dev set at each k, their
        `data_source` `<set>_k<k>` (verl's validation metrics per source), written once per agent."""
        from verl_memagent.data.compose import task_rows
        from verl_memagent.data.prepare import write_parquet

        path = self.build / "data" / f"val_{agent}.parquet"
        if not path.is_file():
            sets = read_door_sets(self.build / "task")
            rows = []
            for name in EVAL_TASKS:
                for k in self.objectives:
                    pool = records(sets.of(name), name)
                    for row in task_rows(pool, agent, "test", objectives=k, num_tasks=VAL_TASKS, seed=1):
                        rows.append({**row, "data_source": f"{name}_k{k}"})
            for index, row in enumerate(rows):
                row["extra_info"]["index"] = index
            write_parquet(rows, path)
        return path

    def rl_data(self, agent: str, seed: int) -> Path:
        """`agent`'s RL questions, written once. MEM1's regime: `RL_TASKS_PER_OBJECTIVE` on the RL doors at
        each RL k. The papers' regime: as many questions as the rl_pool's doors make, k cycling through
        `FRESH_OBJECTIVES`, dealt by the RL seed (`fresh_rl_rows`): the run asks no door twice."""
        from verl_memagent.data.compose import task_rows
        from verl_memagent.data.prepare import write_parquet

        if self.regime == "fresh":
            path = self.build / "data" / f"rl_fresh_{agent}_seed{seed}.parquet"
            if not path.is_file():
                pool = read_door_sets(self.build / "task").rl_pool
                tasks = len(pool) * len(self.rl_objectives) // sum(self.rl_objectives)
                write_parquet(fresh_rl_rows(pool, agent, self.rl_objectives, tasks, seed), path)
            return path
        path = self.build / "data" / f"rl_{agent}{rl_suffix(self.rl_objectives)}.parquet"
        if not path.is_file():
            pool = records(read_door_sets(self.build / "task").rl, "rl")
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
        return phase_label(phase, self.rl_objectives, self.regime, self.settings)

    def missing(self, agent: str, phase: str, seed: int | None) -> list[str]:
        """The evaluation door sets the cell has no records of yet."""
        mine = (agent, self.phase(phase), seed)
        have = {r["door_set"] for r in self.records if (r["agent"], record_phase(r), r["seed"]) == mine}
        return [name for name in self.eval_tasks if name not in have]

    def warm_model(self, agent: str) -> Path:
        return self.build / "warm" / agent / "model" if self.starts is None else self.starts / agent

    def rl_launch(self, agent: str, seed: int, out: Path, overrides: tuple[str, ...] = ()) -> tuple[list[str], dict]:
        """The command and environment of RL seed `seed` from `agent`'s warm start, written to `out`
        (metrics.jsonl, checkpoints/): `recipes/cpu/composed_doors.sh` with this sweep's `rl_overrides`, then
        `overrides`. The retriever must be up (`prepare`)."""
        env = {**os.environ, "WORK": str(out), "SEED": str(seed), "MEMAGENT_RETRIEVER_URL": self.retriever.url}
        env["AGENT_LOOPS_YAML"] = str(self.rl_agent_loops(out))
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])  # this Python
        if self.regime == "fresh":
            env |= {"RECIPE": "composed_doors_fresh", "VAL_DATA": str(self.val_data(agent))}
        command = ["bash", str(RL_LAUNCHER), str(self.warm_model(agent)), str(self.rl_data(agent, seed))]
        return [*command, *self.rl_overrides, *overrides], env

    def rl_agent_loops(self, out: Path) -> Path:
        """The agent loops RL trains: `AGENT_LOOPS`, or with `rl_agent_settings` (`agent.setting=value`, e.g.
        `memsearcher.action_rules=released`) a copy written to `out` with those settings changed. Evaluation
        always runs `AGENT_LOOPS`, so every phase is scored under the same rules."""
        if not self.rl_agent_settings:
            return AGENT_LOOPS
        entries = {entry.name: entry for entry in OmegaConf.load(AGENT_LOOPS)}
        for setting in self.rl_agent_settings:
            path, _, value = setting.partition("=")
            agent, _, key = path.partition(".")
            if agent not in entries or not key or not value:
                raise ValueError(f"rl_agent_settings: {setting!r} is not `agent.setting=value` of {sorted(entries)}")
            OmegaConf.update(entries[agent], key, yaml.safe_load(value), merge=False)
        out.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(OmegaConf.create(list(entries.values())), out / "agent_loops.yaml")
        return out / "agent_loops.yaml"

    def train(self, agent: str, seed: int) -> Path:
        """The policy RL seed `seed` trains from `agent`'s warm start (verl's main_ppo, cached); its curves
        are kept beside the records (`curves`)."""
        label = self.phase("after_rl").removeprefix("after_rl")
        work = self.work / "rl" / f"{agent}{label}_seed{seed}"

        def train_into(out: Path) -> None:
            command, env = self.rl_launch(agent, seed, out)
            with self.holding_lock():
                began = time.perf_counter()
                run(command, out / "train.log", env)
            (out / "wall_s").write_text(f"{time.perf_counter() - began:.1f}\n")

        once(work, train_into)
        if self.curves is not None:
            save_curve(work / "metrics.jsonl", self.curves / f"{agent}{label}_seed{seed}.jsonl")
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
        """Score `model` on every evaluation set the cell lacks, at every k (one eval process per k, so that
        each k has its own clock), and save the cell's records."""
        door_sets = self.missing(agent, phase, seed)
        start = file_digest(self.warm_model(agent) / "model.safetensors")
        trained_on = list(self.rl_objectives) if phase == "after_rl" else None
        provenance = {"rl_objectives": trained_on, "cpu": self.machine, "warm_start_sha256": start}
        if phase == "after_rl" and self.regime != "mem1":
            settings = [*self.rl_overrides, *(f"agent_loops.{setting}" for setting in self.rl_agent_settings)]
            provenance |= {"regime": self.regime, "settings_name": self.settings, "settings": settings}
        cell = []
        for k in self.objectives:
            out = self.work / "eval" / f"{agent}_{self.phase(phase)}_{seed}" / f"k{k}_{'-'.join(door_sets)}"
            data = [f"--data={name}_k{k}={self.build / 'data' / f'{name}_k{k}.parquet'}" for name in door_sets]
            command = [
                str(Path(sys.executable).parent / "verl-memagent"),
                "eval",
                "--agent",
                agent,
                "--model",
                str(model),
            ]
            command += ["--agent-loops", str(AGENT_LOOPS), "--retriever", self.retriever.url, *data, "--out", str(out)]
            lengths = ["--prompt-length", str(PROMPT_LENGTH)]
            command += [*lengths, "--response-length", str(RESPONSE_LENGTH)]
            began = time.perf_counter()
            run(command, out / "log", {**os.environ, "OMP_NUM_THREADS": "1"})
            wall = time.perf_counter() - began
            records = cell_records(agent, phase, seed, k, door_sets, out, wall)
            cell += [{**record, **provenance} for record in records]
        self.records += cell
        self.save()

    def save(self) -> None:
        self.results.parent.mkdir(parents=True, exist_ok=True)
        self.results.write_text(json.dumps(self.records, indent=1) + "\n")

    def sweep(self, seeds: int, agents: tuple[str, ...] = AGENTS) -> None:
        for agent in agents:
            if self.missing(agent, "before_rl", None):
                self.score(agent, "before_rl", None, self.warm_model(agent))
        for seed in range(seeds):
            for agent in agents:
                if self.missing(agent, "after_rl", seed):
                    self.score(agent, "after_rl", seed, self.train(agent, seed))
                print(report_line(self.records, agent, self.phase("after_rl"), seed), flush=True)


def shipped_seed(agents: tuple[str, ...]) -> int:
    """The build seed of the shipped warm starts: their doors are the task's of that seed."""
    seeds = {read_record(SHIPPED_STARTS / agent)["inputs"]["seed"] for agent in agents}
    if len(seeds) != 1:
        raise SystemExit(f"the shipped warm starts were built from different seeds {sorted(seeds)}")
    return seeds.pop()
