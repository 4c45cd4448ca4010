"""The composed task's doors: six disjoint sets, their corpus and their questions (see the package's docstring)."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from memagent_examples.doors import Door, single_token_words, write_questions
from verl_memagent.data.flashrag import QARecord

#: the door sets in the corpus's order; the last two are drawn after the first four (which stay as they were)
SETS = ("demos", "rl", "dev", "unseen", "rl_pool", "test")
#: words of real passage text around each door's statement (wiki-18's passage size)
PASSAGE_WORDS = 100
#: the task's settings its RL recipes share: its `data` section is verl's prompt and response room, which
#: the warm start's contexts and the sweep's scoring share (ReAct's whole history at 8 objectives fits)
RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "cpu" / "composed_task.yaml"


def context_lengths(recipe: Path = RECIPE) -> tuple[int, int]:
    """verl's prompt and response lengths of the task, as its RL recipe sets them."""
    data = yaml.safe_load(recipe.read_text())["data"]
    return data["max_prompt_length"], data["max_response_length"]


PROMPT_LENGTH, RESPONSE_LENGTH = context_lengths()


@dataclass(frozen=True)
class DoorSets:
    """Six disjoint sets of doors; see the package's docstring."""

    demos: tuple[Door, ...]
    rl: tuple[Door, ...]
    dev: tuple[Door, ...]
    unseen: tuple[Door, ...]
    rl_pool: tuple[Door, ...]
    test: tuple[Door, ...]

    def of(self, name: str) -> tuple[Door, ...]:
        if name not in SETS:
            raise ValueError(f"door set: expected one of {SETS}, got {name!r}")
        return getattr(self, name)

    def trained_words(self) -> set[str]:
        """Station and gate words of the doors the warm start or RL sees."""
        return {word for door in self.demos + self.rl + self.rl_pool for word in (door.station, door.gate)}


def make_door_sets(
    words: Sequence[str],
    stations: int = 40,
    gates: int = 40,
    passwords: int = 8,
    rl: int = 96,
    dev: int = 96,
    unseen_stations: int = 8,
    unseen_gates: int = 8,
    pool_side: int = 40,
    test_side: int = 10,
    seed: int = 0,
) -> DoorSets:
    """`stations` x `gates` doors split into `rl`, `dev` and the demonstrations' rest, plus the
    `unseen_stations` x `unseen_gates` doors of words no other door uses; then, from words none of those
    use, the `pool_side` x `pool_side` doors of `rl_pool` and the `test_side` x `test_side` doors of
    `test`, drawn with a generator of their own so the first four sets are what they were before these
    two existed. Station, gate and password words are disjoint; every password is drawn at random from
    the `passwords` words."""
    needed = stations + gates + passwords + unseen_stations + unseen_gates
    if needed + 2 * (pool_side + test_side) > len(words):
        raise ValueError(f"{len(words)} single-token words are too few for {needed + 2 * (pool_side + test_side)}")
    if rl + dev >= stations * gates:
        raise ValueError(f"rl + dev = {rl + dev} leave no demonstration doors of {stations * gates}")
    rng = random.Random(seed)
    picked = rng.sample(list(words), needed)
    chosen = iter(picked)
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
    fresh = random.Random(f"fresh doors {seed}")
    rest = iter(fresh.sample(sorted(set(words) - set(picked)), 2 * (pool_side + test_side)))

    def grid(side: int) -> tuple[Door, ...]:
        sides = [next(rest) for _ in range(side)], [next(rest) for _ in range(side)]
        doors = [Door(s, g, fresh.choice(codes)) for s in sides[0] for g in sides[1]]
        fresh.shuffle(doors)
        return tuple(doors)

    return DoorSets(
        demos=tuple(known[rl + dev :]),
        rl=tuple(known[:rl]),
        dev=tuple(known[rl : rl + dev]),
        unseen=tuple(unseen),
        rl_pool=grid(pool_side),
        test=grid(test_side),
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
            for i, door in enumerate(doors):
                passage = passage_with(door, rng.choice(fillers), rng, passage_words)
                corpus.write(json.dumps({"id": f"{name}-{i}", "contents": passage}) + "\n")
            write_questions(out / f"{name}.jsonl", doors, name)
        corpus.write(base_corpus.read_text(encoding="utf-8"))
    doors_json = {name: [door.__dict__ for door in sets.of(name)] for name in SETS}
    (out / "doors.json").write_text(json.dumps(doors_json, indent=1) + "\n")
    return sets


def read_door_sets(task_dir: Path) -> DoorSets:
    sets = json.loads((task_dir / "doors.json").read_text())
    return DoorSets(**{name: tuple(Door(**door) for door in sets[name]) for name in SETS})


def fresh_rl_rows(doors: Sequence[Door], agent: str, objectives: Sequence[int], tasks: int, seed: int) -> list[dict]:
    """verl rows of `tasks` RL questions, the k of each cycling through `objectives`, their doors dealt from
    one seeded shuffle of `doors`: no door is asked twice, so remembering a door's password is worth nothing
    (the papers' regime: every question new). Each row's `data_source` is `multi_objective_<k>`."""
    from verl_memagent.data.compose import compose_multi_objective

    pool = records(doors, "rl_pool")
    order = list(range(len(pool)))
    random.Random(seed).shuffle(order)
    ks = [objectives[i % len(objectives)] for i in range(tasks)]
    if sum(ks) > len(pool):
        raise ValueError(f"{tasks} questions of k in {list(objectives)} need {sum(ks)} doors; the pool has {len(pool)}")
    rows, dealt = [], iter(order)
    for index, k in enumerate(ks):
        task = [pool[next(dealt)] for _ in range(k)]
        (row,) = compose_multi_objective(task, k, agent=agent, split="train", seed=seed + index, num_tasks=1)
        row["extra_info"]["index"] = index
        rows.append(row)
    return rows
