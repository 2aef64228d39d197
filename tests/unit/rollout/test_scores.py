"""Both sides of a reward model scoring groups as they finish (rollout/scores.py) over a real TCPStore: tickets,
scores of groups of different widths, and a server that leaves only when every engine reached the point."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from torchrl_post.distributed.mailbox import Mailbox
from torchrl_post.rollout.scores import GroupScores, ScoreServer


@pytest.fixture
def store() -> Iterator[dist.TCPStore]:
    yield dist.TCPStore("127.0.0.1", 0, 1, True, timeout=timedelta(seconds=30))


def _client(store: dist.TCPStore) -> dist.TCPStore:
    """A connection of its own (one per process in a run; a thread here): a store client is not shared."""
    return dist.TCPStore("127.0.0.1", store.port, 1, False, timeout=timedelta(seconds=30))


def _score(ids: torch.Tensor) -> torch.Tensor:
    """A stand-in model: each row's sum of real tokens (-1: padding)."""
    return ids.clamp(min=0).sum(1).float()


def test_groups_are_scored_as_they_arrive_and_the_server_leaves_once_every_engine_is_there(
    store: dist.TCPStore,
) -> None:
    box = Mailbox(store, "rm_scores", timeout_s=30)
    engines = [GroupScores(box, e, leader=True) for e in range(2)]
    server = ScoreServer(Mailbox(_client(store), "rm_scores"), 2, _score, first=True)
    thread = threading.Thread(target=server.serve, args=("take1",))
    thread.start()
    a = torch.tensor([[1, 2, -1], [3, -1, -1]])
    b = torch.tensor([[5, 5, 5, 5], [1, 1, 1, 1]])
    c = torch.tensor([[7], [8]])
    tickets = [engines[0].post(a), engines[0].post(b), engines[1].post(c)]
    assert tickets == [0, 1, 0]  # each engine counts its own
    assert engines[0].get(1).tolist() == [20.0, 4.0]
    assert engines[0].get(0).tolist() == [3.0, 3.0]
    assert engines[1].get(0).tolist() == [7.0, 8.0]
    engines[0].ready("take1")
    thread.join(timeout=0.5)
    assert thread.is_alive()  # engine 1 has not reached the point
    engines[1].post(torch.tensor([[2, 2]]))  # posted before it reaches it: scored before the server leaves
    engines[1].ready("take1")
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert server.scored == 4
    assert engines[1].get(1).tolist() == [4.0]


def test_a_wait_past_the_deadline_says_what_did_not_come(store: dist.TCPStore) -> None:
    box = Mailbox(store, "rm_scores", timeout_s=0.2)
    with pytest.raises(RuntimeError, match="the reward model's scores of engine 0's group 0 did not come within 0.2 s"):
        GroupScores(box, 0, leader=True).get(0)
