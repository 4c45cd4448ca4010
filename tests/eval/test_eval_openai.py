"""The OpenAI-compatible path: the eval client against a real completions server of the tiny model.

vLLM cannot run here; `completions_server` serves the same tiny model through HFGenerator with
vLLM's request/response format, so the client's token-id round trip is checked for real.
"""

from __future__ import annotations

import pytest
from completions_server import MODEL_NAME, CompletionsServer

from verl_memagent.eval.openai_client import CompletionsClient, MissingTokenIdsError
from verl_memagent.generation.generator import HFGenerator


def tiny_generator(tiny_model, tokenizer) -> HFGenerator:
    return HFGenerator(
        tiny_model, tokenizer, eos_token_ids={tokenizer.eos_token_id}, max_model_len=8192, default_max_tokens=16
    )


@pytest.fixture(scope="module")
def server(tiny_model, tokenizer):
    server = CompletionsServer(tiny_generator(tiny_model, tokenizer))
    yield server
    server.stop()


def comparable(examples: list[dict]) -> list[dict]:
    """Per-question results in a fixed order (lines are written in completion order)."""
    return sorted(examples, key=lambda e: (e["agent"], e["dataset"], e["id"]))


def test_eval_through_the_server_equals_the_in_process_run(run_eval_cli, server, tiny_model_dir):
    """Greedy, one question at a time (so batching cannot differ): same trajectories, ids and scores."""
    _, local_summary, local = run_eval_cli("--model", str(tiny_model_dir), concurrency=1)
    remote_args = ("--server", f"{server.url}/v1", "--tokenizer", str(tiny_model_dir))
    _, remote_summary, remote = run_eval_cli(*remote_args, concurrency=1)
    assert comparable(remote) == comparable(local)
    for key in ("agents", "datasets", "settings", "sampling_params"):
        assert remote_summary[key] == local_summary[key]


async def test_client_returns_the_sampled_ids_and_logprobs(server, tiny_model, tokenizer):
    prompt = tokenizer.encode("Who wrote the Tamworth manifesto?")
    params = {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "logprobs": True, "max_tokens": 12, "stop": ["</a>"]}
    client = CompletionsClient(server.url)
    try:
        remote = await client.generate("r0", prompt_ids=prompt, sampling_params=params)
    finally:
        await client.aclose()
    local = await tiny_generator(tiny_model, tokenizer).generate("l0", prompt_ids=prompt, sampling_params=params)
    assert client.model == MODEL_NAME  # asked /v1/models
    assert remote.token_ids == local.token_ids and len(remote.token_ids) == 12
    assert remote.log_probs == pytest.approx(local.log_probs)
    assert remote.extra_fields["finish_reason"] == "length"


async def test_a_server_without_token_ids_fails_clearly(tiny_model, tokenizer):
    server = CompletionsServer(tiny_generator(tiny_model, tokenizer), token_ids=False)
    client = CompletionsClient(server.url, MODEL_NAME)
    try:
        with pytest.raises(MissingTokenIdsError, match="return_token_ids"):
            await client.generate("r0", prompt_ids=[1, 2, 3], sampling_params={"max_tokens": 4, "temperature": 0.0})
    finally:
        await client.aclose()
        server.stop()


async def test_unknown_sampling_params_are_refused(server):
    client = CompletionsClient(server.url, MODEL_NAME)
    try:
        with pytest.raises(ValueError, match="best_of"):
            await client.generate("r0", prompt_ids=[1, 2], sampling_params={"best_of": 2})
    finally:
        await client.aclose()


def test_released_checkpoint_format_through_the_server(run_eval_cli, server, tiny_model_dir, tokenizer):
    """A released checkpoint is scored in its inference format: `--set prompt_style=released_eval`.

    Each turn's prompt is the released client's text encoded whole, as SGLang encoded it for
    MemSearcher's checkpoints (tests/agent/test_released_formats.py checks the text token for token).
    """
    from verl_memagent.agent.settings import default_prompts

    args = ("--server", f"{server.url}/v1", "--tokenizer", str(tiny_model_dir))
    _, summary, examples = run_eval_cli(*args, "--set", "memsearcher.prompt_style=released_eval", concurrency=4)
    system = default_prompts("memsearcher", "released_eval")["system"]
    released = [e for e in examples if e["agent"] == "memsearcher"]
    assert released
    for example in released:
        user = f"<question> {example['question']} </question>\n\n<memory>  </memory>"
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) + "<think>"
        first = example["contexts"][0]
        assert first["prompt_text"] == text
        assert first["prompt_ids"] == tokenizer.encode(text, add_special_tokens=False)
