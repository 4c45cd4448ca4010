"""Dense retrieval on a GPU, in one run: the build, the server next to the naive one, and an exact
index of wiki-18's size.

1. build: the bundled corpus (14,230 passages) encoded on the GPU in fp16 into a `torch` index:
   passages/s of the whole build, and the cosine of its vectors to the fp32 CPU encoder's.
2. serve: `retriever_server serve --device cuda` (cache off) and the naive per-request server
   (`shared.naive`) on the same GPU, driven at retriever_bench.py's levels (concurrency 1, 8, 64
   x 1 and 32 queries per request, topk 3) with the multi-hop questions; recall@3 next to the fp32 CPU
   encoder searching the same vectors exactly in numpy. Then the rollout-shaped load (cache on).
3. scale: `--scale-rows` random unit vectors of `--dim` (default: wiki-18 under e5-base, 21,015,324 x
   768) in an .npy stored in fp16 (32 GB; fp32 would not fit a 64 GB disk), loaded into `TorchIndex`
   (seconds, GPU memory, peak anonymous host memory) and searched at batch 1, 16 and 256; known-item
   top-1 for stored rows plus noise, and top-10 agreement with an fp32 product on the same vectors.
Last line: one JSON object of the headline figures.

    python benchmarks/dense_gpu_bench.py [--device cuda] [--model DIR] [--passages 0 (all)]
        [--scale-rows 21015324] [--dim 768] [--work-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import shared
import torch

from retriever_server.corpus import CorpusStore
from retriever_server.dense import EMBEDDINGS_FILE, TorchIndex
from retriever_server.encoders import Encoder, EncoderSpec

SCALE_K = 10


def build(args: argparse.Namespace, multihop: list[dict], report: dict) -> Path:
    corpus = shared.REPO / "data" / "corpus.jsonl"
    if args.passages:
        corpus = shared.dense_subset(args.work_dir, multihop, args.passages)
    out = args.work_dir / f"torch_{args.device}_{args.passages or 'all'}"
    flags = ("--encoder", args.model, "--index-type", "torch", "--device", args.device, "--batch-size", "256")
    seconds = shared.build("dense", corpus, out, *flags)
    passages = json.loads((out / "meta.json").read_text())["num_passages"]
    report["build"] = {"passages": passages, "seconds": seconds, "passages_per_s": round(passages / seconds, 1)}
    print(f"{'build':28s} {json.dumps(report['build'])}", flush=True)
    return out


def cpu_reference(index_dir: Path, questions: list[str], gold: dict, report: dict) -> None:
    """The fp32 CPU encoder against the index's vectors: passage cosine, and exact recall@3."""
    meta = json.loads((index_dir / "meta.json").read_text())["dense"]
    encoder = Encoder(EncoderSpec(**meta["encoder"]), device="cpu", quantize="none")
    store, embeddings = CorpusStore(index_dir / "corpus"), np.load(index_dir / EMBEDDINGS_FILE)
    sample = np.linspace(0, len(store) - 1, min(512, len(store))).astype(int)
    cosine = np.sum(encoder.encode_passages([store.contents(int(i)) for i in sample]) * embeddings[sample], axis=1)
    top = np.argsort(-(encoder.encode_queries(questions) @ embeddings.T), axis=1)[:, : shared.TOPK]
    found = [{store.doc_id(int(r)) for r in rows} for rows in top]
    recall = np.mean([len(ids & set(gold[q])) / len(gold[q]) for q, ids in zip(questions, found, strict=True)])
    report["cpu_fp32_reference"] = {
        "passage_cosine_mean": round(float(cosine.mean()), 5),
        "passage_cosine_min": round(float(cosine.min()), 5),
        "recall_at_3": round(float(recall), 4),
    }
    print(f"{'cpu fp32 reference':28s} {json.dumps(report['cpu_fp32_reference'])}", flush=True)


