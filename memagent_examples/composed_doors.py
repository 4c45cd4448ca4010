"""The password task composed, with doors no policy trained on: the papers' claim in miniature.

One question asks for the passwords of k doors ("Answer the following questions: What is the password
of station century at gate born?; What is ..."), composed by MEM1's `compose_multi_objective` and
scored by its sum-EM reward. Each door's password is stated in one passage, a 100-word passage of the
bundled Wikipedia corpus with the door's statement put in at a random sentence: wiki-18's passages are
100 words, and what a memory agent keeps of one (the statement) is a small part of what a full-history
agent keeps (the passage). So ReAct's context grows by a passage a search, a memory agent's by a line.

The doors come in four disjoint sets (`DoorSets`):
- `demos`: the warm start's scripted demonstrations (k drawn from `DEMO_OBJECTIVES`);
- `rl`: the questions reinforcement learning trains on;
- `held_out`: doors whose station and gate words the demonstrations use, never together; neither the
  warm start nor RL sees them: the sweep's evaluation;
- `unseen`: doors of station and gate words no training door uses: a second, harder column.

`write_door_sets` writes the corpus and one FlashRAG file per set; `demonstration_scripts` writes what
an agent that knows the task plays, in that agent's own format (`ModelFormat`), and `warm_start_agent`
trains a copy-pretrained tiny model on the contexts the real agent loop builds from them; the three agents'
warm starts at the defaults are shipped in `composed_starts/` (`SHIPPED_STARTS`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from memagent_examples.learn_codes.task import Door, single_token_words
from memagent_examples.learn_codes.warm_start import CopyRows
from memagent_examples.model_format import ModelFormat
from verl_memagent.data.compose import compose_multi_objective
from verl_memagent.data.flashrag import QARecord

SETS = ("demos", "rl", "held_out", "unseen")
#: objectives per demonstrated question: every k the sweep evaluates, 1 to 8; demonstrations of 1-3 alone
#: taught no policy to compose more doors (benchmarks/RESULTS.md, the papers' claim)
DEMO_OBJECTIVES = tuple(range(1, 9))
#: demonstrated questions per k, and the warm start's supervised steps: the tiny model learns to choose
#: the next door and keep several statements over thousands of steps, and its answers swing at a
#: constant lr, so the last third of the steps decays it to 0 (`--decay-steps`)
TASKS_PER_OBJECTIVE = 64
WARM_STEPS = 3000
#: words of real passage text around each door's statement (wiki-18's passage size)
PASSAGE_WORDS = 100
SEARCH_THOUGHT = "I must search for the next password."
#: copy rows of every copy-pretraining and warm-start step: the agents' contexts put the question some
#: 400 tokens in, where 128-token copy rows teach no copying (warm_start.distant_copy_batch)
COPY_ROWS = CopyRows(adjacent=8, distant=4)
#: answer rows of every warm-start step (`AnswerRows`)
ANSWER_ROWS = 32
#: verl's prompt and response room (recipes/cpu/composed_doors.yaml): ReAct's whole history at 8 objectives fits
PROMPT_LENGTH, RESPONSE_LENGTH = 1024, 6144
#: the warm starts the sweep's committed records grew from, one folder per agent (model, tokenizer and the
#: `build.json` of `warm_start_agent` at the defaults, seed 0): a warm start built on another CPU is another
#: model (`learn_codes.start`), and these took ~7 core-hours, so RL starts from them unless told to build
SHIPPED_STARTS = Path(__file__).resolve().parent / "composed_starts"


@dataclass(frozen=True)
class DoorSets:
    """Four disjoint sets of doors; see the module's docstring."""

    demos: tuple[Door, ...]
    rl: tuple[Door, ...]
    held_out: tuple[Door, ...]
    unseen: tuple[Door, ...]

    def of(self, name: str) -> tuple[Door, ...]:
        if name not in SETS:
            raise ValueError(f"door set: expected one of {SETS}, got {name!r}")
        return getattr(self, name)

    def trained_words(self) -> set[str]:
        """Station and gate words of the doors the warm start or RL sees."""
        return {word for door in self.demos + self.rl for word in (door.station, door.gate)}


