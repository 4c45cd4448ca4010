"""What trajectory records cost a training step, at the papers' batch size (docs/trajectories.md).

MemSearcher's released setting: 256 questions x 5 trajectories x 5 turns = 6,400 training samples a
step. The samples are real: `--distinct` 5-turn memsearcher trajectories played by the real agent
loop (released format, scripts of `benchmarks/context_tokens.py`, the real BM25 retriever, ten
passages a search), each reused across the batch under new verl keys and trajectory ids, then put
into a real TransferQueue by verl's own agent-loop worker code, as a rollout puts them. Our trainer's
`_compute_advantage` (verl's, with multi_context_grpo) writes the advantages. Then, per step:

- records: `TrajectoryRecorder.training_step`, what `TrajectoryRecordsMixin` runs after each step
  (pick whole groups, fetch the sampled rows, decode, build, write `step_<N>.jsonl`), at the default
  sample (16 trajectories) and at 64;
- baselines from the same run: `AgentMetricsMixin`'s per-step work (fetch every sample's
  `extra_fields`, aggregate the agent metrics) and the advantage step (`_compute_advantage`);
- what the agent loops' `turn_log` and `question` add to each sample on its way to TransferQueue:
  pickled bytes of `extra_fields` with and without them, and the time to pickle all of a step's;
- the page: `verl-memagent show` over a step of `--page-records` records, and, where Chromium is
  installed, the time from opening the file to the first page of cards.

Wall-clock times, median over `--repeats` steps. Run under the shared lock on the 2-core machine.

    python benchmarks/trajectory_records.py [--questions 256] [--rollouts 5] [--turns 5] [--distinct 8] [--repeats 5]
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import pickle
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import ray
import transfer_queue as tq
from shared import REPO, build_loop, check_trajectory, load_questions, script, start_retriever
from transfer_queue import KVBatchMeta
from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ

from memagent_examples.model_format import ModelFormat
from memagent_examples.scripted import ScriptedPolicy
from verl_memagent.agent import verl_sampling_params, verl_trainer_config, verl_worker_row
from verl_memagent.algo.agent_metrics import agent_metrics
from verl_memagent.algo.trainer import MultiContextTrainerSync
from verl_memagent.algo.trajectory_records import TrajectoryRecorder, TrajectoryRecordsConfig
from verl_memagent.output_fields import OutputField
from verl_memagent.trajectories.files import read_records, records_path, write_records

ADDED_FIELDS = ("turn_log", "question")


async def play(questions, passages, turns: int, tokenizer, url: str) -> list[tuple[dict, list]]:
    """(question, outputs) of one `turns`-turn memsearcher trajectory per question, played for real."""
    config = verl_trainer_config(prompt_length=32768, response_length=32768)
    settings = {"retriever_urls": url, "max_turns": turns}
    model = ModelFormat.of(build_loop("memsearcher", config, None, tokenizer, "qwen2", settings))
    played = []
    for question in questions:
        policy = ScriptedPolicy(tokenizer, script(model, question, passages, turns))
        loop = build_loop("memsearcher", config, policy, tokenizer, "qwen2", settings)
        outputs = await loop.run(verl_sampling_params(), **verl_worker_row(question["question"]))
        check_trajectory("memsearcher", outputs, policy, turns)
        played.append((question, outputs))
    return played


async def fill_batch(played, questions: int, rollouts: int) -> list[dict]:
    """Put questions x rollouts trajectories (the played ones, cycled) into TransferQueue as verl's
    agent-loop worker does; returns every sample's extra_fields."""
    worker = object.__new__(AgentLoopWorkerTQ.__ray_actor_class__)
    worker.processor = None
    worker.reward_loop_worker_handles = None  # the score is set here, as the reward manager would
    worker.distillation_enabled = False
    fields = []
    for q in range(questions):
        for session in range(rollouts):
            question, outputs = played[(q * rollouts + session) % len(played)]
            outputs = copy.deepcopy(outputs)
            trajectory_id = uuid.uuid4().hex
            for output in outputs:
                output.extra_fields[OutputField.TRAJECTORY_ID] = trajectory_id
            outputs[-1].reward_score = float((q + session) % 3) / 2
            outputs[-1].extra_fields["reward_extra_info"] = {"f1": outputs[-1].reward_score}
            row = {
                "data_source": "multihop",
                "reward_model": {"ground_truth": question["golden_answers"]},
                "extra_info": {"index": q, "id": question["id"]},
                "index": q,
            }
            await worker._agent_loop_postprocess(
                outputs, validate=False, uid=f"q{q}", session_id=session, global_steps=1, **row
            )
            fields += [output.extra_fields for output in outputs]
    return fields


