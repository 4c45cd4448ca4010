"""The optimizer steps of an update as verl's workers split them, and the checks made before they run."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from verl_memagent.algo.update_plan import (
    describe,
    empty_steps,
    nonfinite_steps,
    plan_update,
    zero_advantage_steps,
)

# 6 real rows, then verl's padding appended: 2 ranks x 2 steps x 3 rows
PADDING = [False] * 6 + [True] * 6


def test_without_spreading_the_split_is_verls_contiguous_one():
    plan = plan_update(PADDING, dp_size=2, rows_per_step=3, micro_batch_size=1, spread_padding=False)
    assert plan.steps == 2
    # rank 0 gets rows 0-5 (steps [0,1,2], [3,4,5]), rank 1 rows 6-11; a step is both ranks' share
    assert plan.step_rows(0).tolist() == [0, 1, 2, 6, 7, 8]
    assert plan.step_rows(1).tolist() == [3, 4, 5, 9, 10, 11]
    assert plan.position(4) == (0, 1, 1)
    assert plan.position(9) == (1, 1, 0)


def test_spreading_deals_each_ranks_padding_over_its_steps():
    padding = [False, False, False, False, False, True, True, True] + [False, False, True, True, True, True, True, True]
    plan = plan_update(padding, dp_size=2, rows_per_step=4, micro_batch_size=2, spread_padding=True)
    # rank 0: 5 real + 3 padding -> steps of 2 real + 2 padding and 3 + 1; rank 1: 2 real + 6 padding -> 1 + 3 each
    assert plan.order.tolist() == [0, 1, 5, 6, 2, 3, 4, 7, 8, 10, 11, 12, 9, 13, 14, 15]
    assert plan.step_rows(0).tolist() == [0, 1, 5, 6, 8, 10, 11, 12]
    assert plan.keeping([1]).tolist() == [2, 3, 4, 7, 9, 13, 14, 15]
    assert sorted(plan.order.tolist()) == list(range(16))


def test_a_plan_needs_whole_steps_and_micro_batches():
    with pytest.raises(ValueError, match="do not split into steps"):
        plan_update([False] * 10, dp_size=2, rows_per_step=3, micro_batch_size=1, spread_padding=True)
    with pytest.raises(ValueError, match="micro-batches of 2"):
        plan_update([False] * 6, dp_size=1, rows_per_step=3, micro_batch_size=2, spread_padding=True)


def _mask(rows: int, width: int = 3) -> torch.Tensor:
    return torch.ones(rows, width, dtype=torch.int64)


def test_a_step_of_padding_only_has_no_loss_token_until_the_padding_is_spread():
    mask = _mask(12)
    mask[6:] = 0  # verl's padding rows have no loss token
    verl_split = plan_update(PADDING, dp_size=1, rows_per_step=3, micro_batch_size=1, spread_padding=False)
    assert [(p.step, p.reason, p.rows.tolist()) for p in empty_steps(verl_split, mask)] == [
        (2, "no loss token", [6, 7, 8]),
        (3, "no loss token", [9, 10, 11]),
    ]
    spread = plan_update(PADDING, dp_size=1, rows_per_step=3, micro_batch_size=1, spread_padding=True)
    assert [mask[spread.step_rows(step)].any(-1).sum().item() for step in range(4)] == [1, 1, 2, 2]
    assert empty_steps(spread, mask) == []


def test_nonfinite_values_count_only_at_loss_tokens():
    plan = plan_update([False] * 4, dp_size=1, rows_per_step=2, micro_batch_size=1, spread_padding=False)
    mask = _mask(4)
    mask[3, 2] = 0
    advantages = torch.zeros(4, 3)
    advantages[1, 0] = float("nan")
    advantages[3, 2] = float("inf")  # outside the mask: never trained on
    log_probs = torch.zeros(4, 3)
    log_probs[2, 1] = -float("inf")
    problems = nonfinite_steps(plan, mask, {"advantages": advantages, "old_log_probs": log_probs})
    assert [(p.step, p.reason, p.rows.tolist()) for p in problems] == [
        (0, "advantages not finite", [1]),
        (1, "old_log_probs not finite", [2]),
    ]
    keys = ["u1_0_0", "u1_0_1", "u2_0_0", "u2_1_0"]
    assert describe(problems[0], plan, keys, "step 6, actor update") == (
        "step 6, actor update, optimizer step 1 of 2: advantages not finite in 1 rows: u1_0_1 (rank 0, micro-batch 1)"
    )


def test_zero_advantage_steps_are_those_with_no_signal_at_any_loss_token():
    plan = plan_update([False] * 6, dp_size=1, rows_per_step=2, micro_batch_size=2, spread_padding=False)
    mask = _mask(6)
    mask[3] = 0
    advantages = torch.zeros(6, 3)
    advantages[0, 1] = 0.5  # step 0 learns
    advantages[3, 0] = -1.0  # step 1: a signal outside the mask only
    zero = zero_advantage_steps(plan, mask, advantages)
    assert [(p.step, p.rows.tolist()) for p in zero] == [(1, [2, 3]), (2, [4, 5])]
    assert np.array_equal(plan.keeping([0]), [0, 1])