def make_door_sets(
    words: Sequence[str],
    stations: int = 40,
    gates: int = 40,
    passwords: int = 8,
    rl: int = 96,
    held_out: int = 96,
    unseen_stations: int = 8,
    unseen_gates: int = 8,
    seed: int = 0,
) -> DoorSets:
    """`stations` x `gates` doors split into `rl`, `held_out` and the demonstrations' rest, plus the
    `unseen_stations` x `unseen_gates` doors of words no other door uses. Station, gate and password
    words are disjoint; every password is drawn at random from the `passwords` words."""
    needed = stations + gates + passwords + unseen_stations + unseen_gates
    if needed > len(words):
        raise ValueError(f"{len(words)} single-token words are too few for {needed}")
    if rl + held_out >= stations * gates:
        raise ValueError(f"rl + held_out = {rl + held_out} leave no demonstration doors of {stations * gates}")
    rng = random.Random(seed)
    chosen = iter(rng.sample(list(words), needed))
    station_words, gate_words = [next(chosen) for _ in range(stations)], [next(chosen) for _ in range(gates)]
    codes = [next(chosen) for _ in range(passwords)]
    new_stations, new_gates = (
        [next(chosen) for _ in range(unseen_stations)],
        [next(chosen) for _ in range(unseen_gates)],
    )
    known = [Door(s, g, rng.choice(codes)) for s in station_words for g in gate_words]
    rng.shuffle(known)
    unseen = [Door(s, g, rng.choice(codes)) for s in new_stations for g in new_gates]
    rng.shuffle(unseen)
    return DoorSets(
        demos=tuple(known[rl + held_out :]),
        rl=tuple(known[:rl]),
        held_out=tuple(known[rl : rl + held_out]),
        unseen=tuple(unseen),
    )


def passage_with(door: Door, filler: str, rng: random.Random, words: int = PASSAGE_WORDS) -> str:
    """The door's title, then the first `words` words of `filler` with its statement put in before one
    of its sentences, chosen at random (never after the cut last one); `words` 0: the statement alone."""
    if words == 0:
        return door.passage
    text = " ".join(filler.split()[:words])
    sentences = re.split(r"(?<=[.!?])\s+", text)
    at = rng.randrange(len(sentences))
    body = " ".join([*sentences[:at], door.statement, *sentences[at:]])
    return f'"station {door.station} gate {door.gate}"\n{body}'


def records(doors: Sequence[Door], prefix: str) -> list[QARecord]:
    """The doors' questions as FlashRAG records, ids `prefix-i`."""
    return [
        QARecord(id=f"{prefix}-{i}", question=door.question, golden_answers=(door.password,), source=prefix)
        for i, door in enumerate(doors)
    ]


def write_door_sets(
    out: Path, tokenizer, base_corpus: Path, seed: int = 0, passage_words: int = PASSAGE_WORDS, **sizes
) -> DoorSets:
    """Write `corpus.jsonl` (every door's passage, then `base_corpus` as distractors), one FlashRAG file
    `<set>.jsonl` per door set and `doors.json` (every set's doors); `sizes` go to `make_door_sets`."""
    out.mkdir(parents=True, exist_ok=True)
    sets = make_door_sets(single_token_words(tokenizer), seed=seed, **sizes)
    base = [json.loads(line)["contents"] for line in base_corpus.read_text(encoding="utf-8").splitlines()]
    fillers = [text.split("\n", 1)[-1] for text in base if len(text.split()) >= PASSAGE_WORDS]
    rng = random.Random(seed)
    with (out / "corpus.jsonl").open("w", encoding="utf-8") as corpus:
        for name in SETS:
            doors = sets.of(name)
            questions = records(doors, name)
            for record, door in zip(questions, doors, strict=True):
                passage = passage_with(door, rng.choice(fillers), rng, passage_words)
                corpus.write(json.dumps({"id": record.id, "contents": passage}) + "\n")
            with (out / f"{name}.jsonl").open("w", encoding="utf-8") as f:
                for record in questions:
                    row = {"id": record.id, "question": record.question, "golden_answers": list(record.golden_answers)}
                    f.write(json.dumps(row) + "\n")
        corpus.write(base_corpus.read_text(encoding="utf-8"))
    doors_json = {name: [door.__dict__ for door in sets.of(name)] for name in SETS}
    (out / "doors.json").write_text(json.dumps(doors_json, indent=1) + "\n")
    return sets


