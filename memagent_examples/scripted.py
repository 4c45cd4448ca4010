"""A scripted policy behind verl's token-in/token-out `generate()`: replays given texts, one per call.

It emits each text's tokens one at a time and stops where a server would (a stop string in the
decoded output, an end-of-sequence id, or `max_tokens`), returning distinct per-token log-probs.
Tests use it to pin exact multi-turn paths; the context-token benchmark uses it to replay
trajectories of a chosen length. It records every call: prompt ids, sampling parameters, returned
token ids and log-probs.
"""

from __future__ import annotations

from typing import Any

from verl.workers.rollout.replica import TokenOutput


class ScriptedPolicy:
    def __init__(self, tokenizer, texts: list[str]):
        self.tokenizer = tokenizer
        self.texts = list(texts)
        self.calls: list[dict[str, Any]] = []
        self.eos_ids = {tokenizer.eos_token_id}
        self._emitted = 0

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **kwargs):
        if len(self.calls) >= len(self.texts):
            raise RuntimeError(f"the script has {len(self.texts)} texts but generate() was called once more")
        text = self.texts[len(self.calls)]
        call = {"prompt_ids": list(prompt_ids), "sampling_params": dict(sampling_params)}
        self.calls.append(call)
        stops = sampling_params.get("stop") or []
        max_tokens = sampling_params.get("max_tokens", len(text) + 1)
        token_ids: list[int] = []
        for token_id in self.tokenizer.encode(text, add_special_tokens=False):
            token_ids.append(token_id)
            if token_id in self.eos_ids or len(token_ids) >= max_tokens:
                break
            if any(stop in self.tokenizer.decode(token_ids) for stop in stops):
                break
        log_probs = [-0.001 * (self._emitted + i + 1) for i in range(len(token_ids))]
        self._emitted += len(token_ids)
        call.update(token_ids=token_ids, log_probs=log_probs)
        return TokenOutput(
            token_ids=token_ids,
            log_probs=log_probs if sampling_params.get("logprobs") else None,
            stop_reason="completed",
        )
