"""The `hf` generator's running batch: requests join it and leave it between decoding steps.

Continuous batching on a transformers causal LM. The rows decoding together share one KV cache,
left-padded so that every row's last token sits in the last column (a 2-D attention mask marks the
padding); a request that arrives while others decode is prefilled on its own and joins them at the next
step, and a row that stops leaves at once, so nobody waits for the longest row of a batch.

Two things keep a step cheap where the model is tiny and a step is mostly overhead (CPU):

- `GrowingLayer`: a layer's keys and values live in a buffer with spare room, and a step writes its
  token in place; transformers' `DynamicLayer` concatenates, copying the whole cache every token.
- `decode_attention` (the attention implementation `memagent_decode`): a step's one query token per row
  attends with grouped-query heads as they are; transformers' sdpa path copies every key and value to
  repeat them per query head whenever a mask is needed, as it is with left padding. Prompts (more than
  one query token) go through transformers' sdpa unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import AttentionInterface, DynamicCache
from transformers.cache_utils import DynamicLayer
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from verl_memagent.generation.prefix_cache import PrefixCache

#: the attention implementation name `register_attention` gives transformers
ATTENTION = "memagent_decode"
#: free cache positions a layer keeps beyond its rows' length; it doubles when they run out
SPARE_POSITIONS = 64


def decode_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """Attention of one new token per row over the cache, keys and values shared by query-head groups.

    Shapes as transformers passes them: query (rows, query heads, 1, head dim), key and value (rows,
    key-value heads, cache length, head dim), mask None or boolean (rows, 1, 1, cache length), True where
    attended. Returns (rows, 1, query heads, head dim). Prompts go to transformers' sdpa.
    """
    if query.shape[2] != 1:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    rows, query_heads, _, head_dim = query.shape
    groups = key.shape[1]
    scores = torch.matmul(query.view(rows, groups, query_heads // groups, head_dim), key.transpose(-1, -2))
    scores = scores * (head_dim**-0.5 if scaling is None else scaling)
    if attention_mask is not None:
        scores = scores.masked_fill(~attention_mask.view(rows, 1, 1, -1), float("-inf"))
    output = torch.matmul(scores.softmax(dim=-1), value)
    return output.view(rows, query_heads, 1, head_dim).transpose(1, 2), None


def register_attention() -> None:
    """Make `ATTENTION` known to transformers: `decode_attention`, with sdpa's mask format."""
    AttentionInterface.register(ATTENTION, decode_attention)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)


