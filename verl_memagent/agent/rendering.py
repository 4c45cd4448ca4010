"""How an agent loop renders text into tokens: the chat template, the turn-closing tokens, messages inserted
into a context, and the caches that make each the same work once per process.

`ChatRendering` is a part of `SearchAgentLoop` (`agent/turns.py`), kept apart so that the turn machinery
reads as turns: it needs the loop's `tokenizer`, `prompts`, `apply_chat_template_kwargs` and `room`.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache, lru_cache
from typing import Any

from verl.utils.tokenizer.chat_template import initialize_turn_separator

from verl_memagent.agent.settings import ByValue
from verl_memagent.agent.trajectory import Context

_PER_PROCESS: dict[tuple, Any] = {}


@cache
def _shared_turn_close_ids(tokenizer, chat_template: ByValue, chat_template_kwargs: ByValue) -> tuple[int, ...]:
    """`assistant_turn_close_ids` once per process for each tokenizer, chat template and template kwargs."""
    return tuple(assistant_turn_close_ids(tokenizer, chat_template_kwargs.value))


@lru_cache(maxsize=256)
def _constant_ids(tokenizer, text: str) -> tuple[int, ...]:
    """Token ids of a text that is the same in every trajectory, encoded once per process and tokenizer."""
    return tuple(tokenizer.encode(text, add_special_tokens=False))


def assistant_turn_close_ids(tokenizer, chat_template_kwargs: dict | None = None) -> list[int]:
    """Tokens the chat template puts after an assistant message's content, minus the turn separator.

    For ChatML that is `<|im_end|>`: what the model emits itself when it ends its turn. Inserted
    (masked) when a stop string, not the model, ended the turn before a tool response follows.
    """
    kwargs = chat_template_kwargs or {}
    marker = "\u2063memagent-content-end\u2063"
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": marker}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)
    ids = tokenizer.encode(text.split(marker)[-1], add_special_tokens=False)
    separator = initialize_turn_separator(tokenizer, **kwargs)
    if separator and ids[-len(separator) :] == separator:
        ids = ids[: -len(separator)]
    return ids


class ChatRendering:
    """The rendering half of an agent loop: text to tokens through the tokenizer and its chat template."""

    def bind_rendering(self, tokenizer) -> None:
        """Read what rendering needs of `tokenizer` and its chat template (shared per process)."""
        #: what the rendering of a chat depends on besides the messages: keys the per-process caches
        self.template_key = (tokenizer, ByValue(tokenizer.chat_template), ByValue(self.apply_chat_template_kwargs))
        self.turn_close_ids = list(_shared_turn_close_ids(*self.template_key))
        self.eos_ids = {tokenizer.eos_token_id, *self.turn_close_ids[-1:]}
        self._encoded: dict[str, list[int]] = {}

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, each text encoded once per loop (one trajectory): a memory is encoded
        for its cap and again for the next prompt, the question for every turn's prompt."""
        if text not in self._encoded:
            self._encoded[text] = self.tokenizer.encode(text, add_special_tokens=False)
        return list(self._encoded[text])

    def per_process(self, name: str, build: Callable[[], Any]) -> Any:
        """`build()` once per process for this agent's settings and chat template: text every trajectory
        renders alike (the loops that share `self.prompts` share the settings)."""
        key = (name, self.prompts, *self.template_key)
        if key not in _PER_PROCESS:
            _PER_PROCESS[key] = build()
        return _PER_PROCESS[key]

    def encode_constant(self, text: str) -> tuple[int, ...]:
        """`encode` for text that is the same in every trajectory (template pieces): once per process."""
        return _constant_ids(self.tokenizer, text)

    def chat_text(self, messages: list[dict], tools=None) -> str:
        """The chat template's text of `messages` up to and including the assistant's generation prompt."""
        return self.tokenizer.apply_chat_template(
            messages, tools=tools, tokenize=False, add_generation_prompt=True, **self.apply_chat_template_kwargs
        )

    def truncate(self, text: str, max_tokens: int) -> tuple[str, int, bool]:
        """Text cut to `max_tokens` tokens: (text, token count after the cut, whether it was cut)."""
        ids = self.encode(text)
        if len(ids) <= max_tokens:
            return text, len(ids), False
        return self.tokenizer.decode(ids[:max_tokens]), max_tokens, True

    async def insert_messages(
        self, context: Context, history: list[dict], new_messages: list[dict], tools=None
    ) -> bool:
        """Append chat messages (tool response, instructions) rendered by verl's Continuous Token builder.

        If a stop string rather than the model ended the assistant turn, the template's turn-closing
        tokens come first. Everything inserted here has mask 0. Returns False, changing nothing, when
        the result would leave no room to generate.
        """
        closed = Context(context.prompt_ids, list(context.response_ids), list(context.response_mask))
        closed.response_logprobs = None if context.response_logprobs is None else list(context.response_logprobs)
        if not closed.response_ids or closed.response_ids[-1] not in self.eos_ids:
            closed.add_inserted(list(self.turn_close_ids))
        merge, mask, logprobs = await self.ct_merge_context_msg(
            history,
            history + new_messages,
            closed.token_ids,
            closed.response_mask,
            closed.response_logprobs,
            tools=tools,
        )
        if len(merge.token_ids) >= context.length + self.room(context):
            return False
        context.response_ids = merge.token_ids[len(context.prompt_ids) :]
        context.response_mask = mask
        context.response_logprobs = logprobs
        return True
