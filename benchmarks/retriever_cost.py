"""What a retriever costs as its corpus grows, projected to wiki-18 (21,015,324 passages).

One size per invocation (`run`), so that each runs on its own under the machine's heavy lock and
other work can go between sizes; `fit` reads every size's figures and fits them.

`run --kind bm25|dense --passages N` generates a corpus shaped like wiki-18's (passages of 100
words and a two-word title, drawn from a Zipf vocabulary of 200,000 invented words), builds an
index of it, serves it with `python -m retriever_server serve` at its defaults (`--cache-size 0`,
so every query is searched), and measures:
  - build: seconds and peak memory, resident and anonymous (sampled every 0.1 s);
  - the index on disk (corpus store included);
  - time to ready: from the server's launch to its first 200 on /health;
  - memory while serving, after the load below, summed over the server and its search processes
    from /proc/PID/smaps_rollup: anonymous (what the machine must have) and file-backed (mapped
    index pages the kernel can drop and read again: the page cache the index wants), as resident
    and as proportional (Pss, each shared page counted once);
  - q/s, p50 and p99 at 64 concurrent one-query requests and at one client sending 32 queries per
    request, on known-item queries (an 8-word window of a sampled passage's text);
  - known-item recall: the source passage first (@1) and in the top 3 (@3).
Dense: 768-dimensional unit vectors drawn at random stand in for the passage embeddings (encoding
does not change what the index costs); the faiss Flat file is built from them by `build_faiss`, as
`build --kind dense` does, and imported with `--prebuilt-faiss` beside an encoder of e5's width
(one BERT-base layer with random weights and bert-base-uncased's tokenizer), int8 and compiled at
build as by default: its query encoding costs about a twelfth of e5-base's (12 layers), so the
figures are the index's, which is what grows. Its queries are text as always, so known-item recall
is the index's own: each probe passage's stored vector, perturbed (cosine 0.9), searched in the
index in process; the HTTP load sends the first 256 probes.

    python benchmarks/retriever_cost.py run --kind bm25 --passages 1000000 [--work-dir DIR] [--results FILE]
    python benchmarks/retriever_cost.py fit [--results FILE]

Generated files live under `--work-dir` and are deleted after each run (`--keep` keeps them).
Last line of `fit`: one JSON object: per kind and cost, the linear fit's slope per million
passages, the growth exponent of a power-law fit (1 = linear), and the projection to 21M.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
from shared import REPO, drive, minilm_dir

from memagent_examples.retriever_process import ServerProcess, build_command, serve_command, status_kb, with_descendants

BENCHMARKS = Path(__file__).resolve().parent

WIKI18_PASSAGES = 21_015_324
WORDS, TITLE_WORDS, VOCAB, ZIPF = 100, 2, 200_000, 1.0
DIM = 768  # e5-base's
PROBES = 1000
DENSE_LOAD_QUERIES = 256  # a flat index scans every vector per batch: fewer queries sent
SEED = 0


# ---------------------------------------------------------------- data


def wiki_like_corpus(path: Path, size: int, chunk: int = 100_000) -> list[tuple[str, str]]:
    """Write `size` passages to `path`; (id, query) known-item probes: 8-word windows of their text."""
    rng = np.random.default_rng(SEED)
    letters = rng.integers(ord("a"), ord("z") + 1, size=(VOCAB, 10), dtype=np.uint8).tobytes()
    vocab = np.array([letters[10 * i : 10 * i + n].decode() for i, n in enumerate(rng.integers(3, 11, size=VOCAB))])
    probs = 1.0 / np.arange(1, VOCAB + 1) ** ZIPF
    probs /= probs.sum()
    probe_rows = set(rng.choice(size, size=min(PROBES, size), replace=False).tolist())
    probes = []
    with path.open("w") as handle:
        for start in range(0, size, chunk):
            words = vocab[rng.choice(VOCAB, size=(min(chunk, size - start), TITLE_WORDS + WORDS), p=probs)]
            lines = []
            for offset, row in enumerate(words):
                text = " ".join(row[TITLE_WORDS:])
                lines.append(
                    json.dumps({"id": str(start + offset), "title": " ".join(row[:TITLE_WORDS]), "text": text})
                )
                if start + offset in probe_rows:
                    window = int(rng.integers(0, WORDS - 8))
                    probes.append((str(start + offset), " ".join(row[TITLE_WORDS + window : TITLE_WORDS + window + 8])))
            handle.write("\n".join(lines) + "\n")
    return probes


def e5_width_encoder(out: Path) -> Path:
    """One BERT-base layer with random weights (768 wide, as e5-base-v2) and bert-base-uncased's
    tokenizer (MiniLM's)."""
    if (out / "config.json").is_file():
        return out
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(SEED)
    BertModel(BertConfig(num_hidden_layers=1)).save_pretrained(out)  # BertConfig's defaults are BERT-base's
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (Path(minilm_dir()) / name).is_file():
            shutil.copy(Path(minilm_dir()) / name, out / name)
    return out


def flat_of_random_vectors(path: Path, size: int, chunk: int = 262_144) -> None:
    """A faiss Flat file of `size` random unit vectors, built by `build_faiss` from a memory-mapped .npy."""
    from retriever_server.dense import build_faiss

    vectors_path = path.with_suffix(".npy")
    vectors = np.lib.format.open_memmap(vectors_path, mode="w+", dtype=np.float32, shape=(size, DIM))
    rng = np.random.default_rng(SEED)
    for start in range(0, size, chunk):
        block = rng.standard_normal((min(chunk, size - start), DIM), dtype=np.float32)
        vectors[start : start + len(block)] = block / np.linalg.norm(block, axis=1, keepdims=True)
    vectors.flush()
    build_faiss(vectors, "flat", path)
    del vectors
    vectors_path.unlink()


# ---------------------------------------------------------------- measures


def timed_child(command: list[str]) -> tuple[float, dict]:
    """Run `command`; (seconds, its peak memory in GB: resident and anonymous, the sums over it and
    its descendants sampled every 0.1 s; the resident set counts the pages of the memory-mapped files
    it reads and writes, which the kernel can drop, the anonymous memory is what it must have)."""
    started = time.perf_counter()
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = {"rss_gb": 0.0, "anon_gb": 0.0}
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.wait(0.1):
            pids = with_descendants(process.pid)
            for name, field in (("rss_gb", "VmRSS"), ("anon_gb", "RssAnon")):
                peak[name] = max(peak[name], sum(status_kb(pid, field) for pid in pids) / 2**20)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, stderr = process.communicate()
    sampling.set()
    sampler.join()
    seconds = time.perf_counter() - started
    if process.returncode:
        raise RuntimeError(f"{command[:6]} failed: {stderr[-3000:]}")
    return seconds, {name: round(value, 2) for name, value in peak.items()}


def memory_gb(pid: int) -> dict:
    """smaps_rollup of `pid` and its descendants, summed: resident and proportional, anonymous and file-backed."""
    fields: dict[str, int] = {}
    for process in with_descendants(pid):
        try:
            lines = Path(f"/proc/{process}/smaps_rollup").read_text().splitlines()
        except OSError:
            continue
        for line in lines[1:]:
            name, value = line.split(":", 1)
            fields[name] = fields.get(name, 0) + int(value.split()[0])
    gb = {name: kb / 2**20 for name, kb in fields.items()}
    return {
        "rss_gb": round(gb["Rss"], 3),
        "anon_gb": round(gb["Anonymous"], 3),
        "file_gb": round(gb["Rss"] - gb["Anonymous"] - gb.get("Shmem", 0), 3),
        "pss_anon_gb": round(gb.get("Pss_Anon", 0), 3),
        "pss_file_gb": round(gb.get("Pss_File", 0), 3),
    }


def disk_gb(path: Path) -> float:
    return round(sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink()) / 2**30, 3)


