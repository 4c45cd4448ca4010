"""multi_context_grpo against hand-computed values and against verl's built-in multi-trajectory grpo."""

import math

import numpy as np
import pytest
import torch
from algo_batches import Trajectory, build_rows
from hypothesis import given, settings
from hypothesis import strategies as st
from verl.protocol import DataProto
from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories

from verl_memagent.algo.config import MultiContextConfig
from verl_memagent.algo.estimators import (
    TrajectoryLayout,
    broken_turn_shift,
    multi_context_grpo,
    rows_off_their_trajectory,
    shift_advantages,
)
from verl_memagent.algo.verl_estimators import broken_turn_rows

EPS = 1e-6

# uid "a": three trajectories with 3, 1 and 2 turns; uid "b": a single trajectory; uid "c": equal rewards
HAND = [
    Trajectory("a", 0, 1.0, [[1, 1, 0, 1], [1, 0, 0, 1], [1]]),
    Trajectory("a", 1, 0.0, [[1, 1]]),
    Trajectory("a", 2, 0.5, [[1, 0, 1], [1, 1, 1, 1]]),
    Trajectory("b", 0, 0.7, [[0, 1], [1]]),
    Trajectory("c", 0, 1.0, [[1, 1, 1]]),
    Trajectory("c", 1, 1.0, [[1], [1, 1]]),
]
# group a: mean 0.5, unbiased std 0.5; group b alone: mean 0, std 1; group c: std 0
HAND_ADVANTAGE = {"a_0": 0.5 / (0.5 + EPS), "a_1": -0.5 / (0.5 + EPS), "a_2": 0.0, "b_0": 0.7 / (1 + EPS), "c_0": 0.0}
HAND_ADVANTAGE["c_1"] = 0.0


def _per_row(keys, values):
    return torch.tensor([values[key.rpartition("_")[0]] for key in keys])


def _run(trajectories, padding=0, shuffle_seed=None, **options):
    keys, is_padding, mask, scores = build_rows(trajectories, padding=padding)
    if shuffle_seed is not None:
        perm = torch.randperm(len(keys), generator=torch.Generator().manual_seed(shuffle_seed))
        keys, is_padding = [keys[i] for i in perm], [is_padding[i] for i in perm]
        mask, scores = mask[perm], scores[perm]
    layout = TrajectoryLayout.from_keys(keys, is_padding)
    return keys, mask, scores, multi_context_grpo(scores, mask, layout, **options)


def test_hand_computed_groups_with_different_turn_counts_single_and_equal_groups():
    keys, mask, _, out = _run(HAND)
    expected = _per_row(keys, HAND_ADVANTAGE).unsqueeze(-1) * mask
    torch.testing.assert_close(out.advantages, expected)
    torch.testing.assert_close(out.returns, expected)
    assert out.metrics["multi_context/trajectories"] == 6
    assert out.metrics["multi_context/turns_max"] == 3
    assert out.metrics["multi_context/turns_mean"] == pytest.approx(11 / 6)


def test_without_std_normalisation_advantage_is_reward_minus_group_mean():
    keys, mask, _, out = _run(HAND, norm_by_std=False)
    expected = {"a_0": 0.5, "a_1": -0.5, "a_2": 0.0, "b_0": 0.7, "c_0": 0.0, "c_1": 0.0}
    torch.testing.assert_close(out.advantages, _per_row(keys, expected).unsqueeze(-1) * mask)


def test_trajectory_weighting_makes_each_trajectory_weigh_the_same_whatever_its_turns():
    keys, mask, _, out = _run(HAND, weight_trajectories=True)
    turns = {"a_0": 3, "a_1": 1, "a_2": 2, "b_0": 2, "c_0": 1, "c_1": 2}
    mean_turns = 11 / 6
    expected = {t: HAND_ADVANTAGE[t] * mean_turns / turns[t] for t in turns}
    torch.testing.assert_close(out.advantages, _per_row(keys, expected).unsqueeze(-1) * mask)
    # summed over its turns (one weight per row, as seq-mean-token-mean counts rows), every trajectory
    # carries |A| * mean_turns, however many turns it took
    row_adv = out.advantages.sum(-1) / mask.sum(-1)
    for traj in ("a_0", "a_1", "b_0"):
        rows = [i for i, k in enumerate(keys) if k.startswith(traj + "_")]
        assert row_adv[rows].sum().item() == pytest.approx(HAND_ADVANTAGE[traj] * mean_turns, rel=1e-5)