def serve(args: argparse.Namespace, index_dir: Path, questions: list[str], gold: dict, report: dict) -> None:
    servers = {
        "naive": shared.naive(index_dir, args.threads),
        "ours": shared.ours(index_dir, args.threads, "--device", args.device, "--cache-size", "0"),
    }
    try:
        shared.levels(servers, questions, gold, report)
        servers["ours"].stop()
        servers["ours"] = shared.ours(index_dir, args.threads, "--device", args.device)
        shared.rollout(servers, questions[: args.rollout_questions], report)
    finally:
        for server in servers.values():
            server.stop()


class PeakAnonymousMemory:
    """Samples this process's anonymous resident memory (heap, not the page cache of a memory map)."""

    def __init__(self, every_s: float = 0.02):
        self.start_kb = self.peak_kb = self._read_kb()
        self._every_s, self._stop = every_s, threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    @staticmethod
    def _read_kb() -> int:
        status = Path("/proc/self/status").read_text()
        return int(next(line for line in status.splitlines() if line.startswith("RssAnon:")).split()[1])

    def _sample(self) -> None:
        while not self._stop.wait(self._every_s):
            self.peak_kb = max(self.peak_kb, self._read_kb())

    def __enter__(self) -> PeakAnonymousMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def scale_file(args: argparse.Namespace, rows: int) -> tuple[Path, int]:
    """Where the fp16 matrix goes: the first of /dev/shm (memory: no disk writes) and --work-dir with
    room for it; else as many rows as 80% of the roomier one holds."""
    need = rows * args.dim * 2 * 1.02
    candidates = [Path("/dev/shm"), args.work_dir]
    free = {d: shutil.disk_usage(d).free for d in candidates if d.is_dir()}
    for directory, room in free.items():
        if room >= need:
            return directory / "scale_fp16.npy", rows
    directory, room = max(free.items(), key=lambda item: item[1])
    return directory / "scale_fp16.npy", int(0.8 * room / (args.dim * 2))


def scale(args: argparse.Namespace, report: dict) -> None:
    device = torch.device(args.device)
    path, rows = scale_file(args, args.scale_rows)
    generator = torch.Generator(device=device).manual_seed(0)
    started = time.perf_counter()
    matrix = np.lib.format.open_memmap(path, mode="w+", dtype=np.float16, shape=(rows, args.dim))
    for first in range(0, rows, 1 << 20):
        block = torch.randn((min(1 << 20, rows - first), args.dim), device=device, generator=generator)
        matrix[first : first + len(block)] = torch.nn.functional.normalize(block, dim=1).half().cpu().numpy()
    matrix.flush()
    written_s = time.perf_counter() - started
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    with PeakAnonymousMemory() as host:
        started = time.perf_counter()
        index = TorchIndex(np.load(path, mmap_mode="r"), devices=[device])
        load_s = time.perf_counter() - started
    result = {
        "rows": rows,
        "dim": args.dim,
        "file_gb": round(path.stat().st_size / 1e9, 2),
        "write_s": round(written_s, 1),
        "load_s": round(load_s, 1),
        "load_host_anon_growth_mb": round((host.peak_kb - host.start_kb) / 1024),
        "gpu_peak_mb": round(torch.cuda.max_memory_allocated(device) / 2**20) if device.type == "cuda" else None,
    }
    rng = np.random.default_rng(0)
    known = np.sort(rng.choice(rows, size=256, replace=False))
    noise = rng.standard_normal((256, args.dim), np.float32) * (0.5 / args.dim**0.5)
    queries = matrix[known].astype(np.float32) + noise
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    for batch in (1, 16, 256):
        index.search(queries[:batch], SCALE_K)  # warm-up
        done, started = 0, time.perf_counter()
        while done < 3 or time.perf_counter() - started < 2.0:
            found, _ = index.search(queries[:batch], SCALE_K)
            done += 1
        result[f"qps_batch{batch}"] = round(batch * done / (time.perf_counter() - started), 1)
    result["known_item_at_1"] = round(float(np.mean(found[:, 0] == known)), 4)
    result["top10_agreement_with_fp32"] = round(top10_agreement(matrix, queries[:32], found[:32], device), 4)
    report["scale"] = result
    del index, matrix
    path.unlink()
    print(f"{'torch index scale':28s} {json.dumps(result)}", flush=True)


