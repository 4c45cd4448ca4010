"""The `verl-memagent` command: one subcommand per job, each a thin wrapper over a module."""

from __future__ import annotations

import argparse
from pathlib import Path


def _doctor(args: argparse.Namespace) -> int:
    from verl_memagent.doctor import main

    return main(retriever=args.retriever)


def _tiny_model(args: argparse.Namespace) -> int:
    from verl_memagent.tiny_model import TinyModelSpec, save_tiny_model

    spec = TinyModelSpec(hidden_size=args.hidden_size, num_layers=args.num_layers, seed=args.seed)
    print(save_tiny_model(Path(args.out), spec=spec))
    return 0


def _prepare(args: argparse.Namespace) -> int:
    from verl_memagent.data.prepare import run_cli

    return run_cli(args)


def _eval(args: argparse.Namespace) -> int:
    from verl_memagent.eval.cli import run_cli

    return run_cli(args)


def _merge(args: argparse.Namespace) -> int:
    from verl_memagent.merge import merge

    print(merge(args.actor_dir, args.out, dtype=args.dtype))
    return 0


def _show(args: argparse.Namespace) -> int:
    from verl_memagent.trajectories.report import show

    print(show(args.paths, args.out, steps=args.steps, max_per_step=args.max_per_step))
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The `verl-memagent` parser: one subcommand per job, each with the function that runs it."""
    parser = argparse.ArgumentParser(prog="verl-memagent", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    doctor = sub.add_parser("doctor", help="check versions, plugin loading, GPUs and the retriever")
    doctor.add_argument("--retriever", metavar="URL", help="also check that this retriever answers /health")
    doctor.set_defaults(func=_doctor)

    tiny = sub.add_parser("tiny-model", help="build a tiny random Qwen2 + local tokenizer (CPU tests, recipes)")
    tiny.add_argument("--out", required=True, help="directory to save the model and tokenizer in")
    tiny.add_argument("--hidden-size", type=int, default=128)
    tiny.add_argument("--num-layers", type=int, default=2)
    tiny.add_argument("--seed", type=int, default=0)
    tiny.set_defaults(func=_tiny_model)

    from verl_memagent.data.prepare import add_arguments as add_prepare_arguments

    prepare = sub.add_parser("prepare", help="FlashRAG JSON lines -> verl parquet (train mix, eval sets, MEM1 tasks)")
    add_prepare_arguments(prepare)
    prepare.set_defaults(func=_prepare)

    from verl_memagent.eval.cli import add_arguments as add_eval_arguments

    evaluate = sub.add_parser("eval", help="run agents over FlashRAG datasets: EM/F1/acc, trajectories, context plot")
    add_eval_arguments(evaluate)
    evaluate.set_defaults(func=_eval)

    merge = sub.add_parser("merge", help="a checkpoint's actor (FSDP shards) -> a transformers model directory")
    merge.add_argument("actor_dir", help="the actor directory of a checkpoint: checkpoints/global_step_N/actor")
    merge.add_argument("--out", required=True, help="directory to write the model, config and tokenizer to")
    merge.add_argument(
        "--dtype",
        choices=["checkpoint", "float32", "bfloat16", "float16"],
        default="checkpoint",
        help="weights' dtype: as trained (default), or cast (verl's merger casts to bfloat16)",
    )
    merge.set_defaults(func=_merge)

    show = sub.add_parser("show", help="write one self-contained HTML page of trajectory records")
    show.add_argument("paths", nargs="+", metavar="PATH", help="a run dir, a trajectories/ dir or a .jsonl file")
    show.add_argument("--out", required=True, help="the HTML file to write")
    show.add_argument("--steps", default="all", help="'all' (default) or a comma list of steps, 'first', 'last'")
    show.add_argument("--max-per-step", type=int, metavar="N", help="the first N trajectories of each step")
    show.set_defaults(func=_show)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run `verl-memagent` with `argv` (default: the command line); returns the exit code."""
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
