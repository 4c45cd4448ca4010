"""multi_context_gae: the turns of a trajectory chained into one GAE, as if laid out as one sequence."""

import math

import pytest
import torch
from algo_batches import verl_gae_on_one_sequence
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_memagent.algo.estimators import TrajectoryLayout
from verl_memagent.algo.gae import multi_context_gae


def _two_turns(values_turn0, values_turn1, reward=1.0):
    """One trajectory: turn 0 = two generated tokens and a tool token, turn 1 = one generated token."""
    layout = TrajectoryLayout.from_keys(["u_0_0", "u_0_1"], [False, False])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    values = torch.tensor([values_turn0, values_turn1])
    scores = torch.zeros(2, 3)
    scores[:, -1] = reward  # verl puts the score at the last response position of every turn
    return layout, mask, values, scores


def test_hand_computed_gamma_lambda_one_is_reward_minus_value():
    layout, mask, values, scores = _two_turns([0.5, 0.2, 9.0], [0.4, 9.0, 9.0])
    out = multi_context_gae(scores, scores, values, mask, layout, whiten=False)
    torch.testing.assert_close(out.advantages, torch.tensor([[0.5, 0.8, 0.0], [0.6, 0.0, 0.0]]))
    torch.testing.assert_close(out.returns, torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]]))


def test_hand_computed_discounted_bootstrap_from_the_next_turn():
    # generated tokens in order: values 0.5, 0.2 | 0.4, reward 1 at the last; gamma 0.5, lambda 1
    # delta = [0 + .5*.2 - .5, 0 + .5*.4 - .2, 1 - .4] = [-.4, 0, .6]; A = [-.25, .3, .6]
    layout, mask, values, scores = _two_turns([0.5, 0.2, 9.0], [0.4, 9.0, 9.0])
    out = multi_context_gae(scores, scores, values, mask, layout, gamma=0.5, lam=1.0, whiten=False)
    torch.testing.assert_close(out.advantages, torch.tensor([[-0.25, 0.3, 0.0], [0.6, 0.0, 0.0]]))
    torch.testing.assert_close(out.returns, torch.tensor([[0.25, 0.5, 0.0], [1.0, 0.0, 0.0]]))


def test_whitening_is_over_valid_tokens_only():
    layout, mask, values, scores = _two_turns([0.5, 0.2, 9.0], [0.4, 9.0, 9.0])
    padded = TrajectoryLayout.from_keys(["u_0_0", "u_0_1", "padx_0_0"], [False, False, True])
    out = multi_context_gae(
        torch.cat([scores, torch.ones(1, 3)]),
        torch.cat([scores, torch.ones(1, 3)]),
        torch.cat([values, torch.ones(1, 3)]),
        torch.cat([mask, torch.ones(1, 3, dtype=torch.int64)]),
        padded,
    )
    raw = torch.tensor([0.5, 0.8, 0.6])
    expected = (raw - raw.mean()) / raw.std()
    assert out.advantages[2].abs().max() == 0  # the padding row
    torch.testing.assert_close(out.advantages[:2][mask.bool()], expected, atol=1e-4, rtol=1e-4)


def test_non_finite_reward_or_value_is_rejected():
    layout, mask, values, scores = _two_turns([0.5, 0.2, 0.0], [0.4, 0.0, 0.0], reward=math.nan)
    with pytest.raises(ValueError, match="trajectory rewards are not finite"):
        multi_context_gae(scores, scores, values, mask, layout)
    layout, mask, values, scores = _two_turns([0.5, math.inf, 0.0], [0.4, 0.0, 0.0])
    with pytest.raises(ValueError, match="critic values are not finite"):
        multi_context_gae(scores, scores, values, mask, layout)


turn_masks = st.lists(st.lists(st.integers(0, 1), min_size=1, max_size=6), min_size=1, max_size=4)


@settings(max_examples=60, deadline=None)
@given(
    trajectories=st.lists(turn_masks, min_size=1, max_size=5),
    gamma=st.sampled_from([1.0, 0.9, 0.5]),
    lam=st.sampled_from([1.0, 0.95, 0.0]),
    seed=st.integers(0, 10_000),
)
def test_equals_verl_gae_over_the_turns_laid_out_as_one_sequence(trajectories, gamma, lam, seed):
    """Rows in shuffled order; each trajectory compared with verl's GAE on its concatenated responses,
    with the outcome at the last generated token and an in-reward KL term on every generated token."""
    gen = torch.Generator().manual_seed(seed)
    width = 6
    keys, masks = [], []
    for j, turns in enumerate(trajectories):
        for t, m in enumerate(turns):
            keys.append(f"u{j % 2}_{j}_{t}")
            masks.append(torch.tensor(m + [0] * (width - len(m))))
    mask = torch.stack(masks)
    rows = len(keys)
    values = torch.randn(rows, width, generator=gen)
    kl = -0.1 * torch.rand(rows, width, generator=gen) * mask
    outcome = torch.randn(len(trajectories), generator=gen)
    scores = torch.zeros(rows, width)
    for i, key in enumerate(keys):
        scores[i, -1] = outcome[int(key.split("_")[1])]
    perm = torch.randperm(rows, generator=gen)
    keys = [keys[i] for i in perm]
    mask, values, kl, scores = mask[perm], values[perm], kl[perm], scores[perm]
    layout = TrajectoryLayout.from_keys(keys, [False] * rows)
    out = multi_context_gae(scores, scores + kl, values, mask, layout, gamma=gamma, lam=lam, whiten=False)

    for j, turns in enumerate(trajectories):
        order = [keys.index(f"u{j % 2}_{j}_{t}") for t in range(len(turns))]
        generated = mask[order].bool()
        if not generated.any():
            assert out.advantages[order].abs().max() == 0
            continue
        advantages, returns = verl_gae_on_one_sequence(mask[order], values[order], outcome[j], gamma, lam, kl[order])
        torch.testing.assert_close(out.advantages[order][generated], advantages, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(out.returns[order][generated], returns, atol=1e-5, rtol=1e-5)
