"""ReAct: one growing context, observations masked, one output."""

from agent_helpers import assert_model_saw_exactly

from memagent_examples.scripted import ScriptedPolicy

TURNS = [
    "<think>Find Leer.</think><search>Leer town</search>",
    "<think>Now the river.</think><search>Leda river</search>",
    "<think>Done.</think><answer>Leda</answer>",
]


async def test_history_accumulates_in_one_context(run_ours, tokenizer):
    policy = ScriptedPolicy(tokenizer, TURNS)
    output = await run_ours("react", policy, max_turns=3, topk=1)
    assert not isinstance(output, list)
    assert output.extra_fields["turn_index"] == 0 and output.extra_fields["num_contexts"] == 1
    assert output.extra_fields["finish_reason"] == "answer" and output.extra_fields["searches"] == 2
    assert_model_saw_exactly([output], policy.calls)
    text = tokenizer.decode(output.response_ids)
    assert text.startswith(TURNS[0] + "\n\n<information>Doc 1(Title: ")
    assert TURNS[1] in text and text.endswith(TURNS[2])
    assert text.count("<information>") == 2 and "Doc 2(Title:" not in text  # topk=1
    assert "This is your last turn" in text.split(TURNS[1])[1]  # hint before the third (last) turn
    # prefill grows with history: every call re-reads everything before it
    assert output.extra_fields["prefill_tokens"] == sum(len(c["prompt_ids"]) for c in policy.calls)


async def test_context_cap_ends_the_trajectory(run_ours, tokenizer):
    policy = ScriptedPolicy(tokenizer, TURNS)
    cap = 360
    output = await run_ours("react", policy, max_turns=5, topk=3, context_max_tokens=cap)
    assert output.extra_fields["finish_reason"] == "context_limit"
    assert len(output.prompt_ids) + len(output.response_ids) <= cap
    assert output.response_mask[-1] == 1  # the observation that did not fit was not appended
    for call in policy.calls:
        assert len(call["prompt_ids"]) + call["sampling_params"]["max_tokens"] <= cap
