"""Scores and per-turn context tokens of `evaluate()` on known trajectories, against hand-computed values.

A scripted policy plays a fixed multi-turn trajectory per agent through the real loops and the real
BM25 retriever, so answers, searches and turn boundaries are known exactly.
"""

from __future__ import annotations

import json
import socket

import pytest

from memagent_examples.scripted import ScriptedPolicy
from verl_memagent.agent import verl_sampling_params, verl_trainer_config
from verl_memagent.data.compose import compose_multi_objective, to_verl_rows
from verl_memagent.data.flashrag import QARecord
from verl_memagent.eval.cli import agent_settings
from verl_memagent.eval.records import contains_answer, score
from verl_memagent.eval.runner import EvalPlan, evaluate

RECORD = QARecord("q1", "What occupation was shared by David Yates and Pietro Germi?", ("director",), "multihop")
RECORD2 = QARecord("q2", "In which country was Pietro Germi born?", ("Italy",), "multihop")
TOOL_CALL = '<tool_call>{"name": "wikipedia_search", "arguments": {"query": "David Yates"}}</tool_call>'
# react and memsearcher: MemSearcher's format, each turn opened by the prompt's <think>
REACT = [" Yates first. </think>" + TOOL_CALL + "<|im_end|>", " Done. </think> \\boxed{film director}<|im_end|>"]
MEMSEARCHER = [TOOL_CALL, "<memory>Yates directs films.</memory>", " Known. </think> \\boxed{Director}<|im_end|>"]
MEM1 = ["<IS>Find Yates.</IS><search>David Yates</search>", "<IS>Both direct.</IS><answer>The director</answer>"]
#: per agent: the script, then (em, f1, acc) of its answer against the gold "director"
SCRIPTS = {
    # "film director": not exact, F1 = 2 * (1/2 * 1) / (1/2 + 1) = 2/3, contains the gold
    "react": (REACT, (0, 2 / 3, 1)),
    "memsearcher": (MEMSEARCHER, (1, 1, 1)),
    # articles are dropped by normalisation: "The director" is an exact match
    "mem1": (MEM1, (1, 1, 1)),
}


async def evaluate_one(agent: str, policy, tokenizer, retriever_url: str, out, row: dict | None = None) -> dict:
    """`evaluate()` of one agent on one row (default: RECORD's), greedy as verl validates."""
    plan = EvalPlan(
        [agent],
        agent_settings([agent], [], retriever_urls=retriever_url, max_turns=3, topk=2),
        verl_sampling_params(temperature=0.0, logprobs=False),
        verl_trainer_config(prompt_length=4096, response_length=4096),
        concurrency=1,
    )
    return await evaluate(policy, tokenizer, {"multihop": [row or to_verl_rows([RECORD], agent, "test")[0]]}, out, plan)


@pytest.mark.parametrize("agent", sorted(SCRIPTS))
async def test_scores_and_turn_tokens_of_a_known_trajectory(agent, tokenizer, retriever_url, tmp_path):
    script, (em, f1, acc) = SCRIPTS[agent]
    policy = ScriptedPolicy(tokenizer, script)
    summary = await evaluate_one(agent, policy, tokenizer, retriever_url, tmp_path)
    ends = [len(call["prompt_ids"]) + len(call["token_ids"]) for call in policy.calls]
    # a turn's context ends with its last call: memsearcher's first turn is the search and the memory rewrite
    turn_tokens = [ends[1], ends[2]] if agent == "memsearcher" else ends
    result = summary["agents"][agent]
    assert result["overall"] == {
        "n": 1,
        "em": em,
        "em_fraction": em,
        "f1": pytest.approx(f1),
        "acc": acc,
        "num_objectives": 1,
        "answered": 1.0,
        "mean_turns": 2,
        "mean_searches": 1,
        "retriever_errors": 0,
        "finish_reasons": {"answer": 1},
        "mean_peak_context_tokens": max(turn_tokens),
        "peak_context_tokens": max(turn_tokens),
    }
    assert result["context_tokens_per_turn"] == [
        {"turn": t + 1, "n": 1, "mean": tokens, "peak": tokens} for t, tokens in enumerate(turn_tokens)
    ]
    assert summary["plot"]["lines"][agent]["mean"] == turn_tokens