def read_door_sets(task_dir: Path) -> DoorSets:
    sets = json.loads((task_dir / "doors.json").read_text())
    return DoorSets(**{name: tuple(Door(**door) for door in sets[name]) for name in SETS})


def composed_texts(model: ModelFormat, doors: Sequence[Door]) -> list[str]:
    """What an agent that knows the task writes for a question on `doors`, in `model`'s format: one
    search per door in the question's order, each noting the statement it read (MemSearcher's memory
    after the search, MEM1's internal state before the next action), then every password, `;`-separated.
    The statements are restated word for word, so keeping one is copying it (see `learn_codes.task`)."""
    statements = [door.statement for door in doors]
    texts = []
    for i, door in enumerate(doors):
        notes = " ".join(statements[: i + 1] if "memory" in model.tags else statements[:i])
        texts += model.search(SEARCH_THOUGHT, f"password of {door.name}", notes)
    answer = " " + "; ".join(door.password for door in doors)
    return [*texts, model.answer(" ".join(statements), answer, " ".join(statements))]


def demonstration_scripts(
    model: ModelFormat,
    doors: Sequence[Door],
    tasks_per_objective: int,
    seed: int = 0,
    objectives: Sequence[int] = DEMO_OBJECTIVES,
) -> list[tuple[str, list[str]]]:
    """(question, texts) of `tasks_per_objective` composed questions for each k in `objectives`."""
    by_id = {record.id: door for record, door in zip(records(doors, "demos"), doors, strict=True)}
    pool = list(records(doors, "demos"))
    scripts = []
    for k in objectives:
        for row in compose_multi_objective(pool, k, seed=seed + k, num_tasks=tasks_per_objective):
            task_doors = [by_id[i] for i in row["extra_info"]["id"].split("+")]
            scripts.append((row["extra_info"]["question"], composed_texts(model, task_doors)))
    return scripts