@torch.inference_mode()
def top10_agreement(matrix: np.ndarray, queries: np.ndarray, found: np.ndarray, device: torch.device) -> float:
    """Overlap of `found` with the top 10 of an fp32 product over the same stored vectors."""
    query = torch.from_numpy(queries).to(device)
    values, rows = [], []
    for first in range(0, len(matrix), 1 << 20):
        block = torch.from_numpy(np.array(matrix[first : first + (1 << 20)])).to(device).float()
        top = torch.topk(query @ block.T, SCALE_K, dim=1)
        values.append(top.values)
        rows.append(top.indices + first)
    best = torch.topk(torch.cat(values, dim=1), SCALE_K, dim=1).indices
    exact = torch.gather(torch.cat(rows, dim=1), 1, best).cpu().numpy()
    return float(np.mean([len(set(a) & set(b)) / SCALE_K for a, b in zip(found, exact, strict=True)]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--model", default=None, help="encoder directory (default: the packaged all-MiniLM-L6-v2)")
    parser.add_argument("--passages", type=int, default=0, help="0: the whole bundled corpus")
    parser.add_argument("--questions", type=int, default=1000)
    parser.add_argument("--rollout-questions", type=int, default=200)
    parser.add_argument("--threads", type=int, help="CPU threads of both servers (default: their own)")
    parser.add_argument("--scale-rows", type=int, default=21_015_324, help="0 skips the scale run")
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--work-dir", type=Path, default=Path(tempfile.gettempdir()) / "dense_gpu_bench")
    args = parser.parse_args()
    args.model = args.model or shared.minilm_dir()
    args.work_dir.mkdir(parents=True, exist_ok=True)
    multihop = shared.read_jsonl(shared.REPO / "data" / "qa_multihop.jsonl")
    questions = [q["question"] for q in multihop][: args.questions]
    gold = {q["question"]: q["supporting_ids"] for q in multihop}
    report: dict = {"device": torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device}

    index_dir = build(args, multihop, report)
    cpu_reference(index_dir, questions, gold, report)
    serve(args, index_dir, questions, gold, report)
    if args.scale_rows:
        scale(args, report)

    c64 = "_c64_q1"
    headline = {
        "device": report["device"],
        "build_passages_per_s": report["build"]["passages_per_s"],
        "passage_cosine_to_cpu_fp32_min": report["cpu_fp32_reference"]["passage_cosine_min"],
        "qps_c64": report[f"ours{c64}"]["qps"],
        "naive_qps_c64": report[f"naive{c64}"]["qps"],
        "speedup_c64": round(report[f"ours{c64}"]["qps"] / report[f"naive{c64}"]["qps"], 2),
        "p99_c64_ms": report[f"ours{c64}"]["p99_ms"],
        "qps_c64_q32": report["ours_c64_q32"]["qps"],
        "naive_qps_c64_q32": report["naive_c64_q32"]["qps"],
        "rollout_speedup": round(report["ours_rollout"]["qps"] / report["naive_rollout"]["qps"], 2),
        "recall_at_3": report[f"ours{c64}"]["recall_at_3"],
        "naive_recall_at_3": report[f"naive{c64}"]["recall_at_3"],
        "cpu_fp32_recall_at_3": report["cpu_fp32_reference"]["recall_at_3"],
        **{f"scale_{key}": value for key, value in report.get("scale", {}).items()},
        "errors": sum(v.get("errors", 0) for v in report.values() if isinstance(v, dict)),
    }
    print(json.dumps(headline))


if __name__ == "__main__":
    main()
