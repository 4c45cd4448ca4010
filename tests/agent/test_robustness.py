"""Every malformed output and every retriever failure has a defined outcome; nothing escapes run()."""

import asyncio
import socket

import pytest
from agent_helpers import OURS, assert_model_saw_exactly
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memagent_examples.scripted import ScriptedPolicy
from verl_memagent.agent.turns import SEARCH_FAILED

EOS = "<|im_end|>"
SEARCH = '<think>t</think><tool_call>{"name": "wikipedia_search", "arguments": {"query": "Leda river"}}</tool_call>'
MEMORY = "<memory>Leer lies on the Leda.</memory>"
ANSWER = "<think>t</think>\\boxed{Leda}" + EOS


@pytest.mark.parametrize(
    ("agent", "script", "reason", "contexts"),
    [
        ("memsearcher", ["I do not know." + EOS], "no_action", 1),
        (
            "memsearcher",
            ['<tool_call>{"name": "wikipedia_search", "arguments": {"query": </tool_call>'],
            "bad_tool_call",
            1,
        ),
        (
            "memsearcher",
            ['<tool_call>{"name": "wikipedia_search", "arguments": {"query": " "}}</tool_call>'],
            "empty_query",
            1,
        ),
        ("memsearcher", ['\\boxed{Leda} <tool_call>{"name": "x"}</tool_call>'], "search_and_answer", 1),
        ("memsearcher", ["\\boxed{Leda" + EOS], "unclosed_tag", 1),
        ("memsearcher", [SEARCH, "I will not write a memory." + EOS], "no_memory", 1),
        ("mem1", ["<answer>Leda</answer>"], "no_state", 1),
        ("mem1", ["<IS>unclosed <search>Leda</search>"], "unclosed_tag", 1),
        ("mem1", ["<IS>s</IS><search>Leda <answer>Leda</answer>"], "search_and_answer", 1),
        ("mem1", ["<IS>s</IS><search>Leer</search>", "<IS>s</IS>" + EOS], "no_action", 2),
        ("react", ["<search> </search>"], "empty_query", 1),
        ("react", ["<think>t</think>" + EOS], "no_action", 1),
    ],
)
async def test_malformed_output_ends_with_its_reason(run_ours, tokenizer, agent, script, reason, contexts):
    from verl_memagent.reward.scores import exact_match_score

    policy = ScriptedPolicy(tokenizer, script)
    outputs = await run_ours(agent, policy)
    outputs = outputs if isinstance(outputs, list) else [outputs]
    assert len(outputs) == contexts and len(policy.calls) == len(script)
    assert {o.extra_fields["finish_reason"] for o in outputs} == {reason}
    assert_model_saw_exactly(outputs, policy.calls)
    final = outputs[-1]
    assert exact_match_score("t", "", ["Leda"], dict(final.extra_fields))["score"] == 0.0


async def test_memory_cut_by_the_token_limit(run_ours, tokenizer):
    rambling = "<memory>" + " ".join(f"w{i}" for i in range(50))
    kept = await run_ours("memsearcher", ScriptedPolicy(tokenizer, [SEARCH, rambling, ANSWER]), max_new_tokens=64)
    assert kept[-1].extra_fields["finish_reason"] == "answer"
    assert "<memory> w0 w1" in tokenizer.decode(kept[1].prompt_ids)
    penalised = await run_ours(
        "memsearcher", ScriptedPolicy(tokenizer, [SEARCH, rambling]), max_new_tokens=64, memory_overflow="penalty"
    )
    assert penalised[-1].extra_fields["finish_reason"] == "memory_overflow" and penalised[-1].extra_fields["penalised"]


class StopServerAt(ScriptedPolicy):
    """Takes the retriever process down when the given generate call arrives."""

    def __init__(self, tokenizer, texts, server, at_call):
        super().__init__(tokenizer, texts)
        self.server, self.at_call = server, at_call

    async def generate(self, request_id, **kwargs):
        if len(self.calls) == self.at_call:
            self.server.stop()
        return await super().generate(request_id, **kwargs)


async def test_retriever_down_mid_trajectory(run_ours, tokenizer, own_retriever):
    policy = StopServerAt(tokenizer, [SEARCH, MEMORY, SEARCH, MEMORY, ANSWER], own_retriever, at_call=2)
    outputs = await run_ours(
        "memsearcher", policy, retriever_urls=own_retriever.url, retriever_max_retries=1, retriever_backoff_s=0.01
    )
    assert [o.extra_fields["retriever_errors"] for o in outputs] == [0, 1, 0]
    assert "Doc 1(Title:" in tokenizer.decode(outputs[0].response_ids)
    assert SEARCH_FAILED in tokenizer.decode(outputs[1].response_ids)
    assert outputs[-1].extra_fields["finish_reason"] == "answer"
    assert_model_saw_exactly(outputs, policy.calls)


async def test_retriever_timeout_becomes_an_observation(run_ours, tokenizer):
    silent = socket.socket()  # accepts connections (backlog) and never answers
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    url = f"http://127.0.0.1:{silent.getsockname()[1]}"
    try:
        policy = ScriptedPolicy(tokenizer, ["<search>Leda</search>", "<answer>Leda</answer>"])
        output = await asyncio.wait_for(
            run_ours("react", policy, retriever_urls=url, retriever_timeout_s=0.3, retriever_max_retries=0),
            timeout=30,
        )
    finally:
        silent.close()
    assert output.extra_fields["retriever_errors"] == 1 and output.extra_fields["finish_reason"] == "answer"
    assert SEARCH_FAILED in tokenizer.decode(output.response_ids)


def test_unknown_setting_is_named(trainer_config, tokenizer):
    from verl_memagent.agent import instantiate_agent_loop

    async def build():
        instantiate_agent_loop("mem1", trainer_config, ScriptedPolicy(tokenizer, []), tokenizer, max_turn=3)

    with pytest.raises(Exception, match=r"mem1 agent settings: unknown keys \['max_turn'\]; known keys: .*'max_turns'"):
        asyncio.run(build())


FRAGMENTS = [
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    '{"name": "wikipedia_search", "arguments": {"query": "Leda"}}',
    "<memory>",
    "</memory>",
    "\\boxed{",
    "}",
    "<IS>",
    "</IS>",
    "<search>",
    "</search>",
    "<answer>",
    "</answer>",
    "Leda",
    " ",
    EOS,
]


@given(
    agent=st.sampled_from(["memsearcher", "mem1", "react"]),
    style=st.sampled_from(["released_train", "released_eval", "ours"]),
    texts=st.lists(st.lists(st.sampled_from(FRAGMENTS), max_size=12).map("".join), min_size=8, max_size=8),
)
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
async def test_random_outputs_never_escape_run(run_agent, tokenizer, agent, style, texts):
    policy = ScriptedPolicy(tokenizer, texts)
    settings = OURS[agent] if style == "ours" else {"prompt_style": style}
    outputs = await run_agent(agent, policy, **{**settings, "max_turns": 3, "max_new_tokens": 48})
    outputs = outputs if isinstance(outputs, list) else [outputs]
    assert outputs[-1].extra_fields["finish_reason"]
    assert_model_saw_exactly(outputs, policy.calls)


async def test_empty_generation_still_gives_verl_a_response_token(run_ours, tokenizer):
    output = await run_ours("react", ScriptedPolicy(tokenizer, [""]))
    assert output.extra_fields["finish_reason"] == "no_action"
    assert output.response_ids == [tokenizer.convert_tokens_to_ids("<|im_end|>")] and output.response_mask == [0]
    assert output.as_dict()["responses"].shape == (1,)  # verl's TransferQueue conversion works
