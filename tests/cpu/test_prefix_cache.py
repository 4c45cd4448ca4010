"""The hf generator's prefix cache: the longest stored prefix, its bound, eviction, and decoding that reuses it."""

from __future__ import annotations

import asyncio

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_memagent.generation.generator import HFGenerator
from verl_memagent.generation.prefix_cache import PrefixCache

GREEDY = {"temperature": 0, "logprobs": True, "ignore_eos": True}


def layers_for(tokens: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Two layers of keys and values whose entries name their position's token, to check what comes back."""
    keys = torch.tensor(tokens, dtype=torch.float32).repeat(2, 1)[..., None].expand(2, len(tokens), 4).clone()
    return [(keys, -keys)] * 2


sequences = st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=12), min_size=1, max_size=6)


@settings(max_examples=200, deadline=None)
@given(stored=sequences, prompt=st.lists(st.integers(0, 3), min_size=1, max_size=14))
def test_longest_is_the_longest_common_prefix_short_of_the_last_token(stored, prompt):
    cache = PrefixCache(max_bytes=1 << 30)
    for tokens in stored:
        cache.store(tokens, layers_for(tokens))
    length, layers = cache.longest(prompt)

    def common(a, b):
        return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))

    assert length == min(max(common(s, prompt) for s in stored), len(prompt) - 1)
    if length:
        keys, values = layers[0]
        assert keys.shape == (2, length, 4)
        assert keys[0, :, 0].tolist() == prompt[:length] and values[1, :, 3].tolist() == [-t for t in prompt[:length]]
    else:
        assert layers is None


def test_least_recently_used_entries_go_first_and_clear_forgets():
    one = sum(k.nbytes + v.nbytes for k, v in layers_for([1, 2, 3]))
    cache = PrefixCache(max_bytes=2 * one)
    cache.store([1, 2, 3], layers_for([1, 2, 3]))
    cache.store([4, 5, 6], layers_for([4, 5, 6]))
    assert cache.longest([1, 2, 3, 9])[0] == 3  # [1, 2, 3] used last
    cache.store([7, 8, 9], layers_for([7, 8, 9]))  # over the budget: [4, 5, 6] goes
    assert len(cache) == 2
    assert cache.longest([4, 5, 6, 0])[0] == 0 and cache.longest([1, 2, 3, 0])[0] == 3
    cache.store(list(range(10)), layers_for(list(range(10))))  # larger than the whole budget: not kept
    assert len(cache) == 2 and cache.longest(list(range(11)))[0] == 0
    cache.clear()
    assert len(cache) == 0 and cache.longest([1, 2, 3, 0]) == (0, None)


async def test_a_prompt_extending_a_finished_sequence_prefills_only_what_it_adds(tiny_model_dir, tokenizer):
    cached = HFGenerator.from_pretrained(tiny_model_dir, max_model_len=256, default_max_tokens=12)
    uncached = HFGenerator.from_pretrained(
        tiny_model_dir, max_model_len=256, default_max_tokens=12, prefix_cache_bytes=0
    )
    first = tokenizer("<question> who wrote the book </question>")["input_ids"]
    widths = []
    hook = cached.model.register_forward_hook(
        lambda module, args, kwargs, out: widths.append(kwargs["input_ids"].shape[1]), with_kwargs=True
    )
    try:
        out = await cached.generate("a", prompt_ids=first, sampling_params=GREEDY)
        widths.clear()
        # the next call of an agent: its context so far, the model's output, then a tool response
        second = first + out.token_ids + tokenizer(" Doc 1(Title: Evan Morris) a lobbyist")["input_ids"]
        reused = await cached.generate("b", prompt_ids=second, sampling_params=GREEDY)
    finally:
        hook.remove()
    # the finished sequence (all but its last sampled token) was reused: the rest is prefilled
    assert widths[0] == len(second) - (len(first) + len(out.token_ids) - 1)
    fresh = await uncached.generate("b", prompt_ids=second, sampling_params=GREEDY)
    assert reused.token_ids == fresh.token_ids
    torch.testing.assert_close(torch.tensor(reused.log_probs), torch.tensor(fresh.log_probs), atol=1e-4, rtol=0)

    # concurrent prompts sharing a prefix with different stored lengths decode as they would alone
    prompts = [second[:n] for n in (5, len(first) + 2, len(second))]
    together = await asyncio.gather(
        *[cached.generate(str(i), prompt_ids=p, sampling_params=GREEDY) for i, p in enumerate(prompts)]
    )
    for prompt, got in zip(prompts, together, strict=True):
        alone = await uncached.generate("c", prompt_ids=prompt, sampling_params=GREEDY)
        assert got.token_ids == alone.token_ids


async def test_new_weights_forget_the_cache(tiny_model_dir, tokenizer):
    generator = HFGenerator.from_pretrained(tiny_model_dir, max_model_len=256, default_max_tokens=4)
    await generator.generate("a", prompt_ids=tokenizer("hello there")["input_ids"], sampling_params=GREEDY)
    assert len(generator.prefixes) == 1
    generator.load_weights(generator.model.state_dict().items())
    assert len(generator.prefixes) == 0
