"""Tests of torchrl_post/algos/advantages.py: GRPO, GAE, REINFORCE(++), RLOO and reward placement by hand."""

import math
import statistics

import pytest
import torch

from tests.unit.algos.helpers import MASK
from torchrl_post.algos.advantages import (
    clip_advantages,
    gae_advantages,
    group_advantages,
    grpo_advantages,
    informative_rows,
    masked_whiten,
    reinforce_plus_plus_advantages,
    reinforce_returns,
    rloo_advantages,
    scores_to_token_rewards,
    whiten_by_moments,
    whiten_moments,
)


def _ids(scores: torch.Tensor, n: int) -> torch.Tensor:
    """Group ids of prompt-major samples, `n` per prompt."""
    return torch.arange(len(scores)) // n


# --- group_advantages ---------------------------------------------------------------------------------------


def test_group_advantages_variable_groups() -> None:
    adv = group_advantages(torch.tensor([1.0, 0.0, 3.0, 2.0, 7.0]), torch.tensor([0, 0, 1, 1, 2]), "grpo", False)
    torch.testing.assert_close(adv, torch.tensor([0.5, -0.5, 0.5, -0.5, 0.0]))
    with pytest.raises(ValueError, match="group advantages support grpo, rloo, not 'gae'"):
        group_advantages(torch.ones(2), torch.zeros(2, dtype=torch.long), "gae")


@pytest.mark.parametrize("estimator", ["grpo", "rloo"])
def test_group_advantages_follow_ids_not_positions(estimator: str) -> None:
    """Equal adjacent groups take the [G, n] path; the same rows shuffled (ids scattered) take the per-group
    path: every row gets the same advantage either way."""
    torch.manual_seed(0)
    scores, ids = torch.rand(12), torch.arange(12) // 4
    adjacent = group_advantages(scores, ids, estimator)
    perm = torch.randperm(12)
    shuffled = group_advantages(scores[perm], ids[perm], estimator)
    torch.testing.assert_close(shuffled, adjacent[perm], atol=1e-6, rtol=0)
    assert adjacent.abs().sum() > 0


# --- grpo_advantages ----------------------------------------------------------------------------------------


def test_grpo_advantages_by_hand():
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    mask = torch.ones(8, 3)
    adv = grpo_advantages(scores, _ids(scores, 4), mask)
    assert adv.shape == (8, 3)
    # group 1: mean 0.5, deviations +-0.5, unbiased var = 4 * 0.25 / 3 = 1/3
    a = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    expected = torch.tensor([a, -a, -a, a, 0.0, 0.0, 0.0, 0.0])
    torch.testing.assert_close(adv, expected[:, None].expand(8, 3))


def test_grpo_advantages_uneven_group():
    scores = torch.tensor([3.0, 0.0, 0.0])
    adv = grpo_advantages(scores, _ids(scores, 3), torch.ones(3, 1))
    # mean 1, deviations [2, -1, -1], unbiased var = (4 + 1 + 1) / 2 = 3
    std = math.sqrt(3.0)
    expected = torch.tensor([2.0, -1.0, -1.0]) / (std + 1e-6)
    torch.testing.assert_close(adv[:, 0], expected)


def test_grpo_advantages_masked_tokens_are_zero():
    scores = torch.tensor([1.0, 0.0, 2.0, 2.0])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    adv = grpo_advantages(scores, _ids(scores, 2), mask)
    assert torch.all(adv[mask == 0] == 0)
    a = 0.5 / (math.sqrt(0.5) + 1e-6)  # group [1, 0]: mean 0.5, unbiased var 0.5
    torch.testing.assert_close(adv[0], torch.tensor([a, a, 0.0]))
    torch.testing.assert_close(adv[1], torch.tensor([-a, 0.0, 0.0]))
    assert torch.all(adv[2:] == 0)


