"""The composed main job's console: a step's rewards per k, the RL questions' reward, the labelled claim."""

from __future__ import annotations

import json

import pytest

from memagent_examples.papers_claim import main_job


def test_a_step_line_gives_each_ks_reward_in_order():
    record = {
        "step": 3,
        "data": {
            "train/multi_objective_8/reward/mean": 2.5,
            "train/multi_objective_1/reward/mean": 0.75,
            "train/multi_objective_1/groups_all_equal": 0.5,
            "actor/kl_loss": 0.0012,
            "timing_s/step": 31.04,
        },
    }
    assert main_job.step_line(record) == "step   3  reward k=1 0.75  k=8 2.50  kl 0.0012  (31.0 s)"


def test_the_rl_reward_is_per_objective_over_the_first_and_last_steps(tmp_path):
    steps = [
        {"train/multi_objective_2/reward/mean": 1.0, "train/multi_objective_4/reward/mean": 2.0},  # 0.5
        {"val-core/dev_k1/reward/mean@1": 1.0},  # a validation line: no RL reward
        {"train/multi_objective_1/reward/mean": 0.25},
        {"train/multi_objective_8/reward/mean": 6.0},
    ]  # 0.75
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps({"step": i, "data": d}) + "\n" for i, d in enumerate(steps)))
    assert main_job.rl_rewards(metrics, window=1) == (pytest.approx(0.5), pytest.approx(0.75))


def test_the_report_labels_each_figure_and_ends_in_json(capsys, monkeypatch, tmp_path):
    cell = {"agent": "memsearcher", "door_set": "test", "seed": None, "rl_objectives": None}
    records = [
        {**cell, "phase": "before_rl", "objectives": k, "em": 0.9 / k, "peak_context_tokens": 500 + k} for k in (1, 8)
    ]
    after = {**cell, "phase": "after_rl", "seed": 0, "regime": "fresh", "rl_objectives": [1, 2, 4, 8]}
    records += [{**after, "objectives": k, "em": 1.0 / k, "peak_context_tokens": 520 + k} for k in (1, 8)]
    react = {"agent": "react", "door_set": "test", "phase": "after_rl", "regime": "fresh", "rl_objectives": [1]}
    react_runs = [{**react, "settings_name": main_job.RECIPE_SETTINGS, "peak_context_tokens": p} for p in (3000, 3200)]
    other_settings = {**react, "settings_name": "lr1e-4", "peak_context_tokens": 9000}
    sweep = tmp_path / "sweep.json"
    sweep.write_text(json.dumps([{**r, "objectives": 8} for r in (*react_runs, other_settings)]))
    monkeypatch.setattr(main_job, "SWEEP_RECORDS", sweep)
    result = main_job.report(records, (0.4, 0.6))
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "test EM per objective, before RL | k=1 0.90  k=8 0.11"
    assert out[1] == "test EM per objective, after RL  | k=1 1.00  k=8 0.12"
    assert out[3] == "peak context tokens, after RL    | k=1 521  k=8 528"
    assert out[4] == "ReAct's peak context after RL, from the committed sweep (not run here) | k=8 3100"
    assert json.loads(out[-1]) == result and result["react_peak_k8"] == 3100 and result["em_after_rl_k1"] == 1.0


def test_the_committed_records_of_the_recipes_settings_ran_the_recipes_lr_kl_and_temperature():
    """The job prints ReAct's figures of the sweep's cells named `RECIPE_SETTINGS`: they ran the values the recipe
    holds now (the sweep gave them as overrides, before the recipe took them)."""
    from omegaconf import OmegaConf

    recipe = OmegaConf.load(main_job.REPO / "recipes" / "cpu" / "composed_doors_fresh.yaml").actor_rollout_ref
    actor = recipe.actor
    records = json.loads(main_job.SWEEP_RECORDS.read_text())
    runs = [r for r in records if r.get("settings_name") == main_job.RECIPE_SETTINGS]
    assert {r["agent"] for r in runs} == {"memsearcher", "mem1", "react"}
    for record in runs:
        settings = dict(override.split("=", 1) for override in record["settings"])
        assert float(settings["actor_rollout_ref.actor.optim.lr"]) == actor.optim.lr
        assert float(settings["actor_rollout_ref.actor.kl_loss_coef"]) == actor.kl_loss_coef
        assert float(settings["actor_rollout_ref.rollout.temperature"]) == recipe.rollout.temperature
