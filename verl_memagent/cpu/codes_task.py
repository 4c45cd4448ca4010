"""A search task a tiny model can learn on CPU in minutes: access codes found only in their own passage.

Each made-up archive ("Kalomir") has one passage stating its access code (a common word); the
question asks for it. Nothing but retrieval gives the code, so a MemSearcher that searches for the
name, keeps the code in memory and answers `\\boxed{code}` scores F1 = 1; a valid format with a wrong
code scores 0.1 (`f1_with_format`).

A random model never writes that format, so `warm_start` first shows it the way: the real
MemSearcher agent loop plays scripted demonstrations against the real retriever, and a short
supervised pass on exactly the tokens the loop built (prompt contexts, masked responses) teaches the
format. Reinforcement learning (recipes/cpu/learn_codes.sh) then improves the sampled policy.
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import dataclass
from pathlib import Path

SYLLABLES = ("ka", "lo", "mir", "ven", "do", "sa", "ril", "tor", "ne", "ba", "gul", "fen", "zo", "pra", "mun", "tek")
CODES = (
    "river", "stone", "garden", "silver", "castle", "forest", "harbor", "meadow", "copper", "falcon", "island",
    "marble", "thunder", "winter", "summer", "valley", "mountain", "bridge", "temple", "lantern", "anchor",
    "canyon", "desert", "glacier", "orchard", "planet", "shadow", "spring", "tower", "violet", "willow", "ember",
)  # fmt: skip


@dataclass(frozen=True)
class Archive:
    name: str
    code: str

    @property
    def passage(self) -> str:
        return f'"{self.name}"\n{self.name} is an archive. The access code of {self.name} is {self.code}.'

    @property
    def question(self) -> str:
        return f"What is the access code of {self.name}?"


def make_archives(count: int, seed: int = 0) -> tuple[list[Archive], list[Archive]]:
    """Two disjoint sets of `count` archives: the task's, and the demonstrations' for the warm start.

    Names are distinct three-syllable words; codes are distinct within a set (count <= len(CODES)).
    """
    if not 0 < count <= len(CODES):
        raise ValueError(f"count must be in 1..{len(CODES)}, got {count}")
    rng = random.Random(seed)
    names: set[str] = set()
    while len(names) < 2 * count:
        names.add("".join(rng.choice(SYLLABLES) for _ in range(3)).capitalize())
    shuffled = rng.sample(sorted(names), 2 * count)
    sets = [shuffled[:count], shuffled[count:]]
    task, demos = ([Archive(n, c) for n, c in zip(part, rng.sample(CODES, count), strict=True)] for part in sets)
    return task, demos


def write_task(out: Path, count: int = 24, seed: int = 0, base_corpus: Path | None = None) -> dict[str, Path]:
    """Write `corpus.jsonl` (all archives' passages, then `base_corpus`), the task's questions `qa.jsonl`
    (FlashRAG format) and the demonstrations' `demos.jsonl` (name, code)."""
    out.mkdir(parents=True, exist_ok=True)
    task, demos = make_archives(count, seed)
    paths = {"corpus": out / "corpus.jsonl", "qa": out / "qa.jsonl", "demos": out / "demos.jsonl"}
    with paths["corpus"].open("w", encoding="utf-8") as f:
        for i, archive in enumerate(task + demos):
            f.write(json.dumps({"id": f"archive-{i}", "contents": archive.passage}) + "\n")
        if base_corpus is not None:
            f.write(base_corpus.read_text(encoding="utf-8"))
    with paths["qa"].open("w", encoding="utf-8") as f:
        for i, archive in enumerate(task):
            f.write(json.dumps({"id": f"code-{i}", "question": archive.question, "golden_answers": [archive.code]}))
            f.write("\n")
    with paths["demos"].open("w", encoding="utf-8") as f:
        for archive in demos:
            f.write(json.dumps({"name": archive.name, "code": archive.code}) + "\n")
    return paths


def demonstration(archive: Archive, eos_token: str, tool_name: str = "wikipedia_search") -> list[str]:
    """What a MemSearcher that knows the task writes: search, keep the code, answer (one text per call).

    Search and memory end at the loop's stop strings; the answer ends with `eos_token`, as a chat
    model's final turn does, so the model learns to stop there.
    """
    call = json.dumps({"name": tool_name, "arguments": {"query": f"{archive.name} access code"}})
    return [
        f"<think> I must look up {archive.name}. </think>\n<tool_call>{call}</tool_call>",
        f"<memory> The access code of {archive.name} is {archive.code}. </memory>",
        f"<think> My memory holds the code. </think>\n\\boxed{{{archive.code}}}{eos_token}",
    ]


def warm_start(
    model_dir: Path,
    out: Path,
    demos: Path,
    retriever_url: str,
    agent_loops_yaml: str,
    steps: int,
    lr: float = 2e-3,
    batch_size: int = 8,
    seed: int = 0,
) -> list[float]:
    """Train `model_dir` on MemSearcher demonstrations of the archives in `demos`; save to `out`."""
    import asyncio

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from verl_memagent.cpu.warm_start import scripted_samples, supervised_steps

    archives = [Archive(**json.loads(line)) for line in demos.read_text().splitlines()]
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    scripts = [(archive.question, demonstration(archive, tokenizer.eos_token)) for archive in archives]
    samples = asyncio.run(
        scripted_samples("memsearcher", scripts, tokenizer, agent_loops_yaml, 1024, 384, retriever_urls=retriever_url)
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    losses = supervised_steps(model, samples, steps, lr, batch_size, tokenizer.pad_token_id, seed)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return losses


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m verl_memagent.cpu.codes_task", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    task = sub.add_parser("task", help="write corpus.jsonl, qa.jsonl and demos.jsonl")
    task.add_argument("--out", type=Path, required=True)
    task.add_argument("--count", type=int, default=24, help="archives in the task (as many again for demos)")
    task.add_argument("--seed", type=int, default=0)
    task.add_argument("--base-corpus", type=Path, help="passages appended after the archives' (distractors)")
    warm = sub.add_parser("warm-start", help="supervised pass on scripted MemSearcher demonstrations")
    warm.add_argument("--model", type=Path, required=True)
    warm.add_argument("--out", type=Path, required=True)
    warm.add_argument("--demos", type=Path, required=True)
    warm.add_argument("--retriever", required=True, help="URL of the retriever serving the task's corpus")
    warm.add_argument("--agent-loops", required=True, help="agent-loop YAML with the memsearcher entry to play")
    warm.add_argument("--steps", type=int, default=200)
    warm.add_argument("--lr", type=float, default=2e-3)
    warm.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.command == "task":
        for name, path in write_task(args.out, args.count, args.seed, args.base_corpus).items():
            print(f"{name}: {path}")
        return 0
    losses = warm_start(args.model, args.out, args.demos, args.retriever, args.agent_loops, args.steps, args.lr)
    print(f"warm start: {len(losses)} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}; saved {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
