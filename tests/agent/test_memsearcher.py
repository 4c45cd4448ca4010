"""MemSearcher's per-turn contexts, driven through verl's construction path with a scripted policy."""

from agent_helpers import QUESTION, assert_model_saw_exactly

from memagent_examples.scripted import ScriptedPolicy
from verl_memagent.agent import MemSearcherAgentLoop
from verl_memagent.agent.settings import Prompts, build_settings

SEARCH = (
    '<think>Find the town first.</think>\n<tool_call>{"name": "wikipedia_search", '
    '"arguments": {"query": "Leer town river Leda"}}</tool_call>'
)
MEMORY = "<memory>Leer lies on the river Leda, near the Ems.</memory>"
ANSWER = "<think>The memory says it.</think>\n\\boxed{Leda}<|im_end|>"


def render(tokenizer, messages, **kwargs):
    from verl_memagent.agent.tool_calls import search_tool_schema

    tools = [search_tool_schema("wikipedia_search")]
    return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, **kwargs)


async def test_two_turns_flat_context_and_exact_tokens(run_ours, tokenizer):
    policy = ScriptedPolicy(tokenizer, [SEARCH, MEMORY, ANSWER])
    outputs = await run_ours("memsearcher", policy, max_turns=4, topk=2)

    assert [o.extra_fields["turn_index"] for o in outputs] == [0, 1]
    assert len({o.extra_fields["trajectory_id"] for o in outputs}) == 1
    assert {o.extra_fields["finish_reason"] for o in outputs} == {"answer"}
    assert_model_saw_exactly(outputs, policy.calls)

    # Turn 0: system + question + empty memory, rendered by the chat template with the tool schema.
    system = Prompts(build_settings("memsearcher", MemSearcherAgentLoop.default_tags, {"prompt_style": "ours"})).render(
        "system"
    )
    first_user = f"<question> {QUESTION} </question>\n<memory>  </memory>\nTurns left, this one included: 4."
    messages = [{"role": "system", "content": system}, {"role": "user", "content": first_user}]
    expected_prompt = render(tokenizer, messages, add_generation_prompt=True)
    assert tokenizer.decode(outputs[0].prompt_ids) == expected_prompt

    # The whole first context = the chat template's rendering of action, tool response and rewrite
    # instruction, followed by the memory the model wrote.
    context0 = tokenizer.decode(outputs[0].prompt_ids + outputs[0].response_ids)
    assert context0.startswith(
        expected_prompt + SEARCH + "<|im_end|>\n<|im_start|>user\n<tool_response>\nDoc 1(Title: "
    )
    assert "Doc 2(Title: " in context0 and "Doc 3(Title: " not in context0  # topk=2 from the real retriever
    assert "Rewrite your memory" in context0 and context0.endswith("<|im_start|>assistant\n" + MEMORY)
    assert outputs[0].extra_fields["searches"] == 1 and outputs[0].extra_fields["retriever_errors"] == 0

    # Turn 1: a fresh context with the question and the new memory, nothing of turn 0's documents.
    prompt1 = tokenizer.decode(outputs[1].prompt_ids)
    assert "<memory> Leer lies on the river Leda, near the Ems. </memory>" in prompt1
    assert "Doc 1(Title:" not in prompt1 and "Find the town first" not in prompt1
    assert "Turns left, this one included: 3." in prompt1
    assert tokenizer.decode(outputs[1].response_ids, skip_special_tokens=False) == ANSWER
    assert outputs[1].extra_fields["memory_tokens"] == len(
        tokenizer.encode("Leer lies on the river Leda, near the Ems.")
    )


async def test_sampling_params_carry_stops_and_per_call_cap(run_ours, tokenizer):
    policy = ScriptedPolicy(tokenizer, [ANSWER])
    await run_ours("memsearcher", policy, max_new_tokens=64)
    params = policy.calls[0]["sampling_params"]
    assert params["stop"] == ["</tool_call>", "</memory>"]
    assert params["max_tokens"] == 64
    assert params["temperature"] == 1.0 and params["logprobs"] is True


async def test_last_turn_must_answer(run_ours, tokenizer):
    policy = ScriptedPolicy(tokenizer, [SEARCH, MEMORY, SEARCH])
    outputs = await run_ours("memsearcher", policy, max_turns=2)
    assert len(outputs) == 2
    assert "This is your last turn" in tokenizer.decode(outputs[1].prompt_ids)
    assert outputs[-1].extra_fields["finish_reason"] == "max_turns"
    assert outputs[-1].extra_fields["searches"] == 0  # the last turn's search is not run
    assert outputs[-1].response_mask == [1] * len(outputs[-1].response_ids)


async def test_memory_over_cap_is_truncated(run_ours, tokenizer):
    long_memory = "<memory>" + " ".join(f"fact{i}" for i in range(40)) + "</memory>"
    policy = ScriptedPolicy(tokenizer, [SEARCH, long_memory, ANSWER])
    outputs = await run_ours("memsearcher", policy, memory_max_tokens=8)
    assert outputs[0].extra_fields["memory_truncated"] is True
    assert outputs[1].extra_fields["memory_tokens"] == 8
    kept = tokenizer.decode(tokenizer.encode(" ".join(f"fact{i}" for i in range(40)))[:8])
    assert f"<memory> {kept} </memory>" in tokenizer.decode(outputs[1].prompt_ids)
    assert outputs[-1].extra_fields["finish_reason"] == "answer"


async def test_memory_over_cap_with_penalty_ends_and_scores_zero(run_ours, tokenizer):
    from verl_memagent.reward.scores import f1_with_format

    long_memory = "<memory>" + " ".join(f"fact{i}" for i in range(40)) + "</memory>"
    policy = ScriptedPolicy(tokenizer, [SEARCH, long_memory])
    outputs = await run_ours("memsearcher", policy, memory_max_tokens=8, memory_overflow="penalty")
    final = outputs[-1].extra_fields
    assert len(outputs) == 1 and final["finish_reason"] == "memory_overflow" and final["penalised"] is True
    text = tokenizer.decode(outputs[-1].response_ids, skip_special_tokens=True)
    assert f1_with_format("test", text, ["Leda"], dict(final))["score"] == 0.0
