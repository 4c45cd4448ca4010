"""Supervised warm start from scripted trajectories played through the real agent loop.

A random tiny model never writes a valid action, so reinforcement learning gets no reward to follow.
This plays scripted texts through the project's own agent loop (`ScriptedPolicy` behind verl's
`generate`), against the real retriever, and trains on exactly the samples the loop emits: each
context's prompt ids, then its response ids with the loss on generated tokens only (response_mask).
The model thus learns the agent's real contexts, not a re-rendering of them.
"""

from __future__ import annotations

import os
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from memagent_examples.scripted import ScriptedPolicy
from verl_memagent.agent import instantiate_agent_loop
from verl_memagent.agent.factory import verl_trainer_config
from verl_memagent.output_fields import FinishReason, OutputField
from verl_memagent.progress import progress

IGNORE = -100


async def scripted_samples(
    agent: str,
    scripts: Sequence[tuple[str, list[str]]],
    tokenizer,
    agent_loops_yaml: str,
    prompt_length: int,
    response_length: int,
    hf_model_type: str | None,
    **settings,
) -> list[tuple[list[int], list[int]]]:
    """(input ids, labels) of every context the agent loop builds while replaying each (question, texts).

    `hf_model_type` (the model's `config.model_type`) picks verl's token builder, as in training:
    Qwen's restores the newline after `<|im_end|>` at turn boundaries, the generic one does not, and
    a warm start on contexts that differ from the live ones teaches the wrong thing.
    """
    config = verl_trainer_config(prompt_length=prompt_length, response_length=response_length)
    samples = []
    played = progress(len(scripts), "demonstrations played", unit="trajectories")
    for index, (question, texts) in enumerate(scripts):
        policy = ScriptedPolicy(tokenizer, texts)
        loop = instantiate_agent_loop(
            agent, config, policy, tokenizer, hf_model_type, path=agent_loops_yaml, **settings
        )
        row = {
            "raw_prompt": [{"role": "user", "content": question}],
            "extra_info": {"question": question},
            "data_source": "scripted",
            "uid": f"scripted-{index}",
            "session_id": 0,
            "global_steps": 0,
        }
        outputs = await loop.run({"temperature": 1.0, "logprobs": False}, **row)
        outputs = outputs if isinstance(outputs, list) else [outputs]
        reason = outputs[-1].extra_fields.get(OutputField.FINISH_REASON)
        if reason != FinishReason.ANSWER or len(policy.calls) != len(texts):
            raise ValueError(f"the script for {question!r} did not play out as an answer: {reason}")
        for out in outputs:
            labels = [tok if keep else IGNORE for tok, keep in zip(out.response_ids, out.response_mask, strict=True)]
            samples.append((out.prompt_ids + out.response_ids, [IGNORE] * len(out.prompt_ids) + labels))
        played.update()
    played.close()
    return samples


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


def distant_copy_batch(
    generator: torch.Generator, vocab_size: int, batch_size: int = 4, length: int = 1024, copies: int = 8
):
    """Random token rows with `copies` segments of 4-16 tokens each repeated at a random later place;
    labels only on the repeats. An agent's query copies names from a question hundreds of tokens into its
    context; `copy_batch`'s 128-token rows form heads that copy 40 tokens back and fail past position 128
    (benchmarks/RESULTS.md, the papers' claim), these rows teach copying at every distance and position.
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
    """AdamW steps on copy rows (`rows`; by default 32 `copy_batch` rows): the standard way to form
    induction heads (attend to the token after the previous occurrence of this one, copy it). Returns
    the loss of each step.

    A pretrained LLM copies names out of its context; a random tiny model cannot, and demonstrations
    alone teach it the format but not the copying (measured: copied tokens stay at chance).
    """
    generator = torch.Generator().manual_seed(seed)
    return adamw_steps(model, steps, lr, lambda: rows.loss(model, generator), "copy pretraining")


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
    main job's short contexts keep the padded batch, whose floats its shipped start was built with).
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
