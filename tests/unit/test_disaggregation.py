"""Roles on their own ranks, without a process group: cells, the transfer plan, sync buckets, the
truncated IS weight, and the placement checks that must fail before any model loads."""

from __future__ import annotations

import math
import random

import pytest
import torch

from torchrl_post.algos.policy_loss import truncated_is_weights
from torchrl_post.config.errors import ConfigError
from torchrl_post.config.load import load_config
from torchrl_post.config.schema import PlacementConfig
from torchrl_post.config.validate import uses_rollout_is, validate_batch, validate_placement
from torchrl_post.distributed.placement import plan_placement
from torchrl_post.distributed.transfer import balance_groups, plan_transfer
from torchrl_post.sync.weights import WireBucket, plan_wire, split_bucket
from torchrl_post.train import describe_plan, planned_world

# --- cells and the sync group ---------------------------------------------------------------------------------


def test_cells_and_sync_group_for_three_and_four_ranks() -> None:
    p3 = plan_placement(PlacementConfig(actor=[0, 1], rollout=[2]), 3)
    assert p3.cells() == {"actor": [0, 1], "rollout": [2]}
    assert p3.sync_ranks() == [0, 2]
    assert [p3.cell_of(r) for r in range(3)] == ["actor", "actor", "rollout"]
    p4 = plan_placement(PlacementConfig(actor=[0, 1], rollout=[2, 3]), 4)
    assert p4.sync_ranks() == [0, 2, 3]
    assert p4.roles_of(3) == ["rollout"]


def test_colocated_is_one_cell_without_sync_group() -> None:
    p = plan_placement(PlacementConfig(reference="actor"), 2)
    assert p.cells() == {"actor": [0, 1]}
    assert p.sync_ranks() == []
    assert p.roles_of(1) == ["actor", "rollout", "reference"]


def test_critic_on_its_own_ranks_is_its_own_cell() -> None:
    p = plan_placement(PlacementConfig(actor=[0, 1], rollout=[2], critic=[3]), 4)
    assert p.cells() == {"actor": [0, 1], "rollout": [2], "critic": [3]}


# --- the transfer plan ----------------------------------------------------------------------------------------


def test_balance_groups_hand_example() -> None:
    # Longest first to the lightest rank with room: 9->0, 7->1, 5->1 (7<9), 1->0 (room: 0 has 1 left, 1 has 0).
    assert balance_groups([5, 9, 1, 7], 2) == [1, 0, 0, 1]


@pytest.mark.parametrize("n_dst", [1, 2, 3, 4])
def test_balance_groups_equal_counts_and_bounded_spread(n_dst: int) -> None:
    rng = random.Random(n_dst)
    tokens = [rng.randint(1, 200) for _ in range(12 * n_dst)]
    dest = balance_groups(tokens, n_dst)
    counts = [dest.count(d) for d in range(n_dst)]
    assert counts == [12] * n_dst
    loads = [sum(t for t, d in zip(tokens, dest, strict=True) if d == r) for r in range(n_dst)]
    assert max(loads) - min(loads) <= max(tokens)


def test_balance_groups_refuses_uneven_split() -> None:
    with pytest.raises(ValueError, match="evenly"):
        balance_groups([1, 2, 3], 2)


def test_plan_transfer_owner_and_dest() -> None:
    # rows: index, owner rank, tokens, version, gen ms (two engines on ranks 2 and 3)
    table = torch.tensor([[0, 2, 10, 0, 5], [1, 2, 30, 0, 5], [3, 3, 20, 0, 7], [2, 3, 40, 0, 7]])
    owner, dest = plan_transfer(table, 4, [0, 1])
    assert owner == {0: 2, 1: 2, 2: 3, 3: 3}
    # tokens by index [10, 30, 40, 20]: 40->0, 30->1, 20->1, 10->0
    assert dest == {0: 0, 1: 1, 2: 0, 3: 1}


def test_plan_transfer_detects_missing_group() -> None:
    table = torch.tensor([[0, 2, 10, 0, 5], [2, 2, 30, 0, 5]])
    with pytest.raises(RuntimeError, match="expected 0..2"):
        plan_transfer(table, 3, [0, 1])


# --- weight sync buckets --------------------------------------------------------------------------------------


def test_plan_wire_by_size_dtype_and_shard_world() -> None:
    f32, bf16 = torch.float32, torch.bfloat16
    specs = [
        ("a", (4, 4), f32, 2),  # 2 rows per rank slot of 4 -> 8 elements a slot, 64 B in full
        ("b", (3,), f32, 2),  # rows 2 per slot (the second rank holds 1): 2 elements, 16 B in full
        ("c", (100,), f32, 2),  # 400 B: alone
        ("d", (2,), bf16, 2),  # a dtype change starts a bucket
        ("e", (2,), bf16, 1),  # so does an unsharded parameter
    ]
    buckets = plan_wire(specs, bucket_bytes=96)
    assert [[e[0] for e in b.entries] for b in buckets] == [["a", "b"], ["c"], ["d"], ["e"]]
    assert buckets[0].entries == (("a", (4, 4), 2, 8), ("b", (3,), 2, 2))
    assert (buckets[0].slot, buckets[0].numel, buckets[0].nbytes) == (10, 20, 80)
    assert buckets[3].world == 1 and buckets[3].nbytes == 4


