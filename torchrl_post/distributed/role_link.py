"""Actor ranks <-> a critic or reference on ranks of its own: prompt groups out, per-token tensors back.

Both sides call the same methods in the same order. Groups go to the role's ranks balanced by tokens and
never split (`transfer.plan_transfer`), as `Batch.to_wire` of each group; the plan made by `send_batch`
serves every later call of the step, so a per-token field (values, ref_log_probs, returns) follows its
groups: the side that has the field filled sends it, the other side receives it.
"""

from __future__ import annotations

from typing import Any

import torch

from torchrl_post.distributed.env import RawGroup
from torchrl_post.distributed.transfer import GroupRow, all_gather_rows, group_rows, plan_transfer, route
from torchrl_post.types import Batch


def _rows_of_groups(batch: Batch) -> dict[int, torch.Tensor]:
    """group id -> its row indices in the batch (samples in order)."""
    return {int(g): (batch.group_ids == g).nonzero().flatten() for g in batch.group_ids.unique().tolist()}


class RoleLink:
    def __init__(self, group: RawGroup, n_actor: int, n_role: int, groups_per_step: int, pad_id: int):
        self.group, self.pad_id, self.groups_per_step = group, pad_id, groups_per_step
        self.is_actor = group.rank() < n_actor
        self.role_ranks = list(range(n_actor, n_actor + n_role))  # ranks of the link group
        self.max_rows = -(-groups_per_step // n_actor)
        self.owner: dict[int, int] = {}
        self.dest: dict[int, int] = {}

    def send_batch(self, batch: Batch | None) -> Batch | None:
        """Actor side: send this step's groups (returns None). Role side: receive this rank's groups."""
        items: dict[int, Any] = {}
        rows = group_rows([])
        if batch is not None:
            parts = batch.split_groups()
            items = {g: part.to_wire() for g, part in parts.items()}
            rows = group_rows(
                [GroupRow(g, self.group.rank(), int(part.attention_mask.sum())) for g, part in parts.items()]
            )
        gathered = all_gather_rows(self.group, rows, self.max_rows)
        self.owner, self.dest = plan_transfer(gathered, self.groups_per_step, self.role_ranks)
        got = route(self.group, items, self.owner, self.dest)
        if self.is_actor:
            return None
        return Batch.concat([Batch.from_wire(got[g]) for g in sorted(got)], self.pad_id)

    def to_role(self, batch: Batch, name: str) -> torch.Tensor | None:
        """Per-token field `name` from the actor's batch to the role's; returns it on the receiving side."""
        return self._move(batch, name, self.owner, self.dest, send=self.is_actor)

    def to_actor(self, batch: Batch, name: str) -> torch.Tensor | None:
        """Per-token field `name` from the role's batch to the actor's; returns it on the receiving side."""
        return self._move(batch, name, self.dest, self.owner, send=not self.is_actor)

    def _move(
        self, batch: Batch, name: str, src: dict[int, int], dst: dict[int, int], send: bool
    ) -> torch.Tensor | None:
        rows = _rows_of_groups(batch)
        items: dict[int, Any] = {}
        if send:
            per_token = getattr(batch, name)
            for g, idx in rows.items():
                width = int(batch.response_mask[idx].sum(-1).max())
                items[g] = per_token[idx, :width].detach().cpu().clone()
        got = route(self.group, items, src, dst)
        if send:
            return None
        trailing = next((t.shape[2:] for t in got.values()), ())  # a [B, R, ...] field: the teacher's top-k
        out = torch.zeros((*batch.response_mask.shape, *trailing), dtype=torch.float32)
        for g, idx in rows.items():
            out[idx, : got[g].shape[1]] = got[g].float()
        return out * batch.response_mask.view(*batch.response_mask.shape, *(1 for _ in trailing))

    def sample_to_actor(self, batch: Batch, name: str) -> torch.Tensor | None:
        """Per-sample field `name` ([B]: a reward model's scores) from the role's batch to the actor's; returns it
        on the actor's side."""
        rows = _rows_of_groups(batch)
        items: dict[int, Any] = {}
        send = not self.is_actor
        if send:
            values = getattr(batch, name)
            items = {g: values[idx].detach().cpu().clone() for g, idx in rows.items()}
        got = route(self.group, items, self.dest, self.owner)
        if send:
            return None
        out = torch.zeros(len(batch), dtype=torch.float32)
        for g, idx in rows.items():
            out[idx] = got[g].float()
        return out

    def metrics_to_actor(self, metrics: dict[str, float] | None) -> dict[str, float]:
        """The role's first rank sends its (already group-reduced) metrics to every actor rank."""
        actors = [r for r in range(self.group.size()) if r not in self.role_ranks]
        owner = {r: self.role_ranks[0] for r in actors}
        items = {r: metrics for r in actors} if self.group.rank() == self.role_ranks[0] else {}
        got = route(self.group, items, owner, {r: r for r in actors})
        return dict(got.get(self.group.rank()) or metrics or {})