class GrowingLayer(DynamicLayer):
    """A `DynamicLayer` that appends into spare room instead of concatenating: one copy per doubling.

    `keys` and `values` are views of the buffers' first `length` positions, as `DynamicLayer` exposes them.
    """

    def __init__(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        super().__init__()
        self.lazy_initialization(keys, values)
        self.length = keys.shape[-2]
        shape = (*keys.shape[:2], self.length + SPARE_POSITIONS, keys.shape[-1])
        self._keys, self._values = keys.new_zeros(shape), values.new_zeros(shape)
        self._keys[..., : self.length, :] = keys
        self._values[..., : self.length, :] = values
        self._expose()

    def _expose(self) -> None:
        self.keys = self._keys[..., : self.length, :]
        self.values = self._values[..., : self.length, :]

    def update(self, key_states, value_states, *args, **kwargs):
        added = key_states.shape[-2]
        if self.length + added > self._keys.shape[-2]:
            room = max(self._keys.shape[-2], added + SPARE_POSITIONS)
            self._keys = torch.cat(
                [self._keys, self._keys.new_zeros((*self._keys.shape[:2], room, self._keys.shape[-1]))], -2
            )
            self._values = torch.cat(
                [self._values, self._values.new_zeros((*self._values.shape[:2], room, self._values.shape[-1]))], -2
            )
        self._keys[..., self.length : self.length + added, :] = key_states
        self._values[..., self.length : self.length + added, :] = value_states
        self.length += added
        self._expose()
        return self.keys, self.values


def _cache(layers: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> DynamicCache:
    cache = DynamicCache()
    cache.layers = [GrowingLayer(keys, values) for keys, values in layers]
    return cache


def _stacked_prefixes(hits: list, reused: list[int], width: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer, the rows' first `reused[row]` cached keys and values (of their hit's layers), left-padded
    to `width` positions and stacked into (rows, heads, width, head dim)."""
    template = next(layers for layers, start in zip(hits, reused, strict=True) if start)
    stacked = []
    for layer, (keys, values) in enumerate(template):
        per_kind = []
        for kind, like in enumerate((keys, values)):
            rows = [
                _left_pad(layers[layer][kind][:, :start], width, -2)
                if start
                else like.new_zeros((like.shape[0], width, like.shape[2]))
                for layers, start in zip(hits, reused, strict=True)
            ]
            per_kind.append(torch.stack(rows))
        stacked.append(tuple(per_kind))
    return stacked


def _left_pad(tensor: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    """`tensor` with zeros before its entries along `dim` up to `width` positions."""
    missing = width - tensor.shape[dim]
    if not missing:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)


class RunningBatch:
    """Rows decoding together: their requests (in row order), the shared cache, its 2-D attention mask,
    each row's next position and last sampled token (not yet in the cache), and the tokens each row has
    seen (only where a repetition penalty needs them)."""

    def __init__(self, requests, cache, mask, positions, last, seen) -> None:
        self.requests = list(requests)
        self.cache, self.mask, self.positions, self.last, self.seen = cache, mask, positions, last, seen

    def __len__(self) -> int:
        return len(self.requests)

    @classmethod
    def prefill(cls, model, requests, pad_token_id: int, prefixes: PrefixCache) -> tuple[RunningBatch, torch.Tensor]:
        """Prefill the requests' prompts as one batch, each from its longest cached prefix: the batch and its
        next-token logits.

        Every row runs the same number of new tokens, `block`, the most any row needs beyond its cached
        prefix; a row that needs fewer runs the last `block` tokens of its prompt (recomputing some cached
        ones) on a shorter prefix, so each row's keys stay contiguous and right-aligned.
        """
        device = next(model.parameters()).device
        hits = [prefixes.longest(r.prompt_ids) for r in requests]
        lengths = [len(r.prompt_ids) for r in requests]
        block = max(length - cached for length, (cached, _) in zip(lengths, hits, strict=True))
        reused = [max(0, length - block) for length in lengths]
        past = max(reused)
        input_ids = torch.full((len(requests), block), pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(requests), past + block), dtype=torch.long)
        for row, (request, length, start) in enumerate(zip(requests, lengths, reused, strict=True)):
            input_ids[row, block - (length - start) :] = torch.tensor(request.prompt_ids[start:])
            mask[row, past + block - length :] = 1
        cache = _cache(_stacked_prefixes([layers for _, layers in hits], reused, past)) if past else DynamicCache()
        input_ids, mask = input_ids.to(device), mask.to(device)
        out = model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=(mask.cumsum(-1) - 1).clamp(min=0)[:, past:],
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,  # the prompt's other positions predict nothing to sample
        )
        if not past:
            cache = _cache([(layer.keys, layer.values) for layer in out.past_key_values.layers])
        positions = mask.sum(-1)
        seen = [torch.tensor(r.prompt_ids, device=device) if r.repetition_penalty != 1.0 else None for r in requests]
        return cls(requests, cache, mask, positions, torch.zeros_like(positions), seen), out.logits[:, -1, :].float()

    def step(self, model) -> torch.Tensor:
        """Feed every row's last token: the next-token logits of every row."""
        self.mask = torch.cat([self.mask, self.mask.new_ones((len(self), 1))], dim=-1)
        out = model(
            input_ids=self.last[:, None],
            attention_mask=self.mask,
            position_ids=self.positions[:, None],
            past_key_values=self.cache,
            use_cache=True,
        )
        self.positions = self.positions + 1
        return out.logits[:, -1, :].float()

    def record(self, tokens: torch.Tensor) -> None:
        """The tokens just sampled, one per row: fed at the next step, and seen by the penalty."""
        self.last = tokens
        for row, seen in enumerate(self.seen):
            if seen is not None:
                self.seen[row] = torch.cat([seen, tokens[row : row + 1]])

    def join(self, other: RunningBatch) -> RunningBatch:
        """One batch of both: the shorter cache padded on the left to the longer's length."""
        width = max(self.mask.shape[1], other.mask.shape[1])
        layers = [
            tuple(
                torch.cat([_left_pad(a, width, -2), _left_pad(b, width, -2)])
                for a, b in ((mine.keys, theirs.keys), (mine.values, theirs.values))
            )
            for mine, theirs in zip(self.cache.layers, other.cache.layers, strict=True)
        ]
        mask = torch.cat([_left_pad(self.mask, width, 1), _left_pad(other.mask, width, 1)])
        return RunningBatch(
            self.requests + other.requests,
            _cache(layers),
            mask,
            torch.cat([self.positions, other.positions]),
            torch.cat([self.last, other.last]),
            self.seen + other.seen,
        )

    def without_finished(self, prefixes: PrefixCache) -> tuple[RunningBatch | None, list]:
        """The rows still decoding (None if none) and the requests that finished, whose sequences' keys and
        values go to `prefixes`; columns that are padding in every remaining row are dropped."""
        keep = [row for row, r in enumerate(self.requests) if r.finish_reason is None]
        finished = [r for r in self.requests if r.finish_reason is not None]
        if not finished:
            return self, []
        for row, request in enumerate(self.requests):
            if request.finish_reason is not None:  # every token but the last sampled one is in the cache
                sequence = request.prompt_ids + request.token_ids[:-1]
                prefixes.store(
                    sequence,
                    [
                        (layer.keys[row, :, -len(sequence) :].clone(), layer.values[row, :, -len(sequence) :].clone())
                        for layer in self.cache.layers
                    ],
                )
        if not keep:
            return None, finished
        index = torch.tensor(keep, device=self.mask.device)
        mask = self.mask.index_select(0, index)
        first = int(mask.any(dim=0).int().argmax())
        layers = [
            (layer.keys.index_select(0, index)[..., first:, :], layer.values.index_select(0, index)[..., first:, :])
            for layer in self.cache.layers
        ]
        batch = RunningBatch(
            [self.requests[row] for row in keep],
            _cache(layers),
            mask[:, first:],
            self.positions.index_select(0, index),
            self.last.index_select(0, index),
            [self.seen[row] for row in keep],
        )
        return batch, finished
