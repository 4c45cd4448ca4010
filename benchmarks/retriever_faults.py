"""The retriever at the papers' scale and under faults: does a well-behaved client ever see an error?

For BM25 (the bundled 14,230 passages) and dense (all-MiniLM-L6-v2, faiss Flat over a subset of
`--dense-passages`), it starts our server at its defaults but for `--search-processes N` (one per
core) and `--cache-size 0` (every query is searched, so a kill hits searches in flight, and memory
compares like with like), then runs three phases, each with queries of its own:

  turn   a paper-size turn: Search-R1's one request of 2,560 queries (512 prompts x 5 samples) and
         2,560 single-query requests from 256 connections (an agent loop per connection), at once;
  kills  such turns back to back while a search process is killed (SIGKILL) every `--kill-every` s,
         until `--kills` kills are done and the pool is whole again: never the last live one, and a
         restarted one only once it has been live longer than the server's crash window (10 s);
  slow   a 16,384-query request, while `--slow-readers` clients ask for 1,024 queries at topk 50
         with scores (about 37 MB each) and never read, and `--slowloris` connections send their
         heads a byte every 0.5 s (opened again when the server closes them);
  slow_turn  a turn beside the same slow readers and slowloris connections.

Before them, `idle`: /health alone for 5 s, the machine's own floor for the /health figures (the
load generators share the machine's cores with the server).

Meanwhile a process of its own asks /health every 20 ms. Per phase: errors of the well-behaved
clients (a non-200, a transport error, or a result of the wrong length), p50/p99 of the single-query
requests, seconds of the large requests, /health p50/p99/max and its failures, the server's RSS (all
its processes) before and after, kills, restarts and retried queries. Every loop is bounded, and all
traffic goes to 127.0.0.1. Last line: one JSON object; `<kind>_targets_met` is issue #27's bar: no
error in any phase, /health p99 under 100 ms in `slow`, and the RSS at the end within 20% of the start.

    python benchmarks/retriever_faults.py [--work-dir DIR] [--kinds bm25,dense] [--dense-passages 3000]
        [--search-processes 2] [--kill-every 3] [--kills 3] [--slow-readers 32] [--slowloris 256]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import multiprocessing
import os
import re
import signal
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import aiohttp
import numpy as np
from faults import Killer, big_answer_request, poll_health, slow_readers, slowloris
from shared import REPO, TOPK, build, dense_subset, minilm_dir, read_jsonl

from memagent_examples.retriever_process import ServerProcess, serve_command
from verl_memagent.search.endpoint import retriever_health

RESTARTED = re.compile(r" restarted \(pid \d+\) in ([\d.]+) s")  # the server's log line of a restart
PROMPTS, SAMPLES = 512, 5  # Search-R1's train_grpo.sh: one request per turn of 512 x 5 queries
SINGLE_CONNECTIONS = 256


class Queries:
    """Queries never sent before in this run: a multi-hop question and a corpus title."""

    def __init__(self):
        self.questions = [q["question"] for q in read_jsonl(REPO / "data" / "qa_multihop.jsonl")]
        corpus = read_jsonl(REPO / "data" / "corpus.jsonl")
        self.titles = [row["contents"].split("\n", 1)[0].strip('"') for row in corpus]
        self.sent = 0

    def take(self, count: int) -> list[str]:
        first, self.sent = self.sent, self.sent + count
        n = len(self.questions)
        return [f"{self.questions[i % n]} {self.titles[(i // n) % len(self.titles)]}" for i in range(first, self.sent)]


# ---------------------------------------------------------------- well-behaved clients


async def post(session: aiohttp.ClientSession, url: str, queries: list[str], topk: int = TOPK) -> str | None:
    """One Search-R1 request; None when it is answered in full, else what went wrong."""
    try:
        payload = {"queries": queries, "topk": topk, "return_scores": True}
        async with session.post(f"{url}/retrieve", json=payload) as response:
            if response.status != 200:
                return f"{response.status} {(await response.text())[:200]}"
            if len((await response.json())["result"]) != len(queries):
                return "a result of the wrong length"
            return None
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, KeyError) as exc:
        return f"{type(exc).__name__}: {exc}"[:200]


async def one_request(url: str, queries: list[str]) -> dict:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900)) as session:
        started = time.perf_counter()
        error = await post(session, url, queries)
        seconds = round(time.perf_counter() - started, 2)
        return {"queries": len(queries), "seconds": seconds, "errors": int(error is not None), **errors_seen([error])}


async def singles(url: str, queries: list[str], connections: int = SINGLE_CONNECTIONS) -> dict:
    """Each query in a request of its own, `connections` at a time, each request on a connection of its
    own as the original clients send them (Search-R1's `requests.post`, no session): a kept-alive
    connection reused after a stall can meet the server's keep-alive close on its way (HTTP/1.1's
    race, not the server's error; our own client retries it, docs/retriever.md)."""
    latencies, errors, cursor = [], [], iter(queries)
    connector = aiohttp.TCPConnector(limit=connections, force_close=True)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=900)) as session:

        async def worker() -> None:
            for query in cursor:
                started = time.perf_counter()
                errors.append(await post(session, url, [query]))
                latencies.append(time.perf_counter() - started)

        await asyncio.gather(*(worker() for _ in range(connections)))
    ms = np.array(latencies) * 1000
    return {
        "requests": len(queries),
        "errors": sum(error is not None for error in errors),
        **errors_seen(errors),
        "p50_ms": round(float(np.percentile(ms, 50)), 1),
        "p99_ms": round(float(np.percentile(ms, 99)), 1),
    }


