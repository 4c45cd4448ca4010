"""Records built from real agent-loop outputs hold exactly what the model saw and did, turn by turn."""

from __future__ import annotations

import pytest
from scripted_runs import ANSWER, GOLDEN, MEMORIES, QUERIES, QUESTION, mem1_states, play, script

from verl_memagent.search import RetrieverClient
from verl_memagent.trajectories.build import ContextSample, build_record


def record_of(outputs, tokenizer, advantages=None, **meta):
    contexts = [
        ContextSample(
            o.prompt_ids, o.response_ids, o.extra_fields, key=f"u_0_{i}", advantages=(advantages or {}).get(i)
        )
        for i, o in enumerate(outputs)
    ]
    meta = {"source": "train", "step": 3, "data_source": "leda", "golden_answers": GOLDEN, "reward": 1.0, **meta}
    return build_record(contexts, tokenizer, uid="u", session=0, row_id=0, **meta)


def decode(tokenizer, ids):
    return tokenizer.decode(ids, skip_special_tokens=False)


async def passages_of(url: str, query: str, topk: int) -> list[tuple[str, str]]:
    client = RetrieverClient([url])
    try:
        return [(doc.id, doc.title) for doc in (await client.search([query], topk))[0]]
    finally:
        await client.aclose()


async def test_memsearcher_turns_hold_contexts_queries_passages_and_memories(tokenizer, trainer_config, retriever_url):
    outputs, policy = await play("memsearcher", script("memsearcher"), tokenizer, trainer_config, retriever_url)
    record = record_of(outputs, tokenizer)

    assert [turn.index for turn in record.turns] == [0, 1, 2]
    assert [turn.context_index for turn in record.turns] == [0, 1, 2]
    assert [turn.sample_key for turn in record.turns] == ["u_0_0", "u_0_1", "u_0_2"]
    calls = [call for turn in record.turns for call in turn.calls]
    assert len(calls) == len(policy.calls) == 5  # action + rewrite, action + rewrite, answer
    for call, seen in zip(calls, policy.calls, strict=True):
        assert call.context == decode(tokenizer, seen["prompt_ids"])  # the context the model saw, exactly
        assert call.context_tokens == len(seen["prompt_ids"])
        assert call.output == decode(tokenizer, seen["token_ids"])
        assert call.output_tokens == len(seen["token_ids"]) and call.finish == "eos"
    assert [turn.query for turn in record.turns] == [*QUERIES, None]
    for turn, query in zip(record.turns, QUERIES, strict=False):
        expected = await passages_of(retriever_url, query, topk=10)  # the shipped topk
        assert [(p.id, p.title) for p in turn.passages] == expected and len(expected) == 10
        assert not turn.search_failed
    assert [turn.memory_before for turn in record.turns] == ["", *MEMORIES]
    assert [turn.memory for turn in record.turns] == [*MEMORIES, None]
    assert [turn.context_tokens for turn in record.turns] == [len(o.prompt_ids) + len(o.response_ids) for o in outputs]

    assert record.question == QUESTION and record.answer == ANSWER and record.finish_reason == "answer"
    assert record.agent == "memsearcher" and record.trajectory_id == outputs[0].extra_fields["trajectory_id"]
    assert record.advantage is None and all(turn.advantage is None for turn in record.turns)


async def test_react_has_one_turn_per_generate_call_in_one_growing_context(tokenizer, trainer_config, retriever_url):
    outputs, policy = await play("react", script("react"), tokenizer, trainer_config, retriever_url)
    record = record_of(outputs, tokenizer)

    assert len(outputs) == 1 and len(record.turns) == 3 == len(policy.calls)
    assert {turn.context_index for turn in record.turns} == {0}
    for turn, seen in zip(record.turns, policy.calls, strict=True):
        (call,) = turn.calls
        assert call.context == decode(tokenizer, seen["prompt_ids"])
        assert call.output == decode(tokenizer, seen["token_ids"])
        assert turn.memory_before is None and turn.memory is None
    assert [turn.query for turn in record.turns] == [*QUERIES, None]
    tokens = [turn.context_tokens for turn in record.turns]
    assert tokens == sorted(tokens) and tokens[-1] == len(outputs[0].prompt_ids) + len(outputs[0].response_ids)
    assert tokens[1] > tokens[0] + 500  # the ten passages of the first search stay in the context


async def test_mem1_records_the_state_it_carried(tokenizer, trainer_config, retriever_url):
    outputs, policy = await play("mem1", script("mem1"), tokenizer, trainer_config, retriever_url)
    record = record_of(outputs, tokenizer)

    assert len(record.turns) == 3 == len(outputs) == len(policy.calls)
    states = [*mem1_states(2), MEMORIES[1]]
    assert [turn.memory for turn in record.turns] == states
    assert [turn.memory_before for turn in record.turns] == ["", *states[:2]]
    assert [turn.query for turn in record.turns] == [*QUERIES, None]
    assert [(p.id, p.title) for p in record.turns[0].passages] == await passages_of(retriever_url, QUERIES[0], topk=3)
    assert record.answer == ANSWER


async def test_advantage_is_the_mean_over_sampled_tokens(tokenizer, trainer_config, retriever_url):
    outputs, _ = await play("memsearcher", script("memsearcher", searches=1), tokenizer, trainer_config, retriever_url)
    # a distinct value per response position: masked positions would shift any mean that included them
    advantages = {i: [float(p) for p in range(len(o.response_ids))] for i, o in enumerate(outputs)}
    record = record_of(outputs, tokenizer, advantages=advantages)

    sampled = [
        [p for p, m in enumerate(o.response_mask) if m] for o in outputs
    ]  # the positions the policy sampled, by the mask
    assert [turn.advantage for turn in record.turns] == [pytest.approx(sum(s) / len(s)) for s in sampled]
    every = [p for s in sampled for p in s]
    assert record.advantage == pytest.approx(sum(every) / len(every))


async def test_each_turn_carries_its_contexts_weight_versions_and_a_record_is_whole(
    tokenizer, trainer_config, retriever_url
):
    outputs, _ = await play("memsearcher", script("memsearcher"), tokenizer, trainer_config, retriever_url)
    assert record_of(outputs, tokenizer).turns[0].weight_versions is None  # a server that reports none
    # as verl's async server client reports them: the second context's rewrite cut short by an update
    versions = [(0, 0), (0, 1), (1, 1)]
    for output, (first, last) in zip(outputs, versions, strict=True):
        output.extra_fields.update(min_global_steps=first, max_global_steps=last)
    record = record_of(outputs, tokenizer)
    assert [turn.weight_versions for turn in record.turns] == [[0, 0], [0, 1], [1, 1]]
    with pytest.raises(ValueError, match="2 of the trajectory's 3 contexts: a record is of a whole trajectory"):
        record_of(outputs[:2], tokenizer)
