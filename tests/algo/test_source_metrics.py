"""Per-source training metrics against hand-computed values."""

from __future__ import annotations

import pytest

from verl_memagent.algo.source_metrics import source_metrics


def test_each_trajectory_counts_once_with_its_last_contexts_score():
    keys = ["a_0_0", "a_0_1", "a_1_0", "b_0_0", "b_1_0", "b_1_1", "c_0_0", "c_1_0"]
    sources = ["k2", "k2", "k2", "k4", "k4", "k4", "k4", "k4"]
    # a: trajectories 0 (last context 1.0) and 1 (2.0); b: 0 (0.0) and 1 (last context 0.0); c: 1.0 and 1.0
    scores = [0.5, 1.0, 2.0, 0.0, 3.0, 0.0, 1.0, 1.0]
    metrics = source_metrics(keys, sources, scores)
    assert metrics == {
        "train/k2/reward/mean": pytest.approx(1.5),  # (1.0 + 2.0) / 2
        "train/k2/groups_all_equal": 0.0,  # a: 1.0 and 2.0
        "train/k4/reward/mean": pytest.approx(0.5),  # (0 + 0 + 1 + 1) / 4
        "train/k4/groups_all_equal": 1.0,  # b: 0 and 0; c: 1 and 1
    }


def test_turn_order_not_row_order_picks_the_last_context():
    assert source_metrics(["u_0_1", "u_0_0"], ["s", "s"], [4.0, 9.0])["train/s/reward/mean"] == 4.0


def test_a_key_that_is_not_verls_is_named():
    with pytest.raises(ValueError, match="not verl's"):
        source_metrics(["nokey"], ["s"], [1.0])
