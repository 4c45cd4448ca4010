"""One answer grammar: with the default tags, what a loop records for its final output (the answer and
format verdict of its rules, `tool_calls.ToolCallAgentLoop.outputs`, `turns.outputs`) is scored exactly
as the rewards' fallback parser scores the same text without a record (plain completions). Renamed
tags: see test_verl_reward_path."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from verl_memagent.agent.parsing import Action, parse_tag_action
from verl_memagent.agent.trajectory import Context
from verl_memagent.reward.scores import (
    exact_match_score,
    f1_with_format,
    multi_objective_em,
    multi_objective_em_with_format,
)

CALL = '<tool_call>{"name": "wikipedia_search", "arguments": {"query": "Leer"}}</tool_call>'
PIECES = [
    "<think>",
    "</think>",
    "<think>the river</think>",
    "\\boxed{",
    "}",
    "\\boxed{Leda}",
    "\\boxed{Lower Saxony; Leda}",
    "\\boxed{}",
    "\\boxed{Leer}",
    "\\boxed Leda",
    "$",
    "<tool_call>",
    "</tool_call>",
    CALL,
    "<answer>",
    "</answer>",
    "<answer>Leda</answer>",
    "<answer>Lower Saxony; Leda</answer>",
    "<answer> </answer>",
    "<search>Leer</search>",
    "<search>",
    "<IS>s</IS>",
    "Leda",
    " ",
    "\n",
]
model_outputs = st.lists(st.one_of(st.sampled_from(PIECES), st.text(max_size=6)), max_size=8).map("".join)


@settings(max_examples=300, deadline=None)
@given(text=model_outputs)
def test_memsearcher_record_scores_as_the_default_grammar_does(memsearcher_loop, qwen_tokenizer, text):
    """A one-turn final context that ended at the model's end of turn, under the released rules."""
    ids = qwen_tokenizer.encode(text, add_special_tokens=False) + [qwen_tokenizer.eos_token_id]
    context = Context(prompt_ids=[0], response_ids=ids, response_mask=[1] * len(ids), texts=[text])
    answer, format_ok = memsearcher_loop.final_verdict(context)
    plain = {"final_response": memsearcher_loop.assistant_turns(context)[-1], "finish_reason": "answer"}
    recorded = {**plain, "final_answer": answer, "final_format_ok": format_ok}
    assert f1_with_format("nq", "", ["Leda"], recorded) == f1_with_format("nq", "", ["Leda"], plain)
    golds = [["Lower Saxony"], ["Leda"]]
    with_format = multi_objective_em_with_format("mo", "", golds, recorded)
    assert with_format == multi_objective_em_with_format("mo", "", golds, plain)
    assert with_format["score"] in (0.0, 0.1, 1.0, 2.0)
    assert with_format["format_ok"] == (format_ok and answer is not None)


def _fields(text: str, action: Action) -> tuple[dict, dict]:
    """(extra_info without a record, the same with the record `turns.outputs` writes) for a final output."""
    finished = {"final_response": text, "finish_reason": "answer" if action.kind == "answer" else "max_turns"}
    answer = action if action.kind == "answer" else None
    recorded = {"final_answer": answer.answer if answer else None, "final_format_ok": bool(answer and answer.format_ok)}
    return finished, {**finished, **recorded}


@settings(max_examples=300, deadline=None)
@given(text=model_outputs)
def test_tag_agents_record_scores_as_the_default_grammar_does(text):
    plain, recorded = _fields(text, parse_tag_action(text))
    assert exact_match_score("nq", "", ["Leda"], recorded) == exact_match_score("nq", "", ["Leda"], plain)
    golds = [["Lower Saxony"], ["Leda"]]
    assert multi_objective_em("mo", "", golds, recorded) == multi_objective_em("mo", "", golds, plain)