def errors_seen(errors: list[str | None]) -> dict:
    """The distinct errors and how often each came, if any."""
    seen = collections.Counter(error for error in errors if error is not None)
    return {"error_kinds": dict(seen.most_common(5))} if seen else {}


async def turn(url: str, queries: Queries) -> dict:
    """A paper-size turn: one request of 2,560 queries and 2,560 single-query requests, at once."""
    batch, single = await asyncio.gather(
        one_request(url, queries.take(PROMPTS * SAMPLES)), singles(url, queries.take(PROMPTS * SAMPLES))
    )
    return {"batch": batch, "singles": single}


def whole(server: ServerProcess) -> bool:
    return retriever_health(server.url, 30)["status"] == "ready"


def counters(server: ServerProcess) -> dict:
    with urllib.request.urlopen(f"{server.url}/stats", timeout=30) as response:
        stats = json.loads(response.read())
    return {key: stats[key] for key in ("search_process_restarts", "retried", "failed", "head_timeouts")}


# ---------------------------------------------------------------- the run


def run_kind(index_dir: Path, args: argparse.Namespace, report: dict, kind: str) -> None:
    flags = ("--search-processes", str(args.search_processes), "--cache-size", "0")
    server = ServerProcess(serve_command(index_dir, *flags), timeout_s=900, cwd=REPO)
    port = int(server.url.rsplit(":", 1)[1])
    context = multiprocessing.get_context("spawn")
    stop_polling, health_samples = context.Event(), context.Queue()
    poller = context.Process(target=poll_health, args=(port, stop_polling, health_samples), daemon=True)
    queries = Queries()
    phases: dict[str, dict] = {}
    try:
        poller.start()
        time.sleep(1)
        rss_start = server.rss_mb()

        def phase(name: str, work) -> None:
            before, rss_before, started = counters(server), server.rss_mb(), time.monotonic()
            result = asyncio.run(work())
            after = counters(server)
            phases[name] = {
                **result,
                "window": (started, time.monotonic()),
                "rss_mb_before": rss_before,
                "rss_mb_after": server.rss_mb(),
                **{key: after[key] - before[key] for key in after},
            }
            print(
                f"{kind} {name:6s} {json.dumps({k: v for k, v in phases[name].items() if k != 'window'})}", flush=True
            )

        phase("idle", idle)
        phase("turn", lambda: turn(server.url, queries))
        phase("kills", lambda: turns_while_killing(server, queries, args))
        large = lambda: one_request(server.url, queries.take(16_384))  # noqa: E731
        phase("slow", lambda: beside_misbehaving(port, queries, args, large, "large"))
        phase("slow_turn", lambda: beside_misbehaving(port, queries, args, lambda: turn(server.url, queries)))
        time.sleep(2)  # the stalled answers are let go
        rss_end = server.rss_mb()
    finally:
        stop_polling.set()
        samples = health_samples.get(timeout=60) if poller.is_alive() else []
        poller.join(timeout=30)
        server.stop()
    for result in phases.values():
        start, end = result.pop("window")
        result["health"] = health_figures([s for s in samples if start <= s[0] <= end])
    report[kind] = kind_report(server, phases, rss_start, rss_end)
    for name, result in phases.items():
        print(f"{kind} {name:6s} /health {json.dumps(result['health'])}", flush=True)
    counts = report[kind]
    print(
        f"{kind} rss {rss_start} -> {rss_end} MB; log: {counts['log_deaths']} deaths, "
        f"{len(counts['restart_s'])} restarts (seconds {counts['restart_s']}), {counts['log_tracebacks']} tracebacks, "
        f"{counts['log_leaked_semaphores']} leaked-semaphore warnings",
        flush=True,
    )


