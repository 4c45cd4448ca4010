"""Keys and values of token sequences the `hf` generator has decoded, so a new prompt prefills only what it adds.

An agent's calls repeat most of their prompts: MemSearcher's memory rewrite extends the context its
action was generated in, every call of every trajectory starts with the same system prompt, and
ReAct's history grows by one turn a call. Without a cache every call runs the whole prompt through
the model again; on the learning demo that was most of the rollout's arithmetic. A finished request
leaves its sequence's keys and values here; a new prompt takes those of its longest common prefix
with any stored sequence. Least recently used entries go first once `max_bytes` is exceeded. Keys and
values hold only for the weights that computed them: `clear()` when the weights change.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass
class _Entry:
    tokens: torch.Tensor  # (length,) the sequence's token ids
    layers: list[tuple[torch.Tensor, torch.Tensor]]  # per layer keys, values (heads, length, head dim)
    nbytes: int
    used: int


class PrefixCache:
    """Stored sequences' keys and values, looked up by the longest common prefix with a new prompt."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: list[_Entry] = []
        self._bytes = 0
        self._clock = 0
        self._tokens: torch.Tensor | None = None  # the entries' token ids, one row each, padded with -1

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        """Forget every entry (their keys and values belong to weights that are gone)."""
        self._entries, self._bytes, self._tokens = [], 0, None

    def store(self, token_ids: Sequence[int], layers: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Keep `layers` (per layer keys and values of shape (heads, len(token_ids), head dim)) for `token_ids`."""
        nbytes = sum(k.nbytes + v.nbytes for k, v in layers)
        if not token_ids or nbytes > self.max_bytes:
            return
        self._clock += 1
        tokens = torch.tensor(token_ids, dtype=torch.long)
        self._entries.append(_Entry(tokens, layers, nbytes, self._clock))
        self._bytes += nbytes
        if self._bytes > self.max_bytes:
            self._entries.sort(key=lambda entry: entry.used, reverse=True)
            while self._bytes > self.max_bytes:
                self._bytes -= self._entries.pop().nbytes
        self._tokens = None

    def longest(self, prompt_ids: Sequence[int]) -> tuple[int, list[tuple[torch.Tensor, torch.Tensor]] | None]:
        """The longest stored prefix of `prompt_ids`, at most all but its last token (whose logits a prefill
        must compute): its length and per layer keys and values (views), or (0, None)."""
        limit = len(prompt_ids) - 1
        if limit < 1 or not self._entries:
            return 0, None
        if self._tokens is None:
            self._tokens = torch.nn.utils.rnn.pad_sequence(
                [entry.tokens for entry in self._entries], batch_first=True, padding_value=-1
            )
        width = min(limit, self._tokens.shape[1])
        prompt = torch.tensor(prompt_ids[:width], dtype=torch.long)
        # each entry's common prefix: the run of equal tokens from the start
        common = (self._tokens[:, :width] == prompt).int().cumprod(dim=1).sum(dim=1)
        best = int(common.max())
        if best == 0:
            return 0, None
        best_entry = self._entries[int(common.argmax())]
        self._clock += 1
        best_entry.used = self._clock
        return best, [(k[:, :best], v[:, :best]) for k, v in best_entry.layers]
