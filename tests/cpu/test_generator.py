"""HFGenerator against independent references: transformers' own generate, a teacher-forced forward."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM
from verl.utils.torch_functional import logprobs_from_logits

from verl_memagent.generation.generator import HFGenerator

TEXTS = [
    "<question> who wrote the book </question>",
    "Doc 1(Title: Evan Morris) Evan L. Morris was a lobbyist",
    "<think> I should search </think> <search>",
    "hello",
]


@pytest.fixture(scope="module")
def generator(tiny_model_dir) -> HFGenerator:
    return HFGenerator.from_pretrained(tiny_model_dir, max_model_len=256, default_max_tokens=16, seed=0)


@pytest.fixture(scope="module")
def prompts(tokenizer) -> list[list[int]]:
    return [tokenizer(text)["input_ids"] for text in TEXTS]


GREEDY = {"temperature": 0, "top_p": 1.0, "top_k": -1, "logprobs": True, "ignore_eos": True}


async def _one(generator, prompt, **params):
    return await generator.generate("r", prompt_ids=prompt, sampling_params=params)


def _teacher_forced_logprobs(model, prompt: list[int], response: list[int], temperature: float) -> torch.Tensor:
    """verl's actor path: log_softmax(logits / temperature) at the response tokens (`logprobs_from_logits`)."""
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    return logprobs_from_logits(logits / temperature, torch.tensor(response))


async def test_greedy_matches_transformers_generate(generator, prompts, tiny_model):
    for prompt in prompts:
        out = await _one(generator, prompt, **GREEDY, max_tokens=12)
        reference = tiny_model.generate(
            torch.tensor([prompt]), max_new_tokens=12, do_sample=False, eos_token_id=None, min_new_tokens=12
        )
        assert out.token_ids == reference[0, len(prompt) :].tolist()
        assert out.extra_fields["finish_reason"] == "length"
        assert out.stop_reason == "completed"


async def test_concurrent_requests_decode_as_one_batch_with_the_same_tokens(generator, prompts):
    forwards = []
    hook = generator.model.register_forward_hook(lambda module, args, output: forwards.append(1))
    try:
        sequential = [await _one(generator, p, **GREEDY, max_tokens=10) for p in prompts]
        sequential_forwards = len(forwards)
        forwards.clear()
        concurrent = await asyncio.gather(*[_one(generator, p, **GREEDY, max_tokens=10) for p in prompts])
    finally:
        hook.remove()
    assert sequential_forwards == 10 * len(prompts)
    assert len(forwards) == 10  # one batch: one forward per generated position
    for seq, con in zip(sequential, concurrent, strict=True):
        assert con.token_ids == seq.token_ids
        torch.testing.assert_close(torch.tensor(con.log_probs), torch.tensor(seq.log_probs), atol=1e-4, rtol=0)


async def test_max_tokens_default_and_context_limit(generator, prompts):
    assert len((await _one(generator, prompts[0], **GREEDY, max_tokens=3)).token_ids) == 3
    assert len((await _one(generator, prompts[0], **GREEDY, max_new_tokens=5)).token_ids) == 5
    assert len((await _one(generator, prompts[0], **GREEDY)).token_ids) == generator.default_max_tokens
    near_limit = [prompts[3][0]] * (generator.max_model_len - 2)
    assert len((await _one(generator, near_limit, **GREEDY, max_tokens=50)).token_ids) == 2
    with pytest.raises(ValueError, match="no room within max_model_len"):
        await _one(generator, [prompts[3][0]] * generator.max_model_len, **GREEDY)


async def test_stop_string_ends_on_the_token_that_completes_it(generator, prompts, tokenizer):
    full = (await _one(generator, prompts[1], **GREEDY, max_tokens=16)).token_ids
    text = tokenizer.decode(full)
    stop = tokenizer.decode(full[5:7]).strip() or tokenizer.decode(full[5:8])
    first_end = next(i for i in range(1, len(full) + 1) if stop in tokenizer.decode(full[:i]))
    assert stop in text and first_end < len(full)
    out = await _one(generator, prompts[1], **GREEDY, max_tokens=16, stop=[stop])
    assert out.token_ids == full[:first_end]
    assert out.extra_fields["finish_reason"] == "stop"


async def test_stop_token_ids_and_eos(tiny_model, tokenizer, prompts):
    generator = HFGenerator(tiny_model, tokenizer, eos_token_ids=[], max_model_len=256, default_max_tokens=16)
    full = (await _one(generator, prompts[2], **GREEDY, max_tokens=16)).token_ids
    stop_token = full[6]
    first = full.index(stop_token)
    out = await _one(generator, prompts[2], **GREEDY, max_tokens=16, stop_token_ids=[stop_token])
    assert out.token_ids == full[: first + 1]  # the stop token is returned, as vLLM does

    with_eos = HFGenerator(tiny_model, tokenizer, eos_token_ids=[stop_token], max_model_len=256, default_max_tokens=16)
    params = {**GREEDY, "ignore_eos": False}
    assert (await _one(with_eos, prompts[2], **params, max_tokens=16)).token_ids == full[: first + 1]
    assert (await _one(with_eos, prompts[2], **GREEDY, max_tokens=16)).token_ids == full  # ignore_eos


