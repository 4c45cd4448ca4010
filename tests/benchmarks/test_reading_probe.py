"""`benchmarks/reading_probe.py`'s counts of what a policy wrote, against hand counts."""

from __future__ import annotations

import json

import reading_probe

QUESTION = (
    "Answer the following questions: What is the password of station held at gate conc?; "
    "What is the password of station mall at gate origin?"
)


def call(query: str) -> str:
    return '<tool_call>\n{"name": "wikipedia_search", "arguments": {"query": "' + query + '"}}\n</tool_call>'


def test_reading_counts_count_each_objectives_query_and_memory():
    written = [
        # the first door searched and kept; the memory then names a wrong password for the second door
        call("password of station held at gate conc")
        + "\n<memory> The password of station held at gate conc is seat. </memory>",
        call("password of station mall at gate origins")
        + "<memory> The password of station mall at gate origin is game. </memory>",
        "<think> done </think> \\boxed{ seat; game}",
    ]
    example = {
        "dataset": "held_out_k2",
        "question": QUESTION,
        "golden_answers": [["seat"], ["trib"]],
        "contexts": [{"response_text": text} for text in written],
    }
    other = {**example, "dataset": "held_out_k1", "contexts": [{"response_text": "\\boxed{ seat}"}]}
    counts = reading_probe.reading_counts([example, other])
    assert counts == {"held_out_k2": [1, 1, 2], "held_out_k1": [0, 0, 2]}


def test_task_doors_reads_one_door_questions_as_mem1_composes_them(tmp_path):
    record = {
        "id": "held_out-0",
        "question": "What is the password of station breed at gate expl?",
        "golden_answers": ["executive"],
    }
    (tmp_path / "held_out.jsonl").write_text(json.dumps(record) + "\n" + json.dumps(record) + "\n")
    doors = reading_probe.task_doors(tmp_path / "held_out.jsonl", 1)
    assert doors == [("Answer the following questions: " + record["question"], "breed", "expl", "executive")]