def load(url: str, probes: list[tuple[str, str]]) -> dict:
    """64 x 1 and 1 x 32 over the probes; known-item recall from the first."""
    queries = [query for _, query in probes]
    singles = asyncio.run(drive(url, [[q] for q in queries], 64))
    batched = asyncio.run(drive(url, [queries[i : i + 32] for i in range(0, len(queries), 32)], 1))
    ranked = [[hit["document"]["id"] for hit in (result or [[]])[0]] for result in singles.pop("results")]
    batched.pop("results")
    sources = [pid for pid, _ in probes]
    return {
        "c64_q1": singles,
        "c1_q32": batched,
        "known_item_at_1": round(float(np.mean([r[:1] == [s] for r, s in zip(ranked, sources, strict=True)])), 4),
        "known_item_at_3": round(float(np.mean([s in r for r, s in zip(ranked, sources, strict=True)])), 4),
    }


def dense_known_item(index_dir: Path, probes: list[tuple[str, str]]) -> dict:
    """Each probe passage's stored vector, perturbed to cosine 0.9, searched in the index in process."""
    from retriever_server.dense import FAISS_FILE, FaissIndex

    index = FaissIndex(index_dir / FAISS_FILE)
    rows = np.array(sorted(int(pid) for pid, _ in probes))
    stored = index.vectors(rows)
    noise = np.random.default_rng(SEED).standard_normal(stored.shape).astype(np.float32)
    noise -= np.sum(noise * stored, axis=1, keepdims=True) * stored  # orthogonal to the stored vector
    noise /= np.linalg.norm(noise, axis=1, keepdims=True)
    queries = 0.9 * stored + np.sqrt(1 - 0.9**2) * noise
    found, _ = index.search(queries, 3)
    return {
        "known_item_at_1": round(float(np.mean(found[:, 0] == rows)), 4),
        "known_item_at_3": round(float(np.mean((found == rows[:, None]).any(axis=1))), 4),
    }


