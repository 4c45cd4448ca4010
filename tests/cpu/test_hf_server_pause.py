"""The `hf` server's pause for the async trainers: abort_all_requests drains, new requests wait for resume."""

from __future__ import annotations

import asyncio

from omegaconf import OmegaConf
from verl.workers.config import RolloutConfig

from verl_memagent.cpu.hf_rollout import HFServer

GREEDY = {"temperature": 0, "ignore_eos": True, "max_tokens": 8}


async def test_abort_lets_running_requests_finish_and_holds_new_ones_until_resume(tiny_model_dir, tokenizer):
    config = RolloutConfig(
        name="hf", tensor_model_parallel_size=1, prompt_length=64, response_length=8, dtype="float32"
    )
    server = HFServer(config, OmegaConf.create({"path": str(tiny_model_dir)}), 0)
    prompt = tokenizer("<question> who wrote it </question>")["input_ids"]

    running = asyncio.create_task(server.generate(prompt, GREEDY, "running"))
    await asyncio.sleep(0)  # admitted before the pause
    await server.abort_all_requests()
    assert running.done() and len(running.result().token_ids) == 8  # drained, not cut short

    held = asyncio.create_task(server.generate(prompt, GREEDY, "held"))
    await asyncio.sleep(0.2)
    assert not held.done()
    await server.abort_all_requests()  # nothing in flight: returns at once
    await server.resume_generation()
    assert (await asyncio.wait_for(held, 30)).token_ids == running.result().token_ids
