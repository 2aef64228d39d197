"""Rollout engines on ranks of their own: the actor side (`RemoteRollouts`) and the rollout ranks' program
(`RolloutServer`), both sides of one exchange per step over the `world` group:

    rollout ranks: batch k's prompt groups (scored)  --transfer-->  actor ranks, whole groups, balanced by tokens
    first actor rank: the new weights               --broadcast->  rollout ranks (sync/weights.py)
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from torchrl_post.checkpoint.dcp import Trained
from torchrl_post.data.dataset import PromptDataset
from torchrl_post.data.sampler import ShardedBatchSampler
from torchrl_post.distributed.env import RawGroup
from torchrl_post.distributed.transfer import (
    ROW_WAIT_MS,
    GroupRow,
    all_gather_rows,
    group_rows,
    plan_transfer,
    route,
)
from torchrl_post.logging.timing import Timer
from torchrl_post.program import no_validation
from torchrl_post.rollout.base import stamp_versions
from torchrl_post.rollout.source import EngineSource
from torchrl_post.rollout.streaming import Groups, rollout_metrics
from torchrl_post.sync.weights import BroadcastSync
from torchrl_post.types import Batch


class RolloutTransfer:
    """Every rank, once per step: the engines' group rows to all, then whole groups to the actor ranks,
    balanced by tokens (`distributed/transfer.py`: plan_transfer, route)."""

    def __init__(self, world: RawGroup, prompts_per_step: int, engines: int, actor_ranks: list[int]) -> None:
        self.world, self.prompts_per_step, self.engines, self.actor_ranks = (
            world,
            prompts_per_step,
            engines,
            actor_ranks,
        )

    def __call__(self, items: dict[int, Any], rows: torch.Tensor) -> tuple[torch.Tensor, dict[int, Any]]:
        """Returns (all rows, the groups this rank received)."""
        table = all_gather_rows(self.world, rows, -(-self.prompts_per_step // self.engines))
        owner, dest = plan_transfer(table, self.prompts_per_step, self.actor_ranks)
        return table, route(self.world, items, owner, dest)

    def take_part(self) -> None:
        """A rank that neither sends nor receives groups (a critic or reference on ranks of its own)."""
        self({}, group_rows([]))


class RemoteRollouts:
    """The actor side of rollout ranks: step k's batch arrives scored, as whole prompt groups."""

    def __init__(
        self,
        transfer: RolloutTransfer,
        sampler: ShardedBatchSampler,
        timer: Timer,
        rejection: bool,
        pad_id: int,
        streaming: bool = False,
        group_size: int = 1,
    ) -> None:
        """`sampler` draws the whole batch: it keeps the data position (epoch, checkpoint), no prompts;
        `rejection`: the engines count what rejection sampling dropped; `streaming`: the engines stream groups
        with partial rollouts (rollout.partial_rollout), each drawing its own prompts."""
        self.transfer, self.sampler, self.timer = transfer, sampler, timer
        self.rejection, self.pad_id, self.streaming = rejection, pad_id, streaming
        self.group_size = group_size
        self._metrics: dict[str, float] = {}

    def next_batch(self, step: int) -> Batch:
        self.sampler.next_batch()  # the trained batches' count (streaming engines draw their own prompts ahead)
        with self.timer("gen"):  # the wait for the rollout ranks
            table, parts = self.transfer({}, group_rows([]))
        self._metrics = rollout_metrics(table, step, self.group_size, self.streaming, self.rejection)
        return Batch.concat([Batch.from_wire(parts[g]) for g in sorted(parts)], self.pad_id)

    def metrics(self) -> dict[str, float]:
        return self._metrics

    @property
    def epoch(self) -> int:
        return self.sampler.epoch

    def validation_totals(self, data: PromptDataset, sources: list[str]) -> torch.Tensor:
        return no_validation(sources)  # the rollout ranks generate

    val_samples: list[dict[str, Any]] = []  # (kept on the rollout ranks)

    def state_dict(self) -> dict[str, Any]:
        return {"sampler": self.sampler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state["sampler"])

    def shutdown(self) -> None:
        pass