def test_grpo_advantages_each_group_sums_to_zero():
    torch.manual_seed(0)
    scores = torch.rand(12)
    adv = grpo_advantages(scores, _ids(scores, 4), torch.ones(12, 1))[:, 0]
    sums = adv.view(3, 4).sum(dim=1)
    torch.testing.assert_close(sums, torch.zeros(3), atol=1e-5, rtol=0)
    assert adv.abs().sum() > 0
    # normalised by the group std: each group's advantages have unbiased std ~1
    torch.testing.assert_close(adv.view(3, 4).std(dim=1), torch.ones(3), atol=1e-4, rtol=0)


def test_grpo_advantages_without_std_is_plain_centering():
    scores = torch.tensor([2.0, 0.0, 1.0, 5.0, 5.0, 8.0])
    adv = grpo_advantages(scores, _ids(scores, 3), torch.ones(6, 2), norm_by_std=False)
    expected = torch.tensor([1.0, -1.0, 0.0, -1.0, -1.0, 2.0])
    torch.testing.assert_close(adv, expected[:, None].expand(6, 2))


def test_grpo_advantages_accepts_integer_scores():
    adv = grpo_advantages(torch.tensor([1, 0]), _ids(torch.tensor([1, 0]), 2), torch.ones(2, 1), norm_by_std=False)
    assert adv.dtype == torch.float32
    torch.testing.assert_close(adv[:, 0], torch.tensor([0.5, -0.5]))


def _whiten_by_hand(xs: list[float]) -> list[float]:
    """(x - mean) / sqrt(unbiased var + 1e-8), with plain Python floats."""
    mean = statistics.fmean(xs)
    var = statistics.variance(xs)  # unbiased (n - 1)
    return [(x - mean) / math.sqrt(var + 1e-8) for x in xs]


def _masked_unbiased_std(x: torch.Tensor, mask: torch.Tensor) -> float:
    return statistics.stdev(x[mask > 0].tolist())


# --- masked_whiten ------------------------------------------------------------------------------------------


def test_masked_whiten_by_hand():
    x = torch.tensor([[1.0, 2.0, 3.0, 100.0]])
    out = masked_whiten(x, torch.tensor([[1.0, 1.0, 1.0, 0.0]]))
    # real entries 1, 2, 3: mean 2, unbiased var ((1 + 0 + 1) / 2) = 1 (a biased var would be 2/3)
    s = 1 / math.sqrt(1 + 1e-8)
    torch.testing.assert_close(out[0, :3], torch.tensor([-s, 0.0, s]))


def test_masked_whiten_single_entry_is_zero_not_nan():
    out = masked_whiten(torch.tensor([[5.0, 7.0]]), torch.tensor([[1.0, 0.0]]))
    assert out[0, 0].item() == 0.0


# --- whiten_moments / whiten_by_moments / clip_advantages (algorithm.whiten_advantages, advantage_clip) --------


def test_whiten_by_moments_by_hand_masked_entries_excluded():
    x = torch.tensor([[1.0, 2.0, 3.0, 99.0], [5.0, 77.0, 77.0, 77.0]])
    moments = whiten_moments(x, MASK)
    # the real entries 1, 2, 3, 5 (99 and the 77s are padding): N = 4, sum 11, sum of squares 1 + 4 + 9 + 25 = 39
    assert moments.tolist() == [4.0, 11.0, 39.0]
    out = whiten_by_moments(x, MASK, moments)
    # mean 2.75; squared deviations 3.0625 + 0.5625 + 0.0625 + 5.0625 = 8.75; unbiased var 8.75 / 3 = 2.91667,
    # std 1.70783: (1 - 2.75) / 1.70783 = -1.02470, -0.75 / . = -0.43916, 0.25 / . = 0.14639, 2.25 / . = 1.31747
    expected = torch.tensor([[-1.02470, -0.43916, 0.14639, 0.0], [1.31747, 0.0, 0.0, 0.0]])
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(out, masked_whiten(x, MASK) * MASK)  # the same numbers as GAE's whitening