def test_turn_discount_scales_turn_t_of_T_by_gamma_to_the_T_minus_t():
    keys, mask, _, out = _run(HAND, turn_discount=0.5)
    last = {"a_0": 2, "a_1": 0, "a_2": 1, "b_0": 1, "c_0": 0, "c_1": 1}
    factors = torch.tensor([0.5 ** (last[k.rpartition("_")[0]] - int(k.rpartition("_")[2])) for k in keys])
    expected = (_per_row(keys, HAND_ADVANTAGE) * factors).unsqueeze(-1) * mask
    torch.testing.assert_close(out.advantages, expected)
    assert factors[:3].tolist() == [0.25, 0.5, 1.0]  # trajectory a_0's three turns


@pytest.mark.parametrize("norm_by_std", [True, False])
def test_equal_reward_groups_get_exactly_zero_and_are_counted(norm_by_std):
    # 0.9 in float32, three times: the group mean differs from 0.9 in the last bit, and verl's
    # (r - mean) / (std + 1e-6) turns that rounding into an advantage of about 0.06
    trajectories = [Trajectory("g", i, 0.9, [[1, 1]]) for i in range(3)] + HAND[:3]
    keys, mask, scores, out = _run(trajectories, norm_by_std=norm_by_std)
    g_rows = [i for i, k in enumerate(keys) if k.startswith("g_")]
    assert out.advantages[g_rows].abs().max().item() == 0.0
    assert _verl_builtin(keys, mask, scores, norm_by_std)[g_rows].abs().max().item() > 0
    torch.testing.assert_close(out.advantages[3:], _run(HAND[:3], norm_by_std=norm_by_std)[3].advantages)
    assert out.metrics["multi_context/zero_variance_groups"] == pytest.approx(1 / 2)


def test_padding_rows_get_zero_and_change_nothing_else():
    keys, mask, _, plain = _run(HAND)
    _, _, _, padded = _run(HAND, padding=3)
    assert padded.advantages[len(keys) :].abs().max().item() == 0.0
    torch.testing.assert_close(padded.advantages[: len(keys)], plain.advantages)
    assert padded.metrics["multi_context/padding_rows"] == 3
    assert padded.metrics["multi_context/trajectories"] == 6


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_reward_is_rejected_with_a_clear_error(bad):
    trajectories = [Trajectory("a", 0, 1.0, [[1]]), Trajectory("a", 1, bad, [[1], [1]])]
    with pytest.raises(ValueError, match="trajectory rewards are not finite"):
        _run(trajectories)


def test_malformed_sample_key_is_rejected():
    with pytest.raises(ValueError, match="uid.*session_id.*index"):
        TrajectoryLayout.from_keys(["nokey"], [False])
    with pytest.raises(ValueError, match="same turn"):
        TrajectoryLayout.from_keys(["u_0_1", "u_0_1"], [False, False])
    with pytest.raises(ValueError, match="'u_x_0'"):
        TrajectoryLayout.from_keys(["u_0_0", "u_x_0"], [False, False])
    assert TrajectoryLayout.from_keys(["u_0_0", "free form"], [False, True]).num_trajectories == 1


def _verl_builtin(keys, mask, scores, norm_by_std=True):
    data = DataProto.from_dict(
        tensors={"token_level_rewards": scores, "response_mask": mask},
        non_tensors={"uid": np.array([k.split("_")[0] for k in keys], dtype=object)},
    )
    out = compute_advantage_for_multi_trajectories(data, keys, "grpo", norm_adv_by_std_in_grpo=norm_by_std)
    return out.batch["advantages"]


@pytest.mark.parametrize("norm_by_std", [True, False])
def test_default_setting_equals_verl_builtin_multi_trajectory_grpo(norm_by_std):
    keys, mask, scores, out = _run(HAND, padding=2, shuffle_seed=0, norm_by_std=norm_by_std)
    torch.testing.assert_close(out.advantages, _verl_builtin(keys, mask, scores, norm_by_std))


# ---- properties over random batch structures ------------------------------------------------------

trajectory_sets = st.lists(
    st.tuples(
        st.integers(0, 3),  # group
        st.floats(-2, 2, allow_nan=False, width=32),  # reward
        st.lists(st.lists(st.integers(0, 1), min_size=1, max_size=5).map(lambda m: [1, *m]), min_size=1, max_size=4),
    ),
    min_size=1,
    max_size=12,
)


