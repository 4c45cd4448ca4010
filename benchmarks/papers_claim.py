"""The papers' claim in miniature: does a memory agent keep its context flat as the task grows, and still answer?

MemSearcher, MEM1 and ReAct on the composed password task (`memagent_examples.composed_doors`): one
question asks for the passwords of k doors. The three agents start from one tiny model, copy-pretrained
once, then each is warm-started the same way (scripted demonstrations in its own format, the same
supervised steps) and trained with RL through verl's real trainer on the same budget
(`recipes/cpu/composed_doors.yaml`: two-objective questions on the RL doors, as MEM1 trains), under the
same limits (`recipes/cpu/composed_doors_agent_loops.yaml`). Before and after RL each agent is scored
greedily by `verl-memagent eval` on doors that neither the warm start nor RL saw, the dev split (`dev`:
known words in new pairs; `unseen`: words no training door used) and with `--test` the test split (words
no other set uses, scored for the final figures only), at k = 1, 2, 4, 8: EM per objective (MEM1's
metric), peak context tokens per trajectory, tokens prefilled and decoded per question, seconds per
question, turns and the share answered. `--regime fresh` trains in the papers' regime at CPU size
(`recipes/cpu/composed_doors_fresh.yaml`: every RL question new, k mixed, one update a step, dev
validation every few steps) and keeps each RL run's curves (`--curves`); `--settings NAME
--rl-override KEY=VALUE ...` name a variant of its settings for the search on the dev split.

RL starts from the warm starts shipped in `memagent_examples/composed_doors/starts/` (the ones the committed
records grew from: a warm start built on another CPU is another model, and the three cost ~7 core-hours);
`--start build` builds the tiny model, copy pretraining and warm starts under `--work` instead.

Every piece is cached under `--work` (the build once; each RL run and each scoring once), and each
cell's records go to `--results` as soon as it is scored, so an interrupted sweep resumes where it
stopped, on this machine or from the committed JSON on another (a cell whose records are there is not
run again). `--report` prints the table and draws the plot from the JSON alone. The machinery is
`memagent_examples.papers_claim`; what the sweep found: docs/papers_claim.md.

    python benchmarks/papers_claim.py --seeds 3 --work DIR [--lock FILE] [--start build]
    python benchmarks/papers_claim.py --regime fresh --seeds 3 --work DIR --test
    python benchmarks/papers_claim.py --report [--regime fresh]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from memagent_examples.composed_doors.warm_start import SHIPPED_STARTS, WARM_STEPS
from memagent_examples.papers_claim.records import AGENTS, REGIMES, RL_OBJECTIVES
from memagent_examples.papers_claim.report import report
from memagent_examples.papers_claim.sweep import Sweep, shipped_seed

RESULTS_DIR = Path(__file__).resolve().parent / "results"
#: each regime's records: MEM1's (before the dev and test splits existed) and the papers' regime's
RESULTS = {"mem1": RESULTS_DIR / "papers_claim.json", "fresh": RESULTS_DIR / "papers_claim_fresh.json"}


def agent_list(text: str) -> tuple[str, ...]:
    agents = tuple(text.split(","))
    if unknown := [agent for agent in agents if agent not in AGENTS]:
        raise argparse.ArgumentTypeError(f"unknown agent(s) {unknown}: choose from {','.join(AGENTS)}")
    return agents


def int_list(text: str) -> tuple[int, ...]:
    return tuple(int(n) for n in text.split(","))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=3, help="RL seeds 0..N-1 for every agent")
    parser.add_argument("--work", type=Path, help="where the build, RL runs and scorings are cached")
    parser.add_argument(
        "--results", type=Path, help="the records' JSON (read to resume); default: the regime's in benchmarks/results"
    )
    parser.add_argument(
        "--regime",
        choices=REGIMES,
        default="mem1",
        help="mem1: MEM1's recipe (k = 2 on the 96 RL doors, composed_doors.yaml); fresh: the papers' regime at CPU "
        "size (composed_doors_fresh.yaml: fresh doors, k = 1, 2, 4, 8, validated on the dev split)",
    )
    parser.add_argument("--settings", default="", help="a name for --rl-override's settings: a phase of its own")
    parser.add_argument(
        "--rl-override", action="append", default=[], help="a hydra override of the regime's recipe (repeatable)"
    )
    parser.add_argument(
        "--rl-agent-setting",
        action="append",
        default=[],
        help="agent.setting=value: an agent-loop setting RL trains under (e.g. memsearcher.action_rules=released; "
        "repeatable); evaluation keeps the composed loops' settings",
    )
    parser.add_argument("--test", action="store_true", help="also score the test split (for the final figures only)")
    parser.add_argument(
        "--curves", type=Path, default=RESULTS_DIR / "curves", help="where each RL run's curves are kept"
    )
    parser.add_argument(
        "--start",
        choices=("shipped", "build"),
        default="shipped",
        help="shipped: RL starts from memagent_examples/composed_doors/starts (the committed records' warm starts); "
        "build: build the tiny model, copy pretraining and warm starts under --work (~7 core-hours)",
    )
    parser.add_argument("--build-seed", type=int, help="--start build: the tiny model, the doors and the warm starts")
    parser.add_argument(
        "--copy-steps",
        type=int_list,
        help="--start build: copy pretraining steps on adjacent, then distant repeats (default 800,1500)",
    )
    parser.add_argument(
        "--warm-steps",
        type=int,
        help=f"--start build: supervised steps of every agent's warm start (default {WARM_STEPS}, "
        "the last third decaying the lr)",
    )
    parser.add_argument(
        "--agents",
        type=agent_list,
        default=AGENTS,
        help="a comma list of the agents to build and score (the others' cells wait for a later run)",
    )
    parser.add_argument(
        "--rl-objectives",
        type=int_list,
        default=RL_OBJECTIVES,
        help="objectives per RL question, a comma list (default 2, as MEM1 trains; e.g. 1,2,4,8 mixes every k, "
        "the experiment against RL at k = 2 unlearning larger k): its cells are phases of their own",
    )
    parser.add_argument("--lock", type=Path, help="a file to hold an exclusive flock on during each verl run")
    parser.add_argument("--report", action="store_true", help="only print the table and draw the plot")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.results = args.results or RESULTS[args.regime]
    if (args.settings or args.rl_override or args.rl_agent_setting) and args.regime == "mem1":
        parser.error("--settings, --rl-override and --rl-agent-setting are the papers' regime's: add --regime fresh")
    if not args.report:
        if args.work is None:
            parser.error("--work is required to run the sweep")
        built = {"build_seed": args.build_seed, "copy_steps": args.copy_steps, "warm_steps": args.warm_steps}
        given = {name: value for name, value in built.items() if value is not None}  # the rest: Sweep's defaults
        starts = SHIPPED_STARTS if args.start == "shipped" else None
        if starts and given:
            options = ", ".join("--" + name.replace("_", "-") for name in given)
            parser.error(f"{options}: settings of a build; add --start build, or leave them out")
        if starts:
            given = {"build_seed": shipped_seed(args.agents)}
        regime = {"regime": args.regime, "settings": args.settings, "rl_overrides": tuple(args.rl_override)}
        regime |= {"rl_agent_settings": tuple(args.rl_agent_setting)}
        regime |= {"test": args.test, "curves": args.curves}
        sweep = Sweep(
            args.work, args.results, lock=args.lock, rl_objectives=args.rl_objectives, starts=starts, **regime, **given
        )
        try:
            sweep.prepare(args.agents)
            sweep.sweep(args.seeds, args.agents)
        finally:
            if sweep.retriever is not None:
                sweep.retriever.stop()
    report(json.loads(args.results.read_text()), args.results.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
