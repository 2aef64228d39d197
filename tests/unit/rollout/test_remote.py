"""Tests of torchrl_post/rollout/remote.py: the rollout ranks' program (RolloutServer over whole batches of
rollout/groups.py: batches made ahead, policy versions, resume) and its actor-side proxy (RemoteRollouts: staleness
and rejection metrics), over test_source.py's scripted engine, with stand-ins for the weight sync and the transfer
(no process group)."""

from __future__ import annotations

import io
from typing import Any, cast

import pytest
import torch

from tests.unit.rollout.test_source import SEED, TOK, TRAIN, ScriptedEngine, _settings, reward, whole_batches
from torchrl_post.data.sampler import ShardedBatchSampler
from torchrl_post.distributed.transfer import (
    ROW_GEN_MS,
    ROW_INDEX,
    ROW_OWNER,
    ROW_TOKENS,
    ROW_VERSION,
    ROW_WAIT_MS,
    GroupRow,
    group_rows,
)
from torchrl_post.engines.batch import collate
from torchrl_post.logging.timing import Timer
from torchrl_post.reward.samples import SampleScoring
from torchrl_post.rollout.groups import Groups
from torchrl_post.rollout.remote import RemoteRollouts, RolloutServer
from torchrl_post.rollout.source import EngineSource
from torchrl_post.types import Batch, Generation, PromptBatch

PAD = 99
RANK = 7  # the rollout rank, as its rows name it
Wire = dict[str, torch.Tensor]
Items = dict[int, Wire]


def _made(number: int) -> Batch:
    """Groups 0 and 1 (n = 2), told apart by their tokens and scores `number` (the proxy's tests)."""
    prompts = PromptBatch([[5, 6], [7]], ["a", "a"], ["src"] * 2, [{}, {}], [0, 1])
    t = 20 + number
    gen = Generation([[t], [t, t], [t, t, t], []], [[-0.5], [-0.5] * 2, [-0.5] * 3, []], ["stop"] * 4)
    batch = collate(prompts, gen, n=2, pad_id=PAD)
    batch.scores = torch.full((4,), float(number))
    batch.reward_errors = torch.zeros(4)
    return batch


class _Engine(ScriptedEngine):
    """The scripted engine, logging each draw it generates (the draw's number, from its seed)."""

    def __init__(self, log: list[tuple[Any, ...]]) -> None:
        super().__init__()
        self.log = log

    def step(self) -> Any:
        calls = len(self.calls)
        out = super().step()
        if len(self.calls) > calls:
            self.log.append(("gen", self.calls[-1][2].seed - SEED * 7919))
        return out


class _Sync:
    def __init__(self, log: list[tuple[Any, ...]]) -> None:
        self.log = log

    def received(self) -> Any:
        self.log.append(("receive",))
        return iter(())


class _Transfer:
    def __init__(self, log: list[tuple[Any, ...]]) -> None:
        self.log = log
        self.sent: list[tuple[Items, torch.Tensor]] = []

    def __call__(self, items: Items, rows: torch.Tensor) -> tuple[torch.Tensor, Items]:
        self.log.append(("transfer", _number(items) if items else None))
        self.sent.append((items, rows))
        return rows, {}


def _number(items: Items) -> int:
    """Which draw these groups are, in an epoch of 4 (from the prompt of group 0: q0 q1 first, then q2 q3, ...)."""
    ids = Batch.from_wire(items[min(items)]).input_ids[0].tolist()
    return int(TOK.decode([t for t in ids if t != TOK.pad_token_id])[1]) // 2