def test_whiten_moments_add_up_over_data_parallel_parts():
    """Two ranks holding a row each: their summed moments whiten each rank's row as the whole batch would."""
    x = torch.tensor([[1.0, 2.0, 3.0, 99.0], [5.0, 77.0, 77.0, 77.0]])
    parts = [(x[:1], MASK[:1]), (x[1:], MASK[1:])]
    total = sum(whiten_moments(xp, mp) for xp, mp in parts)
    assert isinstance(total, torch.Tensor) and total.tolist() == [4.0, 11.0, 39.0]
    whole = whiten_by_moments(x, MASK, whiten_moments(x, MASK))
    for row, (xp, mp) in enumerate(parts):
        torch.testing.assert_close(whiten_by_moments(xp, mp, total), whole[row : row + 1])
    # whitening each part on its own (what a per-rank whitening does) gives other numbers: rank 1's single entry 0
    assert whiten_by_moments(x[1:], MASK[1:], whiten_moments(x[1:], MASK[1:]))[0, 0].item() == 0.0


def test_whiten_by_moments_one_or_no_entry():
    one = torch.tensor([[4.0, 7.0]])
    out = whiten_by_moments(one, torch.tensor([[1.0, 0.0]]), whiten_moments(one, torch.tensor([[1.0, 0.0]])))
    assert out.tolist() == [[0.0, 0.0]]
    none = whiten_by_moments(one, torch.zeros(1, 2), whiten_moments(one, torch.zeros(1, 2)))
    assert none.tolist() == [[0.0, 0.0]]


def test_clip_advantages_by_hand():
    adv = torch.tensor([[2.0, -0.5, -3.0, 9.0], [0.25, 0.0, 0.0, 0.0]])
    out, frac = clip_advantages(adv, MASK, 1.0)
    # real entries 2, -0.5, -3, 0.25: two of the four clamped (the padding's 9 is not counted)
    assert out.tolist() == [[1.0, -0.5, -1.0, 1.0], [0.25, 0.0, 0.0, 0.0]]
    assert frac == 0.5
    assert clip_advantages(adv, torch.zeros_like(MASK), 1.0)[1] == 0.0


# --- gae_advantages -----------------------------------------------------------------------------------------


def test_gae_by_hand():
    # masked positions hold garbage rewards/values that must not leak in
    rewards = torch.tensor([[0.0, 0.0, 1.0, 5.0], [2.0, 7.0, 7.0, 7.0]])
    values = torch.tensor([[0.5, 0.4, 0.2, 9.0], [1.0, 3.0, 3.0, 3.0]])
    adv, ret = gae_advantages(rewards, values, MASK, gamma=0.9, lam=0.8)
    # row 0, right to left (next value after the last real token is 0):
    #   t=2: delta = 1 + 0.9*0 - 0.2 = 0.8;        A2 = 0.8
    #   t=1: delta = 0 + 0.9*0.2 - 0.4 = -0.22;    A1 = -0.22 + 0.72*0.8 = 0.356
    #   t=0: delta = 0 + 0.9*0.4 - 0.5 = -0.14;    A0 = -0.14 + 0.72*0.356 = 0.11632
    # row 1: t=0: delta = 2 + 0 - 1 = 1;         A0 = 1
    raw = [0.11632, 0.356, 0.8, 1.0]
    expected_ret = torch.tensor([[0.61632, 0.756, 1.0, 0.0], [2.0, 0.0, 0.0, 0.0]])
    torch.testing.assert_close(ret, expected_ret)
    w = _whiten_by_hand(raw)
    expected_adv = torch.tensor([[w[0], w[1], w[2], 0.0], [w[3], 0.0, 0.0, 0.0]])
    torch.testing.assert_close(adv, expected_adv)


