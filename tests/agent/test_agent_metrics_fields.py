"""The three loops' outputs carry what `agent_metrics` needs, and give the figures their scripts imply."""

from __future__ import annotations

from test_memsearcher import MEMORY, SEARCH
from test_react import TURNS as REACT_TURNS

from memagent_examples.scripted import ScriptedPolicy
from verl_memagent.algo.agent_metrics import agent_metrics

MEM1_TURNS = [
    "<think>Nothing known yet.</think><search>Leer town river</search>",
    "<think>Leer is on a river; which one?</think><search>Leda river Leer</search>",
    "<think>Leer lies on the Leda.</think><answer>Leda</answer>",
]


def fields_of(outputs) -> list[dict]:
    return [o.extra_fields for o in (outputs if isinstance(outputs, list) else [outputs])]


async def test_memsearcher_two_turns_one_search_one_rewrite(run_agent, tokenizer):
    answer = " The memory says it.</think>\n\\boxed{Leda}<|im_end|>"  # the released prompt opened <think>
    outputs = await run_agent("memsearcher", ScriptedPolicy(tokenizer, [SEARCH, MEMORY, answer]), max_turns=4, topk=2)
    metrics = agent_metrics(fields_of(outputs))
    assert metrics["agent/trajectories"] == 1
    assert metrics["agent/turns/mean"] == metrics["agent/contexts/mean"] == 2
    assert metrics["agent/searches/mean"] == 1 and metrics["agent/retriever_errors/mean"] == 0
    assert metrics["agent/finish/answered"] == 1.0 and metrics["agent/memory_capped"] == 0.0
    memory_tokens = outputs[1].extra_fields["memory_tokens"]
    assert memory_tokens > 0 and metrics["agent/memory_tokens/max"] == memory_tokens
    assert metrics["agent/peak_context_tokens/max"] == max(len(o.prompt_ids) + len(o.response_ids) for o in outputs)
    assert metrics["agent/prefill_tokens/mean"] == sum(o.extra_fields["prefill_tokens"] for o in outputs)
    assert 0 < metrics["agent/search_time_share"] < 1


async def test_mem1_state_cut_at_the_cap_counts_as_capped(run_agent, tokenizer):
    outputs = await run_agent(
        "mem1", ScriptedPolicy(tokenizer, MEM1_TURNS), max_turns=4, memory_max_tokens=4, memory_overflow="truncate"
    )
    metrics = agent_metrics(fields_of(outputs))
    assert metrics["agent/turns/mean"] == 3 and metrics["agent/searches/mean"] == 2
    assert metrics["agent/memory_capped"] == 1.0  # every one of the 3 states is longer than 4 tokens
    assert metrics["agent/memory_tokens/max"] == 4


async def test_react_counts_actions_in_its_single_context(run_ours, tokenizer):
    output = await run_ours("react", ScriptedPolicy(tokenizer, REACT_TURNS), max_turns=3, topk=1)
    metrics = agent_metrics(fields_of(output))
    assert metrics["agent/contexts/mean"] == 1 and metrics["agent/turns/mean"] == 3
    assert metrics["agent/searches/mean"] == 2 and metrics["agent/finish/answered"] == 1.0
    assert metrics["agent/memory_tokens/max"] == 0 and metrics["agent/memory_capped"] == 0.0


async def test_mem1_out_of_turns(run_agent, tokenizer):
    outputs = await run_agent("mem1", ScriptedPolicy(tokenizer, MEM1_TURNS[:2]), max_turns=2)
    metrics = agent_metrics(fields_of(outputs))
    assert metrics["agent/finish/out_of_turns"] == 1.0 and metrics["agent/searches/mean"] == 1


async def test_every_output_carries_exactly_the_written_contract(run_agent, run_ours, tokenizer):
    """`output_fields.OUTPUT_FIELDS` is what the loops write: no reader's name is missing, none unlisted
    (besides the weight versions verl's server adds)."""
    from verl_memagent.output_fields import OUTPUT_FIELDS

    runs = [
        await run_agent("memsearcher", ScriptedPolicy(tokenizer, [SEARCH, MEMORY, "\\boxed{Leda}<|im_end|>"]), topk=2),
        await run_agent("mem1", ScriptedPolicy(tokenizer, MEM1_TURNS), max_turns=4),
        await run_ours("react", ScriptedPolicy(tokenizer, REACT_TURNS), max_turns=3, topk=1),
    ]
    server_fields = {"min_global_steps", "max_global_steps"}
    for outputs in runs:
        for fields in fields_of(outputs):
            assert set(OUTPUT_FIELDS) <= set(fields) and set(fields) - set(OUTPUT_FIELDS) <= server_fields
