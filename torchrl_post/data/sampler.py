"""A resumable, sharded batch sampler: every rank draws the same global batch and keeps its own slice.

Its position (epoch, batches consumed in the epoch) is small plain state that goes into checkpoints, so a
resumed run sees exactly the prompts the uninterrupted run would have seen.
"""

from __future__ import annotations

from typing import Any

import torch


class ShardedBatchSampler:
    def __init__(
        self, num_items: int, global_batch: int, dp_rank: int, dp_size: int, seed: int, shuffle: bool = True
    ) -> None:
        assert global_batch % dp_size == 0, "validated in config: batch divisible by ranks"
        self.num_items = num_items
        self.global_batch = global_batch
        self.dp_rank = dp_rank
        self.dp_size = dp_size
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.batch_in_epoch = 0

    @property
    def batches_per_epoch(self) -> int:
        """Full batches per epoch (the remainder is dropped, so every step has the same size)."""
        return self.num_items // self.global_batch

    def _order(self) -> list[int]:
        if not self.shuffle:
            return list(range(self.num_items))
        gen = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
        return torch.randperm(self.num_items, generator=gen).tolist()

    def next_batch(self) -> tuple[list[int], list[int]]:
        """(this rank's dataset indices, their positions in the global batch); advances the position."""
        if self.batches_per_epoch == 0:
            raise ValueError(f"dataset of {self.num_items} items is smaller than one batch of {self.global_batch}")
        if self.batch_in_epoch >= self.batches_per_epoch:
            self.epoch += 1
            self.batch_in_epoch = 0
        start = self.batch_in_epoch * self.global_batch
        batch = self._order()[start : start + self.global_batch]
        per = self.global_batch // self.dp_size
        positions = list(range(self.dp_rank * per, (self.dp_rank + 1) * per))
        self.batch_in_epoch += 1
        return [batch[p] for p in positions], positions

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch, "num_items": self.num_items}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state["num_items"] != self.num_items:
            raise ValueError(
                f"checkpoint sampler saw {state['num_items']} training prompts, this run has {self.num_items}; "
                "resume with the same data or set trainer.resume_mode=disable"
            )
        self.epoch, self.batch_in_epoch = state["epoch"], state["batch_in_epoch"]


class SamplerHeld:
    """A batch source whose only state across steps is its sampler's position (the actor side of rollout ranks, the
    SFT source): the epoch, the checkpointed position, the last step's metrics; no validation samples of its own and
    nothing to shut down."""

    sampler: ShardedBatchSampler
    _metrics: dict[str, float]

    def metrics(self) -> dict[str, float]:
        return self._metrics

    @property
    def epoch(self) -> int:
        return self.sampler.epoch

    @property
    def val_samples(self) -> list[dict[str, Any]]:
        return []

    def state_dict(self) -> dict[str, Any]:
        return {"sampler": self.sampler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state["sampler"])

    def shutdown(self, process_ends: bool = False) -> None:
        pass
