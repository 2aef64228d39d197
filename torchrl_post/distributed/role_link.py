"""Actor ranks <-> a critic or reference on ranks of its own: prompt groups out, per-token tensors back.

Both sides call the same methods in the same order, each with its own half of the arguments (the actor
side passes its batch or tensor, the role side passes None and gets its own back). Groups go to the
role's ranks balanced by tokens and never split (`transfer.plan_transfer`); the plan made by
`exchange_groups` serves every later call of the step, so per-token tensors follow their groups.
"""

from __future__ import annotations

from typing import Any

import torch

from torchrl_post.distributed.env import RawGroup
from torchrl_post.distributed.transfer import all_gather_rows, plan_transfer, route
from torchrl_post.rollout.base import collate
from torchrl_post.types import Generation, PromptBatch, RolloutBatch


def _group_rows(batch: RolloutBatch) -> dict[int, torch.Tensor]:
    """group id -> its row indices in the batch (samples in order)."""
    out: dict[int, torch.Tensor] = {}
    for g in batch.group_ids.unique().tolist():
        out[int(g)] = (batch.group_ids == g).nonzero().flatten()
    return out


class RoleLink:
    def __init__(self, group: RawGroup, n_actor: int, n_role: int, groups_per_step: int, n: int, pad_id: int):
        self.group, self.n, self.pad_id = group, n, pad_id
        self.groups_per_step = groups_per_step
        self.is_actor = group.rank() < n_actor
        self.role_ranks = list(range(n_actor, n_actor + n_role))  # ranks of the link group
        self.max_rows = -(-groups_per_step // n_actor)
        self.owner: dict[int, int] = {}
        self.dest: dict[int, int] = {}

    def exchange_groups(self, batch: RolloutBatch | None) -> RolloutBatch | None:
        """Actor side: send this step's groups (returns None). Role side: receive this rank's groups as a batch."""
        items: dict[int, Any] = {}
        rows = torch.empty(0, 5, dtype=torch.int64)
        if batch is not None:
            p_width = batch.input_ids.shape[1] - batch.response_width
            table = []
            for g, idx in _group_rows(batch).items():
                first = idx[0]
                prompt = batch.input_ids[first, :p_width][batch.attention_mask[first, :p_width].bool()].tolist()
                responses = [batch.responses[i][batch.response_mask[i].bool()].tolist() for i in idx.tolist()]
                items[g] = (prompt, responses)
                table.append([g, self.group.rank(), int(batch.attention_mask[idx].sum()), 0, 0])
            rows = torch.tensor(table, dtype=torch.int64).view(-1, 5)
        gathered = all_gather_rows(self.group, rows, self.max_rows)
        self.owner, self.dest = plan_transfer(gathered, self.groups_per_step, self.role_ranks)
        got = route(self.group, items, self.owner, self.dest)
        if self.is_actor:
            return None
        groups = sorted(got)
        prompts = PromptBatch(
            [got[g][0] for g in groups], [None] * len(groups), [""] * len(groups), [{}] * len(groups), groups
        )
        responses = [r for g in groups for r in got[g][1]]
        gen = Generation(responses, [[0.0] * len(r) for r in responses], ["stop"] * len(responses))
        return collate(prompts, gen, self.n, self.pad_id)

    def to_role(self, batch: RolloutBatch, per_token: torch.Tensor | None) -> torch.Tensor | None:
        """Actor side passes a [B, R] tensor of its batch; role side receives its own batch's [B, R]."""
        return self._move(batch, per_token, self.owner, self.dest)

    def to_actor(self, batch: RolloutBatch, per_token: torch.Tensor | None) -> torch.Tensor | None:
        """Role side passes a [B, R] tensor of its batch; actor side receives its own batch's [B, R]."""
        return self._move(batch, per_token, self.dest, self.owner)

    def _move(
        self, batch: RolloutBatch, per_token: torch.Tensor | None, src: dict[int, int], dst: dict[int, int]
    ) -> torch.Tensor | None:
        rows = _group_rows(batch)
        items: dict[int, Any] = {}
        if per_token is not None:
            for g, idx in rows.items():
                width = int(batch.response_mask[idx].sum(-1).max())
                items[g] = per_token[idx, :width].detach().cpu().clone()
        got = route(self.group, items, src, dst)
        if per_token is not None:
            return None
        out = torch.zeros(batch.response_mask.shape, dtype=torch.float32)
        for g, idx in rows.items():
            out[idx, : got[g].shape[1]] = got[g].float()
        return out * batch.response_mask

    def metrics_to_actor(self, metrics: dict[str, float] | None) -> dict[str, float]:
        """The role's first rank sends its (already group-reduced) metrics to every actor rank."""
        actors = [r for r in range(self.group.size()) if r not in self.role_ranks]
        owner = {r: self.role_ranks[0] for r in actors}
        items = {r: metrics for r in actors} if self.group.rank() == self.role_ranks[0] else {}
        got = route(self.group, items, owner, {r: r for r in actors})
        return dict(got.get(self.group.rank()) or metrics or {})
