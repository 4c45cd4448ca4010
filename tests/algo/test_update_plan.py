"""The optimizer steps of an update as verl's workers split them, and the checks made before they run."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from verl_memagent.algo.update_plan import (
    data_order,
    describe,
    empty_steps,
    nonfinite_steps,
    plan_update,
    zero_advantage_steps,
)


def plan(padding, dp_size, rows_per_step, micro_batch_size=1, spread_padding=False, data_order=None, lengths=None):
    rows = len(padding)
    data_order = list(range(rows)) if data_order is None else data_order
    lengths = [10] * rows if lengths is None else lengths
    return plan_update(padding, data_order, lengths, dp_size, rows_per_step, micro_batch_size, spread_padding)


# 6 real rows, then verl's padding appended: 2 ranks x 2 steps x 3 rows
PADDING = [False] * 6 + [True] * 6


def test_steps_are_cut_in_the_data_order_whatever_the_batch_order():
    # the batch holds the rows as verl balanced them; the data order is 5, 4, 3, 2, 1, 0
    split = plan(PADDING, dp_size=2, rows_per_step=3, data_order=[5, 4, 3, 2, 1, 0] + [0] * 6)
    assert split.steps == 2
    # released count: the first step is full of real rows (the first six in data order), the second padding
    assert sorted(split.step_rows(0).tolist()) == [0, 1, 2, 3, 4, 5]
    assert sorted(split.step_rows(1).tolist()) == [6, 7, 8, 9, 10, 11]
    # rank 0 gets 3 rows of each step, keeping the data order; equal lengths alternate between the ranks
    assert split.order.tolist() == [5, 3, 1, 6, 8, 10, 4, 2, 0, 7, 9, 11]
    assert split.position(3) == (0, 0, 1)
    assert split.position(9) == (1, 1, 1)


def test_the_same_rows_share_a_step_on_one_rank_and_on_two():
    padding = [False] * 10 + [True] * 2
    lengths = [30, 5, 17, 9, 22, 11, 8, 40, 3, 12, 1, 1]
    data_order = [3, 0, 7, 1, 9, 4, 2, 8, 5, 6, 0, 0]
    for spread in (False, True):
        one = plan(padding, 1, 4, 1, spread, data_order, lengths)
        two = plan(padding, 2, 2, 1, spread, data_order, lengths)
        assert [set(one.step_rows(s)) for s in range(3)] == [set(two.step_rows(s)) for s in range(3)]


def test_a_steps_rows_are_balanced_over_the_ranks_by_tokens():
    # one step of 4 rows on 2 ranks: the longest (9) to rank 0, 7 to rank 1, 5 to rank 1, 3 to rank 0
    split = plan([False] * 4, dp_size=2, rows_per_step=2, lengths=[3, 9, 5, 7])
    assert split.order.tolist() == [0, 1, 2, 3]
    assert split.order.reshape(2, 2).tolist() == [[0, 1], [2, 3]]  # tokens 12 and 12


def test_spreading_deals_the_padding_over_the_steps():
    padding = [False] * 5 + [True] * 3
    split = plan(
        padding,
        dp_size=2,
        rows_per_step=2,
        micro_batch_size=None,
        spread_padding=True,
        lengths=[1, 2, 3, 4, 5, 0, 0, 0],
    )
    # 5 real rows over 2 steps: 3 and 2, each step filled up with padding
    assert [sorted(split.step_rows(s).tolist()) for s in range(2)] == [[0, 1, 2, 5], [3, 4, 6, 7]]
    assert split.keeping([1]).tolist() == [4, 7, 3, 6]
    assert sorted(split.order.tolist()) == list(range(8))


def test_the_data_order_is_prompt_trajectory_turn_with_padding_last():
    keys = ["b_1_0", "a_0_1", "pad_0_0", "a_0_0", "b_0_0", "c_0_0"]
    padding = [False, False, True, False, False, False]
    # prompt a has dataset index 0, b and c index 1 (then by uid)
    assert data_order(keys, padding, [1, 0, 99, 0, 1, 1]).tolist() == [3, 1, 5, 0, 2, 4]


def test_a_plan_needs_whole_steps_and_micro_batches():
    with pytest.raises(ValueError, match="do not split into steps"):
        plan([False] * 10, dp_size=2, rows_per_step=3, spread_padding=True)
    with pytest.raises(ValueError, match="micro-batches of 2"):
        plan([False] * 6, dp_size=1, rows_per_step=3, micro_batch_size=2, spread_padding=True)


def _mask(rows: int, width: int = 3) -> torch.Tensor:
    return torch.ones(rows, width, dtype=torch.int64)


def test_a_step_of_padding_only_has_no_loss_token_until_the_padding_is_spread():
    mask = _mask(12)
    mask[6:] = 0  # verl's padding rows have no loss token
    verl_split = plan(PADDING, dp_size=1, rows_per_step=3, micro_batch_size=1, spread_padding=False)
    assert [(p.step, p.reason, p.rows.tolist()) for p in empty_steps(verl_split, mask)] == [
        (2, "no loss token", [6, 7, 8]),
        (3, "no loss token", [9, 10, 11]),
    ]
    spread = plan(PADDING, dp_size=1, rows_per_step=3, micro_batch_size=1, spread_padding=True)
    assert [mask[spread.step_rows(step)].any(-1).sum().item() for step in range(4)] == [2, 2, 1, 1]
    assert empty_steps(spread, mask) == []


def test_nonfinite_values_count_only_at_loss_tokens():
    split = plan([False] * 4, dp_size=1, rows_per_step=2, micro_batch_size=1, spread_padding=False)
    mask = _mask(4)
    mask[3, 2] = 0
    advantages = torch.zeros(4, 3)
    advantages[1, 0] = float("nan")
    advantages[3, 2] = float("inf")  # outside the mask: never trained on
    log_probs = torch.zeros(4, 3)
    log_probs[2, 1] = -float("inf")
    problems = nonfinite_steps(split, mask, {"advantages": advantages, "old_log_probs": log_probs})
    assert [(p.step, p.reason, p.rows.tolist()) for p in problems] == [
        (0, "advantages not finite", [1]),
        (1, "old_log_probs not finite", [2]),
    ]
    keys = ["u1_0_0", "u1_0_1", "u2_0_0", "u2_1_0"]
    assert describe(problems[0], split, keys, "step 6, actor update") == (
        "step 6, actor update, optimizer step 1 of 2: advantages not finite in 1 rows: u1_0_1 (rank 0, micro-batch 1)"
    )


def test_zero_advantage_steps_are_those_with_no_signal_at_any_loss_token():
    split = plan([False] * 6, dp_size=1, rows_per_step=2, micro_batch_size=2, spread_padding=False)
    mask = _mask(6)
    mask[3] = 0
    advantages = torch.zeros(6, 3)
    advantages[0, 1] = 0.5  # step 0 learns
    advantages[3, 0] = -1.0  # step 1: a signal outside the mask only
    zero = zero_advantage_steps(split, mask, advantages)
    assert [(p.step, p.rows.tolist()) for p in zero] == [(1, [2, 3]), (2, [4, 5])]
    assert np.array_equal(split.keeping([0]), [0, 1])


def test_the_learning_demos_collapsed_step_would_end_in_a_step_of_padding_alone():
    """Issue #24's NaN step: 8 questions x 8 trajectories of one context each plus a few second turns,
    68 rows padded to 96 (4 fixed steps, micro-batches of 8): verl's split leaves step 4 all padding."""
    padding = [False] * 68 + [True] * 28
    mask = _mask(96)
    mask[68:] = 0
    verl_split = plan(padding, dp_size=1, rows_per_step=24, micro_batch_size=8, spread_padding=False)
    assert [(p.step, p.reason, len(p.rows)) for p in empty_steps(verl_split, mask)] == [(3, "no loss token", 24)]
    spread = plan(padding, dp_size=1, rows_per_step=24, micro_batch_size=8, spread_padding=True)
    assert [mask[spread.step_rows(step)].any(-1).sum().item() for step in range(4)] == [17, 17, 17, 17]
    assert empty_steps(spread, mask) == []
