"""Tests of torchrl_post/reward/preference.py: the Bradley-Terry loss and pairwise accuracy, by hand."""

from __future__ import annotations

import math

import pytest
import torch

from torchrl_post.reward.preference import bradley_terry_loss, pairwise_accuracy


def test_bradley_terry_loss_is_the_mean_negative_log_sigmoid_of_the_differences() -> None:
    chosen, rejected = torch.tensor([1.0, 0.0, 2.0]), torch.tensor([0.0, 0.0, 4.0])
    # differences 1, 0, -2: -log sigmoid(d) = log(1 + e^-d) -> log(1 + e^-1), log 2, log(1 + e^2)
    want = (math.log(1 + math.exp(-1)) + math.log(2) + math.log(1 + math.exp(2))) / 3
    assert bradley_terry_loss(chosen, rejected).item() == pytest.approx(want)


def test_a_margin_is_subtracted_from_each_difference() -> None:
    chosen, rejected = torch.tensor([3.0, 1.0]), torch.tensor([1.0, 1.0])
    # differences 2, 0 less margins 1, -1: 1, 1 -> log(1 + e^-1) each
    loss = bradley_terry_loss(chosen, rejected, torch.tensor([1.0, -1.0]))
    assert loss.item() == pytest.approx(math.log(1 + math.exp(-1)))


def test_the_loss_is_stable_far_from_zero() -> None:
    # log(1 + e^-100) is e^-100 to within float precision; log(1 + e^100) = 100 + log(1 + e^-100)
    loss = bradley_terry_loss(torch.tensor([100.0, 0.0]), torch.tensor([0.0, 100.0]))
    assert loss.item() == pytest.approx(50.0)


def test_the_gradient_pushes_chosen_up_and_rejected_down() -> None:
    chosen, rejected = torch.tensor([0.0], requires_grad=True), torch.tensor([0.0], requires_grad=True)
    bradley_terry_loss(chosen, rejected).backward()
    # d/dc -log sigmoid(c - r) = -(1 - sigmoid(0)) = -1/2; d/dr = +1/2
    assert chosen.grad is not None and rejected.grad is not None
    assert chosen.grad.item() == pytest.approx(-0.5) and rejected.grad.item() == pytest.approx(0.5)


def test_pairwise_accuracy_counts_strict_wins() -> None:
    chosen, rejected = torch.tensor([2.0, 1.0, 0.0, -1.0]), torch.tensor([1.0, 1.0, 1.0, -3.0])
    assert pairwise_accuracy(chosen, rejected).item() == pytest.approx(2 / 4)  # a tie is not a win