Ahead = tuple[int, dict[int, dict[str, torch.Tensor]], torch.Tensor, dict[str, Any]]
"""A batch generated ahead: (step, group -> wire batch, its group rows, the source's state after making it)."""


class RolloutServer:
    """Rank program of rollout-only ranks: hand over batch k, generate ahead, take the new weights.

    On-policy, it generates batch k with the weights of update k-1 (staleness 0); with look-ahead it generates batch k + s
    while the actor updates step k, with the weights of update k-1 (staleness s = trainer.max_off_policy_steps).
    The queue of batches generated ahead and the engine's policy version are checkpointed: a resumed async
    run continues with the very batches the uninterrupted run would have used.
    """

    def __init__(
        self,
        source: EngineSource,
        sync: BroadcastSync,
        transfer: RolloutTransfer,
        timer: Timer,
        *,
        rank: int,
        lag: int,
        total_steps: int,
    ) -> None:
        """`source`: this rank's engine and its share of the prompts; `lag`: trainer.max_off_policy_steps."""
        self.source, self.sync, self.transfer, self.timer = source, sync, transfer, timer
        self.rank, self.lag, self.total_steps = rank, lag, total_steps
        self.ahead: deque[Ahead] = deque()
        self.version = 0
        self.sent_state: dict[str, Any] = self.source.state_dict()
        self.waited = 0.0
        """Seconds this rank spent blocked in the last step's exchanges (reported with the next step's rows)."""

    def step(self, step: int) -> dict[str, float]:
        total = self.total_steps
        nxt = self.ahead[-1][0] + 1 if self.ahead else step
        while nxt <= min(step + max(self.lag, 1) - 1, total):  # after a start or resume
            self._generate_ahead(nxt)
            nxt += 1
        got, items, rows, source_state = self.ahead.popleft()
        assert got == step, f"rollout queue holds step {got}, the actor is at {step}"
        waited = self._hand_over(items, rows)
        self.sent_state = source_state
        if self.lag and step + self.lag <= total:
            self._generate_ahead(step + self.lag)  # overlaps the actor's update of `step`
        t = time.perf_counter()
        self.sync.receive(self.source.engine)
        self.waited = waited + time.perf_counter() - t
        self.version = step
        return {}

    def _hand_over(self, items: dict[int, Any], rows: torch.Tensor) -> float:
        """The step's groups to the actor ranks, with the last step's wait; returns the seconds it took."""
        rows = rows.clone()
        rows[:, ROW_WAIT_MS] = int(self.waited * 1000)
        t = time.perf_counter()
        self.transfer(items, rows)
        return time.perf_counter() - t

    def _generate_ahead(self, step: int) -> None:
        """Draw this engine's share of batch `step`, generate and score it, queue its groups."""
        self.timer.reset()
        batch = self.source.produce(step)
        stamp_versions(batch, self.version)
        ms = int(sum(self.timer.seconds.values()) * 1000)
        items: dict[int, dict[str, torch.Tensor]] = {}
        rows = group_rows([])
        if self.source.engine_leader:  # the other ranks of a tensor-parallel engine hold the same samples
            parts = batch.split_groups()
            items = {g: part.to_wire() for g, part in parts.items()}
            rank, counts = self.rank, self.source.filter_counts
            filtered = (counts["dropped_groups"], counts["extra_rounds"], counts["short_groups"])
            rows = group_rows(
                [GroupRow(g, rank, int(p.attention_mask.sum()), self.version, ms, *filtered) for g, p in parts.items()]
            )
        self.ahead.append((step, items, rows, self.source.state_dict()))

    def validation_totals(self, data: PromptDataset, sources: list[str]) -> torch.Tensor:
        return self.source.validation_totals(data, sources)

    def val_samples(self) -> list[dict[str, Any]]:
        return self.source.val_samples

    def trained_roles(self) -> dict[str, Trained]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        # The source may have drawn batches ahead: keep its state after the last one sent, and the queue.
        return {"source": self.sent_state, "version": self.version, "ahead": [list(a) for a in self.ahead]}

    def load_state_dict(self, state: dict[str, Any], step: int) -> None:
        self.sent_state = state["source"]
        self.version = int(state["version"])
        self.ahead = deque((int(s), items, rows, ss) for s, items, rows, ss in state["ahead"])
        # The source continues after the last batch made, not the last one sent.
        self.source.load_state_dict(self.ahead[-1][3] if self.ahead else self.sent_state)

    def after_resume(self) -> None:
        self.sync.receive(self.source.engine)

    def write_hf(self, ckpt_tmp: Path) -> None:
        pass

    def shutdown(self) -> None:
        self.source.shutdown()


