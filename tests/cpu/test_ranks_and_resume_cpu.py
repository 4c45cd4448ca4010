"""The GPU recipes' trainer at one rank and at two, killed and resumed, on the same fixed rollouts.

For memsearcher (multi-context GRPO, the released optimizer-step count, dynamic batch size) and mem1
(multi-context GAE with the critic), each recipe script runs on CPU through the documented switch
(`VERL_PLATFORM=cpu`) with `memagent_examples.scripted.ScriptedAgentLoop`: the real agent loops,
retriever and reward, with a scripted policy whose several-turn trajectories earn different rewards
within a group, so that the advantages are not all zero and every run sees the same rollouts.

- Run A: one rank, 3 steps, a checkpoint every step.
- Run B: two ranks (FSDP2 over gloo, batches padded and balanced over the ranks), 3 steps; killed
  with SIGKILL, driver and Ray workers, while step 2's checkpoint is being written, then started again
  with the same command: it resumes from step 1, so steps 2 and 3 both run after the restart.
- Run E (mem1 only, issue #58 item 2): run A's complete checkpoint of step 1 resumed at one rank: one rank
  against one, so its steps 2 and 3 must be run A's to the last bit (the resume's effect alone, without
  the second rank's).
- Run D (mem1 only, issue #58 item 1), the negative control: run E with the optimizer's state withheld; its
  steps 2 and 3 must fall outside the bound that run B's resume meets, so that the bound can fail.

B must make A's updates: every parameter's change after steps 1 and 3 (mem1: 2 and 3) within fp32
reduction tolerance of A's, the same advantages per trajectory, losses and gradient norms, optimizer-step
counts, questions in the same order, one metrics line per step and complete trajectory records.

The optimizers differ by agent, each for what it proves:
- memsearcher trains with SGD at a constant rate: Adam's first steps move every parameter by about
  lr * sign(gradient), whatever the gradient's size, so a wrongly weighted gradient (a padding row
  counted, a row given another trajectory's advantage) would leave the same parameters; SGD's change
  is the gradient itself.
- mem1 trains with the recipe's AdamW and constant schedule with linear warm-up (MEM1's released
  optimizer), the warm-up over all 3 steps: step 1 at rate 0 (Adam's moments fill, no parameter moves),
  steps 2 and 3 at 1/3 and 2/3 of the rate. A resume that lost the moments would start step 2 with an
  lr * sign(gradient) step, one that restarted the schedule would make it at rate 0: weights after
  step 3, the second step past the resume point, within a tolerance far below either, and the rate
  each step reports equal to the uninterrupted run's, prove both were restored (issue #45, item 6). Run D
  shows the first of these: without the moments its weights leave the bound at both steps. The
  optimizer (AdamW, decoupled weight decay 0.01, the warm-up) is set in the overrides and read back from
  the checkpoints' optimizer state.
Eight launches, most of their time start-up: the memsearcher half (runs A, B twice) about 180 s, the mem1 half
(A, B twice, E, D) 276 s, runs E and D 49 s and 47 s of it (2-core Zen 5, quiet, 2026-12-07).
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch
from gpu_recipes import (
    change_excess,
    checkpoint_optimizer_state,
    checkpoint_weights,
    finish,
    kill_run,
    launch,
    metrics,
    model_weights,
    prepare_data,
    recipe_env,
    scripted_loops,
    session_processes,
    unequal_moments,
    unequal_tensors,
)

from verl_memagent.trajectories.files import read_records

pytestmark = pytest.mark.slow  # verl's main_ppo runs on CPU, three to four times per agent

#: |change at two ranks - change at one| per parameter element, relative to the largest change over all
#: parameters, beyond two float32 roundings of the element itself. The two runs sum each gradient in
#: another order (per-rank partial sums, then gloo's all-reduce; other micro-batches): float32 rounding.
#: Measured on memsearcher: 4-6e-5 of the largest change, all of it at the weights' own float32
#: resolution (1.2e-7 on the RMSNorm weights near 1.0); a row counted twice or dropped moves the
#: change by 1e-2 and more.
CHANGE_TOLERANCE = 1e-4
#: the same with AdamW (mem1), which divides each gradient element by its own running size, so that an
#: element whose gradient is near Adam's epsilon (1e-8) carries its summation-order rounding into the update:
#: measured 1.0e-4 (step 2) and 1.4e-4 (step 3) of the largest change. A resume that lost the moments moves
#: most elements by a large part of the rate (Adam's first step is lr * sign(gradient)), one that restarted
#: the schedule makes step 2 at rate 0: both far beyond this.
ADAM_CHANGE_TOLERANCE = 1e-3
#: relative tolerance of the losses and gradient norms the workers report: measured up to 6.5e-5 apart
#: (the gradient norm sums float32 squares in another order on each side)
METRIC_TOLERANCE = 3e-4
#: GAE's advantages are returns minus the critic's values, which carry the critic's own float32 rounding:
#: measured up to 2.4e-6 apart on advantages of 0.03-0.1 (GRPO's: 1e-7 relative)
ADVANTAGE_ABS_TOLERANCE = 1e-5
#: SGD's rate (memsearcher); AdamW's (mem1) before warm-up: Adam moves a parameter about lr a step
LR = {"memsearcher": 1e-2, "mem1": 1e-3}
#: mem1's warm-up steps: the whole run (rates 0, 1/3, 2/3 of LR for steps 1-3), so that every step's rate
#: differs and a schedule restarted or off by one at the resume changes the update
WARMUP_STEPS = 3
#: mem1's AdamW weight decay (the recipe's), decoupled from the gradient's moments
WEIGHT_DECAY = 0.01
SIZES = {
    # 2 questions x 4 trajectories of 1-3 contexts each; mini-batches of 1 question x 4 turn rows (released)
    "memsearcher": [
        "data.train_batch_size=2",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=1",
    ],
    # 4 two-objective tasks x 1 trajectory; 2 fixed optimizer steps (released: one packed row per trajectory)
    "mem1": ["data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=2"],
}
#: mem1's optimizer steps per training step: 4 tasks in mini-batches of 2
MEM1_OPTIMIZER_STEPS = 2
#: one epoch of 3 steps
ROWS = {"memsearcher": 6, "mem1": 12}
#: micro-batches of 2-3 rows at these lengths, so that dynamic batch size still splits every mini-batch
MICRO_BATCH_TOKENS = ["actor_rollout_ref.actor.ppo_max_token_len_per_gpu=1536"]
OPTIMIZER = {
    "memsearcher": [
        f"{role}.optim.{key}"
        for role in ("actor_rollout_ref.actor", "critic")
        for key in ("optimizer=SGD", "weight_decay=0", f"lr={LR['memsearcher']}")
    ],
    # the recipe's AdamW (weight decay 0.01) and constant schedule with warm-up, at a rate that moves the tiny model
    "mem1": [
        f"{role}.optim.{key}"
        for role in ("actor_rollout_ref.actor", "critic")
        for key in (
            "optimizer=AdamW",
            f"weight_decay={WEIGHT_DECAY}",
            "lr_scheduler_type=constant",
            f"lr={LR['mem1']}",
            f"lr_warmup_steps={WARMUP_STEPS}",
        )
    ],
}
COMMON = [
    *MICRO_BATCH_TOKENS,
    "actor_rollout_ref.actor.checkpoint.save_contents=['model','optimizer','extra','hf_model']",
    "critic.checkpoint.save_contents=['model','optimizer','extra','hf_model']",
    "data.dataloader_num_workers=0",
    "actor_rollout_ref.rollout.agent.num_workers=1",
    "reward.num_workers=1",
    "trainer.total_training_steps=3",
    "trainer.save_freq=1",
    "trainer.test_freq=-1",
    "trainer.val_before_train=False",
    "+trainer.trajectories.per_step=64",
]
#: run D (mem1): verl resumes the model and the extra state (the lr scheduler, the random states) but not
#: the optimizer's: AdamW starts steps 2 and 3 with fresh moments
WITHOUT_OPTIMIZER_STATE = [
    f"{role}.checkpoint.load_contents=['model','extra']" for role in ("actor_rollout_ref.actor", "critic")
]


def recipe_overrides(agent: str) -> list[str]:
    """Every run's overrides of the recipe (mem1's critic start aside): sizes, optimizer, checkpoints."""
    return [*COMMON, *OPTIMIZER[agent], *SIZES[agent]]


def critic_start(model_dir: Path, out: Path) -> Path:
    """The tiny model with a value head saved: verl initialises a missing head at random in each rank's
    process (transformers' init of `score`), so one rank and two would start from different critics."""
    from transformers import AutoModelForTokenClassification, AutoTokenizer

    torch.manual_seed(0)
    AutoModelForTokenClassification.from_pretrained(model_dir, num_labels=1).save_pretrained(out)
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(out)
    return out


def waiting_on_a_pipe(session: int) -> bool:
    """Whether a process of the session is blocked opening a named pipe that has no reader (Linux)."""
    for pid in session_processes(session):
        try:
            if Path(f"/proc/{pid}/wchan").read_text() == "wait_for_partner":  # fs/pipe.c, fifo_open
                return True
        except OSError:  # the process ended meanwhile
            continue
    return False


def kill_while_checkpointing(process: subprocess.Popen, checkpoints: Path, step: int) -> None:
    """SIGKILL the whole run (its session: the script, verl's driver, Ray and its workers) in the middle of
    writing the checkpoint of `step`: after the actor's (and critic's) shards are written, at the
    dataloader's state, before verl marks the checkpoint complete. That file is made a named pipe
    beforehand, which nobody reads: opening it for writing blocks until the kill. The pipe is
    removed afterwards, leaving the checkpoint as a kill at that point leaves it."""
    folder = checkpoints / f"global_step_{step}"
    folder.mkdir(parents=True)
    os.mkfifo(folder / "data.pt")
    while not waiting_on_a_pipe(process.pid):
        assert process.poll() is None, "the run ended before the checkpoint it was to be killed in"
        time.sleep(0.2)
    kill_run(process)
    (folder / "data.pt").unlink()


@pytest.fixture(scope="module", params=["memsearcher", "mem1"])
def runs(request, tmp_path_factory, tiny_model_dir, retriever_url, data_dir):
    agent = request.param
    root = tmp_path_factory.mktemp(f"ranks_{agent}")
    data = prepare_data(agent, data_dir, root / "data", rows=ROWS[agent])
    loops = scripted_loops(root / "agent_loops.yaml")
    overrides = recipe_overrides(agent)
    if agent == "mem1":
        overrides.append(f"critic.model.path={critic_start(tiny_model_dir, root / 'critic_start')}")

    one = root / "one_rank"
    one.mkdir()
    finish(launch(agent, recipe_env(tiny_model_dir, data, one, retriever_url, loops, ranks=1), one, *overrides), one)

    two = root / "two_ranks"
    two.mkdir()
    env = recipe_env(tiny_model_dir, data, two, retriever_url, loops, ranks=2)
    kill_while_checkpointing(launch(agent, env, two, *overrides), two / "checkpoints", step=2)
    killed = {
        "tracker": (two / "checkpoints" / "latest_checkpointed_iteration.txt").read_text().strip(),
        "steps": [line["step"] for line in metrics(two)],
        "partial": sorted(p.name for p in (two / "checkpoints" / "global_step_2" / "actor").glob("model_*.pt")),
    }
    finish(launch(agent, env, two, *overrides), two)
    return {
        "agent": agent,
        "one": one,
        "two": two,
        "killed": killed,
        "initial": tiny_model_dir,
        "data": data,
        "loops": loops,
        "overrides": overrides,
    }


def resume_at_one_rank(runs, tiny_model_dir, retriever_url, name: str, *overrides: str) -> Path:
    """Run A's complete step-1 checkpoint, copied to a run folder of its own and resumed at one rank, as run A
    ran: its steps 2 and 3."""
    work = runs["one"].parent / name
    checkpoints = work / "checkpoints"
    checkpoints.mkdir(parents=True)
    shutil.copytree(runs["one"] / "checkpoints" / "global_step_1", checkpoints / "global_step_1")
    (checkpoints / "latest_checkpointed_iteration.txt").write_text("1")
    env = recipe_env(tiny_model_dir, runs["data"], work, retriever_url, runs["loops"], ranks=1)
    finish(launch(runs["agent"], env, work, *runs["overrides"], *overrides), work)
    return work


@pytest.fixture(scope="module")
def resumed_at_one_rank(runs, tiny_model_dir, retriever_url) -> Path:
    """Run E (mem1): run A's step-1 checkpoint resumed at one rank, with everything it holds."""
    return resume_at_one_rank(runs, tiny_model_dir, retriever_url, "resumed_at_one_rank")


@pytest.fixture(scope="module")
def resumed_without_optimizer_state(runs, tiny_model_dir, retriever_url) -> Path:
    """Run D (mem1): run A's step-1 checkpoint resumed at one rank without the optimizer's state."""
    return resume_at_one_rank(runs, tiny_model_dir, retriever_url, "without_optimizer_state", *WITHOUT_OPTIMIZER_STATE)


def test_the_kill_hit_a_checkpoint_being_written_and_the_restart_resumed_from_the_one_before(runs):
    assert runs["killed"]["tracker"] == "1"  # step 2's checkpoint was not complete
    assert runs["killed"]["partial"]  # its actor shards were on disk
    assert runs["killed"]["steps"] == [1, 2]  # step 2 was logged just before its checkpoint began
    log = (runs["two"] / "run.log").read_text()
    assert "Resuming from" in log and "global_step_1" in log
    assert (runs["two"] / "checkpoints" / "latest_checkpointed_iteration.txt").read_text().strip() == "3"


def _on_policy(run: Path) -> None:
    """verl's staleness of every step's rows reads 0, as with a real server (the scripted loop reports the
    weights of the step before the row's dispatch, `memagent_examples.scripted.server_weight_versions`)."""
    for line in metrics(run):
        for name in ("trajectory_staleness", "trajectory_staleness_worst"):
            for bound in ("min", "max"):
                assert line["data"][f"training/off_policy/{name}/{bound}"] == 0, (line["step"], name, bound)


def test_one_metrics_line_per_step_and_every_row_on_policy(runs):
    for run in ("one", "two"):
        assert [line["step"] for line in metrics(runs[run])] == [1, 2, 3]
        _on_policy(runs[run])


def _same_actor_changes(runs, other: Path, steps: Sequence[int]) -> None:
    """The actor's change since the start, after each of `steps`, in run `other` within tolerance of run A's."""
    initial = model_weights(runs["initial"])
    tolerance = ADAM_CHANGE_TOLERANCE if runs["agent"] == "mem1" else CHANGE_TOLERANCE
    for step in steps:
        one, two = checkpoint_weights(runs["one"], step, "actor"), checkpoint_weights(other, step, "actor")
        assert one.keys() == two.keys()
        largest, excess = change_excess(one, two, initial, initial)
        assert largest > 100 * LR[runs["agent"]] * 1e-4, "the update moved nothing: the comparison would prove nothing"
        assert excess <= tolerance * largest, ("actor", step, excess, largest)


def test_two_ranks_make_the_updates_of_one(runs):
    adam = runs["agent"] == "mem1"
    if adam:  # warm-up's step 1 at rate 0: the moments fill, no parameter moves
        initial = model_weights(runs["initial"])
        for run in ("one", "two"):
            assert all(
                torch.equal(value, initial[name]) for name, value in checkpoint_weights(runs[run], 1, "actor").items()
            )
    _same_actor_changes(runs, runs["two"], (2, 3) if adam else (1, 3))
    if adam:
        # the critic's value head starts random and unsaved: its change since step 1, then its step-1 weights
        one, two = checkpoint_weights(runs["one"], 1, "critic"), checkpoint_weights(runs["two"], 1, "critic")
        later_one, later_two = (
            checkpoint_weights(runs["one"], 3, "critic"),
            checkpoint_weights(runs["two"], 3, "critic"),
        )
        largest, excess = change_excess(later_one, later_two, one, two)
        assert largest > 0 and excess <= ADAM_CHANGE_TOLERANCE * largest, ("critic", 3, excess, largest)
        _, excess = change_excess(one, two, dict.fromkeys(one, 0.0), dict.fromkeys(two, 0.0))
        assert excess <= ADAM_CHANGE_TOLERANCE * largest, ("critic", 1, excess, largest)


def test_the_resumed_run_kept_the_learning_rate_schedule(runs):
    """verl reports the rate its scheduler set for the next step: mem1's warm-up ramps it by a third a
    step across the restart, memsearcher's stays constant."""
    rate = LR[runs["agent"]]
    expected = [rate * min(1.0, step / WARMUP_STEPS) if runs["agent"] == "mem1" else rate for step in (1, 2, 3)]
    roles = ("actor", "critic") if runs["agent"] == "mem1" else ("actor",)
    for run in ("one", "two"):
        for role in roles:
            assert [line["data"][f"{role}/lr"] for line in metrics(runs[run])] == pytest.approx(expected), (run, role)


@pytest.mark.parametrize("runs", ["mem1"], indirect=True)
def test_the_optimizer_is_adamw_with_its_weight_decay(runs):
    """Read back from run A's checkpoint: AdamW (decoupled weight decay) at the test's rate and decay, and
    after step 3 the moments of its six optimizer steps for every parameter."""
    saved = checkpoint_optimizer_state(runs["one"], 3)
    group = saved["param_groups"][0]
    assert group["decoupled_weight_decay"] and group["weight_decay"] == WEIGHT_DECAY
    assert group["initial_lr"] == LR["mem1"] and group["betas"] == (0.9, 0.999)
    assert len(saved["state"]) == len(group["params"])
    steps = 3 * MEM1_OPTIMIZER_STEPS
    assert all(state["step"] == steps and state["exp_avg_sq"].abs().max() > 0 for state in saved["state"].values())


@pytest.mark.parametrize("runs", ["mem1"], indirect=True)
def test_a_resume_at_one_rank_makes_run_as_updates_to_the_last_bit(runs, resumed_at_one_rank):
    """Run E against run A: one rank each, the same rows in the same order, so the same arithmetic. Steps 2
    and 3 after the resume leave the actor, the critic and both optimizers' moments exactly as run A's: the
    resume alone adds nothing to run B's bound, which is the second rank's summation order."""
    work = resumed_at_one_rank
    assert "Resuming from" in (work / "run.log").read_text()
    assert [line["step"] for line in metrics(work)] == [2, 3]
    for role in ("actor", "critic"):
        for step in (2, 3):
            one, resumed = checkpoint_weights(runs["one"], step, role), checkpoint_weights(work, step, role)
            assert unequal_tensors(resumed, one) == [], (role, step)
        assert unequal_moments(work, runs["one"], 3, role) == [], role
        states = checkpoint_optimizer_state(work, 3, role)["state"].values()
        assert all(state["step"] == 3 * MEM1_OPTIMIZER_STEPS for state in states), role
    assert [line["data"]["actor/pg_loss"] for line in metrics(work)] == [
        line["data"]["actor/pg_loss"] for line in metrics(runs["one"])[1:]
    ]


@pytest.mark.parametrize("runs", ["mem1"], indirect=True)
def test_a_resume_without_the_optimizer_state_falls_outside_the_bound(runs, resumed_without_optimizer_state):
    """The negative control of run B's resume: the same bound, the same steps, the moments withheld. The
    rate schedule (the extra state) is restored, so only the moments differ; each step past the resume leaves
    the bound by orders of magnitude (Adam's first step with fresh moments is about lr * sign(gradient))."""
    work = resumed_without_optimizer_state
    log = (work / "run.log").read_text()
    assert "Resuming from" in log and "global_step_1" in log
    assert [line["step"] for line in metrics(work)] == [2, 3]
    rate = LR["mem1"]
    assert [line["data"]["actor/lr"] for line in metrics(work)] == pytest.approx([rate * 2 / 3, rate])
    steps = 2 * MEM1_OPTIMIZER_STEPS  # moments from step 2 on
    assert all(state["step"] == steps for state in checkpoint_optimizer_state(work, 3)["state"].values())
    initial = model_weights(runs["initial"])
    for step in (2, 3):
        largest, excess = change_excess(
            checkpoint_weights(runs["one"], step, "actor"), checkpoint_weights(work, step, "actor"), initial, initial
        )
        assert excess > 10 * ADAM_CHANGE_TOLERANCE * largest, (step, excess, largest)


def _same_losses_and_optimizer_steps(runs, other: Path) -> None:
    """Run `other`'s losses, gradient norms and optimizer-step counts, step by step, those of run A."""
    one, two = metrics(runs["one"]), metrics(other)
    compared = ["actor/pg_loss", "actor/grad_norm", "critic/vf_loss", "critic/grad_norm", "critic/score/mean"]
    for a, b in zip(one, two, strict=True):
        for name in compared:
            if name in a["data"]:
                assert b["data"][name] == pytest.approx(a["data"][name], rel=METRIC_TOLERANCE, abs=1e-7), (
                    name,
                    a["step"],
                )
        assert a["data"]["actor/grad_norm"] > 0
        rows = round(a["data"]["agent/contexts/mean"] * a["data"]["agent/trajectories"])
        steps = math.ceil(rows / 4) if runs["agent"] == "memsearcher" else MEM1_OPTIMIZER_STEPS  # released; fixed
        assert a["data"]["multi_context/actor_steps"] == b["data"]["multi_context/actor_steps"] == steps


def test_losses_gradients_and_optimizer_steps_agree(runs):
    _same_losses_and_optimizer_steps(runs, runs["two"])
    assert any(line["data"]["multi_context/padding_rows"] > 0 for line in metrics(runs["two"]))  # the balancing padded


def _same_records(runs, other: Path) -> list[set[float]]:
    """Every step's trajectory records, complete in run A and run `other`, hold the same questions, rewards and
    advantages; the rewards of each of run A's steps."""
    rewards = []
    for step in (1, 2, 3):
        records = {}
        for run, folder in (("one", runs["one"]), ("other", other)):
            found = read_records(folder / "checkpoints" / "trajectories" / f"step_{step}.jsonl")
            assert len(found) == (8 if runs["agent"] == "memsearcher" else 4)
            assert len({(r.uid, r.session) for r in found}) == len(found)  # every trajectory once
            assert all([t.index for t in r.turns] == list(range(len(r.turns))) for r in found)
            records[run] = sorted(found, key=lambda r: (r.question, r.reward, len(r.turns)))
        assert [r.question for r in records["one"]] == [r.question for r in records["other"]]
        assert [r.reward for r in records["one"]] == [r.reward for r in records["other"]]
        for a, b in zip(records["one"], records["other"], strict=True):
            assert b.advantage == pytest.approx(a.advantage, rel=METRIC_TOLERANCE, abs=ADVANTAGE_ABS_TOLERANCE)
        rewards.append({r.reward for r in records["one"]})
    return rewards


def test_records_are_complete_and_hold_the_same_questions_and_advantages(runs):
    rewards = _same_records(runs, runs["two"])
    # the rewards differ (memsearcher: in every step), so the advantages are not all 0
    assert all(len(step) > 1 for step in rewards) if runs["agent"] == "memsearcher" else len(set.union(*rewards)) > 1
