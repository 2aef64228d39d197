"""Batch transfer between role cells: a prompt's group of samples moves whole from the rank that holds it
to the rank that needs it, over the cross-cell gloo group (point-to-point, no rank sees the whole batch).

The plan is computed identically on every rank from one all_gather of per-group rows (position in the
step's batch, token count, ...): `balance_groups` gives every data-parallel rank the same number of groups
with token sums as even as a greedy pass makes them (FSDP ranks run their micro-batches in lock step).
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

from torchrl_post.distributed.env import RawGroup

_TAG_SIZE, _TAG_DATA = 1, 2


def balance_groups(tokens: list[int], n_dst: int) -> list[int]:
    """Destination (0..n_dst-1) for each group: equal counts, greedy longest-first to the lightest rank.

    `len(tokens)` must divide by `n_dst` (placement validation checks the batch arithmetic).
    """
    if len(tokens) % n_dst:
        raise ValueError(f"{len(tokens)} groups cannot be split evenly over {n_dst} ranks")
    room = [len(tokens) // n_dst] * n_dst
    load = [0] * n_dst
    dest = [-1] * len(tokens)
    for g in sorted(range(len(tokens)), key=lambda i: (-tokens[i], i)):
        d = min((r for r in range(n_dst) if room[r]), key=lambda r: (load[r], r))
        dest[g], room[d], load[d] = d, room[d] - 1, load[d] + tokens[g]
    return dest


def all_gather_rows(group: RawGroup, rows: torch.Tensor, max_rows: int) -> torch.Tensor:
    """Every rank's int64 rows [k <= max_rows, c] -> the valid rows of all ranks, in rank order.

    Padding rows carry -1 in column 0, so real rows must have column 0 >= 0.
    """
    if rows.shape[0] > max_rows:
        raise ValueError(f"{rows.shape[0]} rows exceed the agreed maximum of {max_rows}")
    padded = torch.full((max_rows, rows.shape[1]), -1, dtype=torch.int64)
    padded[: rows.shape[0]] = rows
    out = [torch.empty_like(padded) for _ in range(group.size())]
    group.allgather([out], [padded]).wait()
    table = torch.cat(out)
    return table[table[:, 0] >= 0]


def route(group: RawGroup, items: dict[int, Any], owner: dict[int, int], dest: dict[int, int]) -> dict[int, Any]:
    """Move item `g` from rank `owner[g]` to rank `dest[g]` (ranks of `group`); returns what this rank receives.

    Every rank in the plan calls this with the same `owner` and `dest`; `items` holds this rank's own items
    (all keys with owner == this rank). One message per (sender, receiver) pair: a size, then the payload.
    """
    me = group.rank()
    mine = {g for g, r in owner.items() if r == me}
    if set(items) != mine:
        raise ValueError(f"rank {me} holds items {sorted(items)} but the plan says {sorted(mine)}")
    outgoing: dict[int, dict[int, Any]] = {}
    for g in sorted(mine):
        outgoing.setdefault(dest[g], {})[g] = items[g]
    received = dict(outgoing.pop(me, {}))
    senders = sorted({owner[g] for g, d in dest.items() if d == me and owner[g] != me})

    payloads = {d: _pack(batch) for d, batch in outgoing.items()}
    works, keep = [], []
    for d, data in payloads.items():
        size = torch.tensor([data.numel()], dtype=torch.int64)
        keep.append(size)
        works.append(group.send([size], d, _TAG_SIZE))
    sizes = {s: torch.empty(1, dtype=torch.int64) for s in senders}
    recvs = [group.recv([sizes[s]], s, _TAG_SIZE) for s in senders]
    for w in recvs:
        w.wait()
    buffers = {s: torch.empty(int(sizes[s].item()), dtype=torch.uint8) for s in senders}
    recvs = [group.recv([buffers[s]], s, _TAG_DATA) for s in senders]
    works += [group.send([data], d, _TAG_DATA) for d, data in payloads.items()]
    for w in recvs + works:
        w.wait()
    for s in senders:
        received.update(_unpack(buffers[s]))
    expected = {g for g, d in dest.items() if d == me}
    if set(received) != expected:  # a protocol error, never a user error
        raise RuntimeError(f"rank {me} expected groups {sorted(expected)}, received {sorted(received)}")
    return received


def _pack(obj: Any) -> torch.Tensor:
    return torch.frombuffer(bytearray(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)), dtype=torch.uint8)


def _unpack(t: torch.Tensor) -> Any:
    return pickle.loads(t.numpy().tobytes())


class GroupRow(NamedTuple):
    """What a rank publishes about each prompt group it holds, before the groups move (one int64 row)."""

    group: int
    """The group's position in the step's global batch (its group id)."""
    owner: int
    """The rank holding it, in the group the transfer runs over."""
    tokens: int
    """Its real tokens (the balance weight)."""
    version: int = 0
    """The policy version that generated it (async staleness)."""
    gen_ms: int = 0
    """How long its engine took to generate and score the batch."""
    dropped: int = 0
    """Rejection sampling on its engine this step: uniform groups dropped, ..."""
    rounds: int = 0
    """... extra generation rounds, ..."""
    short: int = 0
    """... and dropped groups that filled the batch at weight 0 (the same on every row of one engine)."""
    partial: int = 0
    """Its samples whose tokens came from more than one policy version (rollout.partial_rollout)."""
    stale_dropped: int = 0
    """Groups its engine dropped for trainer.max_staleness since the last step (the same on every row of one
    engine, as are the next two)."""
    wait_ms: int = 0
    """How long its rank was blocked in the last step's exchanges (the weight broadcast and this handover)."""
    in_flight: int = 0
    """Requests its engine had generating when the step took its groups (rollout.partial_rollout)."""


(
    ROW_INDEX, ROW_OWNER, ROW_TOKENS, ROW_VERSION, ROW_GEN_MS, ROW_DROPPED, ROW_ROUNDS, ROW_SHORT, ROW_PARTIAL,
    ROW_STALE_DROPPED, ROW_WAIT_MS, ROW_IN_FLIGHT,
) = range(len(GroupRow._fields))  # fmt: skip


def group_rows(rows: Sequence[tuple[int, ...]]) -> torch.Tensor:
    """[k, columns] int64 (k may be 0) for `all_gather_rows`; columns a row leaves out take GroupRow's defaults."""
    return torch.tensor([tuple(GroupRow(*r)) for r in rows], dtype=torch.int64).view(-1, len(GroupRow._fields))


def plan_transfer(table: torch.Tensor, n_groups: int, dst_ranks: list[int]) -> tuple[dict[int, int], dict[int, int]]:
    """(owner, dest) for `route` from the gathered rows: group index -> the rank holding it / receiving it."""
    if table.shape[0] != n_groups or sorted(table[:, ROW_INDEX].tolist()) != list(range(n_groups)):
        raise RuntimeError(f"rollout rows cover {sorted(table[:, ROW_INDEX].tolist())}, expected 0..{n_groups - 1}")
    by_index = table[table[:, ROW_INDEX].argsort()]
    owner = {g: int(r) for g, r in enumerate(by_index[:, ROW_OWNER].tolist())}
    slots = balance_groups([int(t) for t in by_index[:, ROW_TOKENS].tolist()], len(dst_ranks))
    return owner, {g: dst_ranks[s] for g, s in enumerate(slots)}


class RolloutTransfer:
    """Every rank, once per step: the engines' group rows to all, then whole groups to the actor ranks, balanced by
    tokens (`plan_transfer`, `route`)."""

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
