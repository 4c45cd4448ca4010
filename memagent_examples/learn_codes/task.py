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
instead and answered the task at chance (docs/main_job.md).

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
from dataclasses import asdict, dataclass
from pathlib import Path

from retriever_server.bm25 import terms

TASK_WORDS = ("password", "station", "gate")


@dataclass(frozen=True)
class Door:
    """One gate of a made-up station, whose password only its own passage states."""

    station: str
    gate: str
    password: str

    @property
    def name(self) -> str:
        return f"station {self.station} at gate {self.gate}"

    @property
    def statement(self) -> str:
        return f"The password of {self.name} is {self.password}."

    @property
    def passage(self) -> str:
        return f'"station {self.station} gate {self.gate}"\n{self.statement}'

    @property
    def question(self) -> str:
        return f"What is the password of {self.name}?"


def single_token_words(tokenizer) -> list[str]:
    """Lower-case words of four letters or more that `tokenizer` writes as one token after a space,
    one per BM25 term (so a query for one finds no other: "seasons" and "season" stem alike), none a
    stop word or one of the task's own words; sorted."""
    words = {token[1:] for token in tokenizer.get_vocab() if token.startswith("Ġ")}
    words = sorted(w for w in words if len(w) >= 4 and w.isascii() and w.isalpha() and w.islower())
    words = [w for w in words if len(tokenizer.encode(" " + w)) == 1]
    taken = {term for (term,) in terms(list(TASK_WORDS))}
    kept = []
    for word, word_terms in zip(words, terms(words), strict=True):
        if len(word_terms) == 1 and word_terms[0] not in taken:
            taken.add(word_terms[0])
            kept.append(word)
    return kept


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
    for name, doors in (("qa", task), ("held_out", held_out)):
        prefix = "door" if name == "qa" else "held-out"
        with paths[name].open("w", encoding="utf-8") as f:
            for i, door in enumerate(doors):
                row = {"id": f"{prefix}-{i}", "question": door.question, "golden_answers": [door.password]}
                f.write(json.dumps(row) + "\n")
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
    model_dir: Path,
    out: Path,
    demos: Path,
    retriever_url: str,
    agent_loops_yaml: str,
    steps: int,
    lr: float = 1e-3,
    batch_size: int = 8,
    seed: int = 0,
    copy_steps: int = 800,
    checkpoint_every: int = 0,
) -> list[float]:
    """Copy pretraining, then MemSearcher demonstrations of the doors in `demos`; save to `out`, with
    its build record (`start.build_record`). `checkpoint_every` > 0 also saves the model every that
    many demonstration steps, to `out/step_N`: the same models as runs of N steps (no schedule
    depends on the step count)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from memagent_examples.learn_codes.start import DIGESTED_DOORS, BuildSaver, build_record, contexts_digest
    from memagent_examples.learn_codes.warm_start import CopyRows, copy_pretraining, supervised_steps

    doors = [Door(**json.loads(line)) for line in demos.read_text().splitlines()]
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    model_type = model.config.model_type
    samples = demonstration_samples(doors, tokenizer, agent_loops_yaml, retriever_url, model_type)
    digested = demonstration_samples(doors[:DIGESTED_DOORS], tokenizer, agent_loops_yaml, retriever_url, model_type)
    inputs = {"seed": seed, "copy_steps": copy_steps, "steps": steps, "lr": lr, "batch_size": batch_size}
    record = build_record(inputs, contexts_digest(digested))

    saver = BuildSaver(model, tokenizer, record, out, checkpoint_every)
    copy_losses = copy_pretraining(model, copy_steps, seed=seed)
    print(f"copy pretraining: {copy_steps} steps, loss {copy_losses[0]:.3f} -> {copy_losses[-1]:.3f}")

    losses = supervised_steps(
        model, samples, steps, lr, batch_size, tokenizer.pad_token_id, seed, (CopyRows(adjacent=16),), saver.after_step
    )
    saver.save(out, steps)
    return losses


def demonstration_samples(
    doors: list[Door], tokenizer, agent_loops_yaml: str, retriever_url: str, hf_model_type: str
) -> list[tuple[list[int], list[int]]]:
    """The (input ids, labels) the MemSearcher loop builds while playing each door's demonstration."""
    import asyncio

    from memagent_examples.learn_codes.warm_start import scripted_samples

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
    `start.LIBRARIES`. Equal digests, equal builds: the main job reuses a cached build under its key."""
    from importlib.metadata import version

    import memagent_examples
    import retriever_server
    import verl_memagent
    from memagent_examples.learn_codes.start import LIBRARIES, RECORD

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
    losses = warm_start(
        args.model,
        args.out,
        args.demos,
        args.retriever,
        args.agent_loops,
        args.steps,
        args.lr,
        seed=args.seed,
        copy_steps=args.copy_steps,
        checkpoint_every=args.checkpoint_every,
    )
    print(f"warm start: {len(losses)} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}; saved {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