def test_split_bucket_undoes_the_rank_major_layout() -> None:
    """What one all_gather of [a rows 0-1, b rows 0-1] and [a rows 2-3, b row 2, pad] looks like."""
    a, b = torch.arange(16.0).view(4, 4), torch.tensor([100.0, 101.0, 102.0])
    bucket = WireBucket(torch.float32, 2, (("a", (4, 4), 2, 8), ("b", (3,), 2, 2)))
    rank0 = torch.cat([a[:2].reshape(-1), b[:2]])
    rank1 = torch.cat([a[2:].reshape(-1), b[2:], torch.zeros(1)])
    got = dict(split_bucket(torch.cat([rank0, rank1]), bucket))
    assert torch.equal(got["a"], a) and torch.equal(got["b"], b)


# --- truncated importance sampling ----------------------------------------------------------------------------


def test_truncated_is_weights_hand_computed() -> None:
    old = torch.tensor([[math.log(0.5), math.log(0.9), math.log(0.2)]])
    rollout = torch.tensor([[math.log(0.25), math.log(0.9), math.log(0.8)]])
    w = truncated_is_weights(old, rollout, cap=1.5)
    assert w.tolist()[0] == pytest.approx([1.5, 1.0, 0.25])  # 2.0 capped at 1.5; equal; 0.2/0.8
    assert not w.requires_grad


def test_rollout_is_auto_follows_off_policy_steps() -> None:
    assert not uses_rollout_is(load_config([]))
    assert not uses_rollout_is(load_config(["rollout.mode=async"]))  # continuous batching, still on-policy
    assert uses_rollout_is(load_config(["trainer.max_off_policy_steps=1"]))
    assert uses_rollout_is(load_config(["algorithm.rollout_is=token"]))
    assert not uses_rollout_is(load_config(["trainer.max_off_policy_steps=1", "algorithm.rollout_is=none"]))


def test_rollout_mode_async_is_valid_colocated() -> None:
    """verl users set rollout.mode=async everywhere; it must not be an error with the hybrid engine."""
    cfg = load_config(["rollout.mode=async"])
    p = plan_placement(cfg.placement, 2)
    validate_placement(cfg, p.ranks, p.colocated)
    assert "rollout mode: async, trainer.max_off_policy_steps=0 (on-policy)" in describe_plan(
        cfg, p, validate_batch(cfg, 2, 2), "cpu", "gloo"
    )


# --- placement checks -----------------------------------------------------------------------------------------


def _placement_error(world: int, overrides: list[str]) -> str:
    cfg = load_config(overrides)
    with pytest.raises(ConfigError) as info:
        p = plan_placement(cfg.placement, world)
        validate_placement(cfg, p.ranks, p.colocated)
        validate_batch(cfg, len(p.ranks["actor"]), len(p.ranks["rollout"]) // cfg.rollout.tensor_parallel_size)
    msg = str(info.value)
    assert "\n" not in msg
    return msg


@pytest.mark.parametrize(
    ("world", "overrides", "needle"),
    [
        (3, ["placement.actor=[0,1]", "placement.rollout=[2]", "rollout.tensor_parallel_size=2"], "does not divide"),
        (3, ["placement.actor=[0,1]", "placement.rollout=[2]", "rollout.engine=hf"], "rollout.engine=hf"),
        (2, ["trainer.max_off_policy_steps=1"], "trainer.max_off_policy_steps=1 needs the rollout on ranks of its own"),
        (4, ["actor.fsdp.fsdp_size=3"], "actor.fsdp.fsdp_size=3"),
        (5, ["placement.actor=[0,1,2]", "placement.rollout=[3,4]", "data.train_batch_size=16"], "3 actor"),
        (4, ["placement.actor=[0,1]", "placement.rollout=[2,3]", "data.train_batch_size=3"], "train_batch_size=3"),
        (3, ["placement.actor=[0,1]", "placement.rollout=[2]", "placement.critic=[2]"], "placement.critic"),
    ],
)
def test_placement_errors_name_the_key(world: int, overrides: list[str], needle: str) -> None:
    assert needle in _placement_error(world, overrides)


def test_planned_world() -> None:
    assert planned_world(None, 3, True) == 3
    assert planned_world(8, 1, False) == 8
    with pytest.raises(ConfigError, match="torchrun started 2"):
        planned_world(4, 2, True)


def test_describe_plan_shows_meshes_engines_and_sync_group() -> None:
    cfg = load_config(["rollout.tensor_parallel_size=2", "actor.fsdp.fsdp_size=2", "trainer.max_off_policy_steps=1"])
    cfg.placement.actor, cfg.placement.rollout = [0, 1, 2, 3], [4, 5, 6, 7]
    p = plan_placement(cfg.placement, 8)
    text = describe_plan(cfg, p, validate_batch(cfg, 4, 2), "cpu", "gloo")
    assert "actor mesh ('dp_replicate', 'dp_shard') = (2, 2) (HSDP)" in text
    assert "rollout engines (vllm, tensor_parallel_size=2): [[4, 5], [6, 7]]" in text
    assert "weight sync: broadcast over ranks [0, 4, 5, 6, 7]" in text
    assert "max_off_policy_steps=1" in text and "samples_per_actor_rank: 32" in text


def test_group_rows_fill_named_columns() -> None:
    from torchrl_post.distributed.transfer import ROW_SHORT, ROW_TOKENS, GroupRow, group_rows

    rows = group_rows([GroupRow(3, 1, 40, short=2), (4, 1, 50)])
    assert rows.shape == (2, len(GroupRow._fields)) and rows.dtype == torch.int64
    assert rows[:, ROW_TOKENS].tolist() == [40, 50] and rows[:, ROW_SHORT].tolist() == [2, 0]
    assert group_rows([]).shape == (0, len(GroupRow._fields))
