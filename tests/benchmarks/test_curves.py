"""An RL run's curve keeps the figures that show where RL goes, per step, and drops the per-turn detail."""

from __future__ import annotations

import json

from memagent_examples.papers_claim.curves import curve, save_curve


def test_a_curve_keeps_rewards_per_k_validation_per_dev_source_and_kl(tmp_path):
    steps = [
        {
            "step": 0,
            "data": {
                "val-core/dev_k8/reward/mean@1": 2.5,
                "val-aux/dev_k8/em_fraction/mean@1": 0.31,
                "val-aux/dev_k8/agent/memory_retention_exact/turn_3": 0.9,
                "val-aux/dev_k8/num_objectives/mean@1": 8.0,
            },
        },
        {
            "step": 1,
            "data": {
                "train/multi_objective_4/reward/mean": 1.5,
                "train/multi_objective_4/groups_all_equal": 0.5,
                "actor/kl_loss": 0.002,
                "actor/pg_loss": -0.1,
                "agent/finish/format_broken": 0.25,
                "agent/memory_retention_exact/mean": 0.8,
                "agent/memory_retention_exact/turn_2": 0.7,
                "multi_context/zero_variance_groups": 3,
                "multi_context/broken_turns": 2,
                "timing_s/step": 30.0,
                "timing_s/gen": 9.0,
            },
        },
    ]
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps(step) + "\n" for step in steps))
    assert curve(metrics) == [
        {"step": 0, "val-core/dev_k8/reward/mean@1": 2.5, "val-aux/dev_k8/em_fraction/mean@1": 0.31},
        {
            "step": 1,
            "train/multi_objective_4/reward/mean": 1.5,
            "train/multi_objective_4/groups_all_equal": 0.5,
            "actor/kl_loss": 0.002,
            "agent/finish/format_broken": 0.25,
            "agent/memory_retention_exact/mean": 0.8,
            "multi_context/zero_variance_groups": 3,
            "multi_context/broken_turns": 2,
            "timing_s/step": 30.0,
        },
    ]
    save_curve(metrics, tmp_path / "curves" / "run.jsonl")
    lines = (tmp_path / "curves" / "run.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == curve(metrics)
