"""Copy rows: random tokens in which segments repeat, the loss on the repeats (induction heads).

A pretrained LLM copies names out of its context; a random tiny model cannot, and demonstrations alone
teach it the format but not the copying (measured: copied tokens stay at chance). Rows of random
tokens whose segments repeat, with the loss on the repeats, are the standard way to form the heads
that copy (attend to the token after the previous occurrence of this one, copy it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from memagent_examples.training import IGNORE, adamw_steps, labelled_loss


def copy_batch(generator: torch.Generator, vocab_size: int, batch_size: int = 32, length: int = 128):
    """Random token rows made of segments of 4-32 tokens each followed by its repeat; labels only on
    the repeats. Varying lengths mean no fixed offset predicts a repeat: only copying does."""
    input_ids = torch.randint(0, vocab_size, (batch_size, length), generator=generator)
    labels = torch.full_like(input_ids, IGNORE)
    for row in range(batch_size):
        start = 0
        while start < length:
            size = int(torch.randint(4, 33, (1,), generator=generator))
            repeat = slice(start + size, min(start + 2 * size, length))
            if repeat.start >= length:
                break
            input_ids[row, repeat] = input_ids[row, start : start + repeat.stop - repeat.start]
            labels[row, repeat] = input_ids[row, repeat]
            start += 2 * size
    return input_ids, labels


def distant_copy_batch(
    generator: torch.Generator, vocab_size: int, batch_size: int = 4, length: int = 1024, copies: int = 8
):
    """Random token rows with `copies` segments of 4-16 tokens each repeated at a random later place;
    labels only on the repeats. An agent's query copies names from a question hundreds of tokens into its
    context; `copy_batch`'s 128-token rows form heads that copy 40 tokens back and fail past position 128
    (benchmarks/reading_probe.py, docs/papers_claim.md), these rows teach copying at every distance and position.
    A repeat never overwrites, nor touches, an earlier segment or repeat, so each label is a true copy."""
    if length < 40 * copies:
        raise ValueError(f"distant copy rows: length {length} leaves no room for {copies} copies; use >= {40 * copies}")
    input_ids = torch.randint(0, vocab_size, (batch_size, length), generator=generator)
    labels = torch.full_like(input_ids, IGNORE)
    for row in range(batch_size):
        taken = torch.zeros(length + 1, dtype=torch.bool)
        made = 0
        while made < copies:
            size = int(torch.randint(4, 17, (1,), generator=generator))
            source = int(torch.randint(0, length - 2 * size + 1, (1,), generator=generator))
            to = int(torch.randint(source + size, length - size + 1, (1,), generator=generator))
            if taken[max(to - 1, 0) : to + size + 1].any():
                continue
            input_ids[row, to : to + size] = input_ids[row, source : source + size]
            labels[row, to : to + size] = input_ids[row, to : to + size]
            taken[source : source + size] = taken[to : to + size] = True
            made += 1
    return input_ids, labels


@dataclass(frozen=True)
class CopyRows:
    """The copy rows a training step adds to its loss: `adjacent` `copy_batch` rows (128 tokens) and
    `distant` `distant_copy_batch` rows of `distant_length` tokens."""

    adjacent: int = 0
    distant: int = 0
    distant_length: int = 1024

    def loss(self, model, generator: torch.Generator) -> torch.Tensor | float:
        """The sum of each kind's mean loss on fresh rows drawn from `generator` (0.0 when there are none)."""
        loss = 0.0
        if self.adjacent:
            loss = loss + labelled_loss(model, *copy_batch(generator, model.config.vocab_size, self.adjacent))
        if self.distant:
            rows = distant_copy_batch(generator, model.config.vocab_size, self.distant, self.distant_length)
            loss = loss + labelled_loss(model, *rows)
        return loss


def copy_pretraining(
    model, steps: int, lr: float = 1e-3, seed: int = 0, rows: CopyRows = CopyRows(adjacent=32)
) -> list[float]:
    """AdamW steps on copy rows (`rows`; by default 32 `copy_batch` rows); the loss of each step."""
    generator = torch.Generator().manual_seed(seed)
    return adamw_steps(model, steps, lr, lambda: rows.loss(model, generator), "copy pretraining")