async def idle() -> dict:
    """/health alone for 5 s: the machine's own floor for the /health figures."""
    await asyncio.sleep(5)
    return {}


async def turns_while_killing(server: ServerProcess, queries: Queries, args: argparse.Namespace) -> dict:
    """Turns back to back while `Killer` kills search processes, until its kills are done and the pool is whole."""
    killer, rounds = Killer(server, args.kill_every, args.kills), []
    killer.start()
    deadline = time.monotonic() + args.kill_phase_max_s
    try:
        while time.monotonic() < deadline and (killer.kills < args.kills or not whole(server)):
            rounds.append(await turn(server.url, queries))
    finally:
        killer.stop.set()
        killer.join()
    return {"rounds": rounds, "kills": killer.kills}


async def beside_misbehaving(port: int, queries: Queries, args: argparse.Namespace, work, key: str = "") -> dict:
    """`work()` (under `key`, if given) while slow readers and slowloris connections hold the server."""
    stop, closed = asyncio.Event(), [0]
    misbehaving = [
        asyncio.create_task(slow_readers(port, big_answer_request(port, queries.take(1024)), args.slow_readers, stop)),
        asyncio.create_task(slowloris(port, args.slowloris, stop, closed)),
    ]
    await asyncio.sleep(2)  # the slow readers' answers fill their buffers
    try:
        result = await work()
    finally:
        stop.set()
        await asyncio.gather(*misbehaving)
    return {**({key: result} if key else result), "slowloris_closed": closed[0]}


def kind_report(server: ServerProcess, phases: dict, rss_start: float, rss_end: float) -> dict:
    """The phases, the server's memory at the start and end, and what its log tells of deaths and restarts."""
    log = server.log.read_text().splitlines()
    return {
        "phases": phases,
        "rss_mb_start": rss_start,
        "rss_mb_end": rss_end,
        "log_deaths": sum(" died " in line for line in log),
        "restart_s": [float(m.group(1)) for line in log if (m := RESTARTED.search(line))],
        "log_tracebacks": sum("Traceback" in line for line in log),
        "log_leaked_semaphores": sum("leaked semaphore" in line for line in log),
    }


def health_figures(samples: list[tuple[float, float, int]]) -> dict:
    ms = np.array([latency for _, latency, _ in samples]) * 1000
    statuses = [status for _, _, status in samples]
    return {
        "asked": len(samples),
        "failures": statuses.count(0),
        "degraded_503": statuses.count(503),
        "p50_ms": round(float(np.percentile(ms, 50)), 1),
        "p99_ms": round(float(np.percentile(ms, 99)), 1),
        "max_ms": round(float(ms.max()), 1),
    }