@dataclass(frozen=True)
class AnswerRows:
    """Synthetic rows for an answer's last copy, in one agent's answer format: random tokens holding 1 to
    `statements` statements that end " is V." (as many as a demonstrated question asks), then the
    agent's answer opener (MemSearcher's `</think> \\boxed{`, MEM1's `</IS><answer>`) and the values in
    their order, `;`-separated, then its closer; labels on the answer only. Why: in a demonstration the
    password after the opener is one labelled token in hundreds, and a tiny model never finds that
    lookup from so rare a signal (teacher-forced, at chance after 600 warm-start steps, and after 400
    more on answer turns alone); rows that each end in one teach it (benchmarks/RESULTS.md, the papers'
    claim). Rows of at most 3 statements taught answers of at most 3: an answer of 8 passwords repeated
    one after the fourth until the call's tokens ran out."""

    statement_end: tuple[int, int]  # " is" and "."
    opener: tuple[int, ...]
    separator: tuple[int, ...]
    closer: tuple[int, ...]
    rows: int = ANSWER_ROWS
    statements: int = max(DEMO_OBJECTIVES)
    length: int = 96

    @classmethod
    def of(cls, model: ModelFormat, tokenizer, rows: int = ANSWER_ROWS) -> AnswerRows:
        text = model.answer("\x00", " \x01", "\x00")  # the format around a thought and an answer
        opener, closer = text[text.rindex("\x00") + 1 :].split(" \x01")
        ids = lambda part: tuple(tokenizer(part, add_special_tokens=False).input_ids)  # noqa: E731
        (is_id,), (stop,) = ids(" is"), ids(".")
        return cls((is_id, stop), ids(opener), ids(";"), ids(closer), rows)

    def batch(self, generator, vocab_size: int):
        """`rows` rows of `length` tokens and their labels (the answer and the closer)."""
        import torch

        from memagent_examples.learn_codes.warm_start import IGNORE

        input_ids = torch.randint(0, vocab_size, (self.rows, self.length), generator=generator)
        labels = torch.full_like(input_ids, IGNORE)
        is_id, stop = self.statement_end
        for row in range(self.rows):
            count = int(torch.randint(1, self.statements + 1, (1,), generator=generator))
            values = torch.randint(0, vocab_size, (count,), generator=generator).tolist()
            answer = [token for i, value in enumerate(values) for token in (*(self.separator if i else ()), value)]
            tail = [*self.opener, *answer, *self.closer]
            room = self.length - len(tail) - 3 * count  # the statements, 3 tokens each, before the tail
            starts = sorted(torch.randperm(room + 1, generator=generator)[:count].tolist())
            for shift, (start, value) in enumerate(zip(starts, values, strict=True)):
                input_ids[row, start + 3 * shift : start + 3 * shift + 3] = torch.tensor([is_id, value, stop])
            input_ids[row, -len(tail) :] = torch.tensor(tail)
            answered = len(answer) + len(self.closer)
            labels[row, -answered:] = input_ids[row, -answered:]
        return input_ids, labels

    def loss(self, model, generator):
        from memagent_examples.learn_codes.warm_start import labelled_loss

        return labelled_loss(model, *self.batch(generator, model.config.vocab_size))


def agent_format(agent: str, tokenizer, hf_model_type: str, agent_loops_yaml: str, retriever_url: str) -> ModelFormat:
    """The format of `agent` as the YAML configures it, read off a loop built the way verl builds it."""
    from verl_memagent.agent import instantiate_agent_loop, verl_trainer_config

    config = verl_trainer_config(prompt_length=PROMPT_LENGTH, response_length=RESPONSE_LENGTH)
    loop = instantiate_agent_loop(
        agent, config, None, tokenizer, hf_model_type, path=agent_loops_yaml, retriever_urls=retriever_url
    )
    return ModelFormat.of(loop)


