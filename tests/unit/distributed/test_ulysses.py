"""Tests of torchrl_post/distributed/ulysses.py without a process group: with no group (one rank) every collective
is the identity, gradients included. The exchanges on several ranks: tests/distributed/test_ulysses.py."""

from __future__ import annotations

import torch

from torchrl_post.distributed.ulysses import group_size, heads_to_seq, seq_to_heads, sum_over


def test_one_rank_is_the_identity() -> None:
    assert group_size(None) == 1
    x = torch.randn(2, 4, 5, 8, requires_grad=True)
    assert seq_to_heads(x, None) is x and heads_to_seq(x, None) is x
    total = sum_over(x.sum(), None)
    total.backward()
    assert x.grad is not None and torch.equal(x.grad, torch.ones_like(x))