def turns_of(phase: dict) -> list[dict]:
    return phase.get("rounds", [phase] if "batch" in phase else [])


def well_behaved_errors(phase: dict) -> int:
    """Errors of every well-behaved client in a phase (the misbehaving ones are not counted)."""
    errors = sum(t["batch"]["errors"] + t["singles"]["errors"] for t in turns_of(phase))
    return errors + phase.get("large", {}).get("errors", 0)


def headline(report: dict) -> dict:
    out: dict = {"cpus": report["cpus"], "search_processes": report["search_processes"]}
    for kind in ("bm25", "dense"):
        if kind not in report:
            continue
        result = report[kind]
        for name, phase in result["phases"].items():
            out[f"{kind}_{name}_errors"] = well_behaved_errors(phase)
            if turns := turns_of(phase):
                out[f"{kind}_{name}_singles_p99_ms"] = max(t["singles"]["p99_ms"] for t in turns)
                out[f"{kind}_{name}_batch_2560_s"] = max(t["batch"]["seconds"] for t in turns)
            out[f"{kind}_{name}_health_p99_ms"] = phase["health"]["p99_ms"]
        out[f"{kind}_kills"] = result["phases"]["kills"]["kills"]
        out[f"{kind}_restarts"] = result["phases"]["kills"]["search_process_restarts"]
        out[f"{kind}_retried_queries"] = result["phases"]["kills"]["retried"]
        out[f"{kind}_large_16384_s"] = result["phases"]["slow"]["large"]["seconds"]
        out[f"{kind}_rss_end_over_start"] = round(result["rss_mb_end"] / result["rss_mb_start"], 3)
        out[f"{kind}_restart_s_max"] = max(result["restart_s"], default=None)
        out[f"{kind}_log_tracebacks"] = result["log_tracebacks"]
        out[f"{kind}_targets_met"] = (
            all(well_behaved_errors(phase) == 0 for phase in result["phases"].values())
            and result["phases"]["slow"]["health"]["p99_ms"] < 100
            and out[f"{kind}_rss_end_over_start"] <= 1.2
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work-dir", type=Path, default=Path(tempfile.gettempdir()) / "retriever_bench")
    parser.add_argument("--kinds", default="bm25,dense", help="indexes to measure (comma-separated)")
    parser.add_argument("--dense-passages", type=int, default=3000)
    parser.add_argument("--search-processes", type=int, default=max(2, len(os.sched_getaffinity(0))))
    parser.add_argument("--kill-every", type=float, default=3.0, help="seconds between kills (when one is allowed)")
    parser.add_argument("--kills", type=int, default=3, help="search processes killed while turns are served")
    parser.add_argument("--kill-phase-max-s", type=float, default=600.0, help="bound on the kills phase")
    parser.add_argument("--slow-readers", type=int, default=32)
    parser.add_argument("--slowloris", type=int, default=256)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the `finally`s: stop the servers

    args.work_dir.mkdir(parents=True, exist_ok=True)
    report: dict = {"cpus": len(os.sched_getaffinity(0)), "search_processes": args.search_processes}
    kinds = args.kinds.split(",")
    if "bm25" in kinds:
        index = args.work_dir / "bm25_corpus"
        build("bm25", REPO / "data" / "corpus.jsonl", index)
        run_kind(index, args, report, "bm25")
    if "dense" in kinds:
        index = args.work_dir / f"dense_flat_{args.dense_passages}"
        subset = dense_subset(args.work_dir, read_jsonl(REPO / "data" / "qa_multihop.jsonl"), args.dense_passages)
        build("dense", subset, index, "--encoder", minilm_dir(), "--index-type", "flat")
        run_kind(index, args, report, "dense")
    print(json.dumps(headline(report)))


if __name__ == "__main__":
    main()