def timed(function, repeats: int) -> tuple[float, object]:
    times, result = [], None
    for step in range(repeats):
        start = time.perf_counter()
        result = function(step + 1)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000, result


def agent_fields_cost(fields: list[dict]) -> dict:
    """Pickled size and time of a step's extra_fields, with and without what the records need."""
    without = [{k: v for k, v in f.items() if k not in ADDED_FIELDS} for f in fields]

    def cost(batch):
        start = time.perf_counter()
        size = sum(len(pickle.dumps(f)) for f in batch)
        return size, (time.perf_counter() - start) * 1000

    (size_with, ms_with), (size_without, ms_without) = cost(fields), cost(without)
    return {
        "bytes_per_sample_with": size_with / len(fields),
        "bytes_per_sample_without": size_without / len(fields),
        "pickle_ms_per_step_with": ms_with,
        "pickle_ms_per_step_without": ms_without,
    }


def page_cost(records, count: int, workdir: Path) -> dict:
    """`verl-memagent show` over one step of `count` records, and the time Chromium takes to show it."""
    many = [records[i % len(records)].model_copy(update={"trajectory_id": f"t{i}"}) for i in range(count)]
    write_records(records_path(workdir / "page" / "trajectories", "train", 1), many)
    out = workdir / "page" / "report.html"
    start = time.perf_counter()
    show = [sys.executable, "-m", "verl_memagent.cli", "show", str(workdir / "page"), "--out", str(out)]
    subprocess.run(show, check=True, capture_output=True)
    result = {"records": count, "show_s": time.perf_counter() - start, "page_mb": out.stat().st_size / 2**20}
    if not (shutil.which("chromium") and shutil.which("chromedriver")):
        return {**result, "chromium": "not installed"}
    from selenium import webdriver
    from selenium.webdriver.common.by import By

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(argument)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(shutil.which("chromedriver")))
    try:
        start = time.perf_counter()
        driver.get(f"file://{out}")  # returns once the page's scripts ran: the first page is drawn
        cards = len(driver.find_elements(By.CSS_SELECTOR, ".trajectory"))
        result |= {"open_to_cards_s": time.perf_counter() - start, "cards_in_dom": cards}
        start = time.perf_counter()
        driver.find_element(By.ID, "page-next").click()
        driver.find_element(By.ID, "page-label")
        result["next_page_s"] = time.perf_counter() - start
    finally:
        driver.quit()
    return result


