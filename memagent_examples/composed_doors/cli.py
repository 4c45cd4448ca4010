"""`python -m memagent_examples.composed_doors task | copy-pretrain | warm-start`: the task's build, step by step."""

from __future__ import annotations

import argparse
from pathlib import Path

from memagent_examples import composed_doors
from memagent_examples.composed_doors.task import PASSAGE_WORDS, SETS
from memagent_examples.composed_doors.warm_start import DEMO_OBJECTIVES, TASKS_PER_OBJECTIVE, WARM_STEPS


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m memagent_examples.composed_doors", description=composed_doors.__doc__
    )
    sub = parser.add_subparsers(dest="command", required=True)
    task = sub.add_parser("task", help="write corpus.jsonl, doors.json and one FlashRAG file per door set")
    task.add_argument("--out", type=Path, required=True)
    task.add_argument("--tokenizer", type=Path, required=True, help="tokenizer directory (words are its tokens)")
    task.add_argument(
        "--base-corpus", type=Path, required=True, help="passages the statements go into, then distractors"
    )
    task.add_argument("--seed", type=int, default=0)
    task.add_argument("--passage-words", type=int, default=PASSAGE_WORDS, help="0: each statement alone")
    copy = sub.add_parser("copy-pretrain", help="copy pretraining of a tiny model, the agents' common start")
    copy.add_argument("--model", type=Path, required=True)
    copy.add_argument("--out", type=Path, required=True)
    copy.add_argument("--steps", type=int, default=800, help="steps on adjacent repeats (induction heads form)")
    copy.add_argument(
        "--distant-steps", type=int, default=1500, help="then steps on COPY_ROWS (copies at any distance)"
    )
    copy.add_argument("--seed", type=int, default=0)
    add_warm_start(sub.add_parser("warm-start", help="supervised steps on one agent's demonstrations"))
    return parser


def add_warm_start(warm: argparse.ArgumentParser) -> None:
    warm.add_argument("--agent", required=True, choices=("memsearcher", "mem1", "react"))
    warm.add_argument("--model", type=Path, required=True, help="the copy-pretrained model")
    warm.add_argument("--out", type=Path, required=True)
    warm.add_argument("--task", type=Path, required=True, help="the directory `task` wrote")
    warm.add_argument("--retriever", required=True, help="URL of the retriever serving the task's corpus")
    warm.add_argument("--agent-loops", required=True, help="agent-loop YAML with the agent's entry")
    warm.add_argument("--steps", type=int, default=WARM_STEPS)
    warm.add_argument("--tasks-per-objective", type=int, default=TASKS_PER_OBJECTIVE)
    warm.add_argument(
        "--objectives",
        type=lambda text: [int(k) for k in text.split(",")],
        default=list(DEMO_OBJECTIVES),
        help="objectives per demonstrated question, a comma list",
    )
    warm.add_argument("--lr", type=float, default=1e-3)
    warm.add_argument(
        "--decay-steps",
        type=int,
        help="over the last N steps the learning rate falls linearly to 0; default: a third of --steps; 0: constant",
    )
    warm.add_argument("--seed", type=int, default=0)
    warm.add_argument("--checkpoint-every", type=int, default=0, help="also save every N steps, to OUT/step_N")
    warm.add_argument(
        "--resume-every",
        type=int,
        default=100,
        help="keep the whole state in OUT/resume.pt every N steps; a run started again resumes there (0: never)",
    )


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "task":
        from transformers import AutoTokenizer

        from memagent_examples.composed_doors.task import write_door_sets

        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
        sets = write_door_sets(args.out, tokenizer, args.base_corpus, args.seed, args.passage_words)
        print(" ".join(f"{name}: {len(sets.of(name))} doors" for name in SETS))
        return 0
    from memagent_examples.composed_doors.warm_start import composed_options, copy_pretrain, warm_start_agent

    if args.command == "copy-pretrain":
        losses = copy_pretrain(args.model, args.out, args.steps, args.distant_steps, args.seed)
        print(
            f"copy pretraining: {args.steps} + {args.distant_steps} steps,"
            f" loss {losses[0]:.3f} -> {losses[-1]:.3f}; saved {args.out}"
        )
        return 0
    options = composed_options(
        args.steps,
        args.decay_steps,
        lr=args.lr,
        seed=args.seed,
        checkpoint_every=args.checkpoint_every,
        resume_every=args.resume_every,
    )
    where = (args.agent, args.model, args.out, args.task, args.retriever, args.agent_loops)
    losses = warm_start_agent(*where, options, args.tasks_per_objective, args.objectives)
    print(f"{args.agent} warm start: {len(losses)} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}; saved {args.out}")
    return 0
