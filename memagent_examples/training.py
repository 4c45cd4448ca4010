"""The training loop of every warm start: AdamW steps on the loss of labelled tokens, resumable.

A sample is (input ids, labels), labels `IGNORE` where no loss is taken (prompts, observations): the
loss is the causal LM's on the labelled positions only. `supervised_steps` trains on demonstration
samples with synthetic rows (copy rows, answer rows) added to each step; `adamw_steps` is the loop
under it, which can keep its whole state to resume a run of hours (`ResumePoint`).
"""

from __future__ import annotations

import os
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from verl_memagent.progress import progress

IGNORE = -100


def labelled_loss(model, input_ids: torch.Tensor, labels: torch.Tensor, attention_mask=None, reduction="mean"):
    """The causal LM's mean next-token loss on the labelled positions, as `model(..., labels=labels).loss`,
    with the vocabulary projection computed only where a label is: most positions have none, and that
    projection is most of a tiny model's cost. `reduction="sum"`: the sum over the labelled positions."""
    hidden = model.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state[:, :-1]
    targets = labels[:, 1:]
    keep = targets != IGNORE
    return torch.nn.functional.cross_entropy(model.lm_head(hidden[keep]).float(), targets[keep], reduction=reduction)


@dataclass(frozen=True)
class ResumePoint:
    """Where a long run of AdamW steps keeps its whole state every `every` steps: the model, AdamW's
    moments, the lr schedule, the losses so far and the random sources its batches are drawn from. A
    run killed after a save resumes there and ends with the weights of a run never stopped. Why: a
    warm start on ReAct's long contexts takes hours, more than a working session lasts. `identity`
    (the run's inputs) is saved with the state; a state saved by other inputs is refused."""

    path: Path
    every: int = 100
    identity: dict = field(default_factory=dict)

    def restore(self, model, optimizer, schedule, randomness: Sequence) -> list[float]:
        """The losses of the steps the saved state has done (none if nothing is saved), the state loaded."""
        if not self.path.is_file():
            return []
        state = torch.load(self.path, weights_only=False)
        if state["identity"] != self.identity:
            raise ValueError(
                f"{self.path} holds the state of a run with other inputs ({state['identity']}, not "
                f"{self.identity}): delete it to start this run afresh, or resume with its inputs"
            )
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["schedule"])
        torch.set_rng_state(state["torch_rng"])
        for source, saved in zip(randomness, state["randomness"], strict=True):
            source.setstate(saved) if isinstance(source, random.Random) else source.set_state(saved)
        return state["losses"]

    def save(self, model, optimizer, schedule, randomness: Sequence, losses: list[float]) -> None:
        """Write the state whole or not at all (a kill while writing leaves the previous save)."""
        partial = self.path.with_name(self.path.name + ".partial")
        sources = [
            source.getstate() if isinstance(source, random.Random) else source.get_state() for source in randomness
        ]
        state = {"identity": self.identity, "model": model.state_dict(), "optimizer": optimizer.state_dict()}
        state |= {"schedule": schedule.state_dict(), "torch_rng": torch.get_rng_state(), "randomness": sources}
        torch.save({**state, "losses": losses}, partial)
        os.replace(partial, self.path)


def adamw_steps(
    model,
    steps: int,
    lr: float,
    step_loss,
    desc: str,
    after_step=None,
    decay_steps: int = 0,
    resume: ResumePoint | None = None,
    randomness: Sequence = (),
) -> list[float]:
    """`steps` AdamW updates of `model` on `step_loss()` (a fresh batch's loss each call), in train
    mode, back in eval mode after; returns the loss of each step. Reports progress as `desc`.
    `after_step(n)`, if given, is called after the n-th update (1-based), the model in train mode.
    `decay_steps`: over the last that many steps the learning rate falls linearly from `lr` towards 0
    (constant, then decay: the shape of a warmup-stable-decay schedule without the warm-up).
    `resume`: save the whole state there every `resume.every` steps and start from what it holds;
    `randomness`: the `random.Random`s and `torch.Generator`s `step_loss` draws from, saved with it."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    factor = (lambda done: min(1.0, (steps - done) / decay_steps)) if decay_steps else (lambda done: 1.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    losses = resume.restore(model, optimizer, schedule, randomness) if resume else []
    model.train()
    with progress(steps, desc) as bar:
        bar.update(len(losses))
        for step in range(len(losses) + 1, steps + 1):
            loss = step_loss()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
            losses.append(loss.item())
            if after_step is not None:
                after_step(step)
            if resume and step % resume.every == 0 and step < steps:
                resume.save(model, optimizer, schedule, randomness, losses)
            bar.set_postfix(loss=losses[-1])
            bar.update()
    model.eval()
    return losses


def supervised_steps(
    model,
    samples,
    steps: int,
    lr: float,
    batch_size: int,
    pad_token_id: int,
    seed: int = 0,
    extra_rows: Sequence = (),
    after_step=None,
    unpadded: bool = False,
    decay_steps: int = 0,
    resume: ResumePoint | None = None,
):
    """AdamW steps of next-token loss on the labelled tokens; returns the loss of each step.

    `extra_rows` (each with a `loss(model, generator)`, as `CopyRows`) add the loss of synthetic rows to
    each step: copy rows keep the copying `copy_pretraining` formed while the format is learned.
    `unpadded`: the same loss (the mean over the batch's labelled tokens) computed one sample at a
    time, without padding: with a padding mask torch's CPU attention materialises every row's full
    score matrix, which made a batch of ReAct trajectories of up to 3k tokens take 27 s a step (the
    learning demo's short contexts keep the padded batch, whose floats its shipped start was built with).
    `decay_steps`, `resume`: as `adamw_steps`'.
    """
    rng = random.Random(seed)
    generator = torch.Generator().manual_seed(seed + 1)

    def padded_loss(batch):
        width = max(len(ids) for ids, _ in batch)
        input_ids = torch.full((len(batch), width), pad_token_id)
        labels = torch.full((len(batch), width), IGNORE)
        attention_mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, (ids, targets) in enumerate(batch):
            input_ids[row, : len(ids)] = torch.tensor(ids)
            labels[row, : len(ids)] = torch.tensor(targets)
            attention_mask[row, : len(ids)] = 1
        return labelled_loss(model, input_ids, labels, attention_mask)

    def unpadded_loss(batch):
        labelled = sum(sum(target != IGNORE for target in targets[1:]) for _, targets in batch)
        rows = [(torch.tensor([ids]), torch.tensor([targets])) for ids, targets in batch]
        return sum(labelled_loss(model, ids, targets, reduction="sum") for ids, targets in rows) / labelled

    def step_loss():
        batch = rng.sample(samples, min(batch_size, len(samples)))
        loss = unpadded_loss(batch) if unpadded else padded_loss(batch)
        return loss + sum(rows.loss(model, generator) for rows in extra_rows)

    randomness = (rng, generator)
    return adamw_steps(model, steps, lr, step_loss, "demonstrations", after_step, decay_steps, resume, randomness)
