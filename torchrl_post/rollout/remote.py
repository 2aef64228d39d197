"""Rollout engines on ranks of their own: the actor side (`RemoteRollouts`) and the rollout ranks' program
(`RolloutServer`), both sides of one exchange per step over the `world` group:

    rollout ranks: batch k's prompt groups (scored)  --transfer-->  actor ranks, whole groups, balanced by tokens
    first actor rank: the new weights               --broadcast->  rollout ranks (sync/weights.py)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from torchrl_post.checkpoint.dcp import Trained
from torchrl_post.data.dataset import PromptDataset
from torchrl_post.data.sampler import SamplerHeld, ShardedBatchSampler
from torchrl_post.distributed import liveness
from torchrl_post.distributed.transfer import ROW_WAIT_MS, RolloutTransfer, group_rows
from torchrl_post.logging.timing import Timer
from torchrl_post.program import no_validation
from torchrl_post.rollout.groups import Groups
from torchrl_post.rollout.source import EngineSource
from torchrl_post.rollout.taken import rollout_metrics
from torchrl_post.sync.weights import BroadcastSync
from torchrl_post.types import Batch


class RemoteRollouts(SamplerHeld):
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

    def validation_totals(self, data: PromptDataset, sources: list[str]) -> torch.Tensor:
        return no_validation(sources)  # the rollout ranks generate (and keep the validation samples)


class RolloutServer:
    """Rank program of rollout-only ranks: hand over step k's groups, generate ahead while the actor trains (the
    producer, rollout/groups.py, by the plan's fill policy), take update k: after a counted amount of generation, so
    that a run resumes exactly, or with rollout.update_on_arrival when the weights are here (`generate_until`)."""

    def __init__(
        self,
        source: EngineSource,
        producer: Groups,
        sync: BroadcastSync,
        transfer: RolloutTransfer,
        *,
        rank: int,
        lag: int,
        on_arrival: bool = False,
        agree: Callable[[bool], bool] = bool,
    ) -> None:
        """`source`: this rank's engine and its share of the prompts; `lag`: trainer.max_off_policy_steps;
        `agree`: the engine's first rank's value of a flag on every rank of a tensor-parallel engine (the weights'
        arrival: engines/lockstep.py)."""
        self.source, self.producer, self.sync, self.transfer = source, producer, sync, transfer
        self.rank, self.lag, self.on_arrival, self.agree = rank, lag, on_arrival, agree
        self.version = 0
        self.waited = 0.0
        """Seconds this rank spent blocked in the last step's exchanges (reported with the next step's rows)."""

    def step(self, step: int) -> dict[str, float]:
        taken = self.producer.take(step)
        leader = self.source.engine_leader  # a tensor-parallel engine's other ranks hold the same groups
        items = {g: part.to_wire() for g, (part, _) in taken.parts().items()} if leader else {}
        rows = group_rows(taken.rows(self.rank)) if leader else group_rows([])
        rows[:, ROW_WAIT_MS] = int(self.waited * 1000)
        t = time.perf_counter()
        liveness.enter("transfer", step)
        self.transfer(items, rows)
        waited = time.perf_counter() - t
        liveness.enter("gen")
        # Overlaps the actor's update of `step`. Streamed groups fill also after the last step, so that the state a
        # checkpoint keeps does not depend on trainer.total_training_steps (an extended run goes on exactly).
        self.producer.fill(self.lag, step + 1)
        if self.on_arrival:
            incoming = self.sync.incoming()
            self.producer.generate_until(lambda: self.agree(incoming.arrived()), step + 1)
            weights = incoming.weights()
        else:
            liveness.enter("sync")
            weights = self.sync.received()
        t = time.perf_counter()
        self.producer.update(weights, version=step)
        self.waited = waited + time.perf_counter() - t
        self.version = step
        return {}

    def validation_totals(self, data: PromptDataset, sources: list[str]) -> torch.Tensor:
        self.producer.suspend()  # the engine's batch generation would run the requests in flight to their end
        return self.source.validation_totals(data, sources)

    def val_samples(self) -> list[dict[str, Any]]:
        return self.source.val_samples

    def trained_roles(self) -> dict[str, Trained]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {"producer": self.producer.state_dict(), "version": self.version}

    def load_state_dict(self, state: dict[str, Any], step: int) -> None:
        self.producer.load_state_dict(state["producer"])
        self.version = int(state["version"])

    def after_resume(self) -> None:
        self.producer.update(self.sync.received(), version=self.version)

    def write_hf(self, ckpt_tmp: Path) -> None:
        pass

    def shutdown(self, process_ends: bool = False) -> None:
        self.source.shutdown(process_ends)