def step_costs(played, args: argparse.Namespace, tokenizer, workdir: Path) -> tuple[int, list[dict], dict, list]:
    """A step's batch of the played trajectories in TransferQueue (a local Ray), then what each piece costs on
    it: the advantage step, the agent metrics and the records at 16 and 64 trajectories a step. Returns the
    batch's samples, their extra_fields, the costs and the records written last."""
    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False)
    tq.init()
    try:
        fields = asyncio.run(fill_batch(played, args.questions, args.rollouts))
        tags = tq.kv_list("train")["train"]
        batch = KVBatchMeta(keys=list(tags), tags=list(tags.values()), partition_id="train")
        trainer = object.__new__(MultiContextTrainerSync)
        trainer.config = verl_trainer_config(n=args.rollouts)  # verl's full config, with multi_context_grpo
        trainer.config.algorithm.adv_estimator = "multi_context_grpo"
        trainer.config.algorithm.rollout_correction = None  # no actor computed old log-probs here
        advantage_ms, _ = timed(lambda step: trainer._compute_advantage(batch, {}), args.repeats)

        def metrics_step(step):
            data = tq.kv_batch_get(keys=batch.keys, partition_id="train", select_fields=["extra_fields"])
            return agent_metrics(list(data["extra_fields"]))

        metrics_ms, _ = timed(metrics_step, args.repeats)
        records = {}
        for per_step in (16, 64):
            recorder = TrajectoryRecorder(
                TrajectoryRecordsConfig(per_step=per_step), workdir / str(per_step), tokenizer, []
            )
            ms, written = timed(lambda step, r=recorder: r.training_step(batch, step), args.repeats)
            file = records_path(workdir / str(per_step), "train", args.repeats)
            assert read_records(file) == written and len(written) == per_step
            records[per_step] = {"ms_per_step": ms, "file_kb": file.stat().st_size / 1024}
    finally:
        tq.close()
        ray.shutdown()

    return (
        len(batch.keys),
        fields,
        {"advantage_ms": advantage_ms, "metrics_ms": metrics_ms, "records": records},
        written,
    )


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--questions", type=int, default=256)
    parser.add_argument("--rollouts", type=int, default=5)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--distinct", type=int, default=8, help="distinct trajectories played, reused over the batch")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--page-records", type=int, default=2000)
    args = parser.parse_args(argv)

    from transformers import AutoTokenizer

    from verl_memagent.tiny_model import save_tiny_model

    workdir = Path(tempfile.mkdtemp(prefix="trajectory_records_"))
    tokenizer = AutoTokenizer.from_pretrained(save_tiny_model(workdir / "model"))
    questions, passages = load_questions(REPO / "data", args.distinct)
    retriever = start_retriever(REPO / "data" / "corpus.jsonl", workdir)
    try:
        played = asyncio.run(play(questions, passages, args.turns, tokenizer, retriever.url))
    finally:
        retriever.stop()

    samples, fields, costs, written = step_costs(played, args, tokenizer, workdir)
    advantage_ms, metrics_ms, records = costs["advantage_ms"], costs["metrics_ms"], costs["records"]
    agent = agent_fields_cost(fields)
    page = page_cost(written, args.page_records, workdir)
    shutil.rmtree(workdir, ignore_errors=True)

    print(f"batch: {args.questions} questions x {args.rollouts} trajectories x {args.turns} turns = {samples} samples")
    for per_step, figures in records.items():
        print(
            f"records of {per_step:3d} trajectories: {figures['ms_per_step']:7.1f} ms per step, "
            f"file {figures['file_kb']:.0f} KB"
        )
    print(f"baseline agent metrics (AgentMetricsMixin): {metrics_ms:7.1f} ms per step")
    print(f"baseline advantage step (_compute_advantage): {advantage_ms:7.1f} ms per step")
    print(
        f"extra_fields per sample: {agent['bytes_per_sample_with']:.0f} bytes with turn_log and question, "
        f"{agent['bytes_per_sample_without']:.0f} without; pickling a step's: "
        f"{agent['pickle_ms_per_step_with']:.1f} ms vs {agent['pickle_ms_per_step_without']:.1f} ms"
    )
    print(f"page: {page}")
    headline = {
        "samples_per_step": samples,
        "records_ms_per_step_default": round(records[16]["ms_per_step"], 1),
        "records_ms_per_step_64": round(records[64]["ms_per_step"], 1),
        "agent_metrics_ms_per_step": round(metrics_ms, 1),
        "advantage_ms_per_step": round(advantage_ms, 1),
        "records_vs_agent_metrics": round(records[16]["ms_per_step"] / metrics_ms, 2),
        "records_vs_advantage": round(records[16]["ms_per_step"] / advantage_ms, 2),
        "file_kb_default": round(records[16]["file_kb"]),
        "extra_fields_bytes_added_per_sample": round(
            agent["bytes_per_sample_with"] - agent["bytes_per_sample_without"]
        ),
        "extra_fields_pickle_ms_added_per_step": round(
            agent["pickle_ms_per_step_with"] - agent["pickle_ms_per_step_without"], 1
        ),
        "page": page,
    }
    print(json.dumps(headline))
    return headline


if __name__ == "__main__":
    main()