def _server(
    lag: int, total: int, log: list[tuple[Any, ...]], leader: bool = True
) -> tuple[RolloutServer, Groups, _Transfer]:
    """The rollout rank's program over whole batches made up to `lag` steps ahead (rollout/groups.py)."""
    engine, transfer = _Engine(log), _Transfer(log)
    sampler = ShardedBatchSampler(len(TRAIN), 2, 0, 1, seed=0, shuffle=False)
    source = EngineSource(
        _settings(), engine, TOK, TRAIN, SampleScoring(lambda _: reward, TOK), sampler, Timer(), engine_index=0, n_engines=1,
        engine_leader=leader,
    )  # type: ignore[arg-type]  # fmt: skip
    groups = Groups(source, whole_batches(lag), total)
    server = RolloutServer(source, groups, cast(Any, _Sync(log)), cast(Any, transfer), rank=RANK, lag=lag)
    return server, groups, transfer


def _untimed(rows: torch.Tensor) -> torch.Tensor:
    """The rows without their times (engine seconds, waits)."""
    keep = [c for c in range(rows.shape[1]) if c not in (ROW_GEN_MS, ROW_WAIT_MS)]
    return rows[:, keep]


def _through_checkpoint(state: dict[str, Any]) -> dict[str, Any]:
    """As the checkpoint keeps a rank's state: torch.save, then a weights_only load."""
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


# --- RolloutServer ----------------------------------------------------------------------------------------------


def test_on_policy_generates_step_k_at_step_k_with_the_weights_of_update_k_minus_1() -> None:
    log: list[tuple[Any, ...]] = []
    server, _, transfer = _server(lag=0, total=3, log=log)
    for step in (1, 2, 3):
        assert server.step(step) == {}
    G, T, R = "gen", "transfer", "receive"
    assert log == [(G, 1), (T, 0), (R,), (G, 2), (T, 1), (R,), (G, 3), (T, 2), (R,)]
    versions = [int(rows[:, ROW_VERSION].unique().item()) for _, rows in transfer.sent]
    assert versions == [0, 1, 2]  # batch k made after the weights of update k - 1 arrived
    assert server.version == 3


def test_look_ahead_one_queues_step_k_plus_1_while_handing_over_step_k() -> None:
    log: list[tuple[Any, ...]] = []
    server, _, transfer = _server(lag=1, total=3, log=log)
    for step in (1, 2, 3):
        server.step(step)
    G, T, R = "gen", "transfer", "receive"
    assert log == [
        (G, 1),  # the first step has nothing made ahead
        (T, 0),
        (G, 2),  # made while the actor updates step 1
        (R,),
        (T, 1),
        (G, 3),
        (R,),
        (T, 2),
        (R,),  # nothing past total_steps
    ]
    versions = [int(rows[:, ROW_VERSION].unique().item()) for _, rows in transfer.sent]
    assert versions == [0, 0, 1]  # batch k + 1 with the weights of update k - 1


def test_handed_over_groups_and_their_rows() -> None:
    server, _, transfer = _server(lag=0, total=1, log=[])
    server.step(1)
    ((items, rows),) = transfer.sent
    assert sorted(items) == [0, 1]
    texts = {
        g: TOK.batch_decode(Batch.from_wire(w).responses.tolist(), skip_special_tokens=True) for g, w in items.items()
    }
    assert texts == {0: ["1", "1"], 1: ["1", "2"]}  # q0's and q1's scripted responses
    assert rows[:, ROW_INDEX].tolist() == [0, 1] and rows[:, ROW_OWNER].tolist() == [RANK, RANK]
    # real tokens per group: a prompt of 2 characters twice, each with a response of 1
    assert rows[:, ROW_TOKENS].tolist() == [(2 + 1) * 2, (2 + 1) * 2]
    assert rows[:, ROW_VERSION].tolist() == [0, 0]


def test_a_non_leader_rank_of_an_engine_sends_nothing() -> None:
    server, _, transfer = _server(lag=0, total=1, log=[], leader=False)
    server.step(1)
    ((items, rows),) = transfer.sent
    assert items == {} and rows.shape == (0, len(GroupRow._fields))


