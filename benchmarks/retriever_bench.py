"""The retriever service under concurrent load, next to a naive per-request server, in one run.

BM25 over the bundled 14,230 passages, dense (all-MiniLM-L6-v2, faiss Flat) over a subset holding every
gold passage of the multi-hop questions (`--dense-passages` in all). Ours (`python -m retriever_server
serve`; `--cache-size 0` where queries are unique) and the naive baseline (`shared.naive`: one request at
a time, no batching, no cache: Search-R1's design made thread-safe) are driven over HTTP from this
process at concurrency 1, 8, 64 x 1 and 32 queries per request, topk 3, level by level in turn so all
see the same load. Dense runs ours four times: fp32 (`--quantize none`, as the naive server), at its
defaults (int8 where this CPU runs it faster: /health's `query_encoder`) with 1 and with N = one per
core search processes, and with idle cores lent to a lone batch (`--lone-threads`). Then a rollout-shaped
load (each question sent by 5 trajectories), each encoder's in-process ceiling (before and after the
dense levels, averaged), BM25's backends in process, and a soak of `--soak-requests` at concurrency 64.
Before the load, each server's start-up (launch to the first 200 on /health, `--startup-reps` times,
medians). What an index costs as its corpus grows is `retriever_cost.py`'s.

`--search-r1 FILE`: Search-R1's own server (`search_r1/search/retrieval_server.py`) beside the others in
the dense levels, over the same faiss file, corpus and MiniLM, as released but for what a torch without
CUDA needs (`SEARCH_R1_SITECUSTOMIZE`). `--cpu-standin avx2`: everything runs as on a CPU with AVX2 and
no AVX-512 (oneDNN, MKL, fbgemm, ATen, numba, numpy and faiss held to AVX2 by their variables, and
torch's oneDNN off, so that `torch._int_mm` takes the reference loop of CPUs without VNNI).

Every report carries the CPU it ran on (`cpu`). Last line: one JSON object of the headline figures.

    python benchmarks/retriever_bench.py [--work-dir DIR] [--questions 384] [--threads N]
        [--kinds bm25,dense] [--dense-passages 3000] [--rollout-questions 96]
        [--soak-requests 100000] [--startup-reps 3] [--cpu-standin avx2]
        [--search-r1 Search-R1/search_r1/search/retrieval_server.py]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import shared
from search_r1_server import SearchR1Server
from shared import REPO, TOPK, build, dense_subset, drive, levels, minilm_dir, naive, ours, read_jsonl, rollout

from memagent_examples.retriever_process import ServerProcess
from retriever_server.options import default_threads
from verl_memagent.search.endpoint import retriever_health

PROCESSES = max(2, len(os.sched_getaffinity(0)))  # the "N" of 1 vs N search processes: one per core
# our dense server three times: label -> serve flags (the naive server runs fp32, as Search-R1's);
# dense_default and dense_default_xN run at the defaults (int8 queries where this CPU runs them faster
# than fp32, the cores shared out)
DENSE_VARIANTS = {
    "dense": ["--quantize", "none"],
    "dense_default": [],
    "dense_lone_threads": ["--lone-threads", str(len(os.sched_getaffinity(0)))],  # idle cores lent to a lone batch
    "dense_default_xN": ["--search-processes", str(PROCESSES)],
}
ENCODER_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_int8")  # reported with figures
# --cpu-standin avx2: the environment of a CPU with AVX2 and no AVX-512 (see the docstring)
AVX2_ENVIRONMENT = {
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    "FBGEMM_ENABLE_INSTRUCTIONS": "AVX2",
    "NUMBA_CPU_NAME": "haswell",  # bm25s's numba scorer compiled for AVX2
    "NPY_DISABLE_CPU_FEATURES": "AVX512F AVX512CD AVX512_SKX AVX512_CLX AVX512_CNL AVX512_ICL AVX512_SPR",
    "FAISS_OPT_LEVEL": "avx2",
}
STANDIN_SITECUSTOMIZE = (
    "import torch\n\ntorch.backends.mkldnn.enabled = False  # _int_mm: the loop of CPUs without VNNI\n"
)


def cpu_kind() -> dict:
    """The CPU the figures come from: lscpu's model name, family and model, the flags that decide the
    query encoder, what multiplies int8 matrices in this process, and the stand-in if any."""
    from retriever_server.quantize import int8_matmul

    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout.splitlines()
    info = {name.strip(): value.strip() for name, _, value in (line.partition(":") for line in lscpu)}
    flags = set(info.get("Flags", "").split()) & set(ENCODER_FLAGS)
    return {
        "model_name": info.get("Model name"),
        "family": info.get("CPU family"),
        "model": info.get("Model"),
        "flags": sorted(flags),
        "int8_matmul": int8_matmul(),
        "standin": os.environ.get("RETRIEVER_BENCH_STANDIN"),
    }


def standin_environment(kind: str) -> dict[str, str]:
    """os.environ plus what makes this machine stand in for a CPU of `kind` (only "avx2")."""
    site = Path(tempfile.mkdtemp(prefix="retriever_bench_standin_"))
    (site / "sitecustomize.py").write_text(STANDIN_SITECUSTOMIZE)
    path = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    return {**os.environ, **AVX2_ENVIRONMENT, "PYTHONPATH": path, "RETRIEVER_BENCH_STANDIN": kind}


def startup(kind: str, index_dir: Path, threads: int | None, reps: int, report: dict) -> None:
    """Time to ready of the naive server and of ours with 1 and N search processes at their
    defaults, started in turn (each alone on the machine), `reps` times; the medians."""
    servers = {
        f"naive_{kind}": lambda: naive(index_dir, threads),
        f"{kind}_x1": lambda: ours(index_dir, threads),
        f"{kind}_xN": lambda: ours(index_dir, threads, "--search-processes", str(PROCESSES)),
    }
    seconds: dict[str, list[float]] = {label: [] for label in servers}
    for _ in range(reps):
        for label, start in servers.items():
            server = start()
            seconds[label].append(round(server.ready_s, 2))
            server.stop()
    for label, values in seconds.items():
        report[f"{label}_ready"] = {"median_s": round(float(np.median(values)), 2), "runs_s": values}
        print(f"{label + ' ready':28s} {json.dumps(report[label + '_ready'])}", flush=True)


def encoder_ceiling(questions: list[str], threads: int | None, report: dict, key: str) -> None:
    """In-process throughput of each query encoder (fp32 traced, int8 compiled): one query per call
    (no batching) and batched (the best batch size is its ceiling). Where int8 runs torch's reference
    loop (a few queries/s) it gets fewer queries: 16 one at a time, 64 in one batch."""
    import torch

    from retriever_server.encoders import Encoder, resolve_spec
    from retriever_server.quantize import int8_slow_here

    torch.set_num_threads(threads or default_threads(1))  # as one search process of ours runs it
    spec = resolve_spec(minilm_dir())
    report[key] = {"threads": torch.get_num_threads()}
    for quantize in ("none", "int8"):
        encoder = Encoder(spec, device="cpu", quantize=quantize)
        few = quantize == "int8" and int8_slow_here() is not None
        sample = questions[: 16 if few else 48]
        started = time.perf_counter()
        for q in sample:
            encoder.encode_queries([q], batch_size=1)
        per_query = len(sample) / (time.perf_counter() - started)
        best = {}
        for batch in (64,) if few else (8, 16, 32, 64, 128):
            texts = questions[:64] if few else questions
            started = time.perf_counter()
            encoder.encode_queries(texts, batch_size=batch)
            best[batch] = len(texts) / (time.perf_counter() - started)
        report[key]["fp32" if quantize == "none" else quantize] = {
            "per_query_qps": round(per_query, 1),
            "batched_qps": {str(k): round(v, 1) for k, v in best.items()},
            "ceiling_qps": round(max(best.values()), 1),
        }
    print(f"{key:28s} {json.dumps(report[key])}", flush=True)


def bm25_inprocess(index_dir: Path, questions: list[str], report: dict) -> None:
    """Each BM25 backend in this process, one query at a time and all in one batch: the numba
    default was chosen from these figures on one kind of CPU, so every run measures both."""
    from retriever_server.index import Searcher
    from retriever_server.options import LoadOptions

    report["bm25_inprocess"] = {}
    for backend in ("numba", "numpy"):
        searcher = Searcher(index_dir, LoadOptions(bm25_backend=backend))
        searcher.search(["warm up"], TOPK)  # numba compiles on the first call, and on the first batch
        searcher.search(questions[:8], TOPK)
        started = time.perf_counter()
        for q in questions:
            searcher.search([q], TOPK)
        single = len(questions) / (time.perf_counter() - started)
        started = time.perf_counter()
        searcher.search(questions, TOPK)
        batched = len(questions) / (time.perf_counter() - started)
        report["bm25_inprocess"][backend] = {"single_qps": round(single, 1), "batched_qps": round(batched, 1)}
    print(f"{'bm25 (in process)':28s} {json.dumps(report['bm25_inprocess'])}", flush=True)


def soak(server: ServerProcess, questions: list[str], requests: int, report: dict) -> None:
    bodies = [[f"{questions[i % len(questions)]} {i % 997}"] for i in range(requests)]
    stats = asyncio.run(drive(server.url, bodies, 64))
    report["soak"] = {"requests": requests, **{k: v for k, v in stats.items() if k != "results"}}
    print(f"{'bm25 soak c64':28s} {json.dumps(report['soak'])}", flush=True)


def parsed() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work-dir", type=Path, default=Path(tempfile.gettempdir()) / "retriever_bench")
    parser.add_argument("--dense-passages", type=int, default=3000)
    parser.add_argument("--soak-requests", type=int, default=100_000, help="0 skips the soak")
    parser.add_argument("--questions", type=int, default=384, help="unique multi-hop questions sent per level")
    parser.add_argument("--rollout-questions", type=int, default=96, help="questions x 5 trajectories; 0 skips")
    parser.add_argument("--kinds", default="bm25,dense", help="indexes to measure (comma-separated)")
    parser.add_argument("--threads", type=int, help="threads of every server and the ceiling (default: their own)")
    parser.add_argument("--startup-reps", type=int, default=3, help="start-ups timed per server; 0 skips")
    parser.add_argument("--cpu-standin", choices=["avx2"], help="run as on a CPU of this kind (see above)")
    parser.add_argument("--search-r1", type=Path, help="dense: Search-R1's retrieval_server.py, measured beside ours")
    return parser.parse_args()


def main() -> None:
    args = parsed()
    if args.cpu_standin and os.environ.get("RETRIEVER_BENCH_STANDIN") != args.cpu_standin:
        environment = standin_environment(args.cpu_standin)  # in force from the interpreter's start
        os.execve(sys.executable, [sys.executable, __file__, *sys.argv[1:]], environment)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the `finally`s: stop the servers

    work = args.work_dir
    work.mkdir(parents=True, exist_ok=True)
    multihop = read_jsonl(REPO / "data" / "qa_multihop.jsonl")
    questions = [q["question"] for q in multihop][: args.questions]
    gold = {q["question"]: q["supporting_ids"] for q in multihop}
    report: dict = {"cpus": len(os.sched_getaffinity(0)), "cpu": cpu_kind()}
    print(f"{'cpu':28s} {json.dumps(report['cpu'])}", flush=True)
    kinds = args.kinds.split(",")
    indexes = {}
    if "bm25" in kinds:
        indexes["bm25"] = (work / "bm25_corpus", REPO / "data" / "corpus.jsonl")
        report["bm25_build_s"] = build("bm25", indexes["bm25"][1], indexes["bm25"][0])
    if "dense" in kinds:
        subset = dense_subset(work, multihop, args.dense_passages)
        indexes["dense"] = (work / f"dense_flat_{args.dense_passages}", subset)
        flags = ("--encoder", minilm_dir(), "--index-type", "flat")
        report["dense_build_s"] = build("dense", subset, indexes["dense"][0], *flags)
        report["dense_passages"] = sum(1 for _ in subset.open())
    for kind, (index_dir, _) in indexes.items():
        if args.startup_reps:
            startup(kind, index_dir, args.threads, args.startup_reps, report)
    for kind, (index_dir, corpus) in indexes.items():
        if kind == "bm25":
            bm25_inprocess(index_dir, questions, report)
        else:
            encoder_ceiling(questions, args.threads, report, "encoder_before_levels")
        under_load(args, kind, index_dir, corpus, questions, gold, report)
    print(json.dumps(headline(report, args.threads)))


def under_load(args, kind: str, index_dir: Path, corpus: Path, questions: list[str], gold: dict, report: dict):
    """The levels on unique queries (cache off), then the rollout-shaped load and the soak (cache on)."""
    with contextlib.ExitStack() as running:  # every server started here is stopped on any exit

        def start(server: ServerProcess) -> ServerProcess:
            running.callback(server.stop)
            return server

        variants = DENSE_VARIANTS if kind == "dense" else {kind: []}
        originals = {}
        if kind == "dense" and args.search_r1:
            standin = STANDIN_SITECUSTOMIZE if os.environ.get("RETRIEVER_BENCH_STANDIN") else ""
            originals["search_r1"] = start(SearchR1Server(args.search_r1.resolve(), index_dir, corpus, standin))
            report["search_r1_ready_s"] = round(originals["search_r1"].ready_s, 1)
        baseline = start(naive(index_dir, args.threads))
        unique = {
            label: start(ours(index_dir, args.threads, "--cache-size", "0", *flags))
            for label, flags in variants.items()
        }
        if kind == "dense":
            for label, server in unique.items():
                report[f"{label}_query_encoder"] = retriever_health(server.url, 30).get("query_encoder")
                print(f"{label + ' query encoder':28s} {json.dumps(report[label + '_query_encoder'])}", flush=True)
        levels({**originals, f"naive_{kind}": baseline, **unique}, questions, gold, report)
        report[f"naive_{kind}_peak_rss_mb"] = baseline.peak_rss_mb()
        for label, server in unique.items():
            report[f"{label}_peak_rss_mb"] = server.peak_rss_mb()
            server.stop()
        if kind == "dense":
            encoder_ceiling(questions, args.threads, report, "encoder_after_levels")
        if not (args.rollout_questions or (kind == "bm25" and args.soak_requests)):
            return
        cached = {label: start(ours(index_dir, args.threads, *flags)) for label, flags in variants.items()}
        if args.rollout_questions:
            rollout({f"naive_{kind}": baseline, **cached}, questions[: args.rollout_questions], report)
        if kind == "bm25" and args.soak_requests:
            soak(cached[kind], questions, args.soak_requests, report)


def headline(report: dict, threads: int | None) -> dict:
    """The figures that matter, from what this run measured (levels it skipped are left out)."""

    def figure(key: str, name: str = "qps"):
        return report.get(key, {}).get(name)

    def ratio(numerator, denominator):
        return round(numerator / denominator, 2) if numerator and denominator else None

    out: dict = {"cpus": report["cpus"], "cpu": report["cpu"], "threads": threads, "search_processes_n": PROCESSES}
    out.update({key: report[key] for key in report if key.endswith("_query_encoder")})
    encoder = [report[key] for key in ("encoder_before_levels", "encoder_after_levels") if key in report]
    for quantize in ("fp32", "int8") if encoder else ():  # the machine's load drifts: before and after, averaged
        out[f"encoder_{quantize}_per_query_qps"] = round(
            float(np.mean([e[quantize]["per_query_qps"] for e in encoder])), 1
        )
        out[f"encoder_{quantize}_ceiling_qps"] = round(float(np.mean([e[quantize]["ceiling_qps"] for e in encoder])), 1)
    for concurrency, per_request in shared.LEVELS:
        level = f"c{concurrency}_q{per_request}"
        for kind, labels in (("bm25", ["bm25"]), ("dense", list(DENSE_VARIANTS))):
            naive_qps = figure(f"naive_{kind}_{level}")
            if naive_qps is None:
                continue
            out[f"naive_{kind}_qps_{level}"] = naive_qps
            for label in labels:
                out[f"{label}_qps_{level}"] = figure(f"{label}_{level}")
                out[f"{label}_p99_ms_{level}"] = figure(f"{label}_{level}", "p99_ms")
                out[f"{label}_speedup_{level}"] = ratio(figure(f"{label}_{level}"), naive_qps)
        out[f"dense_default_xN_over_x1_{level}"] = ratio(
            figure(f"dense_default_xN_{level}"), figure(f"dense_default_{level}")
        )
        out[f"search_r1_qps_{level}"] = figure(f"search_r1_{level}")
        out[f"dense_default_over_search_r1_{level}"] = ratio(
            figure(f"dense_default_{level}"), figure(f"search_r1_{level}")
        )
        out[f"dense_lone_threads_over_default_{level}"] = ratio(
            figure(f"dense_lone_threads_{level}"), figure(f"dense_default_{level}")
        )
    for kind in ("bm25", "dense"):
        naive_s = figure(f"naive_{kind}_ready", "median_s")
        out[f"naive_{kind}_ready_s"] = naive_s
        for n in ("x1", "xN"):
            out[f"{kind}_ready_s_{n}"] = figure(f"{kind}_{n}_ready", "median_s")
            out[f"{kind}_ready_{n}_over_naive"] = ratio(figure(f"{kind}_{n}_ready", "median_s"), naive_s)
    out["search_r1_ready_s"] = report.get("search_r1_ready_s")
    for label in ("naive_bm25", "bm25", "naive_dense", "search_r1", *DENSE_VARIANTS):
        out[f"{label}_recall_at_3"] = figure(f"{label}_c64_q1", "recall_at_3")
        out[f"{label}_rollout_qps"] = figure(f"{label}_rollout")
    out.update(
        bm25_inprocess_qps=report.get("bm25_inprocess", {}).get("numba", {}).get("single_qps"),
        bm25_numba_over_numpy_single=ratio(
            *(report.get("bm25_inprocess", {}).get(b, {}).get("single_qps") for b in ("numba", "numpy"))
        ),
        bm25_numba_over_numpy_batched=ratio(
            *(report.get("bm25_inprocess", {}).get(b, {}).get("batched_qps") for b in ("numba", "numpy"))
        ),
        soak_requests=figure("soak", "requests"),
        errors=sum(v.get("errors", 0) for v in report.values() if isinstance(v, dict)),
    )
    return {key: value for key, value in out.items() if value is not None}


if __name__ == "__main__":
    main()