def test_gae_gamma_lam_one_returns_are_future_reward_sums():
    torch.manual_seed(0)
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0, 0.0]])
    rewards = torch.randn(3, 5)
    values = torch.randn(3, 5)
    adv, ret = gae_advantages(rewards, values, mask, gamma=1.0, lam=1.0)
    future = (rewards * mask).flip(-1).cumsum(-1).flip(-1) * mask
    torch.testing.assert_close(ret, future)
    # returns = adv_raw + values, so the unwhitened advantage is (sum of future rewards) - V on real tokens
    adv_raw = (ret - values) * mask
    torch.testing.assert_close(adv_raw, (future - values) * mask)
    # and the returned advantages are exactly that quantity, whitened over the batch
    w = _whiten_by_hand(adv_raw[mask > 0].tolist())
    torch.testing.assert_close(adv[mask > 0], torch.tensor(w))
    assert torch.all(adv[mask == 0] == 0) and torch.all(ret[mask == 0] == 0)


def test_gae_advantages_whitened_returns_not():
    torch.manual_seed(1)
    rewards = torch.randn(2, 4) * 3 + 2
    values = torch.randn(2, 4)
    adv, ret = gae_advantages(rewards, values, MASK, gamma=0.99, lam=0.95)
    assert (adv * MASK).sum().item() == pytest.approx(0.0, abs=1e-5)
    assert _masked_unbiased_std(adv, MASK) == pytest.approx(1.0, abs=1e-4)
    assert _masked_unbiased_std(ret, MASK) != pytest.approx(1.0, abs=1e-2)


def test_gae_and_reinforce_plus_plus_unwhitened_for_a_whole_batch_whitening():
    """whiten=False (algorithm.whiten_advantages: the caller whitens over every rank's rows): the raw A * m."""
    rewards = torch.tensor([[0.0, 0.0, 1.0, 5.0], [2.0, 7.0, 7.0, 7.0]])
    values = torch.tensor([[0.5, 0.4, 0.2, 9.0], [1.0, 3.0, 3.0, 3.0]])
    adv, _ = gae_advantages(rewards, values, MASK, gamma=0.9, lam=0.8, whiten=False)
    torch.testing.assert_close(adv, torch.tensor([[0.11632, 0.356, 0.8, 0.0], [1.0, 0.0, 0.0, 0.0]]))
    adv, ret = reinforce_plus_plus_advantages(rewards, MASK, gamma=0.5, whiten=False)
    # returns-to-go at gamma 0.5: row 0 G2 = 1, G1 = 0.5, G0 = 0.25 (the masked 5 not counted); row 1 G0 = 2
    torch.testing.assert_close(adv, torch.tensor([[0.25, 0.5, 1.0, 0.0], [2.0, 0.0, 0.0, 0.0]]))
    assert adv is ret


# --- reinforce_returns / reinforce_plus_plus_advantages -----------------------------------------------------


def test_reinforce_returns_by_hand_gamma_half():
    rewards = torch.tensor([[1.0, 2.0, 4.0, 8.0], [3.0, 5.0, 5.0, 5.0]])
    ret = reinforce_returns(rewards, MASK, gamma=0.5)
    # row 0: G2 = 4; G1 = 2 + 0.5*4 = 4; G0 = 1 + 0.5*4 = 3 (the masked 8 must not count); row 1: G0 = 3
    torch.testing.assert_close(ret, torch.tensor([[3.0, 4.0, 4.0, 0.0], [3.0, 0.0, 0.0, 0.0]]))


def test_reinforce_plus_plus_by_hand():
    rewards = torch.tensor([[1.0, 2.0, 4.0, 8.0], [3.0, 5.0, 5.0, 5.0]])
    adv, ret = reinforce_plus_plus_advantages(rewards, MASK, gamma=0.5)
    torch.testing.assert_close(ret, torch.tensor([[3.0, 4.0, 4.0, 0.0], [3.0, 0.0, 0.0, 0.0]]))
    # real returns 3, 4, 4, 3: mean 3.5, unbiased var = 4 * 0.25 / 3 = 1/3
    a = 0.5 / math.sqrt(1 / 3 + 1e-8)
    torch.testing.assert_close(adv, torch.tensor([[-a, a, a, 0.0], [-a, 0.0, 0.0, 0.0]]))