@pytest.mark.parametrize("lag", [0, 1, 2])
def test_resume_continues_the_queue_and_versions_exactly(lag: int) -> None:
    total, stop = 6, 2
    reference, _, sent = _server(lag, total, [])
    for step in range(1, total + 1):
        reference.step(step)
    first, _, _ = _server(lag, total, [])
    for step in range(1, stop + 1):
        first.step(step)
    state = _through_checkpoint(first.state_dict())
    resumed, groups, resent = _server(lag, total, [])  # a fresh producer at its start
    resumed.load_state_dict(state, stop)
    assert groups.draws == min(stop + lag, total)  # continues after the last batch made, not the last one sent
    for step in range(stop + 1, total + 1):
        resumed.step(step)
    after = sent.sent[stop:]
    assert [_number(items) for items, _ in resent.sent] == [_number(items) for items, _ in after]
    for (items, rows), (want_items, want_rows) in zip(resent.sent, after, strict=True):
        assert torch.equal(_untimed(rows), _untimed(want_rows))  # versions included
        assert items.keys() == want_items.keys()
        for g in items:
            assert items[g].keys() == want_items[g].keys()
            assert all(torch.equal(items[g][k], want_items[g][k]) for k in items[g])
    assert resumed.version == reference.version == total


# --- RemoteRollouts ---------------------------------------------------------------------------------------------


class _Table:
    """The actor side of the transfer: all ranks' rows and this rank's groups."""

    def __init__(self, table: torch.Tensor, parts: Items) -> None:
        self.table, self.parts = table, parts
        self.calls: list[tuple[Items, torch.Tensor]] = []

    def __call__(self, items: Items, rows: torch.Tensor) -> tuple[torch.Tensor, Items]:
        self.calls.append((items, rows))
        return self.table, self.parts


def _remote(transfer: Any, rejection: bool) -> RemoteRollouts:
    sampler = ShardedBatchSampler(8, 4, 0, 1, seed=0)
    return RemoteRollouts(transfer, sampler, Timer(), rejection, PAD)


def _two_engines() -> tuple[torch.Tensor, Items]:
    """Groups 0, 1 from the engine on rank 4 (version 2, 1.5 s; dropped 3, 1 extra round), groups 2, 3 from rank 5
    (version 1, 2.5 s; dropped 1, 2 rounds, 1 short group); this actor rank receives groups 3 and 1."""
    table = group_rows(
        [
            GroupRow(0, 4, 10, 2, 1500, 3, 1, 0, partial=1, stale_dropped=2, wait_ms=300, in_flight=6),
            GroupRow(1, 4, 12, 2, 1500, 3, 1, 0, partial=0, stale_dropped=2, wait_ms=300, in_flight=6),
            GroupRow(3, 5, 9, 1, 2500, 1, 2, 1, partial=2, stale_dropped=1, wait_ms=700, in_flight=4),
            GroupRow(2, 5, 11, 1, 2500, 1, 2, 1, partial=1, stale_dropped=1, wait_ms=700, in_flight=4),
        ]
    )
    groups = _made(0).split_groups()
    parts = {3: groups[1].to_wire(), 1: groups[0].to_wire()}
    parts[3]["group_ids"] = torch.full_like(parts[3]["group_ids"], 3)
    parts[1]["group_ids"] = torch.full_like(parts[1]["group_ids"], 1)
    return table, parts


