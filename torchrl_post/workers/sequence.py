"""Ulysses sequence parallelism on the trainer's side: which rows an sp group trains, and what its ranks sum.

Every rank still draws, generates and scores its own share of the step's prompts. Before a forward, the ranks
of an sp group gather their shares into one union (`SequenceGroup.union`): each of them then runs every row of
the union, on its own 1/sp of each row's tokens (`workers/ulysses.py`), and holds the whole per-token result
after a sum over the group. Sums over the batch (loss denominators, metrics) run over the dp group: one rank of
each sp group, so nothing is counted sp times.

Gradients: every rank of a group computes the same loss from the same whole per-token tensors; the sum's
backward adds the group's gradients, so the group's parameter gradients add up to sp x the loss's, and FSDP's
mean over dp x sp ranks gives the mean over the dp groups: the same as sp = 1 with dp ranks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from torchrl_post.distributed.placement import all_gather_objects
from torchrl_post.distributed.ulysses import sum_over
from torchrl_post.types import Batch
from torchrl_post.workers.micro_batches import chunks
from torchrl_post.workers.ulysses import SequenceShard, sequence_parallel


@dataclass(frozen=True)
class SequenceGroup:
    """This rank's place in the (dp, sp) layout of its role (`distributed.placement.sequence_mesh`)."""

    shard: SequenceShard
    dp: dist.ProcessGroup
    """The ranks that hold distinct rows: sums over the batch."""
    dp_size: int

    @staticmethod
    def of(mesh: DeviceMesh | None) -> SequenceGroup | None:
        if mesh is None:
            return None
        sp = mesh.get_group("sp")
        shard = SequenceShard(sp, dist.get_rank(sp), dist.get_world_size(sp))
        return SequenceGroup(shard, mesh.get_group("dp"), mesh.size(0))

    @property
    def size(self) -> int:
        return self.shard.size

    @staticmethod
    def mine(out: torch.Tensor, rows: torch.Tensor, batch: Batch) -> torch.Tensor:
        """This rank's rows of a per-token result of the union [B_union, R_union] -> [B, R] of its own `batch`
        (the union's responses are right-padded to the group's widest: the first R columns are this rank's)."""
        return out[rows, : batch.response_width]

    def union(self, batch: Batch, mini: int = 0) -> tuple[Batch, torch.Tensor]:
        """The rows of every rank of the sp group, and the indices of this rank's rows in it. With `mini` > 0 the
        union's mini-batch j (of `mini` x sp rows) is the ranks' mini-batches j in rank order, so each optimizer
        step trains the rows it would with sp = 1."""
        assert self.shard.group is not None
        parts: list[Batch] = all_gather_objects(batch, self.shard.group)
        cuts = [list(chunks(len(p), mini or max(len(p), 1))) for p in parts]
        pieces: list[Batch] = []
        mine: list[int] = []
        offset = 0
        for j in range(max(len(c) for c in cuts)):
            for r, (part, cut) in enumerate(zip(parts, cuts, strict=True)):
                if j >= len(cut):
                    continue
                n = cut[j].stop - cut[j].start
                if r == self.shard.rank:
                    mine += range(offset, offset + n)
                pieces.append(part.select(cut[j]))
                offset += n
        # the fill under a zero attention mask is never read: any token id pads
        return Batch.concat(pieces, pad_id=0), torch.tensor(mine, dtype=torch.long)


def sequence_outputs(model: torch.nn.Module, inputs: dict[str, Any], shard: SequenceShard | None) -> torch.Tensor:
    """`model(**inputs).logits` at every column, [b, T, ...] (a value head's outputs): with a sequence `shard`
    this rank runs its columns and the sp group sums the placed results, so every rank holds all T."""
    if shard is None or shard.size == 1:
        return model(**inputs).logits
    total = inputs["input_ids"].shape[1]
    padded = shard.pad_to(total)
    start, end = shard.span(padded)
    with sequence_parallel(model, shard, inputs) as local:
        out = model(**local).logits
    pad = [0, 0] * (out.dim() - 2) + [start, padded - end]
    return sum_over(torch.nn.functional.pad(out, pad), shard.group)[:, :total]
