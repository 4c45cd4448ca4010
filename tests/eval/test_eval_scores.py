"""Scores and per-turn context tokens of `evaluate()` on known trajectories, against hand-computed values.

A scripted policy plays a fixed multi-turn trajectory per agent through the real loops and the real
BM25 retriever, so answers, searches and turn boundaries are known exactly.
"""

from __future__ import annotations

import json
import socket

import pytest

from verl_memagent.agent import ScriptedPolicy, verl_trainer_config
from verl_memagent.data.prepare import QARecord
from verl_memagent.eval.cli import agent_settings
from verl_memagent.eval.records import contains_answer
from verl_memagent.eval.runner import evaluate, load_datasets

RECORD = QARecord("q1", "What occupation was shared by David Yates and Pietro Germi?", ("director",), "multihop")
TOOL_CALL = '<tool_call>{"name": "wikipedia_search", "arguments": {"query": "David Yates"}}</tool_call>'
REACT = ["<think>Yates first.</think><search>David Yates</search>", "<answer>film director</answer>"]
MEMSEARCHER = [TOOL_CALL, "<memory>Yates directs films.</memory>", "\\boxed{Director}<|im_end|>"]
MEM1 = ["<IS>Find Yates.</IS><search>David Yates</search>", "<IS>Both direct.</IS><answer>The director</answer>"]
#: per agent: the script, then (em, f1, acc) of its answer against the gold "director"
SCRIPTS = {
    # "film director": not exact, F1 = 2 * (1/2 * 1) / (1/2 + 1) = 2/3, contains the gold
    "react": (REACT, (0, 2 / 3, 1)),
    "memsearcher": (MEMSEARCHER, (1, 1, 1)),
    # articles are dropped by normalisation: "The director" is an exact match
    "mem1": (MEM1, (1, 1, 1)),
}


async def evaluate_one(agent: str, policy, tokenizer, retriever_url: str, out) -> dict:
    """`evaluate()` of one agent on RECORD, one question at a time, greedy as verl validates."""
    return await evaluate(
        policy,
        tokenizer,
        [agent],
        {"multihop": [RECORD]},
        out,
        settings=agent_settings([agent], [], retriever_urls=retriever_url, max_turns=3, topk=2),
        sampling_params={"temperature": 0.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": False},
        trainer_config=verl_trainer_config(prompt_length=4096, response_length=4096),
        concurrency=1,
    )


@pytest.mark.parametrize("agent", sorted(SCRIPTS))
async def test_scores_and_turn_tokens_of_a_known_trajectory(agent, tokenizer, eval_retriever_url, tmp_path):
    script, (em, f1, acc) = SCRIPTS[agent]
    policy = ScriptedPolicy(tokenizer, script)
    summary = await evaluate_one(agent, policy, tokenizer, eval_retriever_url, tmp_path)
    ends = [len(call["prompt_ids"]) + len(call["token_ids"]) for call in policy.calls]
    # a turn's context ends with its last call: memsearcher's first turn is the search and the memory rewrite
    turn_tokens = [ends[1], ends[2]] if agent == "memsearcher" else ends
    result = summary["agents"][agent]
    assert result["overall"] == {
        "n": 1,
        "em": em,
        "f1": pytest.approx(f1),
        "acc": acc,
        "answered": 1.0,
        "mean_turns": 2,
        "mean_searches": 1,
        "retriever_errors": 0,
        "finish_reasons": {"answer": 1},
    }
    assert result["context_tokens_per_turn"] == [
        {"turn": t + 1, "n": 1, "mean": tokens, "peak": tokens} for t, tokens in enumerate(turn_tokens)
    ]
    assert summary["plot"]["lines"][agent]["mean"] == turn_tokens


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


def test_datasets_are_named_limited_and_validated(data_dir, tmp_path):
    path = data_dir / "qa_bamboogle.jsonl"
    datasets = load_datasets([f"bamboo={path}", str(data_dir / "qa_multihop.jsonl")], limit=3)
    assert {name: len(records) for name, records in datasets.items()} == {"bamboo": 3, "qa_multihop": 3}
    assert datasets["bamboo"][0].question == json.loads(path.read_text().splitlines()[0])["question"]
    with pytest.raises(ValueError, match="given twice"):
        load_datasets([f"x={path}", f"x={path}"])
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "1", "question": "q?"}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1: field 'golden_answers'"):
        load_datasets([str(bad)])