async def test_a_two_objective_task_sums_em_over_objectives(tokenizer, retriever_url, tmp_path):
    (row,) = compose_multi_objective([RECORD, RECORD2], 2, split="test", num_tasks=1)
    parts = {"director": "The director", "Italy": "Rome Italy"}  # EM 1 and 0; F1 1 and 2/3; both contain the gold
    answer = "; ".join(parts[golds[0]] for golds in row["reward_model"]["ground_truth"])
    policy = ScriptedPolicy(tokenizer, [MEM1[0], f"<IS>Both found.</IS><answer>{answer}</answer>"])
    summary = await evaluate_one("mem1", policy, tokenizer, retriever_url, tmp_path, row=row)
    (example,) = [json.loads(line) for line in (tmp_path / "examples.jsonl").read_text().splitlines()]
    assert example["golden_answers"] == [list(golds) for golds in row["reward_model"]["ground_truth"]]
    assert example["question"] == row["extra_info"]["question"]
    expected = {"em": 1.0, "em_fraction": 0.5, "f1": pytest.approx((1 + 2 / 3) / 2), "acc": 1.0, "num_objectives": 2}
    assert example["scores"] == expected
    overall = summary["agents"]["mem1"]["overall"]
    assert {key: overall[key] for key in expected} == expected
    ends = [len(call["prompt_ids"]) + len(call["token_ids"]) for call in policy.calls]
    assert (overall["mean_peak_context_tokens"], overall["peak_context_tokens"]) == (max(ends), max(ends))


ANSWERED = {"finish_reason": "answer", "penalised": False}


@pytest.mark.parametrize(
    ("fields", "ground_truth", "expected"),
    [
        # "x; wrong" on [[x], [y]]: one objective of two (not "a": normalisation drops articles)
        ({"final_response": "<answer>x; wrong</answer>"}, [["x"], ["y"]], (1.0, 0.5, 0.5, 0.5)),
        # parts are matched in order; extra parts are ignored
        ({"final_response": "<answer>y; x; z</answer>"}, [["x"], ["y"]], (0.0, 0.0, 0.0, 0.0)),
        # fewer parts than objectives: the missing ones score 0
        ({"final_response": "<answer>X</answer>"}, [["w", "x"], ["y"], ["z"], ["v"]], (1.0, 0.25, 0.25, 0.25)),
        # no valid answer (the loop ended on its turn limit): nothing is read
        ({"final_response": "<answer>x; y</answer>", "finish_reason": "max_turns"}, [["x"], ["y"]], (0, 0, 0, 0)),
        # a flat list of golds is one question
        ({"final_response": "<answer>x y</answer>"}, ["x"], (0.0, 0.0, 2 / 3, 1.0)),
    ],
)
def test_score_by_the_shape_of_the_ground_truth(fields, ground_truth, expected):
    prediction, scores = score({**ANSWERED, **fields}, ground_truth)
    em, em_fraction, f1, acc = expected
    objectives = len(ground_truth) if isinstance(ground_truth[0], list) else 1
    assert scores == {
        "em": em,
        "em_fraction": em_fraction,
        "f1": pytest.approx(f1),
        "acc": acc,
        "num_objectives": objectives,
    }
    assert prediction == (None if fields.get("finish_reason") else fields["final_response"][8:-9])


async def test_a_dead_retriever_fails_before_any_question(tokenizer, tmp_path):
    with socket.socket() as sock:  # a loopback port nobody listens on
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    policy = ScriptedPolicy(tokenizer, REACT)
    with pytest.raises(RuntimeError, match="no retriever answers /health.*--retriever"):
        await evaluate_one("react", policy, tokenizer, dead, tmp_path)
    assert policy.calls == [] and not (tmp_path / "examples.jsonl").exists()


def test_contains_answer_is_flashrags_acc():
    assert contains_answer("He was the Director of films.", ["director"]) == 1.0
    assert contains_answer("directors", ["Film Director"]) == 0.0
    assert contains_answer(None, ["director"]) == 0.0


def test_settings_apply_to_all_agents_or_one():
    settings = agent_settings(
        ["memsearcher", "react"], ["topk=5", "react.max_turns=7", "stop=[</a>]"], max_turns=3, retriever_urls=None
    )
    assert settings["memsearcher"] == {"max_turns": 3, "topk": 5, "stop": ["</a>"]}
    assert settings["react"] == {"max_turns": 7, "topk": 5, "stop": ["</a>"]}
    with pytest.raises(ValueError, match="KEY=VALUE"):
        agent_settings(["react"], ["topk"])
