"""Role placement: which ranks run the actor, rollout, critic, reference and reward model, and their meshes and groups.

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
from torchrl_post.distributed.env import DistEnv, RawGroup, init_distributed, new_group, open_store

ROLES = ("actor", "rollout", "critic", "reference", "reward_model", "teacher")
SERVED = ("critic", "reference", "reward_model", "teacher")
"""Roles that may sit on ranks of their own and answer the actor over a link (workers/remote.py)."""


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

    def cells(self) -> dict[str, list[int]]:
        """Cell name -> global ranks: `actor` (with every colocated role), then each role on its own ranks."""
        out = {"actor": self.ranks["actor"]}
        for role, ranks in self.ranks.items():
            if not self.colocated.get(role):
                out[role] = ranks
        return out

    def cell_of(self, rank: int) -> str:
        return next(name for name, ranks in self.cells().items() if rank in ranks)

    def roles_of(self, rank: int) -> list[str]:
        return [role for role, ranks in self.ranks.items() if rank in ranks]

    def sync_ranks(self) -> list[int]:
        """The weight broadcast group: the first actor rank + the rollout ranks; [] when colocated."""
        if self.colocated.get("rollout"):
            return []
        return [self.ranks["actor"][0], *self.ranks["rollout"]]

    def describe(self) -> str:
        lines = [f"world size {self.world_size}, {len(self.cells())} cell(s) (a cell is one torch world)"]
        for role, ranks in self.ranks.items():
            how = " (colocated with actor)" if self.colocated.get(role) and role != "actor" else ""
            lines.append(f"  {role:<9} ranks {ranks}{how}")
        sync = self.sync_ranks()
        lines.append(
            f"  weight sync: broadcast over ranks {sync} (rank {sync[0]} sends)"
            if sync
            else "  weight sync: in-process reload on every actor rank (colocated)"
        )
        for role in SERVED:
            if role == "reward_model" and sync and self.has(role) and not self.colocated[role]:
                lines.append(
                    f"  reward_model: groups as they finish, from rollout ranks {self.ranks['rollout']} to "
                    f"reward_model ranks {self.ranks[role]} and their scores back, through the store"
                )
            elif self.has(role) and not self.colocated[role]:
                lines.append(
                    f"  {role} link: actor ranks {self.ranks['actor']} <-> {role} ranks {self.ranks[role]} "
                    "(prompt groups out, per-token results back)"
                )
        return "\n".join(lines)


def _parse_ranks(key: str, value: Any, world_size: int) -> list[int]:
    if isinstance(value, int) or not isinstance(value, (list, tuple)):
        raise ConfigError(f"{key}={value!r} must be a list of ranks like [0,1] (or `actor`)")
    odd = [r for r in value if isinstance(r, bool) or not isinstance(r, int)]
    if odd:
        raise ConfigError(f"{key}={list(value)!r}: rank {odd[0]!r} is not an integer; give ranks like [2,3]")
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
    for role in ("rollout", *SERVED):
        value = getattr(cfg, role, None)  # a spec without a role (critic=, reference=, ...) has none
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
    for role in SERVED:
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


class Topology:
    """This rank's part of the placement: its cell (the default world), role meshes, cross-role groups.

    A cell is a set of ranks that share one set of roles: the actor's ranks (with every colocated role), and
    each role placed on ranks of its own. Each cell is its own torch world (vLLM's `external_launcher`
    builds its groups over the default world, so a rollout cell must be one). Roles talk across cells over:
      world   gloo over all ranks: batch transfer, metrics, barriers (None when fully colocated)
      sync    {first actor rank} + rollout ranks on the device backend: weight broadcast (None if colocated)
      links   per critic/reference/reward model on ranks of its own: gloo over the actor's and its ranks (role_link.py)
    Every group here is built by its members only, so no cell waits on another to build its own.
    """

    def __init__(
        self,
        placement: Placement,
        env: DistEnv,
        fsdp_sizes: dict[str, int],
        tp: int = 1,
        timeout_s: int = 1800,
        sp: int = 1,
        ep_sizes: dict[str, int] | None = None,
    ):
        self.placement, self.env, self.rank = placement, env, env.rank
        self.cell_name = placement.cell_of(env.rank)
        self.cell = placement.cells()[self.cell_name]
        self.store = open_store(env, timeout_s)
        init_distributed(env, self.store, self.cell, self.cell_name, timeout_s)
        everyone = list(range(placement.world_size))
        colocated = placement.fully_colocated()
        self.world = None if colocated else new_group(env, self.store, "world", everyone, False, timeout_s)
        self.sync_ranks = placement.sync_ranks()
        self.sync = (
            None if not self.sync_ranks else new_group(env, self.store, "sync", self.sync_ranks, True, timeout_s)
        )
        # A critic, reference or reward model on ranks of its own talks to the actor over a gloo group of both.
        self.links: dict[str, RawGroup | None] = {}
        for role in SERVED:
            if placement.has(role) and not placement.colocated[role]:
                members = placement.ranks["actor"] + placement.ranks[role]
                self.links[role] = new_group(env, self.store, f"link_{role}", members, False, timeout_s)
        # A tensor-parallel engine spans consecutive ranks of its cell: a group per engine (creation is
        # collective over the cell, so every rank creates all of them). Colocated, its actor ranks generate
        # the union of their prompts over it; in both placements the agent loop keeps the engine's ranks in
        # lockstep over it. (vLLM builds its own groups for the engine's tensors.)
        self.engine_group: dist.ProcessGroup | None = None
        engine_cell = "actor" if placement.colocated["rollout"] else "rollout"
        if self.cell_name == engine_cell and tp > 1:
            engines = [list(range(i, i + tp)) for i in range(0, len(self.cell), tp)]  # ranks of the cell's world
            self.engine_group, _ = dist.new_subgroups_by_enumeration(engines)
        self._meshes: dict[str, DeviceMesh] = {}
        self._sequence: dict[str, DeviceMesh] = {}
        self._experts: dict[str, DeviceMesh] = {}
        by_ep: dict[tuple[int, int], DeviceMesh] = {}  # colocated roles with one layout share its mesh and groups
        for role in placement.roles_of(env.rank):
            if role == "rollout":
                continue  # vLLM builds its own groups over the cell
            self._meshes[role] = fsdp_mesh(env.device.type, len(self.cell), fsdp_sizes.get(role, -1))
            if sp > 1:
                self._sequence[role] = sequence_mesh(env.device.type, len(self.cell), sp)
            ep = (ep_sizes or {}).get(role, 1)
            if ep > 1:
                layout = (ep, fsdp_sizes.get(role, -1))
                if layout not in by_ep:
                    by_ep[layout] = expert_mesh(env.device.type, len(self.cell), *layout)
                self._experts[role] = by_ep[layout]

    def sum_all(self, t: torch.Tensor) -> torch.Tensor:
        """Sum `t` over every rank (all cells), in place; returns it."""
        if self.world is None:
            dist.all_reduce(t)
        else:
            self.world.allreduce([t]).wait()
        return t

    def barrier_all(self) -> None:
        if self.world is None:
            dist.barrier()
        else:
            self.world.barrier().wait()

    def mesh(self, role: str) -> DeviceMesh:
        """The role's FSDP mesh (over all its ranks, sp groups included)."""
        return self._meshes[role]

    def sequence(self, role: str) -> DeviceMesh | None:
        """The role's (dp, sp) mesh with sequence parallelism (`sequence_mesh`), else None."""
        return self._sequence.get(role)

    def experts(self, role: str) -> DeviceMesh | None:
        """The role's sparse mesh with expert parallelism (`expert_mesh`), else None."""
        return self._experts.get(role)

    def has(self, role: str) -> bool:
        return self.rank in self.placement.ranks.get(role, [])