def copy_pretrain(model_dir: Path, out: Path, steps: int, distant_steps: int, seed: int = 0) -> list[float]:
    """The tiny model after `steps` of copy pretraining on adjacent repeats (`warm_start.copy_pretraining`,
    as the main job's start), then `distant_steps` on `COPY_ROWS`, saved to `out`: the one starting point
    every agent's warm start continues from. Two phases because induction heads form on adjacent repeats
    (loss 8.3 -> 2.4 in 800 steps) and not on distant ones from a random model (16.7 -> 16.0 in 1,300)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from memagent_examples.learn_codes.warm_start import copy_pretraining

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    losses = copy_pretraining(model, steps, seed=seed)
    losses += copy_pretraining(model, distant_steps, seed=seed, rows=COPY_ROWS)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(out)
    return losses


def warm_start_agent(
    agent: str,
    model_dir: Path,
    out: Path,
    task_dir: Path,
    retriever_url: str,
    agent_loops_yaml: str,
    steps: int,
    tasks_per_objective: int = TASKS_PER_OBJECTIVE,
    lr: float = 1e-3,
    batch_size: int = 8,
    seed: int = 0,
    objectives: Sequence[int] = DEMO_OBJECTIVES,
    checkpoint_every: int = 0,
    answer_rows: int = ANSWER_ROWS,
    decay_steps: int = 0,
    resume_every: int = 100,
) -> list[float]:
    """`steps` supervised steps of `model_dir` (copy-pretrained) on `agent`'s demonstrations of the
    demonstration doors, played through the real agent loop against the real retriever; saved to `out`
    with its build record. The same steps, lr and batch for every agent. `checkpoint_every` > 0 also
    saves the model every that many steps to `out/step_N`, to find where a warm start starts to read.
    `decay_steps`: over the last that many steps the learning rate falls linearly to 0 (at a constant
    lr, what the policy answers swings from one checkpoint to the next; RESULTS, the papers' claim).
    `resume_every` > 0 keeps the run's whole state in `out/resume.pt` every that many steps, and a run
    started again with the same inputs resumes from it (`ResumePoint`); it is removed once `out` is saved."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from memagent_examples.learn_codes.start import BuildSaver, build_record, contexts_digest
    from memagent_examples.learn_codes.warm_start import ResumePoint, scripted_samples, supervised_steps

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    model_type = model.config.model_type
    model_format = agent_format(agent, tokenizer, model_type, agent_loops_yaml, retriever_url)
    demos = read_door_sets(task_dir).demos
    scripts = demonstration_scripts(model_format, demos, tasks_per_objective, seed, objectives)
    samples = asyncio.run(
        scripted_samples(
            agent,
            scripts,
            tokenizer,
            agent_loops_yaml,
            PROMPT_LENGTH,
            RESPONSE_LENGTH,
            model_type,
            retriever_urls=retriever_url,
        )
    )
    inputs = {"agent": agent, "seed": seed, "steps": steps, "lr": lr, "decay_steps": decay_steps}
    inputs |= {"batch_size": batch_size, "tasks_per_objective": tasks_per_objective, "objectives": list(objectives)}
    record = {**build_record(inputs, contexts_digest(samples[:64])), "samples": len(samples)}

    saver = BuildSaver(model, tokenizer, record, out, checkpoint_every)
    out.mkdir(parents=True, exist_ok=True)
    identity = {"inputs": record["inputs"], "contexts": record["contexts"]}
    resume = ResumePoint(out / "resume.pt", resume_every, identity) if resume_every else None
    losses = supervised_steps(
        model,
        samples,
        steps,
        lr,
        batch_size,
        tokenizer.pad_token_id,
        seed,
        extra_rows=(COPY_ROWS, AnswerRows.of(model_format, tokenizer, answer_rows)) if answer_rows else (COPY_ROWS,),
        after_step=saver.after_step,
        unpadded=True,
        decay_steps=decay_steps,
        resume=resume,
    )
    saver.save(out, steps)
    if resume:
        resume.path.unlink(missing_ok=True)
    return losses


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m memagent_examples.composed_doors", description=__doc__)
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
    warm = sub.add_parser("warm-start", help="supervised steps on one agent's demonstrations")
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
    args = parser.parse_args(argv)
    if args.command == "task":
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
        sets = write_door_sets(args.out, tokenizer, args.base_corpus, args.seed, args.passage_words)
        print(" ".join(f"{name}: {len(sets.of(name))} doors" for name in SETS))
    elif args.command == "copy-pretrain":
        losses = copy_pretrain(args.model, args.out, args.steps, args.distant_steps, args.seed)
        print(
            f"copy pretraining: {args.steps} + {args.distant_steps} steps,"
            f" loss {losses[0]:.3f} -> {losses[-1]:.3f}; saved {args.out}"
        )
    else:
        losses = warm_start_agent(
            args.agent,
            args.model,
            args.out,
            args.task,
            args.retriever,
            args.agent_loops,
            args.steps,
            args.tasks_per_objective,
            seed=args.seed,
            objectives=args.objectives,
            lr=args.lr,
            checkpoint_every=args.checkpoint_every,
            resume_every=args.resume_every,
            decay_steps=args.steps // 3 if args.decay_steps is None else args.decay_steps,
        )
        print(
            f"{args.agent} warm start: {len(losses)} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}; saved {args.out}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
