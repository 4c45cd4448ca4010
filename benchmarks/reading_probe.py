"""Does a composed-doors policy read? Three probes of the steps a right answer needs, each on its own.

A warm start that answers held-out doors at chance says nothing about where it fails. A right answer
takes three copies: the asked door from the question into the query, the door's password from a
retrieved passage into the memory, and that password from the memory into `\\boxed{}`. This measures
each one apart:

- `copy`: a model's accuracy at copying an 8-token segment seen `distance` tokens back, at a given
  position, in rows of random tokens (the raw skill copy pretraining teaches);
- `eval DIR`: of a `verl-memagent eval --agent memsearcher` run on composed questions, how many queries
  name the asked door and how many memories hold its password (written by the policy, not teacher-forced);
- `answer`: teacher-forced, the answer turn of a memory that holds the right statement and a think
  that restates it: is the model's next token after `\\boxed{` the password? On demonstration doors
  and held-out doors, so that a lookup never learned is told from one learned but not generalised.

    python benchmarks/reading_probe.py copy MODEL...
    python benchmarks/reading_probe.py eval EVAL_DIR...
    python benchmarks/reading_probe.py answer --template EVAL_DIR --task TASK_DIR MODEL...
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from memagent_examples.doors import Door

#: (row length, segment position, copy position): near and far copies, early and late in a row
COPY_PROBES = ((128, 20, 60), (128, 10, 110), (512, 50, 450), (1024, 100, 950), (1024, 900, 1000))
DOOR = re.compile(r"station (\S+) at gate (\S+?)\?")


def copy_accuracy(model, length: int, segment_at: int, copy_at: int, rows: int = 16, segment: int = 8) -> float:
    """Share of a repeated segment's tokens (all but its first) the model predicts, greedy."""
    import torch

    ids = torch.randint(10, model.config.vocab_size, (rows, length), generator=torch.Generator().manual_seed(0))
    ids[:, copy_at : copy_at + segment] = ids[:, segment_at : segment_at + segment]
    with torch.no_grad():
        predicted = model(input_ids=ids).logits[:, copy_at : copy_at + segment - 1].argmax(-1)
    return (predicted == ids[:, copy_at + 1 : copy_at + segment]).float().mean().item()


def reading_counts(examples: list[dict]) -> dict[str, list[int]]:
    """Per dataset: [queries naming the asked door, memories holding its password, objectives], over
    the examples of an eval run (`examples.jsonl`) of composed door questions."""
    counts: dict[str, list[int]] = {}
    for example in examples:
        written = " ".join(context["response_text"] for context in example["contexts"])
        tally = counts.setdefault(example["dataset"], [0, 0, 0])
        for (station, gate), gold in zip(DOOR.findall(example["question"]), example["golden_answers"], strict=True):
            door = f"station {station} at gate {gate}"
            tally[0] += re.search(rf'"query": "password of {door}\b', written) is not None
            tally[1] += re.search(rf"<memory>[^<]*{door} is {re.escape(gold[0])}\.", written) is not None
            tally[2] += 1
    return counts


def answer_hits(model, tokenizer, template: str, doors: list[tuple[str, str, str, str]]) -> int:
    """Of `doors` (question, station, gate, password), how many answer turns built on `template` (an answer
    turn's prompt) get the password as the greedy next token after the think and `\\boxed{`."""
    import torch

    hits = 0
    for question, station, gate, password in doors:
        statement = Door(station, gate, password).statement
        prompt = re.sub(r"<memory>.*?</memory>", f"<memory> {statement} </memory>", template, flags=re.S)
        prompt = re.sub(r"<question>.*?</question>", f"<question> {question} </question>", prompt, flags=re.S)
        ids = tokenizer(prompt + f"<think> {statement} </think> \\boxed{{", add_special_tokens=False).input_ids
        with torch.no_grad():
            token = int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax())
        hits += token == tokenizer(" " + password, add_special_tokens=False).input_ids[0]
    return hits


def task_doors(path: Path, count: int) -> list[tuple[str, str, str, str]]:
    """The first `count` one-door questions of a door set's FlashRAG file, as MEM1 composes one door."""
    doors = []
    for line in path.read_text().splitlines()[:count]:
        record = json.loads(line)
        station, gate = DOOR.findall(record["question"])[0]
        question = f"Answer the following questions: {record['question']}"
        doors.append((question, station, gate, record["golden_answers"][0]))
    return doors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="probe", required=True)
    sub.add_parser("copy").add_argument("models", nargs="+", type=Path)
    sub.add_parser("eval").add_argument("runs", nargs="+", type=Path)
    answer = sub.add_parser("answer")
    answer.add_argument("--template", type=Path, required=True, help="an eval run of memsearcher at k = 1")
    answer.add_argument("--task", type=Path, required=True, help="the directory `composed_doors task` wrote")
    answer.add_argument("--doors", type=int, default=48)
    answer.add_argument("models", nargs="+", type=Path)
    args = parser.parse_args(argv)
    if args.probe == "eval":
        for run in args.runs:
            examples = [json.loads(line) for line in (run / "examples.jsonl").read_text().splitlines()]
            for dataset, (queries, memories, total) in reading_counts(examples).items():
                named, held = f"{queries}/{total}", f"{memories}/{total}"
                print(f"{run} {dataset}: queries naming the door {named}, memory holding its password {held}")
        return 0
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    for path in args.models:
        model = AutoModelForCausalLM.from_pretrained(path).eval()
        if args.probe == "copy":
            cells = [
                f"d{copy - at}@{length}: {copy_accuracy(model, length, at, copy):.2f}"
                for length, at, copy in COPY_PROBES
            ]
            print(path, *cells)
            continue
        tokenizer = AutoTokenizer.from_pretrained(path)
        first = json.loads((args.template / "examples.jsonl").read_text().splitlines()[0])
        template = first["contexts"][-1]["prompt_text"]
        cells = []
        for name in ("demos", "held_out"):
            doors = task_doors(args.task / f"{name}.jsonl", args.doors)
            cells.append(f"{name} {answer_hits(model, tokenizer, template, doors)}/{len(doors)}")
        print(path, "answer token after \\boxed{ right:", *cells)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
