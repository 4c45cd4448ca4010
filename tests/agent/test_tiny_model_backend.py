"""The loops on a real tiny model behind verl's generate(): the sample holds what was sampled, log-probs match."""

import asyncio

import pytest
import torch
from agent_helpers import assert_model_saw_exactly

KNOWN_REASONS = {
    "answer",
    "bad_format",
    "max_turns",
    "context_limit",
    "memory_overflow",
    "no_memory",
    "no_state",
    "no_action",
    "unclosed_tag",
    "search_and_answer",
    "empty_query",
    "empty_answer",
    "bad_tool_call",
}


class Recording:
    """Passes generate() through to the engine and keeps what each call was given and returned."""

    def __init__(self, engine):
        self.engine, self.calls = engine, []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        output = await self.engine.generate(
            request_id, prompt_ids=prompt_ids, sampling_params=sampling_params, **kwargs
        )
        self.calls.append(
            {"prompt_ids": list(prompt_ids), "token_ids": list(output.token_ids), "log_probs": output.log_probs}
        )
        return output


@pytest.fixture(scope="module")
def engine(tiny_model, tokenizer):
    from verl_memagent.generation.generator import HFGenerator

    return HFGenerator(
        tiny_model, tokenizer, eos_token_ids={tokenizer.eos_token_id}, max_model_len=8192, default_max_tokens=32, seed=0
    )


@pytest.mark.parametrize("agent", ["memsearcher", "mem1", "react"])
async def test_sampled_tokens_and_logprobs_are_what_the_trainer_sees(run_agent, tokenizer, tiny_model, engine, agent):
    results = []
    for seed in range(3):  # sequential trajectories: each recorder sees only its own calls
        recording = Recording(engine)
        torch.manual_seed(seed)
        output = await asyncio.wait_for(run_agent(agent, recording, max_new_tokens=24, max_turns=2), timeout=120)
        results.append((output if isinstance(output, list) else [output], recording.calls))
    for outputs, calls in results:
        assert_model_saw_exactly(outputs, calls)
        assert {o.extra_fields["finish_reason"] for o in outputs} <= KNOWN_REASONS
        assert len({o.extra_fields["trajectory_id"] for o in outputs}) == 1
        for output in outputs:
            # the actor recomputes log p(token | everything before it) on prompt + response: same numbers
            ids = torch.tensor([output.prompt_ids + output.response_ids])
            with torch.no_grad():
                logits = tiny_model(ids).logits[0, :-1].float()
            logp = torch.log_softmax(logits, -1).gather(1, ids[0, 1:, None])[:, 0]
            response_logp = logp[len(output.prompt_ids) - 1 :]
            mask = torch.tensor(output.response_mask, dtype=torch.bool)
            rollout = torch.tensor(output.response_logprobs)
            torch.testing.assert_close(rollout[mask], response_logp[mask], atol=2e-4, rtol=1e-4)


async def test_a_sampling_seed_makes_a_rollout_independent_of_batching_and_restarts(
    trainer_config, tokenizer, retriever_url, engine
):
    from agent_helpers import QUESTION

    from verl_memagent.agent import instantiate_agent_loop, verl_sampling_params, verl_worker_row

    async def play(session: int, seed: int | None) -> list[list[int]]:
        recording = Recording(engine)
        loop = instantiate_agent_loop(
            "memsearcher",
            trainer_config,
            recording,
            tokenizer,
            hf_model_type="qwen2",
            retriever_urls=retriever_url,
            max_new_tokens=24,
            max_turns=2,
            sampling_seed=seed,
        )
        row = verl_worker_row(QUESTION, {"index": 3}, data_source="test", session_id=session, global_steps=5)
        await loop.run(verl_sampling_params(), **row)
        # the first call's tokens: later calls also depend on what the retriever answered (on time or not)
        return recording.calls[0]["token_ids"]

    alone = await play(0, seed=7)
    batched = await asyncio.gather(play(0, seed=7), play(1, seed=7), play(2, seed=7))
    assert batched[0] == alone  # decoded in a batch with other requests: the same tokens
    assert batched[1] != alone and batched[2] != alone  # other sessions sample otherwise
    assert await play(0, seed=8) != alone
    assert await play(0, seed=None) != await play(0, seed=None)  # unseeded: the server's generator moves on
