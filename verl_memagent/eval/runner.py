"""`verl-memagent eval`: run agents over datasets of tasks with the training turn logic, score and report.

Each task (a verl dataset row, see `eval.tasks`) gets its own agent loop, built by
`instantiate_agent_loop` exactly as verl's AgentLoopWorker builds one per sample, and its real `run()`
with the row's kwargs; the loop talks to a `generate()` backend (the in-process `HFGenerator`, or
`CompletionsClient` for a vLLM/SGLang server) and to the retriever. Tasks of all agents and datasets
run concurrently, at most `concurrency` at a time.

Writes to the output directory: `examples.jsonl` (one line per agent and task, in completion
order), `summary.json` (scores per agent and dataset, context tokens per turn), `context_tokens.png`
and `trajectories/eval.jsonl` (every trajectory as a record, the schema training writes: docs/trajectories.md).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verl_memagent.agent import AGENT_LOOPS_YAML, instantiate_agent_loop
from verl_memagent.eval.judge import Judge, JudgeSettings
from verl_memagent.eval.plot import plot_context_tokens
from verl_memagent.eval.records import example_record, trajectory_record
from verl_memagent.eval.report import summarise
from verl_memagent.eval.tasks import worker_kwargs
from verl_memagent.progress import progress
from verl_memagent.search.endpoint import RetrieverUnavailable, retriever_health
from verl_memagent.trajectories.files import TRAJECTORIES_DIR, records_path, write_records

EXAMPLES_FILE, SUMMARY_FILE, PLOT_FILE = "examples.jsonl", "summary.json", "context_tokens.png"


async def check_retriever(urls: list[str]) -> None:
    """Fail before any question runs unless a retriever replica answers `/health` (`search.endpoint`'s rule).

    The agents turn a failed search into an observation (as in training), so a dead retriever would
    otherwise only show up as low scores and `retriever_errors` in the summary.
    """
    for url in urls:
        try:
            await asyncio.to_thread(retriever_health, url, 10.0)
            return
        except RetrieverUnavailable:
            continue
    raise RuntimeError(
        f"no retriever answers /health at {urls}: start one (python -m retriever_server serve --index DIR) "
        "and pass its URL with --retriever (or set MEMAGENT_RETRIEVER_URL)"
    )


@dataclass(frozen=True)
class EvalPlan:
    """Which agents an evaluation runs and how: their `settings` (per agent), the `sampling_params` verl's
    worker sends (temperature, top_p, top_k, repetition_penalty, logprobs), verl's `trainer_config` their
    loops are built with, from the agent-loop YAML `agent_loops`, with the model's `hf_model_type`; tasks
    run `concurrency` at a time. `run_info` (model, server, ...) is copied into the summary as `run`. With
    `judge`, an LLM judges every answer once all tasks ran (`eval.judge`): its verdicts go into the
    examples and the trajectory records, its accuracy into the summary."""

    agents: list[str]
    settings: dict[str, dict[str, Any]]
    sampling_params: dict[str, Any]
    trainer_config: Any
    concurrency: int = 32
    hf_model_type: str | None = None
    agent_loops: str | Path = AGENT_LOOPS_YAML
    run_info: dict[str, Any] | None = None
    judge: JudgeSettings | None = None

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError(f"concurrency: expected a positive integer, got {self.concurrency}")


async def evaluate(
    generator, tokenizer, datasets: dict[str, list[dict[str, Any]]], out_dir: str | Path, plan: EvalPlan
) -> dict[str, Any]:
    """Run every agent of `plan` on every task (`datasets`: name -> verl rows) through `generator`, write the
    three outputs to `out_dir`, return the summary."""
    agents, settings, sampling_params = plan.agents, plan.settings, plan.sampling_params

    def build(agent: str):  # a fresh loop per question, as verl's worker makes one per sample
        return instantiate_agent_loop(
            agent,
            plan.trainer_config,
            generator,
            tokenizer,
            plan.hf_model_type,
            path=plan.agent_loops,
            **settings[agent],
        )

    for agent in agents:  # bad settings or a dead retriever fail here, before any question runs
        await check_retriever(build(agent).retriever.urls)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    slots = asyncio.Semaphore(plan.concurrency)

    async def run_one(agent: str, dataset: str, session: int, row: dict[str, Any]):
        async with slots:
            kwargs = {**worker_kwargs(row, agent), "session_id": session}
            outputs = await build(agent).run(dict(sampling_params), **kwargs)
            example = example_record(agent, dataset, kwargs, outputs, tokenizer)
            return example, trajectory_record(example, outputs, tokenizer)

    # the dataset's position stands for verl's session (which of a row's rollouts this is), so that the
    # agents' `sampling_seed` draws otherwise for a question repeated under another dataset name
    jobs = [
        run_one(agent, dataset, session, row)
        for agent in agents
        for session, (dataset, rows) in enumerate(datasets.items())
        for row in rows
    ]
    start = time.perf_counter()
    records, trajectories = [], []
    with (out_dir / EXAMPLES_FILE).open("w", encoding="utf-8") as lines, progress(len(jobs), "eval", "tasks") as bar:
        for job in asyncio.as_completed(jobs):
            record, trajectory = await job
            lines.write(json.dumps(record) + "\n")
            lines.flush()
            records.append(record)
            trajectories.append(trajectory)
            bar.update()
    if plan.judge is not None:
        trajectories = await judged(records, trajectories, plan.judge, out_dir / EXAMPLES_FILE)
    write_records(records_path(out_dir / TRAJECTORIES_DIR, "eval"), trajectories)
    summary = {
        "run": plan.run_info or {},
        "agents": summarise(records),
        "datasets": {name: len(rows) for name, rows in datasets.items()},
        "sampling_params": sampling_params,
        "settings": settings,
        "elapsed_s": time.perf_counter() - start,
    }
    drawn = plot_context_tokens(summary["agents"], out_dir / PLOT_FILE)
    summary["plot"] = {"file": PLOT_FILE, "lines": drawn}
    (out_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return summary


async def judged(records: list[dict[str, Any]], trajectories: list, settings: JudgeSettings, examples: Path) -> list:
    """Ask the judge about every record, rewrite `examples` with the verdicts, and return the trajectory
    records with each verdict in its `reward_info` (records and trajectories in the same order)."""
    judge = Judge(settings)
    try:
        questions = sum(record["scores"]["num_objectives"] == 1 for record in records)
        with progress(questions, "judge", "answers") as bar:
            await judge.judge_examples(records, done=bar.update)
    finally:
        await judge.aclose()
    partial = examples.with_name(f".{examples.name}.partial")
    partial.write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")
    partial.replace(examples)
    return [
        trajectory.model_copy(update={"reward_info": {**trajectory.reward_info, "llm_judge": record["llm_judge"]}})
        if "llm_judge" in record
        else trajectory
        for record, trajectory in zip(records, trajectories, strict=True)
    ]
