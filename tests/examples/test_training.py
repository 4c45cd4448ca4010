"""The warm starts' training floor (`memagent_examples.training`, `copy_rows`): supervised steps, resumes, copy rows."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from memagent_examples.copy_rows import CopyRows, copy_batch, copy_pretraining, distant_copy_batch
from memagent_examples.training import IGNORE, ResumePoint, adamw_steps, labelled_loss, supervised_steps


def test_a_checkpoint_after_k_steps_is_the_model_of_a_k_step_run(tiny_model_dir, tokenizer):
    """What `warm-start --checkpoint-every` and benchmarks/warm_start_sweep.py rely on."""
    generator = torch.Generator().manual_seed(0)
    samples = [(ids, ids) for ids in torch.randint(5, 200, (6, 24), generator=generator).tolist()]
    run = dict(
        samples=samples, lr=1e-3, batch_size=2, pad_token_id=tokenizer.pad_token_id, extra_rows=(CopyRows(adjacent=1),)
    )
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    saved = {}

    def after_step(step: int) -> None:
        if step == 2:
            saved.update({name: value.detach().clone() for name, value in model.state_dict().items()})

    supervised_steps(model, steps=4, after_step=after_step, **run)
    short = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    supervised_steps(short, steps=2, **run)
    assert saved.keys() == short.state_dict().keys()
    assert all(torch.equal(saved[name], value) for name, value in short.state_dict().items())
    assert not all(torch.equal(saved[name], value) for name, value in model.state_dict().items())


class Killed(Exception):
    """Stands for the SIGKILL that ends a session in the middle of a warm start."""


def test_a_warm_start_killed_and_resumed_ends_with_the_weights_of_one_never_stopped(tiny_model_dir, tmp_path):
    """`warm-start --resume-every`: killed after step 5 (its last save at step 4: step 5 is lost), started
    again, it redoes step 5 from the saved AdamW moments, lr schedule (decaying over the run's last 3 of 6
    steps) and batch sources, and ends bit for bit where an uninterrupted run ends, with the same losses."""
    generator = torch.Generator().manual_seed(3)
    samples = [(ids, ids) for ids in torch.randint(5, 200, (8, 24), generator=generator).tolist()]
    run = dict(samples=samples, steps=6, lr=1e-3, batch_size=2, pad_token_id=0, decay_steps=3, unpadded=True)
    run["extra_rows"] = (CopyRows(adjacent=1),)
    whole = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    whole_losses = supervised_steps(whole, **run)

    resume = ResumePoint(tmp_path / "resume.pt", every=2, identity={"steps": 6})

    def kill_after_step_5(step: int) -> None:
        if step == 5:
            raise Killed

    with pytest.raises(Killed):
        supervised_steps(
            AutoModelForCausalLM.from_pretrained(tiny_model_dir), after_step=kill_after_step_5, resume=resume, **run
        )
    assert len(torch.load(resume.path, weights_only=False)["losses"]) == 4
    resumed = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    steps_run = []
    resumed_losses = supervised_steps(resumed, after_step=steps_run.append, resume=resume, **run)
    assert steps_run == [5, 6]
    assert resumed_losses == whole_losses
    assert all(torch.equal(value, resumed.state_dict()[name]) for name, value in whole.state_dict().items())

    # the same state under other inputs is refused, with the file and the fix named
    other = ResumePoint(resume.path, every=2, identity={"steps": 7})
    with pytest.raises(ValueError, match="resume.pt holds the state of a run with other inputs.*delete it"):
        supervised_steps(AutoModelForCausalLM.from_pretrained(tiny_model_dir), resume=other, **run)


def test_copy_batch_labels_exactly_the_repeats():
    input_ids, labels = copy_batch(torch.Generator().manual_seed(0), vocab_size=50, batch_size=4, length=64)
    assert input_ids.shape == labels.shape == (4, 64)
    for row_ids, row_labels in zip(input_ids.tolist(), labels.tolist(), strict=True):
        labelled = [i for i, label in enumerate(row_labels) if label != IGNORE]
        assert 0 < len(labelled) < 64
        start = 0
        while start < 64 and row_labels[start] == IGNORE:  # segments: size unlabelled, then its repeat
            size = next((i for i in range(start, 64) if row_labels[i] != IGNORE), 64) - start
            repeat = row_ids[start + size : start + 2 * size]
            assert repeat == row_ids[start : start + len(repeat)]
            assert row_labels[start + size : start + 2 * size] == repeat
            start += 2 * size


def test_distant_copy_batch_labels_exactly_the_copies_at_every_distance():
    input_ids, labels = distant_copy_batch(torch.Generator().manual_seed(0), 50, batch_size=8, length=320, copies=6)
    distances = []
    for row_ids, row_labels in zip(input_ids.tolist(), labels.tolist(), strict=True):
        labelled = [i for i, label in enumerate(row_labels) if label != IGNORE]
        runs = [[labelled[0]]]  # each copy is one run of labels, apart from the others
        for i in labelled[1:]:
            runs[-1].append(i) if i == runs[-1][-1] + 1 else runs.append([i])
        assert len(runs) == 6 and all(4 <= len(run) <= 16 for run in runs)
        for run in runs:
            copy = row_ids[run[0] : run[-1] + 1]
            assert [row_labels[i] for i in run] == copy
            sources = [s for s in range(run[0] - len(copy) + 1) if row_ids[s : s + len(copy)] == copy]
            assert sources, "every labelled run repeats an earlier segment"
            distances.append(run[0] - sources[-1])
    assert min(distances) < 40 and max(distances) > 160  # near and far copies alike
    with pytest.raises(ValueError, match="use >= 320"):
        distant_copy_batch(torch.Generator(), 50, length=100, copies=8)


def test_copy_rows_add_each_kinds_loss(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    rows = CopyRows(adjacent=2, distant=1, distant_length=320)
    adjacent = labelled_loss(model, *copy_batch(torch.Generator().manual_seed(3), model.config.vocab_size, 2))
    generator = torch.Generator().manual_seed(3)
    copy_batch(generator, model.config.vocab_size, 2)
    distant = labelled_loss(model, *distant_copy_batch(generator, model.config.vocab_size, 1, 320))
    torch.testing.assert_close(rows.loss(model, torch.Generator().manual_seed(3)), adjacent + distant)
    assert CopyRows().loss(model, torch.Generator()) == 0.0


def test_labelled_loss_is_the_models_own_loss_on_the_labels(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    input_ids, labels = copy_batch(torch.Generator().manual_seed(1), model.config.vocab_size, batch_size=3, length=40)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[2, 30:] = 0  # a right-padded row, its padding unlabelled
    labels[2, 30:] = IGNORE
    expected = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
    torch.testing.assert_close(labelled_loss(model, input_ids, labels, attention_mask), expected)


def test_copy_pretraining_updates_the_model(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    before = model.model.layers[0].self_attn.q_proj.weight.clone()
    losses = copy_pretraining(model, steps=2)
    assert len(losses) == 2 and all(8.0 < loss < 9.0 for loss in losses)  # ~ln(4096) for random tokens
    assert not torch.equal(before, model.model.layers[0].self_attn.q_proj.weight)


@pytest.mark.parametrize("decay_steps, factors", [(0, [1, 1, 1, 1]), (4, [1, 0.75, 0.5, 0.25]), (2, [1, 1, 1, 0.5])])
def test_adamw_steps_keep_or_linearly_decay_the_learning_rate(decay_steps, factors):
    """On a loss of constant gradient Adam's update is the learning rate itself, so each step's change
    shows the rate it took: 0.1 throughout; falling by a quarter a step over all 4 steps; or by half a
    step over the last 2."""
    model = torch.nn.Module()
    model.weight = torch.nn.Parameter(torch.zeros(()))
    values = []
    record = lambda _: values.append(model.weight.item())  # noqa: E731
    adamw_steps(model, 4, 0.1, lambda: 3.0 * model.weight, "test", record, decay_steps)
    expected, weight = [], 0.0
    for factor in factors:  # AdamW: the weight shrinks by rate x 0.01 (its default decay), then moves by the rate
        rate = 0.1 * factor
        expected.append(weight - (weight * (1 - rate * 0.01) - rate))
        weight -= expected[-1]
    changes = [before - after for before, after in zip([0.0, *values[:-1]], values, strict=True)]
    assert changes == pytest.approx(expected, abs=1e-6)