@pytest.mark.parametrize("temperature", [1.0, 0.7])
async def test_sampled_logprobs_equal_the_trainers_teacher_forced_logprobs(generator, prompts, temperature):
    params = {"temperature": temperature, "top_p": 1.0, "top_k": -1, "logprobs": True, "ignore_eos": True}
    calls = [_one(generator, p, **params, max_tokens=12, seed=i) for i, p in enumerate(prompts)]
    outputs = await asyncio.gather(*calls)
    for prompt, out in zip(prompts, outputs, strict=True):
        expected = _teacher_forced_logprobs(generator.model, prompt, out.token_ids, temperature)
        torch.testing.assert_close(torch.tensor(out.log_probs), expected, atol=1e-4, rtol=0)


async def test_top_k_and_top_p_restrict_and_renormalise(generator, prompts):
    prompt = prompts[0]
    params = {"temperature": 1.0, "top_p": 1.0, "logprobs": True, "ignore_eos": True, "max_tokens": 12}
    greedy = (await _one(generator, prompt, **GREEDY, max_tokens=12)).token_ids
    assert (await _one(generator, prompt, **params, top_k=1)).token_ids == greedy
    assert (await _one(generator, prompt, **{**params, "top_p": 1e-6}, top_k=-1)).token_ids == greedy

    out = await _one(generator, prompt, **params, top_k=5, seed=3)
    with torch.no_grad():
        logits = generator.model(input_ids=torch.tensor([prompt + out.token_ids])).logits[0, len(prompt) - 1 : -1]
    top5 = logits.topk(5, dim=-1)
    for step, token in enumerate(out.token_ids):
        assert token in top5.indices[step].tolist()
        renormalised = torch.log_softmax(top5.values[step], dim=-1)[top5.indices[step].tolist().index(token)]
        assert out.log_probs[step] == pytest.approx(renormalised.item(), abs=1e-4)


async def test_seed_reproduces_and_varies(generator, prompts):
    params = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "ignore_eos": True, "max_tokens": 16}
    a = await _one(generator, prompts[0], **params, seed=7)
    b = await _one(generator, prompts[0], **params, seed=7)
    c = await _one(generator, prompts[0], **params, seed=8)
    assert a.token_ids == b.token_ids != c.token_ids
    assert a.log_probs is None  # logprobs not asked for


async def test_repetition_penalty_matches_transformers(generator, prompts, tiny_model):
    prompt = prompts[1]
    out = await _one(generator, prompt, **GREEDY, max_tokens=12, repetition_penalty=1.5)
    reference = tiny_model.generate(
        torch.tensor([prompt]), max_new_tokens=12, min_new_tokens=12, do_sample=False, repetition_penalty=1.5
    )
    assert out.token_ids == reference[0, len(prompt) :].tolist()


async def test_load_weights_switches_the_model(tiny_model_dir, prompts):
    generator = HFGenerator.from_pretrained(tiny_model_dir, max_model_len=256, default_max_tokens=12)
    other = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    torch.manual_seed(1)
    for p in other.parameters():
        p.data.normal_(0, 0.5)
    before = (await _one(generator, prompts[0], **GREEDY)).token_ids
    loaded = generator.load_weights(other.state_dict().items(), global_steps=3)
    assert loaded == len(other.state_dict())
    after = await _one(generator, prompts[0], **GREEDY)
    expected = other.generate(torch.tensor([prompts[0]]), max_new_tokens=12, min_new_tokens=12, do_sample=False)
    assert after.token_ids == expected[0, len(prompts[0]) :].tolist() != before
    assert after.extra_fields["global_steps"] == 3
    with pytest.raises(KeyError, match="not a parameter"):
        generator.load_weights([("model.nonexistent.weight", torch.zeros(1))])


async def test_bad_sampling_params_are_named(generator, prompts):
    with pytest.raises(ValueError, match="unsupported sampling_params \\['best_of'\\]"):
        await _one(generator, prompts[0], best_of=2)
    with pytest.raises(ValueError, match="top_p"):
        await _one(generator, prompts[0], top_p=0.0)
    with pytest.raises(ValueError, match="image_data"):
        await generator.generate("r", prompt_ids=prompts[0], sampling_params={}, image_data=["x"])


def test_loading_prints_nothing_and_leaves_the_progress_bar_as_it_was(tiny_model_dir):
    """A scoring's console shows eval's own progress only: no transformers bar per loaded tensor; the
    switch is transformers' global one, so it is put back (a fresh process: no earlier load in this
    one has touched it)."""
    load = (
        "from transformers.utils import logging\n"
        "from verl_memagent.generation.generator import HFGenerator\n"
        f"HFGenerator.from_pretrained({str(tiny_model_dir)!r}, max_model_len=96, default_max_tokens=32)\n"
        "assert logging.is_progress_bar_enabled()\n"
    )
    loaded = subprocess.run([sys.executable, "-c", load], capture_output=True, text=True, timeout=120)
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stderr == ""