def _trajectories(spec):
    sessions: dict[int, int] = {}
    out = []
    for group, reward, masks in spec:
        sessions[group] = sessions.get(group, -1) + 1
        out.append(Trajectory(f"u{group}", sessions[group], reward, masks))
    return out


@settings(max_examples=60, deadline=None)
@given(spec=trajectory_sets, padding=st.integers(0, 3), seed=st.integers(0, 1000))
def test_properties_sum_to_zero_constant_per_trajectory_zero_off_mask(spec, padding, seed):
    trajectories = _trajectories(spec)
    keys, mask, scores, out = _run(trajectories, padding=padding, shuffle_seed=seed)
    adv = out.advantages
    assert (adv[mask == 0] == 0).all()
    per_traj: dict[str, set] = {}
    for i, key in enumerate(keys):
        per_traj.setdefault(key.rpartition("_")[0], set()).update(adv[i][mask[i] == 1].tolist())
    assert all(len(values) == 1 for name, values in per_traj.items() if not name.startswith("padabc"))
    groups: dict[str, list[float]] = {}
    for name, values in per_traj.items():
        if not name.startswith("padabc"):
            groups.setdefault(name.split("_")[0], []).append(next(iter(values)))
    rewards: dict[str, set] = {}
    for t in trajectories:
        rewards.setdefault(t.uid, set()).add(t.reward)
    equal = {uid for uid, values in rewards.items() if len(values) == 1 and len(groups[uid]) > 1}
    for uid, values in groups.items():
        if uid in equal:
            assert values == [0.0] * len(values)  # exactly
        elif len(values) > 1:
            assert abs(sum(values)) < 1e-3 * len(values)
    # elsewhere verl's built-in grpo; in an equal-reward group it divides rounding by std + 1e-6
    rows = [i for i, key in enumerate(keys) if key.split("_")[0] not in equal]
    torch.testing.assert_close(adv[rows], _verl_builtin(keys, mask, scores)[rows], rtol=1e-5, atol=1e-4)


@settings(max_examples=30, deadline=None)
@given(spec=trajectory_sets, seed=st.integers(0, 1000))
def test_property_row_order_does_not_matter(spec, seed):
    trajectories = _trajectories(spec)
    keys, _, _, ordered = _run(trajectories, weight_trajectories=True, turn_discount=0.9)
    shuffled_keys, _, _, shuffled = _run(trajectories, shuffle_seed=seed, weight_trajectories=True, turn_discount=0.9)
    position = {k: i for i, k in enumerate(keys)}
    torch.testing.assert_close(shuffled.advantages, ordered.advantages[[position[k] for k in shuffled_keys]])


def test_rows_off_their_trajectory_finds_advantages_written_to_the_wrong_rows():
    layout = TrajectoryLayout.from_keys(["a_0_0", "a_0_1", "a_1_0", "pad_0_0"], [False, False, False, True])
    mask = torch.tensor([[1, 1, 0], [1, 0, 1], [1, 1, 1], [0, 0, 0]])
    right = torch.tensor([[0.5, 0.5, 0.0], [0.5, 9.0, 0.5], [-0.5, -0.5, -0.5], [7.0, 7.0, 7.0]])
    assert rows_off_their_trajectory(layout, right, mask).tolist() == []  # off-mask and padding values ignored
    swapped = torch.tensor([[0.5, 0.5, 0.0], [-0.5, 0.0, -0.5], [0.5, 0.5, 0.5], [0.0, 0.0, 0.0]])  # a_0 and a_1 mixed
    assert rows_off_their_trajectory(layout, swapped, mask).tolist() == [0, 1]
    uneven = right.clone()
    uneven[2, 1] = 0.3
    assert rows_off_their_trajectory(layout, uneven, mask).tolist() == [2]


