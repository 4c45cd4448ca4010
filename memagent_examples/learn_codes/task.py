"""A search task a tiny model can learn on CPU in minutes: passwords found only in their own passage.

Each door of a made-up station ("station century at gate born") has one passage stating its
password ("album"); the question asks for it. Nothing but retrieval gives the password, so a
MemSearcher that searches for the door, keeps the password in memory and answers `\\boxed{ album}`
scores F1 = 1; a valid format with a wrong password scores 0.1 (`f1_with_format`).

Stations, gates and passwords are words the tokenizer writes as one token after a space, and every
door's password is drawn at random. The warm start's demonstrations and the task use disjoint doors
(station x gate pairs), and there are so many demonstration doors (1,584 of 40 x 40) that
remembering their passwords is harder than reading them: the model has to learn to copy. The
demonstrated memory and final thought restate the passage's sentence word for word ("The password
of station century at gate born is album."), so copying is continuing a repeat, which is what
copy pretraining teaches a random model. With 8 stations x 6 gates and a memory that paraphrased
("The password is album.") the warm-started model remembered the 32 demonstration doors' passwords
instead and answered the task at chance (docs/learn_codes.md).

A random model never writes the format, so `warm_start` first shows it the way: the real MemSearcher
agent loop plays scripted demonstrations against the real retriever, and a short supervised pass on
exactly the tokens the loop built (prompt contexts, masked responses) teaches format and reading.
Reinforcement learning (recipes/cpu/learn_codes.sh) then improves the sampled policy on the task's
doors.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from memagent_examples.doors import Door, single_token_words, write_questions

if TYPE_CHECKING:
    from memagent_examples.warm_start import WarmStartOptions


def make_doors(
    words: list[str], stations: int = 40, gates: int = 40, passwords: int = 8, task_count: int = 16, seed: int = 0
) -> tuple[list[Door], list[Door]]:
    """All `stations` x `gates` doors, split into the task's `task_count` and the demonstrations' rest.

    Stations, gates and passwords are disjoint sets of `words`; each door's password is drawn at random.
    """
    doors = stations * gates
    if min(stations, gates, passwords) < 1 or not 0 < task_count < doors:
        raise ValueError(f"need at least one station, gate and password, and 0 < task_count < {doors} doors")
    if stations + gates + passwords > len(words):
        raise ValueError(f"{len(words)} single-token words are too few for {stations + gates + passwords}")
    rng = random.Random(seed)
    chosen = rng.sample(words, stations + gates + passwords)
    names, gate_names, codes = chosen[:stations], chosen[stations : stations + gates], chosen[stations + gates :]
    all_doors = [Door(s, g, rng.choice(codes)) for s in names for g in gate_names]
    rng.shuffle(all_doors)
    return all_doors[:task_count], all_doors[task_count:]


def held_out_doors(
    words: list[str], doors: list[Door], stations: int = 12, gates: int = 8, seed: int = 0
) -> list[Door]:
    """`stations` x `gates` doors of station and gate words that none of `doors` uses, with their passwords:
    questions whose door names the warm start and RL never saw. Drawn with a generator of their own, so
    the task's and the demonstrations' doors stay what they were for the same seed."""
    used = {word for door in doors for word in (door.station, door.gate, door.password)}
    free = [word for word in words if word not in used]
    if stations + gates > len(free):
        raise ValueError(f"{len(free)} unused single-token words are too few for {stations + gates}")
    rng = random.Random(f"held-out:{seed}")
    chosen = rng.sample(free, stations + gates)
    codes = sorted({door.password for door in doors})
    return [Door(s, g, rng.choice(codes)) for s in chosen[:stations] for g in chosen[stations:]]


def write_task(out: Path, tokenizer, seed: int = 0, base_corpus: Path | None = None, **sizes) -> dict[str, Path]:
    """Write `corpus.jsonl` (every door's passage, then `base_corpus`), the task's questions `qa.jsonl`
    and the held-out doors' `held_out.jsonl` (FlashRAG format; `held_out_doors`), and the demonstrations'
    doors `demos.jsonl`; `sizes` go to `make_doors`."""
    out.mkdir(parents=True, exist_ok=True)
    words = single_token_words(tokenizer)
    task, demos = make_doors(words, seed=seed, **sizes)
    held_out = held_out_doors(words, task + demos, seed=seed)
    paths = {name: out / f"{name}.jsonl" for name in ("corpus", "qa", "held_out", "demos")}
    with paths["corpus"].open("w", encoding="utf-8") as f:
        for i, door in enumerate(task + demos):
            f.write(json.dumps({"id": f"door-{i}", "contents": door.passage}) + "\n")
        for i, door in enumerate(held_out):
            f.write(json.dumps({"id": f"held-out-{i}", "contents": door.passage}) + "\n")
        if base_corpus is not None:
            f.write(base_corpus.read_text(encoding="utf-8"))
    write_questions(paths["qa"], task, "door")
    write_questions(paths["held_out"], held_out, "held-out")
    with paths["demos"].open("w", encoding="utf-8") as f:
        for door in demos:
            f.write(json.dumps(asdict(door)) + "\n")
    return paths


def demonstration(door: Door, eos_token: str, tool_name: str = "wikipedia_search") -> list[str]:
    """What a MemSearcher that knows the task writes: search, keep the password, answer (one text per call).

    Station, gate and password always follow a space, so each is the same single token wherever it
    appears. Search and memory end at the loop's stop strings; the answer ends with `eos_token`, as
    a chat model's final turn does, so the model learns to stop there.
    """
    query = f"password of {door.name}"
    call = json.dumps({"name": tool_name, "arguments": {"query": query}})
    return [
        f"<think> I must search for the password. </think>\n<tool_call>{call}</tool_call>",
        f"<memory> {door.statement} </memory>",
        f"<think> {door.statement} </think>\n\\boxed{{ {door.password}}}{eos_token}",
    ]


def warm_start(
    model_dir: Path, out: Path, demos: Path, retriever_url: str, agent_loops_yaml: str, options: WarmStartOptions
) -> list[float]:
    """Copy pretraining (`options.copy_steps`), then MemSearcher demonstrations of the doors in `demos`;
    saved to `out` with its build record, which digests the contexts of the first `DIGESTED_DOORS`."""
    from memagent_examples.build_records import contexts_digest
    from memagent_examples.copy_rows import CopyRows
    from memagent_examples.learn_codes.start import DIGESTED_DOORS
    from memagent_examples.warm_start import Demonstrations
    from memagent_examples.warm_start import warm_start as build_warm_start

    doors = [Door(**json.loads(line)) for line in demos.read_text().splitlines()]

    def demonstrate(tokenizer, model_type: str) -> Demonstrations:
        samples = demonstration_samples(doors, tokenizer, agent_loops_yaml, retriever_url, model_type)
        digested = demonstration_samples(doors[:DIGESTED_DOORS], tokenizer, agent_loops_yaml, retriever_url, model_type)
        contexts = {"doors": DIGESTED_DOORS, "sha256": contexts_digest(digested)}
        return Demonstrations(samples, contexts, extra_rows=(CopyRows(adjacent=16),))

    return build_warm_start(model_dir, out, demonstrate, options)


def demonstration_samples(
    doors: list[Door], tokenizer, agent_loops_yaml: str, retriever_url: str, hf_model_type: str
) -> list[tuple[list[int], list[int]]]:
    """The (input ids, labels) the MemSearcher loop builds while playing each door's demonstration."""
    import asyncio

    from memagent_examples.warm_start import scripted_samples

    scripts = [(door.question, demonstration(door, tokenizer.eos_token)) for door in doors]
    return asyncio.run(
        scripted_samples(
            "memsearcher", scripts, tokenizer, agent_loops_yaml, 1024, 384, hf_model_type, retriever_urls=retriever_url
        )
    )


#: the kinds of file the build's code is written in
CODE = {".py", ".yaml", ".jinja"}


def build_key(inputs: dict, files: list[Path]) -> str:
    """A digest of what the task and its warm start are built from: `inputs` (seed, steps, ...), the
    `files` given, the code that builds the tiny model, the task, the retriever's answers and the agent
    loop's contexts (not a shipped warm start's files: a folder with a build record), and the versions of
    `build_records.LIBRARIES`. Equal digests, equal builds: the learning demo reuses a cached build under its key."""
    from importlib.metadata import version

    import memagent_examples
    import retriever_server
    import verl_memagent
    from memagent_examples.build_records import LIBRARIES, RECORD

    package = Path(verl_memagent.__file__).parent
    sources = [package / "agent", package / "search", package / "tiny_model.py"]
    sources += [Path(retriever_server.__file__).parent, Path(memagent_examples.__file__).parent]
    files_under = [p for root in sources for p in ([root] if root.is_file() else root.rglob("*"))]
    starts = {p.parent for p in files_under if p.name == RECORD}
    code = sorted(p for p in files_under if p.suffix in CODE and not starts & set(p.parents))
    digest = hashlib.sha256(json.dumps({**inputs, **{lib: version(lib) for lib in LIBRARIES}}).encode())
    for path in [*code, *files]:
        digest.update(f"{path.name}\0".encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m memagent_examples.learn_codes.task", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    task = sub.add_parser("task", help="write corpus.jsonl, qa.jsonl, held_out.jsonl and demos.jsonl")
    task.add_argument("--out", type=Path, required=True)
    task.add_argument("--tokenizer", type=Path, required=True, help="tokenizer directory (words are its tokens)")
    task.add_argument("--stations", type=int, default=40)
    task.add_argument("--gates", type=int, default=40, help="gates per station")
    task.add_argument("--passwords", type=int, default=8, help="distinct passwords")
    task.add_argument("--task-doors", type=int, default=16, help="doors asked about; the others are demonstrated")
    task.add_argument("--seed", type=int, default=0)
    task.add_argument("--base-corpus", type=Path, help="passages appended after the doors' (distractors)")
    warm = sub.add_parser("warm-start", help="supervised pass on scripted MemSearcher demonstrations")
    warm.add_argument("--model", type=Path, required=True)
    warm.add_argument("--out", type=Path, required=True)
    warm.add_argument("--demos", type=Path, required=True)
    warm.add_argument("--retriever", required=True, help="URL of the retriever serving the task's corpus")
    warm.add_argument("--agent-loops", required=True, help="agent-loop YAML with the memsearcher entry to play")
    warm.add_argument("--copy-steps", type=int, default=800, help="copy pretraining steps before the demonstrations")
    warm.add_argument("--steps", type=int, default=400, help="supervised steps on the demonstrations")
    warm.add_argument("--lr", type=float, default=1e-3)
    warm.add_argument("--seed", type=int, default=0)
    warm.add_argument("--checkpoint-every", type=int, default=0, help="also save every N demonstration steps")
    key = sub.add_parser("build-key", help="print the digest a cached task and warm start are reused under")
    key.add_argument("--input", action="append", default=[], metavar="NAME=VALUE", help="an input; repeat")
    key.add_argument("--file", type=Path, action="append", default=[], help="a file the build reads; repeat")
    args = parser.parse_args(argv)
    if args.command == "build-key":
        print(build_key(dict(item.partition("=")[::2] for item in args.input), args.file))
        return 0
    if args.command == "task":
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
        sizes = {"stations": args.stations, "gates": args.gates, "passwords": args.passwords}
        sizes["task_count"] = args.task_doors
        for name, path in write_task(args.out, tokenizer, args.seed, args.base_corpus, **sizes).items():
            print(f"{name}: {path}")
        return 0
    from memagent_examples.warm_start import WarmStartOptions

    options = WarmStartOptions(
        args.steps, args.lr, seed=args.seed, copy_steps=args.copy_steps, checkpoint_every=args.checkpoint_every
    )
    losses = warm_start(args.model, args.out, args.demos, args.retriever, args.agent_loops, options)
    print(f"warm start: {len(losses)} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}; saved {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
