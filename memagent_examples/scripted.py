"""A scripted policy behind verl's token-in/token-out `generate()`: replays given texts, one per call.

Each text is tokenised once, at construction. A call returns its tokens up to where a server would
stop: the first end-of-sequence id, `max_tokens`, or the first token after which the decoded output
contains a stop string; per-token log-probs are distinct. Tests use it to pin exact multi-turn paths;
the benchmarks use it to replay trajectories of a chosen length. It records every call: prompt ids,
sampling parameters, returned token ids and log-probs.
"""

from __future__ import annotations

from typing import Any

from verl.workers.rollout.replica import TokenOutput


class ScriptedPolicy:
    def __init__(self, tokenizer, texts: list[str]):
        self.tokenizer = tokenizer
        self.texts = list(texts)
        self.token_ids = [tokenizer.encode(text, add_special_tokens=False) for text in self.texts]
        self.calls: list[dict[str, Any]] = []
        self.eos_ids = {tokenizer.eos_token_id}
        self._emitted = 0

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **kwargs):
        if len(self.calls) >= len(self.texts):
            raise RuntimeError(f"the script has {len(self.texts)} texts but generate() was called once more")
        index = len(self.calls)
        call = {"prompt_ids": list(prompt_ids), "sampling_params": dict(sampling_params)}
        self.calls.append(call)
        max_tokens = sampling_params.get("max_tokens", len(self.texts[index]) + 1)
        token_ids = self._emitted_ids(self.token_ids[index], sampling_params.get("stop") or [], max_tokens)
        log_probs = [-0.001 * (self._emitted + i + 1) for i in range(len(token_ids))]
        self._emitted += len(token_ids)
        call.update(token_ids=token_ids, log_probs=log_probs)
        return TokenOutput(
            token_ids=token_ids,
            log_probs=log_probs if sampling_params.get("logprobs") else None,
            stop_reason="completed",
        )

    def _emitted_ids(self, ids: list[int], stops: list[str], max_tokens: int) -> list[int]:
        """The tokens a server emits: through the first EOS id, at most `max_tokens` (at least one),
        and no further than the shortest prefix whose decoding contains a stop string.

        A stop string, once in the decoded output, stays in every longer output, so that prefix is
        found by bisection: a few decodes per call instead of one per token.
        """
        end = min(len(ids), max(max_tokens, 1))
        end = next((i + 1 for i, token_id in enumerate(ids[:end]) if token_id in self.eos_ids), end)
        if not self._stopped(ids[:end], stops):
            return list(ids[:end])
        low, high = 1, end  # the first `high` tokens hold a stop string; no prefix shorter than `low` does
        while low < high:
            middle = (low + high) // 2
            if self._stopped(ids[:middle], stops):
                high = middle
            else:
                low = middle + 1
        return list(ids[:low])

    def _stopped(self, ids: list[int], stops: list[str]) -> bool:
        if not stops or not ids:
            return False
        text = self.tokenizer.decode(ids)
        return any(stop in text for stop in stops)
