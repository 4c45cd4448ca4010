"""One decoding step's sampling for a batch of `generator` requests, with vLLM's semantics: repetition
penalty, temperature, top-k, top-p, then a draw from each row's own generator (its `seed`) or, for the
rows without one, one draw for all of them from the caller's generator, and the processed
log-probability of the sampled token (vLLM's `processed_logprobs`)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

#: vLLM treats temperatures below this as greedy (vllm/sampling_params.py `_SAMPLING_EPS`).
GREEDY_EPS = 1e-5


class BatchSampler:
    """Per-row sampling with vLLM's order: repetition penalty, temperature, top-k, top-p, then sample.
    `batch` holds the rows' requests (`requests.Request`): their `temperature`, `top_k`, `top_p`,
    `repetition_penalty` and `generator` (None: the caller's default)."""

    def __init__(self, batch: Sequence, device: torch.device) -> None:
        self.batch = batch
        self.greedy = torch.tensor([r.temperature < GREEDY_EPS for r in batch], device=device)
        self.temperature = torch.tensor([max(r.temperature, GREEDY_EPS) for r in batch], device=device)[:, None]
        self.top_k = torch.tensor([r.top_k if r.top_k > 0 else -1 for r in batch], device=device)
        self.top_p = torch.tensor([r.top_p for r in batch], device=device)[:, None]
        self.penalty = [r.repetition_penalty for r in batch]
        self.truncates = bool((self.top_k > 0).any() or (self.top_p < 1).any())
        sampled = [row for row, r in enumerate(batch) if r.temperature >= GREEDY_EPS]
        #: rows drawing from the caller's generator, in one call; rows with a seed draw from their own
        self.shared_rows = [row for row in sampled if batch[row].generator is None]
        self.seeded_rows = [row for row in sampled if batch[row].generator is not None]

    def sample(
        self, logits: torch.Tensor, seen: list[torch.Tensor], default_generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Return the sampled token of each row and its processed log-probability."""
        for row, penalty in enumerate(self.penalty):
            if penalty != 1.0:
                ids = seen[row].unique()
                values = logits[row, ids]
                logits[row, ids] = torch.where(values > 0, values / penalty, values * penalty)
        greedy_logp = torch.log_softmax(logits, dim=-1)
        greedy_tokens = logits.argmax(dim=-1)

        processed = logits / self.temperature
        if self.truncates:  # sorting the vocabulary is most of a step's sampling: skipped when nothing is cut
            processed = self._top_k_top_p(processed)
        logp = torch.log_softmax(processed, dim=-1)
        probs = logp.exp()
        sampled = greedy_tokens.clone()
        if self.shared_rows:
            draws = torch.multinomial(probs[self.shared_rows].cpu(), 1, generator=default_generator)
            sampled[self.shared_rows] = draws.squeeze(-1).to(sampled.device)
        for row in self.seeded_rows:
            sampled[row] = torch.multinomial(probs[row].cpu(), 1, generator=self.batch[row].generator).item()
        chosen = torch.where(self.greedy[:, None], greedy_logp, logp)
        return sampled, chosen.gather(-1, sampled[:, None]).squeeze(-1)

    def _top_k_top_p(self, logits: torch.Tensor) -> torch.Tensor:
        """Mask logits outside each row's top-k, then outside its nucleus of mass top-p (at least one kept)."""
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        rank = torch.arange(logits.shape[-1], device=logits.device)[None, :]
        k = torch.where(self.top_k > 0, self.top_k, logits.shape[-1])[:, None]
        sorted_logits = sorted_logits.masked_fill(rank >= k, float("-inf"))
        probs = sorted_logits.softmax(dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs
        sorted_logits = sorted_logits.masked_fill((mass_before >= self.top_p) & (rank > 0), float("-inf"))
        return torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