class StreamingServer(RolloutServer):
    """Rank program of rollout-only ranks with rollout.partial_rollout: the engine streams groups (`Groups`: single
    samples, or agent episodes).

    Step k hands over the first complete groups of this engine's share (within trainer.max_staleness), fills
    trainer.max_off_policy_steps batches ahead while the actor trains (the requests that do not finish in time carry
    on), then takes update k between two engine steps: the requests in flight continue under it, their KV cache kept
    or recomputed (rollout.inflight_update). The update comes after a counted amount of generation, never on
    arrival, so a run is reproducible and resumes exactly; with rollout.update_on_arrival the engine goes on
    generating after the fill until the weights are here (`Groups.generate_until`): no wait while there is work,
    at the cost of that reproducibility.
    """

    def __init__(
        self,
        source: EngineSource,
        groups: Groups[Any],
        sync: BroadcastSync,
        transfer: RolloutTransfer,
        timer: Timer,
        *,
        rank: int,
        lag: int,
        total_steps: int,
        on_arrival: bool = False,
        agree: Callable[[bool], bool] = bool,
    ) -> None:
        """`agree`: the engine's first rank's value of a flag on every rank of a tensor-parallel engine (the
        weights' arrival: rollout/lockstep.py)."""
        super().__init__(source, sync, transfer, timer, rank=rank, lag=lag, total_steps=total_steps)
        self.groups, self.on_arrival, self.agree = groups, on_arrival, agree

    def step(self, step: int) -> dict[str, float]:
        taken = self.groups.take(step)
        leader = self.source.engine_leader  # a tensor-parallel engine's other ranks hold the same groups
        items = {int(d.batch.group_ids[0]): d.batch.to_wire() for d in taken.groups} if leader else {}
        rows = taken.rows(self.rank) if leader else []
        waited = self._hand_over(items, group_rows(rows))
        # Overlaps the actor's update of `step`; also after the last step, so that the state a checkpoint keeps does
        # not depend on trainer.total_training_steps (a run extended from its last checkpoint goes on exactly).
        if self.lag:
            self.groups.fill(self.lag, step + 1)
        if self.on_arrival:
            incoming = self.sync.incoming()
            self.groups.generate_until(lambda: self.agree(incoming.arrived()), step + 1)
            weights = incoming.weights()
        else:
            weights = self.sync.received()
        t = time.perf_counter()
        self.groups.update(weights, version=step)
        self.waited = waited + time.perf_counter() - t
        self.version = step
        return {}

    def validation_totals(self, data: PromptDataset, sources: list[str]) -> torch.Tensor:
        self.groups.suspend()  # the engine's batch generation would run the requests in flight to their end
        return self.source.validation_totals(data, sources)

    def state_dict(self) -> dict[str, Any]:
        return {"groups": self.groups.state_dict(), "version": self.version}

    def load_state_dict(self, state: dict[str, Any], step: int) -> None:
        self.groups.load_state_dict(state["groups"])
        self.version = int(state["version"])

    def after_resume(self) -> None:
        self.groups.update(self.sync.received(), version=self.version)
