"""Tests of torchrl_post/workers/remote.py: a critic or reference on ranks of its own. The actor-side proxies
(RemoteCritic, RemoteReference) and the role ranks' program (RoleServer) must make the same link exchanges in the
same order, each side sending what the other receives: checked on recording links (no process group), and on a
pair of in-memory links whose two sides run in two threads and meet at every exchange."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any, cast

import pytest
import torch

from tests.unit.batch_helpers import _two_prompt_batch
from torchrl_post.config.errors import ConfigError
from torchrl_post.config.load import load_config
from torchrl_post.plan import plan_run
from torchrl_post.types import Batch
from torchrl_post.workers.remote import Frozen, RemoteCritic, RemoteReference, RoleServer

Exchange = tuple[str, str | None]  # (link method, per-token field)
REF_LP, RETURNS = -0.75, 0.5
CRITIC_METRICS = {"critic/vf_loss": 0.25}


def _batch() -> Batch:
    batch = _two_prompt_batch()
    batch.scores = torch.tensor([1.0, 0.0, 0.25, 0.75])
    return batch


def _values(batch: Batch) -> torch.Tensor:
    return 0.1 * torch.arange(1, batch.response_width + 1).float().expand_as(batch.loss_mask) * batch.loss_mask


class _Reference:
    def __init__(self) -> None:
        self.seen: list[Batch] = []

    def log_probs(self, batch: Batch) -> torch.Tensor:
        self.seen.append(batch)
        return torch.full_like(batch.loss_mask, REF_LP) * batch.response_mask


class _Critic:
    def __init__(self) -> None:
        self.returns_at_update: torch.Tensor | None = None

    def values(self, batch: Batch) -> torch.Tensor:
        return _values(batch)

    def update(self, batch: Batch) -> dict[str, float]:
        self.returns_at_update = None if batch.returns is None else batch.returns.clone()
        return dict(CRITIC_METRICS)

    def trained(self) -> dict[str, Any]:
        return {"critic": "trained"}

    def state_dict(self) -> dict[str, Any]:
        return {"w": 1}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loaded = state


def _actor_side(link: Any, role: str) -> tuple[Batch, dict[str, float]]:
    """The proxies as Trainer.train_step calls them: reference logprobs, values, (the estimator's) returns, the
    critic's update started, the actor's update, then the wait for the critic's metrics."""
    batch, metrics = _batch(), dict[str, float]()
    if role == "reference":
        batch.ref_log_probs = RemoteReference(link).log_probs(batch)
    else:
        critic = RemoteCritic(link)
        batch.values = critic.values(batch)
        batch.returns = torch.full_like(batch.loss_mask, RETURNS) * batch.loss_mask
        wait = critic.start_update(batch)
        metrics = wait()
    return batch, metrics


# --- recording links: the two sides' sequences -----------------------------------------------------------------


class _RecordingLink:
    """Records each exchange and which side sends; a sender must have the field filled, a receiver gets a canned
    answer (what the other side would have sent)."""

    def __init__(self, is_actor: bool, log: list[str] | None = None) -> None:
        self.is_actor = is_actor
        self.calls: list[Exchange] = []
        self.sent: list[Exchange] = []
        self.log = log if log is not None else []

    def _record(self, what: Exchange, sends: bool, filled: bool) -> None:
        self.calls.append(what)
        self.log.append(f"link.{what[0]}")
        if sends:
            assert filled, f"{'actor' if self.is_actor else 'role'} side sends {what} without it"
            self.sent.append(what)

    def send_batch(self, batch: Batch | None) -> Batch | None:
        self._record(("send_batch", None), self.is_actor, batch is not None)
        return None if self.is_actor else _batch()

    def to_actor(self, batch: Batch, name: str) -> torch.Tensor | None:
        self._record(("to_actor", name), not self.is_actor, getattr(batch, name) is not None)
        if not self.is_actor:
            return None
        return _Reference().log_probs(batch) if name == "ref_log_probs" else _values(batch)

    def to_role(self, batch: Batch, name: str) -> torch.Tensor | None:
        self._record(("to_role", name), self.is_actor, getattr(batch, name) is not None)
        return None if self.is_actor else torch.full_like(batch.loss_mask, RETURNS) * batch.loss_mask

    def metrics_to_actor(self, metrics: dict[str, float] | None) -> dict[str, float]:
        self._record(("metrics_to_actor", None), not self.is_actor, metrics is not None)
        return dict(CRITIC_METRICS) if self.is_actor else dict(metrics or {})


def _server(link: Any, role: str, transfer: Callable[[], None] | None = None) -> RoleServer:
    if role == "critic":
        return RoleServer(link, transfer, critic=cast(Any, _Critic()))
    return RoleServer(link, transfer, frozen=Frozen("ref", "ref_log_probs", _Reference().log_probs))


@pytest.mark.parametrize(
    ("role", "exchanges"),
    [
        ("reference", [("send_batch", None), ("to_actor", "ref_log_probs")]),
        (
            "critic",
            [("send_batch", None), ("to_actor", "values"), ("to_role", "returns"), ("metrics_to_actor", None)],
        ),
    ],
)
def test_role_server_makes_the_proxies_exchanges_in_their_order(role: str, exchanges: list[Exchange]) -> None:
    actor_link, role_link = _RecordingLink(is_actor=True), _RecordingLink(is_actor=False)
    batch, metrics = _actor_side(actor_link, role)
    assert _server(role_link, role).step(1) == {}
    assert actor_link.calls == role_link.calls == exchanges
    # every exchange has exactly one sender, which holds what it sends
    assert sorted(actor_link.sent + role_link.sent) == sorted(exchanges)
    assert not set(actor_link.sent) & set(role_link.sent)
    if role == "reference":
        assert batch.ref_log_probs is not None
    else:
        assert batch.values is not None and metrics == CRITIC_METRICS


def test_role_server_takes_its_part_in_the_rollout_transfer_first() -> None:
    log: list[str] = []
    link = _RecordingLink(is_actor=False, log=log)
    _server(link, "critic", transfer=lambda: log.append("rollout_transfer")).step(1)
    assert log == ["rollout_transfer", "link.send_batch", "link.to_actor", "link.to_role", "link.metrics_to_actor"]


def test_critic_and_reference_never_share_ranks_of_their_own() -> None:
    """A RoleServer holding both would answer over one link in one pass (send_batch once), while the actor's two
    proxies each start with send_batch: the placement refuses the case."""
    over = ["algorithm.adv_estimator=gae", "actor.use_kl_loss=true", "placement.actor=[0,1]"]
    with pytest.raises(ConfigError, match="shares ranks"):
        plan_run(load_config([*over, "placement.critic=[2]", "placement.reference=[2]"]), 3)
    plan = plan_run(load_config([*over, "placement.critic=[2]", "placement.reference=[3]"]), 4)
    assert (plan.critic, plan.reference) == ("own_ranks", "own_ranks")


def test_role_server_state_is_its_critics() -> None:
    critic = _Critic()
    server = RoleServer(cast(Any, _RecordingLink(False)), None, critic=cast(Any, critic))
    assert server.state_dict() == {"critic": {"w": 1}}
    assert server.trained_roles() == {"critic": "trained"}
    server.load_state_dict({"critic": {"w": 2}}, 3)
    assert critic.loaded == {"w": 2}
    frozen = Frozen("ref", "ref_log_probs", _Reference().log_probs)
    assert RoleServer(cast(Any, _RecordingLink(False)), None, frozen=frozen).state_dict() == {}


# --- paired links: both sides at once --------------------------------------------------------------------------


class _PairedLink:
    """One side of an in-memory link: each exchange posts this side's (exchange, payload) and waits for the other
    side's, which must be the same exchange (as the real link's collectives must match)."""

    def __init__(self, outbox: queue.Queue[Any], inbox: queue.Queue[Any], is_actor: bool) -> None:
        self.outbox, self.inbox, self.is_actor = outbox, inbox, is_actor
        self.calls: list[Exchange] = []

    def _meet(self, what: Exchange, payload: Any) -> Any:
        self.calls.append(what)
        self.outbox.put((what, payload))
        theirs, their_payload = self.inbox.get(timeout=10)
        assert theirs == what, f"out of step: {what} on the {'actor' if self.is_actor else 'role'} side, {theirs}"
        return their_payload

    def send_batch(self, batch: Batch | None) -> Batch | None:
        got = self._meet(("send_batch", None), None if batch is None else batch.to_wire())
        return None if self.is_actor else Batch.from_wire(got)

    def to_actor(self, batch: Batch, name: str) -> torch.Tensor | None:
        got = self._meet(("to_actor", name), None if self.is_actor else getattr(batch, name).clone())
        return got if self.is_actor else None

    def to_role(self, batch: Batch, name: str) -> torch.Tensor | None:
        got = self._meet(("to_role", name), getattr(batch, name).clone() if self.is_actor else None)
        return None if self.is_actor else got

    def metrics_to_actor(self, metrics: dict[str, float] | None) -> dict[str, float]:
        got = self._meet(("metrics_to_actor", None), metrics)
        return dict(got if self.is_actor else metrics or {})


@pytest.mark.parametrize("role", ["reference", "critic"])
def test_paired_sides_meet_at_every_exchange_and_the_tensors_arrive(role: str) -> None:
    to_role: queue.Queue[Any] = queue.Queue()
    to_actor: queue.Queue[Any] = queue.Queue()
    actor_link, role_link = _PairedLink(to_role, to_actor, True), _PairedLink(to_actor, to_role, False)
    server = _server(role_link, role)
    failed: list[BaseException] = []

    def serve() -> None:
        try:
            server.step(1)
        except BaseException as e:  # re-raised in the test's thread
            failed.append(e)

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        batch, metrics = _actor_side(actor_link, role)
    finally:
        thread.join(timeout=20)
    assert not thread.is_alive() and not failed, failed
    assert actor_link.calls == role_link.calls
    if role == "reference":
        assert server.frozen is not None
        reference = cast(_Reference, server.frozen.answer.__self__)  # the bound method's reference
        (seen,) = reference.seen  # the role computed on the actor's samples
        assert torch.equal(seen.input_ids, batch.input_ids)
        assert batch.ref_log_probs is not None
        torch.testing.assert_close(batch.ref_log_probs, torch.full_like(batch.loss_mask, REF_LP) * batch.response_mask)
    else:
        critic = cast(_Critic, server.critic)
        assert batch.values is not None and torch.equal(batch.values, _values(batch))
        assert critic.returns_at_update is not None and batch.returns is not None
        assert torch.equal(critic.returns_at_update, batch.returns)  # the critic regresses on the actor's returns
        assert metrics == CRITIC_METRICS
