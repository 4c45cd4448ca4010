"""One `generate` call of the `hf` generator: its sampling params checked with vLLM's names and defaults, and
the rules that end it (a stop token, a stop string, the token budget)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import torch

KNOWN_KEYS = frozenset(
    {
        "temperature",
        "top_p",
        "top_k",
        "repetition_penalty",
        "logprobs",
        "max_tokens",
        "max_new_tokens",
        "stop",
        "stop_token_ids",
        "ignore_eos",
        "seed",
        # vLLM's flag only shapes the returned text; the token ids end with the stop token either way
        "include_stop_str_in_output",
    }
)


@dataclass
class Request:
    """One `generate` call, validated, with the future its caller awaits and what it has generated."""

    prompt_ids: list[int]
    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    repetition_penalty: float
    want_logprobs: bool
    stop: list[str]
    stop_token_ids: set[int]
    generator: torch.Generator | None
    future: asyncio.Future
    token_ids: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    finish_reason: str | None = None

    @classmethod
    def of(
        cls,
        prompt_ids: list[int],
        params: dict[str, Any],
        max_model_len: int,
        default_max_tokens: int,
        eos_token_ids: set[int],
    ) -> Request:
        """A request from verl's `sampling_params` (vLLM's names); an unknown or invalid one is an error
        naming it. Must be called inside the running event loop (the future belongs to it)."""
        unknown = set(params) - KNOWN_KEYS
        if unknown:
            raise ValueError(
                f"hf rollout: unsupported sampling_params {sorted(unknown)}; supported: {sorted(KNOWN_KEYS)}"
            )
        if not prompt_ids:
            raise ValueError("hf rollout: prompt_ids is empty")
        room = max_model_len - len(prompt_ids)
        if room < 1:
            raise ValueError(
                f"hf rollout: prompt of {len(prompt_ids)} tokens leaves no room within max_model_len={max_model_len}"
            )
        max_tokens = params.get("max_tokens", params.get("max_new_tokens"))
        max_tokens = default_max_tokens if max_tokens is None else int(max_tokens)
        if max_tokens < 1:
            raise ValueError(f"hf rollout: max_tokens must be >= 1, got {max_tokens}")
        temperature = float(params.get("temperature", 1.0))
        top_p = float(params.get("top_p", 1.0))
        top_k = int(params.get("top_k", -1))
        penalty = float(params.get("repetition_penalty", 1.0))
        if temperature < 0 or not 0 < top_p <= 1 or top_k < -1 or penalty <= 0:
            raise ValueError(
                f"hf rollout: invalid sampling_params temperature={temperature} (>= 0), top_p={top_p} (in (0, 1]), "
                f"top_k={top_k} (-1, 0 or positive), repetition_penalty={penalty} (> 0)"
            )
        stop = params.get("stop") or []
        seed = params.get("seed")
        return cls(
            prompt_ids=prompt_ids,
            max_tokens=min(max_tokens, room),
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            repetition_penalty=penalty,
            want_logprobs=bool(params.get("logprobs", False)),
            stop=[stop] if isinstance(stop, str) else list(stop),
            stop_token_ids=set(params.get("stop_token_ids") or [])
            | (set() if params.get("ignore_eos", False) else eos_token_ids),
            generator=None if seed is None else torch.Generator().manual_seed(int(seed)),
            future=asyncio.get_running_loop().create_future(),
        )

    def append(self, token: int, log_prob: float, tokenizer) -> None:
        """Take one sampled token; it may end the request (a stop token or the string that completes a stop
        string is kept, as vLLM keeps them; else the budget)."""
        self.token_ids.append(token)
        self.log_probs.append(log_prob)
        if token in self.stop_token_ids:
            self.finish_reason = "stop"
        elif self.stop and any(s in tokenizer.decode(self.token_ids) for s in self.stop):
            self.finish_reason = "stop"
        elif len(self.token_ids) >= self.max_tokens:
            self.finish_reason = "length"