# ---------------------------------------------------------------- run and fit


def run(kind: str, size: int, work: Path, results: Path, keep: bool) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    corpus, index = work / f"corpus_{size}.jsonl", work / f"{kind}_{size}"
    shutil.rmtree(index, ignore_errors=True)
    started = time.perf_counter()
    probes = wiki_like_corpus(corpus, size)
    figures: dict = {"kind": kind, "passages": size, "generate_s": round(time.perf_counter() - started, 1)}
    if kind == "bm25":
        build_s, peak = timed_child(build_command("bm25", corpus, index))
        serve_flags: list[str] = []
    else:
        faiss_file = work / f"flat_{size}.index"
        faiss_s, faiss_peak = timed_child(
            [
                sys.executable,
                "-c",
                f"import sys; sys.path.insert(0, {str(BENCHMARKS)!r}); import retriever_cost as c; "
                f"c.flat_of_random_vectors(__import__('pathlib').Path({str(faiss_file)!r}), {size})",
            ]
        )
        encoder = e5_width_encoder(work / "e5_width_random")
        flags = [
            "--encoder",
            str(encoder),
            "--family",
            "e5",
            "--prebuilt-faiss",
            str(faiss_file),
        ]
        import_s, import_peak = timed_child(build_command("dense", corpus, index, *flags))
        build_s = faiss_s + import_s
        peak = {name: max(faiss_peak[name], import_peak[name]) for name in faiss_peak}
        figures["build_faiss_s"] = round(faiss_s, 1)
        serve_flags = ["--device", "cpu"]
    figures.update(build_s=round(build_s, 1), build_peak=peak, disk_gb=disk_gb(index))
    if kind == "dense":
        figures["disk_gb"] = round(figures["disk_gb"] + faiss_file.stat().st_size / 2**30, 3)
    server = ServerProcess(serve_command(index, "--cache-size", "0", *serve_flags), cwd=REPO, ready=False)
    try:
        figures["ready_s"] = round(server.wait_ready(timeout_s=1800, every_s=0.05), 2)
        figures["memory_at_ready"] = memory_gb(server.process.pid)
        figures.update(load(server.url, probes if kind == "bm25" else probes[:DENSE_LOAD_QUERIES]))
        figures["memory_after_load"] = memory_gb(server.process.pid)
    finally:
        server.stop()
    if kind == "dense":
        figures["known_item_index"] = dense_known_item(index, probes)
    figures["date"] = time.strftime("%Y-%m-%d %H:%M")
    with results.open("a") as handle:
        handle.write(json.dumps(figures) + "\n")
    print(json.dumps(figures), flush=True)
    if not keep:
        shutil.rmtree(index, ignore_errors=True)
        corpus.unlink(missing_ok=True)
        if kind == "dense":
            faiss_file.unlink(missing_ok=True)
    return figures