def test_reinforce_plus_plus_whitened_stats():
    torch.manual_seed(2)
    mask = torch.tensor([[1.0] * 6, [1.0] * 4 + [0.0] * 2, [1.0] + [0.0] * 5])
    adv, ret = reinforce_plus_plus_advantages(torch.randn(3, 6) + 1.0, mask, gamma=0.9)
    assert (adv * mask).sum().item() / mask.sum().item() == pytest.approx(0.0, abs=1e-5)
    assert _masked_unbiased_std(adv, mask) == pytest.approx(1.0, abs=1e-4)
    assert torch.all(adv[mask == 0] == 0) and torch.all(ret[mask == 0] == 0)


# --- rloo_advantages ----------------------------------------------------------------------------------------


def test_rloo_by_hand_leave_one_out():
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 4.0, 6.0, 8.0])
    mask = torch.ones(8, 2)
    mask[1, 1] = 0.0
    adv = rloo_advantages(scores, _ids(scores, 4), mask)
    # A_i = r_i - mean of the other three: group 1: 1 - 1/3 = 2/3, 0 - 2/3 = -2/3; group 2: 2 - 6 = -4, 4 - 16/3, ...
    expected = torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3, -4.0, 4 - 16 / 3, 6 - 14 / 3, 8 - 4.0])
    torch.testing.assert_close(adv[:, 0], expected)
    torch.testing.assert_close(adv[:, 1], expected * mask[:, 1])
    assert adv[1, 1].item() == 0.0


def test_rloo_equals_scaled_centering_and_groups_sum_to_zero():
    torch.manual_seed(3)
    n = 3
    scores = torch.rand(12)
    adv = rloo_advantages(scores, _ids(scores, n), torch.ones(12, 1))[:, 0]
    groups = scores.view(-1, n)
    torch.testing.assert_close(adv, (n / (n - 1) * (groups - groups.mean(1, keepdim=True))).flatten())
    torch.testing.assert_close(adv.view(-1, n).sum(1), torch.zeros(4), atol=1e-6, rtol=0)


def test_rloo_n_two_and_uneven_mask():
    adv = rloo_advantages(
        torch.tensor([3.0, 1.0]), _ids(torch.tensor([3.0, 1.0]), 2), torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    )
    torch.testing.assert_close(adv, torch.tensor([[2.0, 2.0, 2.0], [-2.0, 0.0, 0.0]]))


def test_rloo_group_of_one_gets_zero():
    adv = rloo_advantages(torch.tensor([1.0, 2.0]), _ids(torch.tensor([1.0, 2.0]), 1), torch.ones(2, 1))
    torch.testing.assert_close(adv, torch.zeros(2, 1))


# --- scores_to_token_rewards --------------------------------------------------------------------------------


def test_scores_to_token_rewards_last_real_token():
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    out = scores_to_token_rewards(torch.tensor([0.5, -1.0, 7.0, 2.0]), mask)
    expected = torch.tensor([[0.0, 0.0, 0.5, 0.0], [-1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 2.0]])
    torch.testing.assert_close(out, expected)


def test_informative_rows_are_those_with_a_nonzero_advantage_on_a_trained_token() -> None:
    adv = torch.tensor([[0.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.0, 0.0, -1.0], [2.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [0.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    # row 0: all zero; row 3: its only nonzero advantage is on an untrained token; row 4: nothing trained
    assert informative_rows(adv, mask).tolist() == [1, 2]


def test_a_grpo_group_with_equal_rewards_has_no_informative_row() -> None:
    scores = torch.tensor([1.0, 1.0, 0.0, 1.0])
    adv = group_advantages(scores, torch.tensor([0, 0, 1, 1]), "grpo")[:, None] * torch.ones(4, 3)
    assert informative_rows(adv, torch.ones(4, 3)).tolist() == [2, 3]
