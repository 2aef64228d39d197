"""Rollouts on the actor's own ranks (the engine colocated, time-sliced with the update): a step takes this rank's
groups from its engine's producer (rollout/groups.py).

A step takes the groups, then suspends what still generates (the engine sleeps and the update runs); with partial
rollouts the requests come back at the next step with their tokens so far, so the new weights prefill them
(colocated engines always recompute) and they carry on under the new version. The ranks of a tensor-parallel engine
draw the engine's groups together and run them in lockstep (engines/lockstep.py); each keeps every tp-th taken group.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist

from torchrl_post.data.dataset import PromptDataset
from torchrl_post.distributed.transfer import group_rows
from torchrl_post.rollout.groups import Groups
from torchrl_post.rollout.source import EngineSource
from torchrl_post.rollout.taken import gather_rows, rollout_metrics
from torchrl_post.types import Batch


class LocalRollouts:
    """The actor side's `RolloutSource` (rollout/source.py) when its ranks hold the engines."""

    def __init__(self, source: EngineSource, producer: Groups, streaming: bool) -> None:
        """`streaming`: groups carried across updates (rollout.partial_rollout), whose metrics the step reports."""
        self.source, self.producer, self.streaming = source, producer, streaming
        group = source.engine_group
        tp = dist.get_world_size(group) if group is not None else 1
        self.first = group is None or dist.get_rank(group) == 0
        self.keep = slice(dist.get_rank(group) if group is not None else 0, None, tp)
        self._metrics: dict[str, float] = {}

    def next_batch(self, step: int) -> Batch:
        self.producer.at_version(step - 1)  # the sync after update step - 1 loaded its weights
        start = time.perf_counter()
        taken = self.producer.take(step)
        self.producer.suspend()
        self.source.engine.sleep()
        seconds = self.source.timer.seconds
        seconds["gen"], seconds["gen_engine"] = time.perf_counter() - start, taken.engine_seconds
        seconds["reward"] = taken.reward_seconds
        if self.source.loop is not None:  # agent episodes
            seconds["env"] = taken.env_seconds
        rank = dist.get_rank() if dist.is_initialized() else 0
        table = group_rows(gather_rows(taken.rows(rank, self.first, self.keep)))
        rejection = self.source.rejection.enable
        self._metrics = rollout_metrics(table, step, self.source.settings.group_size, self.streaming, rejection)
        for timing in ("timing_s/rollout_wait", "timing_s/gen_engine"):  # no rollout rank waits; the timer's
            self._metrics.pop(timing)
        return taken.batch(self.source.pad_id, self.keep)

    def metrics(self) -> dict[str, float]:
        return self._metrics

    @property
    def epoch(self) -> int:
        return self.source.epoch

    def validation_totals(self, data: PromptDataset, sources: list[str]) -> torch.Tensor:
        return self.source.validation_totals(data, sources)  # suspended between steps

    @property
    def val_samples(self) -> list[dict[str, Any]]:
        return self.source.val_samples

    def state_dict(self) -> dict[str, Any]:
        return {"producer": self.producer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.producer.load_state_dict(state["producer"])

    def shutdown(self, process_ends: bool = False) -> None:
        self.source.shutdown(process_ends)