def mesh_shape(n: int, fsdp_size: int) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """A role's FSDP mesh over its n ranks: 1-D ("dp",) shards over all of them; 2-D ("dp_replicate",
    "dp_shard") is HSDP when 0 < fsdp_size < n (replicas of fsdp_size shards)."""
    if 0 < fsdp_size < n:
        return ("dp_replicate", "dp_shard"), (n // fsdp_size, fsdp_size)
    return ("dp",), (n,)


def fsdp_mesh(device_type: str, n: int, fsdp_size: int) -> DeviceMesh:
    """The DeviceMesh of `mesh_shape(n, fsdp_size)` over ranks 0..n-1 of the cell."""
    dims, shape = mesh_shape(n, fsdp_size)
    return DeviceMesh(device_type, torch.arange(n, dtype=torch.int).view(*shape), mesh_dim_names=dims)


def sequence_mesh(device_type: str, n: int, sp: int) -> DeviceMesh:
    """Ulysses' (dp, sp) layout of a role's n ranks: sp groups of consecutive ranks (`get_group("sp")`, one row's
    tokens; within a node first), and the dp groups of ranks that hold distinct rows (`get_group("dp")`, where
    sums over the batch run). The FSDP mesh shards over all n ranks regardless (`fsdp_mesh`): with HSDP each
    replica's shard group is whole sp groups."""
    return DeviceMesh(device_type, torch.arange(n, dtype=torch.int).view(n // sp, sp), mesh_dim_names=("dp", "sp"))


def expert_mesh(device_type: str, n: int, ep: int, fsdp_size: int = -1) -> DeviceMesh:
    """Expert parallelism's sparse mesh over a role's n ranks: ep groups of consecutive ranks (`["ep"]`: each MoE
    layer's experts spread over them, tokens exchanged by all-to-all; within a node first), and the efsdp groups
    of the ranks that hold the same experts (`["efsdp"]`: FSDP shards those experts over them). The dense mesh
    (`fsdp_mesh`) shards everything else over all n ranks.

    With HSDP (`mesh_shape`: replicas of fsdp_size shards) the ep groups lie within a replica's shard group, as
    torchtitan borrows ep from dp_shard: (dp_replicate, efsdp, ep) = (n / fsdp_size, fsdp_size / ep, ep), and the
    experts are HSDP over (dp_replicate, efsdp) (`workers/fsdp.py: apply_fsdp`)."""
    dims, shape = mesh_shape(n, fsdp_size)
    if len(dims) == 2:
        grid = torch.arange(n, dtype=torch.int).view(shape[0], shape[1] // ep, ep)
        return DeviceMesh(device_type, grid, mesh_dim_names=("dp_replicate", "efsdp", "ep"))
    return DeviceMesh(device_type, torch.arange(n, dtype=torch.int).view(n // ep, ep), mesh_dim_names=("efsdp", "ep"))


def all_reduce_max(value: float, group: dist.ProcessGroup | None) -> float:
    """The largest `value` over `group`'s ranks (the value itself without a process group)."""
    t = torch.tensor([value], dtype=torch.float64)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return float(t.item())


def all_reduce_sum(t: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """A small CPU tensor summed over `group`'s ranks, as a copy (`t`'s values without a process group)."""
    out = t.clone()
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)
    return out


def dp_group(mesh: DeviceMesh) -> dist.ProcessGroup:
    """All data-parallel ranks of a role mesh: its group for a 1-D mesh; for HSDP's 2-D mesh (which spans its
    whole cell, see `Topology`) the cell's default group."""
    if mesh.ndim == 1:
        return mesh.get_group()
    group = dist.group.WORLD
    assert group is not None and dist.get_world_size() == mesh.size()
    return group


def all_gather_objects(obj: Any, group: dist.ProcessGroup) -> list[Any]:
    """Every rank's `obj` (pickled; small things such as a rank's share of a batch), in group rank order."""
    out: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, obj, group=group)
    return out