# name -> (how to read it from one run's figures, how it is projected: "linear" for what a passage
# adds to (time, memory, disk), "power" (y = c N^p) for throughput and latency)
COSTS = {
    "build_s": (lambda f: f["build_s"], "linear"),
    "build_peak_rss_gb": (lambda f: f["build_peak"]["rss_gb"], "linear"),
    "build_peak_anon_gb": (lambda f: f["build_peak"]["anon_gb"], "linear"),
    "disk_gb": (lambda f: f["disk_gb"], "linear"),
    "ready_s": (lambda f: f["ready_s"], "linear"),
    "serve_anon_gb": (lambda f: f["memory_after_load"]["anon_gb"], "linear"),
    "serve_file_gb": (lambda f: f["memory_after_load"]["file_gb"], "linear"),
    "qps_c64_q1": (lambda f: f["c64_q1"]["qps"], "power"),
    "p99_ms_c64_q1": (lambda f: f["c64_q1"]["p99_ms"], "power"),
    "qps_c1_q32": (lambda f: f["c1_q32"]["qps"], "power"),
    "p99_ms_c1_q32": (lambda f: f["c1_q32"]["p99_ms"], "power"),
}


def fit(results: Path) -> dict:
    """Per kind and cost: the least-squares line y = a + b N and power law y = c N^p over the sizes
    measured (the last run of each), and the projection to wiki-18's 21M passages."""
    runs = [json.loads(line) for line in results.read_text().splitlines() if line.strip()]
    out: dict = {}
    for kind in sorted({r["kind"] for r in runs}):
        latest = {r["passages"]: r for r in runs if r["kind"] == kind}
        sizes = np.array(sorted(latest), dtype=float)
        if len(sizes) < 2:
            continue
        for name, (read, projection) in COSTS.items():
            values = np.array([read(latest[int(n)]) for n in sizes], dtype=float)
            slope, intercept = np.polyfit(sizes / 1e6, values, 1)
            exponent, log_c = np.polyfit(np.log(sizes), np.log(np.maximum(values, 1e-9)), 1)
            linear = intercept + slope * WIKI18_PASSAGES / 1e6
            power = float(np.exp(log_c) * WIKI18_PASSAGES**exponent)
            out[f"{kind}_{name}"] = {
                "per_million": round(float(slope), 4),
                "at_0": round(float(intercept), 3),
                "exponent": round(float(exponent), 2),
                "at_21m": round(float(linear if projection == "linear" else power), 2),
                "projected_by": projection,
                "measured": {str(int(n)): v for n, v in zip(sizes, values.tolist(), strict=True)},
            }
            print(f"{kind:6s} {name:18s} {json.dumps(out[f'{kind}_{name}'])}", flush=True)
    print(json.dumps(out))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=("run", "fit"))
    parser.add_argument("--kind", choices=("bm25", "dense"))
    parser.add_argument("--passages", type=int)
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/retriever_cost"))
    parser.add_argument("--results", type=Path, default=Path("/tmp/retriever_cost/results.jsonl"))
    parser.add_argument("--keep", action="store_true", help="keep the corpus and index")
    args = parser.parse_args()
    if args.command == "fit":
        fit(args.results)
        return
    if not args.kind or not args.passages:
        parser.error("run needs --kind and --passages")
    args.results.parent.mkdir(parents=True, exist_ok=True)
    run(args.kind, args.passages, args.work_dir, args.results, args.keep)


if __name__ == "__main__":
    main()
