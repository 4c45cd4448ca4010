"""MemSearcher's reward, score for score against the released reward run on the released rollout.

fixtures/released_rollouts.json (`rewards`) holds scripted trajectories, mostly one answer turn of every
kind the released reward treats differently from a strict format rule (several boxes, extra think
blocks, text after the box, empty and brace-less boxes, no end-of-turn token, answers written in a
memory rewrite, ...), each with the score the released reward manager and `re_call.py` gave its final
row. Our loop plays the same outputs with its default settings and `f1_with_format` scores its record.
A property test feeds random answer turns built from the grammar's pieces to the same path.
"""

import json
from pathlib import Path

import pytest
from agent_helpers import QUESTION
from hypothesis import given, settings
from hypothesis import strategies as st
from test_released_rollouts import TOPK, script

from memagent_examples.scripted import ScriptedPolicy
from verl_memagent.agent.trajectory import Context
from verl_memagent.reward.scores import FORMAT_ONLY_REWARD, f1_with_format

REWARDS = json.loads((Path(__file__).parent / "fixtures" / "released_rollouts.json").read_text())["rewards"]


def test_at_least_forty_answer_turns():
    assert len(REWARDS) >= 40
    assert {0.0, FORMAT_ONLY_REWARD, 1.0} <= {case["score"] for case in REWARDS}


@pytest.mark.parametrize("case", REWARDS, ids=lambda case: case["name"])
async def test_reward_is_the_released_one(run_released, qwen_tokenizer, case):
    policy = ScriptedPolicy(qwen_tokenizer, script(case["outputs"]))
    outputs = await run_released("memsearcher", policy, QUESTION, topk=TOPK, max_turns=case["max_turns"])
    assert len(outputs) == case["contexts"] and len(policy.calls) == len(case["outputs"])
    reward = f1_with_format("nq", "", case["golds"], dict(outputs[-1].extra_fields))
    assert reward["score"] == pytest.approx(case["score"]), case["reason"]


#: name -> (released score, score under `action_rules: strict`): where the project's rule differs
STRICT = {
    "second_think": (1.0, 0.0),  # one think block at most
    "two_boxes_last_right": (1.0, 0.0),  # exactly one box
    "space_box": (1.0, 0.0),  # `\\boxed{}` only
    "empty_box": (0.1, 0.0),  # a non-empty answer
    "cut_by_length": (0.0, 1.0),  # the strict rule ignores the end of the turn
    "correct": (1.0, 1.0),
}


@pytest.mark.parametrize("name", STRICT)
async def test_strict_rules_are_a_named_option(run_released, qwen_tokenizer, name):
    (case,) = [case for case in REWARDS if case["name"] == name]
    released, strict = STRICT[name]
    assert case["score"] == pytest.approx(released)
    policy = ScriptedPolicy(qwen_tokenizer, script(case["outputs"]))
    outputs = await run_released("memsearcher", policy, QUESTION, action_rules="strict")
    assert f1_with_format("nq", "", case["golds"], dict(outputs[-1].extra_fields))["score"] == strict


PIECES = [
    "<think>",
    "</think>",
    " t </think>",
    "\\boxed{",
    "\\boxed ",
    "\\boxed{Leda}",
    "\\boxed{Ems}",
    "\\boxed{}",
    "\\fbox{",
    "{",
    "}",
    "$",
    " ",
    "\n",
    "Leda",
    "the",
    "<tool_call>",
    "</tool_call>",
    '{"name": "wikipedia_search", "arguments": {"query": "Leer"}}',
    "<memory>",
    "</memory>",
    "\\[",
    "\\]",
]
answer_turns = st.tuples(st.lists(st.sampled_from(PIECES), max_size=12).map("".join), st.booleans())


@settings(max_examples=300, deadline=None)
@given(turn=answer_turns)
def test_any_answer_turn_scores_zero_format_only_or_an_f1(memsearcher_loop, qwen_tokenizer, turn):
    text, ended = turn
    ids = qwen_tokenizer.encode(text, add_special_tokens=False) + ([qwen_tokenizer.eos_token_id] if ended else [])
    context = Context(prompt_ids=[0], response_ids=ids or [0], response_mask=[1] * len(ids or [0]), texts=[text])
    answer, format_ok = memsearcher_loop.final_verdict(context)
    record = {"final_answer": answer, "final_format_ok": format_ok}
    reward = f1_with_format("nq", "", ["Leda", "the Leda river"], record)
    assert reward["score"] in (0.0, FORMAT_ONLY_REWARD) or (0.0 < reward["score"] <= 1.0 == reward["format_ok"])
    assert reward["score"] == (0.0 if not format_ok else reward["f1"] or FORMAT_ONLY_REWARD)
    assert not format_ok or ended  # no end-of-turn token, no reward
