"""MEM1's contexts: question + latest internal state and action + latest observation, nothing older."""

from agent_helpers import QUESTION, assert_model_saw_exactly

from memagent_examples.scripted import ScriptedPolicy

TURN0 = "<IS>Nothing known yet.</IS><search>Leer town river</search>"
TURN1 = "<IS>Leer is on a river; which one?</IS><search>Leda river Leer</search>"
TURN2 = "<IS>Leer lies on the Leda.</IS><answer>Leda</answer>"


async def test_each_context_drops_everything_but_the_latest_turn(run_ours, tokenizer):
    policy = ScriptedPolicy(tokenizer, [TURN0, TURN1, TURN2])
    outputs = await run_ours("mem1", policy, max_turns=4, topk=2)
    assert [o.extra_fields["turn_index"] for o in outputs] == [0, 1, 2]
    assert outputs[-1].extra_fields["finish_reason"] == "answer"
    assert_model_saw_exactly(outputs, policy.calls)

    base = outputs[0].prompt_ids
    assert QUESTION in tokenizer.decode(base) and tokenizer.decode(base).endswith("<|im_start|>assistant\n")
    for turn, output in enumerate(outputs):
        # the response is the turn's sampled tokens only, all trained on
        assert output.response_ids == policy.calls[turn]["token_ids"]
        assert output.response_mask == [1] * len(output.response_ids)
    for turn in (1, 2):
        previous = policy.calls[turn - 1]["token_ids"]
        prompt = outputs[turn].prompt_ids
        assert prompt[: len(base) + len(previous)] == base + previous  # exact ids of the latest turn
        observation = tokenizer.decode(prompt[len(base) + len(previous) :])
        assert observation.startswith("\n\n<information>Doc 1(Title: ") and "Doc 3(Title:" not in observation
        assert observation.rstrip().endswith(f"{4 - turn} turns left.")
    assert "Nothing known yet" not in tokenizer.decode(outputs[2].prompt_ids)  # turn 0 is gone by turn 2
    # the state each context starts from: none, then the state the previous turn wrote
    written = [len(tokenizer.encode(s)) for s in ("Nothing known yet.", "Leer is on a river; which one?")]
    assert [o.extra_fields["memory_tokens"] for o in outputs] == [0, *written]


async def test_last_turn_hint_and_forcing(run_ours, tokenizer):
    policy = ScriptedPolicy(tokenizer, [TURN0, TURN1])
    outputs = await run_ours("mem1", policy, max_turns=2)
    assert tokenizer.decode(outputs[1].prompt_ids).rstrip().endswith("This is your last turn: answer now.")
    assert outputs[-1].extra_fields["finish_reason"] == "max_turns" and outputs[-1].extra_fields["searches"] == 0


async def test_overlong_state_is_cut_in_the_next_prompt_but_kept_in_the_sample(run_ours, tokenizer):
    state = " ".join(f"note{i}" for i in range(30))
    policy = ScriptedPolicy(tokenizer, [f"<IS>{state}</IS><search>Leer</search>", TURN2])
    outputs = await run_ours("mem1", policy, memory_max_tokens=5)
    assert outputs[0].response_ids == policy.calls[0]["token_ids"]  # sampled ids stay whole
    assert outputs[0].extra_fields["memory_truncated"] is True and outputs[1].extra_fields["memory_tokens"] == 5
    cut = tokenizer.decode(tokenizer.encode(state)[:5])
    assert tokenizer.decode(outputs[1].prompt_ids[len(outputs[0].prompt_ids) :]).startswith(
        f"<IS>{cut}</IS>\n<search>Leer</search>\n\n<information>"
    )


async def test_multi_objective_answer_scores_per_objective(run_ours, tokenizer):
    from verl_memagent.reward.scores import multi_objective_em

    question = "Answer the following questions: Where is Leer?; Which river runs past Leer?"
    policy = ScriptedPolicy(tokenizer, ["<IS>Both known.</IS><answer>Lower Saxony; Leda</answer>"])
    outputs = await run_ours("mem1", policy, question=question)
    text = tokenizer.decode(outputs[-1].response_ids, skip_special_tokens=True)
    golds = [["Lower Saxony", "Germany"], ["Leda", "Leda river"]]
    assert multi_objective_em("mo", text, golds, dict(outputs[-1].extra_fields))["score"] == 2.0
