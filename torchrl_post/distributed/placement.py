"""Role placement: which ranks run the actor, rollout, critic and reference, and their meshes and groups.

`plan_placement` is pure (no process group) and validates the config against the world size, so bad
placements fail before anything heavy starts. `RoleMeshes` is the one place that creates DeviceMeshes
and process groups; everything else asks it by role name. Every rank creates every group, in the same
order, because group creation is collective.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from torchrl_post.config.errors import ConfigError

ROLES = ("actor", "rollout", "critic", "reference")


@dataclass(frozen=True)
class Placement:
    world_size: int
    ranks: dict[str, list[int]]
    """role -> sorted ranks, for the roles that exist."""
    colocated: dict[str, bool] = field(default_factory=dict)
    """role -> shares the actor's ranks."""

    def has(self, role: str) -> bool:
        return role in self.ranks

    def fully_colocated(self) -> bool:
        return all(self.colocated.get(r, True) for r in self.ranks)

    def describe(self) -> str:
        lines = [f"world size {self.world_size}"]
        for role, ranks in self.ranks.items():
            how = " (colocated with actor)" if self.colocated.get(role) and role != "actor" else ""
            lines.append(f"  {role:<9} ranks {ranks}{how}")
        return "\n".join(lines)


def _parse_ranks(key: str, value: Any, world_size: int) -> list[int]:
    if isinstance(value, int) or not isinstance(value, (list, tuple)):
        raise ConfigError(f"{key}={value!r} must be a list of ranks like [0,1] (or `actor`)")
    ranks = [int(r) for r in value]
    if not ranks:
        raise ConfigError(f"{key} is an empty list; give at least one rank")
    bad = [r for r in ranks if not 0 <= r < world_size]
    if bad:
        raise ConfigError(f"{key}={ranks} has ranks {bad} outside the world of {world_size} (0..{world_size - 1})")
    if len(set(ranks)) != len(ranks):
        raise ConfigError(f"{key}={ranks} lists a rank twice")
    return sorted(ranks)


def plan_placement(cfg: Any, world_size: int) -> Placement:
    """Validate `placement.*` against the world size; one ConfigError naming the key on any problem."""
    actor = list(range(world_size)) if cfg.actor is None else _parse_ranks("placement.actor", cfg.actor, world_size)
    ranks: dict[str, list[int]] = {"actor": actor}
    colocated = {"actor": True}
    for role in ("rollout", "critic", "reference"):
        value = getattr(cfg, role)
        if value is None:
            if role == "rollout":
                raise ConfigError("placement.rollout=null: the rollout role is required (`actor` or a rank list)")
            continue
        if value == "actor":
            ranks[role], colocated[role] = actor, True
            continue
        if isinstance(value, str):
            raise ConfigError(f"placement.{role}={value!r}: use `actor` (colocated) or a rank list like [2,3]")
        rr = _parse_ranks(f"placement.{role}", value, world_size)
        overlap = sorted(set(rr) & set(actor))
        if overlap and rr != actor:
            raise ConfigError(
                f"placement.{role}={rr} partly overlaps placement.actor={actor} (ranks {overlap}); "
                f"use `actor` to colocate or disjoint ranks"
            )
        ranks[role], colocated[role] = rr, rr == actor
    for role in ("critic", "reference"):
        if role in ranks and not colocated[role]:
            others = {r for k, v in ranks.items() if k not in (role, "actor") and not colocated[k] for r in v}
            clash = sorted(set(ranks[role]) & others)
            if clash:
                raise ConfigError(f"placement.{role}={ranks[role]} shares ranks {clash} with another role's own ranks")
    covered = {r for v in ranks.values() for r in v}
    idle = sorted(set(range(world_size)) - covered)
    if idle:
        raise ConfigError(f"ranks {idle} have no role; add them to placement.actor or placement.rollout")
    return Placement(world_size, ranks, colocated)


class RoleMeshes:
    """DeviceMeshes and process groups per role, built once on every rank."""

    def __init__(self, placement: Placement, device_type: str) -> None:
        self.placement = placement
        self.device_type = device_type
        self.rank = dist.get_rank()
        self._meshes: dict[str, DeviceMesh] = {}
        for role, ranks in placement.ranks.items():
            if placement.colocated.get(role) and role != "actor":
                continue
            mesh = torch.tensor(ranks, dtype=torch.int)
            # DeviceMesh construction creates its group on every rank (collective), members or not.
            self._meshes[role] = DeviceMesh(device_type, mesh, mesh_dim_names=("dp",))

    def mesh(self, role: str) -> DeviceMesh:
        if self.placement.colocated.get(role) and role != "actor":
            return self._meshes["actor"]
        return self._meshes[role]

    def dp_rank(self, role: str) -> int:
        return self.placement.ranks[role].index(self.rank)

    def dp_size(self, role: str) -> int:
        return len(self.placement.ranks[role])