def test_a_broken_turn_loses_the_penalty_on_its_own_generated_tokens_only():
    # group a: a_0 broke at its turn 1, a_1 answered in one turn; b_0 broke at once; one padding row
    keys = ["a_0_0", "a_0_1", "a_1_0", "b_0_0", "pad_0_0"]
    layout = TrajectoryLayout.from_keys(keys, [False, False, False, False, True])
    broken = torch.tensor([False, True, False, True, True])
    shift = broken_turn_shift(layout, broken, 0.25)
    torch.testing.assert_close(shift, torch.tensor([0.0, -0.25, 0.0, -0.25, 0.0]))
    advantages = torch.tensor([[0.5, 0.5, 0.0], [0.5, 0.5, 0.5], [-1.0, -1.0, -1.0], [0.0, 0.0, 0.0], [0.0] * 3])
    mask = torch.tensor([[1, 1, 0], [1, 0, 1], [1, 1, 1], [1, 1, 1], [0, 0, 0]])
    expected = torch.tensor([[0.5, 0.5, 0.0], [0.25, 0.5, 0.25], [-1.0, -1.0, -1.0], [-0.25] * 3, [0.0] * 3])
    torch.testing.assert_close(shift_advantages(advantages, mask, shift), expected)
    with pytest.raises(ValueError, match="one entry per row"):
        broken_turn_shift(layout, broken[:2], 0.25)


def test_with_the_baseline_each_turn_is_compared_with_its_groups_turns_at_the_same_depth():
    # group a, 4 trajectories: at depth 0 one of four broke (a_3), at depth 1 one of two (a_1), at depth 2
    # a_0 is alone; group b: both broke at depth 0 (all alike: no signal); c_0 alone
    keys = ["a_0_0", "a_0_1", "a_0_2", "a_1_0", "a_1_1", "a_2_0", "a_3_0", "b_0_0", "b_1_0", "c_0_0"]
    broken = torch.tensor([False, False, False, False, True, False, True, True, True, True])
    layout = TrajectoryLayout.from_keys(keys, [False] * len(keys))
    shift = broken_turn_shift(layout, broken, 0.5, baseline=True)
    eps = 1e-6
    # depth 0 of a: b = 0, 0, 0, 1: mean 1/4, unbiased std 1/2; depth 1 of a: b = 0, 1: mean 1/2, std sqrt(1/2)
    well, bad = -0.5 * (0 - 0.25) / (0.5 + eps), -0.5 * (1 - 0.25) / (0.5 + eps)
    std1 = math.sqrt(0.5)
    pair_well, pair_bad = -0.5 * (0 - 0.5) / (std1 + eps), -0.5 * (1 - 0.5) / (std1 + eps)
    expected = [well, pair_well, 0.0, well, pair_bad, well, bad, 0.0, 0.0, 0.0]
    torch.testing.assert_close(shift, torch.tensor(expected))
    assert shift[:7].sum().item() == pytest.approx(0.0, abs=1e-6)  # each depth's credit sums to zero


def _fields(turn, contexts, finish, penalised=False):
    return {"turn_index": turn, "num_contexts": contexts, "finish_reason": finish, "penalised": penalised}


def test_the_broken_turn_is_the_final_turn_of_a_trajectory_its_output_ended():
    rows = [
        _fields(0, 2, "no_action"),  # an earlier turn of a broken trajectory: it did nothing wrong
        _fields(1, 2, "no_action"),
        _fields(0, 1, "answer"),
        _fields(2, 3, "max_turns"),  # out of turns: no one turn's fault
        _fields(0, 1, "context_limit"),
        _fields(0, 1, "memory_overflow"),
        _fields(1, 2, "answer", penalised=True),
        _fields(0, 1, "bad_format"),  # released action rules: a final turn the released reward gives 0
        None,  # verl's padding, or another agent loop's output
        {"turn_index": 0},
    ]
    expected = [False, True, False, False, False, True, True, True, False, False]
    assert broken_turn_rows(rows).tolist() == expected


def test_the_broken_turn_penalty_is_checked():
    assert MultiContextConfig.from_algorithm({"multi_context": {"broken_turn_penalty": 1}}).broken_turn_penalty == 1
    with pytest.raises(ValueError, match="set algorithm.multi_context.broken_turn_penalty > 0 too"):
        MultiContextConfig.from_algorithm({"multi_context": {"broken_turn_baseline": True}})
    with pytest.raises(ValueError, match="broken_turn_baseline: expected"):
        MultiContextConfig.from_algorithm({"multi_context": {"broken_turn_baseline": "yes"}})
    with pytest.raises(ValueError, match="broken_turn_penalty must be >= 0"):
        MultiContextConfig.from_algorithm({"multi_context": {"broken_turn_penalty": -0.5}})
