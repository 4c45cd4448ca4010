"""How good is the learning demo's warm start after N demonstration steps? EM at every checkpoint of one run.

The learning demo (`recipes/cpu/learn_codes.sh`) stops its warm start early on purpose, so that RL has
something to reinforce and room to show it (docs/learn_codes.md). Where "early" lies moves with the code and
libraries the build depends on, so this measures it: one warm start of a build's tiny model on its
demonstrations (`task warm-start --checkpoint-every`, the demo's command; a checkpoint after N
steps is the model of a run of N steps), then `verl-memagent eval` of every checkpoint on the task's
questions, greedy and sampled, as the demo scores its policy. The baseline is the random model
(no demonstration steps). Prints one line per checkpoint, then one JSON object.

    START=build recipes/cpu/learn_codes.sh trainer.total_training_steps=1   # once, to build and cache the task
    python benchmarks/warm_start_sweep.py --build outputs/cpu/cache/learn_codes/<key> --every 25
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from shared import REPO

from memagent_examples.learn_codes.reward_curve import eval_em
from memagent_examples.retriever_process import ServerProcess, serve_command

AGENT_LOOPS = REPO / "recipes" / "cpu" / "learn_codes_agent_loops.yaml"
LENGTHS = ("--prompt-length", "512", "--response-length", "320")  # learn_codes.yaml's


def em(model: Path, build: Path, url: str, out: Path, samples: int) -> tuple[float, float]:
    """(greedy EM, sampled EM over `samples` passes) of `model` on the build's questions."""
    command = [
        "verl-memagent",
        "eval",
        "--agent",
        "memsearcher",
        "--model",
        str(model),
        "--tokenizer",
        str(build / "model"),
        "--agent-loops",
        str(AGENT_LOOPS),
        "--retriever",
        url,
        *LENGTHS,
    ]
    questions = str(build / "task" / "qa.jsonl")
    sampled = [arg for i in range(samples) for arg in ("--data", f"sample{i}={questions}")]
    runs = {"greedy": ["--data", f"codes={questions}"], "sampled": [*sampled, "--temperature", "1"]}
    scores = []
    for name, data in runs.items():
        subprocess.run([*command, *data, "--out", str(out / name)], check=True, capture_output=True)
        scores.append(eval_em(out / name / "summary.json"))
    return scores[0], scores[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--build", type=Path, required=True, help="a cached build of the learning demo (has task/, bm25/)"
    )
    parser.add_argument("--steps", type=int, default=400, help="demonstration steps of the run")
    parser.add_argument("--every", type=int, default=25, help="checkpoint and score every N steps")
    parser.add_argument("--copy-steps", type=int, default=800)
    parser.add_argument("--samples", type=int, default=4, help="sampled passes over the questions")
    parser.add_argument("--seed", type=int, default=0, help="the build's BUILD_SEED")
    parser.add_argument("--work", type=Path, help="output directory (default: a temporary one)")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="warm_start_sweep_"))
    server = ServerProcess(serve_command(args.build / "bm25", "--bm25-backend", "numpy"), timeout_s=120, cwd=REPO)
    try:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "memagent_examples.learn_codes.task",
                "warm-start",
                "--model",
                str(args.build / "model"),
                "--out",
                str(work / "warm"),
                "--demos",
                str(args.build / "task" / "demos.jsonl"),
                "--retriever",
                server.url,
                "--agent-loops",
                str(AGENT_LOOPS),
                "--copy-steps",
                str(args.copy_steps),
                "--steps",
                str(args.steps),
                "--seed",
                str(args.seed),
                "--checkpoint-every",
                str(args.every),
            ],
            check=True,
            cwd=REPO,
        )
        rows = []
        print("demonstration steps  EM greedy  EM sampled", flush=True)
        for steps in [0, *range(args.every, args.steps + 1, args.every)]:
            model = args.build / "model" if steps == 0 else work / "warm" / f"step_{steps}"
            greedy, sampled = em(model, args.build, server.url, work / f"eval_{steps}", args.samples)
            rows.append({"demonstration_steps": steps, "em_greedy": greedy, "em_sampled": sampled})
            print(f"{steps:19d}  {greedy:9.3f}  {sampled:10.3f}", flush=True)
    finally:
        server.stop()
    print(json.dumps({"build": str(args.build), "copy_steps": args.copy_steps, "rows": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