def test_remote_rollouts_batch_staleness_and_rejection_metrics() -> None:
    table, parts = _two_engines()
    transfer = _Table(table, parts)
    rollouts = _remote(transfer, rejection=True)
    batch = rollouts.next_batch(4)
    ((items, rows),) = transfer.calls  # the actor ranks send nothing
    assert items == {} and rows.shape == (0, len(GroupRow._fields))
    assert batch.group_ids.tolist() == [1, 1, 3, 3]  # groups in order, joined
    assert batch.scores is not None and batch.scores.tolist() == [0.0] * 4
    assert rollouts.metrics() == {
        "rollout/staleness": (4 - 1) - 1,  # the oldest version among the step's groups
        "rollout/staleness_mean": (1 + 1 + 2 + 2) / 4,
        "rollout/staleness_groups/0": 0,
        "rollout/staleness_groups/1": 2,
        "rollout/staleness_groups/2": 2,
        "rollout/staleness_groups/3": 0,
        "rollout/staleness_groups/4+": 0,
        "timing_s/gen_engine": 2.5,  # the slowest engine
        "timing_s/rollout_wait": 0.7,  # the rollout rank that waited longest in the last step's exchanges
        "filter/rejection/dropped_groups": 3 + 1,  # each engine's counts once, not once per row
        "filter/rejection/extra_rounds": 1 + 2,
        "filter/rejection/short_groups": 0 + 1,
    }
    assert rollouts.sampler.state_dict()["batch_in_epoch"] == 1  # the data position moves with the steps


def test_remote_rollouts_without_rejection_reports_no_filter_counts() -> None:
    table, parts = _two_engines()
    rollouts = _remote(_Table(table, parts), rejection=False)
    rollouts.next_batch(3)
    metrics = rollouts.metrics()
    assert not [k for k in metrics if k.startswith("filter/")]
    assert metrics["rollout/staleness"] == 1.0 and metrics["timing_s/gen_engine"] == 2.5


def test_remote_rollouts_state_round_trips_the_data_position() -> None:
    table, parts = _two_engines()
    rollouts = _remote(_Table(table, parts), rejection=False)
    for step in (1, 2, 3):
        rollouts.next_batch(step)
    restored = _remote(_Table(table, parts), rejection=False)
    restored.load_state_dict(_through_checkpoint(rollouts.state_dict()))
    assert (
        restored.sampler.state_dict()
        == rollouts.sampler.state_dict()
        == {"epoch": 1, "batch_in_epoch": 1, "num_items": 8}
    )
    assert restored.epoch == 1


@pytest.mark.parametrize("lag", [0, 1, 2])
def test_server_and_proxy_together_give_the_documented_staleness(lag: int) -> None:
    """The server's rows handed to the proxy: rollout/staleness is 0 on-policy, and min(step - 1, lag) with
    look-ahead (trainer.max_off_policy_steps: the batch of step i + lag is made with the weights of update i - 1)."""
    server, _, _ = _server(lag, total=5, log=[])
    handed: list[tuple[torch.Tensor, Items]] = []
    server.transfer = cast(Any, lambda items, rows: handed.append((rows, items)))
    rollouts = _remote(lambda items, rows: handed[-1], rejection=False)
    staleness = []
    for step in range(1, 6):
        server.step(step)
        batch = rollouts.next_batch(step)
        assert _number({0: batch.to_wire()}) == (step - 1) % 4  # the draws in order
        staleness.append(rollouts.metrics()["rollout/staleness"])
    assert staleness == [float(min(step - 1, lag)) for step in range(1, 6)]


def test_streamed_groups_report_partial_samples_stale_drops_and_requests_in_flight() -> None:
    table, parts = _two_engines()
    sampler_before = ShardedBatchSampler(8, 4, 0, 1, seed=0).state_dict()
    rollouts = RemoteRollouts(cast(Any, _Table(table, parts)), ShardedBatchSampler(8, 4, 0, 1, seed=0), Timer(),
                              False, PAD, streaming=True, group_size=2)  # fmt: skip
    rollouts.next_batch(4)
    metrics = rollouts.metrics()
    assert metrics["rollout/partial_samples"] == (1 + 0 + 2 + 1) / (4 * 2)  # of the step's samples
    assert metrics["rollout/stale_dropped_groups"] == 2 + 1  # each engine's count once
    assert metrics["rollout/in_flight"] == 6 + 4
    assert rollouts.sampler.state_dict() != sampler_before  # counts trained batches (training/epoch)
