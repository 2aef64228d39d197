"""Tests of torchrl_post/data/sampler.py: the resumable sharded batch sampler."""

import re

import pytest

from torchrl_post.data.sampler import ShardedBatchSampler

# --- ShardedBatchSampler ------------------------------------------------------------------------------------


def test_sampler_ranks_split_the_global_batch():
    s0 = ShardedBatchSampler(40, 8, dp_rank=0, dp_size=2, seed=3)
    s1 = ShardedBatchSampler(40, 8, dp_rank=1, dp_size=2, seed=3)
    full = ShardedBatchSampler(40, 8, dp_rank=0, dp_size=1, seed=3)
    for _ in range(7):  # crosses an epoch boundary (5 batches per epoch)
        idx0, pos0 = s0.next_batch()
        idx1, pos1 = s1.next_batch()
        global_idx, global_pos = full.next_batch()
        assert pos0 == [0, 1, 2, 3] and pos1 == [4, 5, 6, 7]
        assert global_pos == list(range(8))
        assert len(idx0) == len(idx1) == 4
        assert not set(idx0) & set(idx1)
        assert idx0 + idx1 == global_idx


def test_sampler_epoch_covers_every_index_once():
    s = ShardedBatchSampler(20, 4, dp_rank=0, dp_size=1, seed=0)
    assert s.batches_per_epoch == 5
    seen = [i for _ in range(5) for i in s.next_batch()[0]]
    assert sorted(seen) == list(range(20))


def test_sampler_drops_the_remainder():
    s = ShardedBatchSampler(10, 4, dp_rank=0, dp_size=1, seed=0)
    assert s.batches_per_epoch == 2
    first = [i for _ in range(2) for i in s.next_batch()[0]]
    assert len(set(first)) == 8
    s.next_batch()
    assert s.state_dict()["epoch"] == 1


def test_sampler_epochs_reshuffle():
    s = ShardedBatchSampler(32, 32, dp_rank=0, dp_size=1, seed=0)
    e0 = s.next_batch()[0]
    e1 = s.next_batch()[0]
    assert sorted(e0) == sorted(e1) == list(range(32))
    assert e0 != e1
    assert s.state_dict()["epoch"] == 1


def test_sampler_seed_changes_order():
    a = ShardedBatchSampler(32, 32, dp_rank=0, dp_size=1, seed=0).next_batch()[0]
    b = ShardedBatchSampler(32, 32, dp_rank=0, dp_size=1, seed=1).next_batch()[0]
    c = ShardedBatchSampler(32, 32, dp_rank=0, dp_size=1, seed=0).next_batch()[0]
    assert a != b
    assert a == c


def test_sampler_without_shuffle_is_in_order():
    s = ShardedBatchSampler(8, 4, dp_rank=1, dp_size=2, seed=0, shuffle=False)
    assert s.next_batch() == ([2, 3], [2, 3])
    assert s.next_batch() == ([6, 7], [2, 3])
    assert s.next_batch() == ([2, 3], [2, 3])


def test_sampler_resume_draws_the_same_sequence():
    s = ShardedBatchSampler(30, 6, dp_rank=1, dp_size=2, seed=7)  # 5 batches per epoch
    for _ in range(5):
        s.next_batch()
    state = s.state_dict()
    expected = [s.next_batch() for _ in range(3)]
    fresh = ShardedBatchSampler(30, 6, dp_rank=1, dp_size=2, seed=7)
    fresh.load_state_dict(dict(state))
    assert [fresh.next_batch() for _ in range(3)] == expected
    assert fresh.state_dict() == s.state_dict()


def test_sampler_resume_mid_epoch():
    s = ShardedBatchSampler(30, 6, dp_rank=0, dp_size=1, seed=7)
    for _ in range(2):
        s.next_batch()
    state = s.state_dict()
    assert state == {"epoch": 0, "batch_in_epoch": 2, "num_items": 30}
    expected = [s.next_batch() for _ in range(4)]
    fresh = ShardedBatchSampler(30, 6, dp_rank=0, dp_size=1, seed=7)
    fresh.load_state_dict(state)
    assert [fresh.next_batch() for _ in range(4)] == expected


def test_sampler_load_with_different_dataset_size():
    s = ShardedBatchSampler(30, 6, dp_rank=0, dp_size=1, seed=7)
    s.next_batch()
    other = ShardedBatchSampler(31, 6, dp_rank=0, dp_size=1, seed=7)
    with pytest.raises(ValueError, match=re.escape("30")):
        other.load_state_dict(s.state_dict())


def test_sampler_dataset_smaller_than_batch():
    s = ShardedBatchSampler(3, 4, dp_rank=0, dp_size=1, seed=0)
    with pytest.raises(ValueError):
        s.next_batch()
