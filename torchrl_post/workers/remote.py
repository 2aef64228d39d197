"""Roles on ranks of their own: the actor-side proxies and the programs of the ranks they talk to.

Proxies have the interface of the local object they stand for, so the step never asks where a role sits:
    RemoteRollouts   (rollout source)  <- rollout ranks running RolloutServer, over the `world` group
    RemoteCritic     (critic)          <- critic ranks running RoleServer, over the critic's link
    RemoteReference  (reference)       <- reference ranks running RoleServer, over the reference's link
Both sides of a pair make the same collectives in the same order: the rollout transfer at the start of
the step, then the links in the actor's order (reference logprobs, critic values, returns out, critic
metrics back), then the weight broadcast.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import torch

from torchrl_post.config.schema import Config
from torchrl_post.data.dataset import PromptDataset
from torchrl_post.distributed.role_link import RoleLink
from torchrl_post.distributed.transfer import (
    ROW_DROPPED,
    ROW_GEN_MS,
    ROW_OWNER,
    ROW_ROUNDS,
    ROW_SHORT,
    ROW_VERSION,
    GroupRow,
    all_gather_rows,
    group_rows,
    plan_transfer,
    route,
)
from torchrl_post.logging.timing import Timer
from torchrl_post.loop import Run, Trained
from torchrl_post.rollout.source import VAL_TOTALS
from torchrl_post.sync.weights import BroadcastSync
from torchrl_post.types import Batch
from torchrl_post.workers.critic import Critic
from torchrl_post.workers.reference import Reference


class ReferenceRole(Protocol):
    """A reference policy here (`workers.reference.Reference`) or on its own ranks (`RemoteReference`)."""

    def log_probs(self, batch: Batch) -> torch.Tensor: ...


class CriticRole(Protocol):
    """A critic here (`workers.critic.Critic`) or on its own ranks (`RemoteCritic`)."""

    def values(self, batch: Batch) -> torch.Tensor: ...

    def start_update(self, batch: Batch) -> Callable[[], dict[str, float]]: ...

    def trained(self) -> dict[str, Trained]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def mini_batch_samples(cfg: Config, dp_size: int) -> int:
    """Samples per optimizer step on each of `dp_size` ranks."""
    return (cfg.actor.ppo_mini_batch_size or cfg.data.train_batch_size) * cfg.rollout.n // dp_size


def build_critic(run: Run) -> Critic:
    cfg, mesh = run.cfg, run.topo.mesh("critic")
    return Critic(
        cfg.model,
        cfg.critic,
        mesh,
        run.env.device,
        mini_batch_samples=mini_batch_samples(cfg, mesh.size()),
        epochs=cfg.actor.ppo_epochs,
        max_response_length=cfg.data.max_response_length,
    )


def build_reference(run: Run) -> Reference:
    cfg = run.cfg
    mesh = run.topo.mesh("reference")
    return Reference(
        cfg.model, cfg.reference, cfg.actor.fsdp, mesh, run.env.device, temperature=cfg.rollout.temperature
    )


def link(run: Run, role: str) -> RoleLink:
    placement = run.topo.placement
    return RoleLink(
        run.topo.links[role],
        len(placement.ranks["actor"]),
        len(placement.ranks[role]),
        run.cfg.data.train_batch_size,
        run.tokenizer.pad_token_id,
    )


def transfer_rollout(run: Run, items: dict[int, Any], rows: torch.Tensor) -> tuple[torch.Tensor, dict[int, Any]]:
    """Every rank, once per step: the engines' group rows to all, then whole groups to the actor ranks,
    balanced by tokens. Returns (all rows, the groups this rank received)."""
    bsz = run.cfg.data.train_batch_size
    engines = len(run.topo.placement.ranks["rollout"]) // run.cfg.rollout.tensor_parallel_size
    table = all_gather_rows(run.topo.world, rows, -(-bsz // engines))
    owner, dest = plan_transfer(table, bsz, run.actor_ranks)
    return table, route(run.topo.world, items, owner, dest)


class RemoteRollouts:
    """The actor side of rollout ranks: step k's batch arrives scored, as whole prompt groups."""

    def __init__(self, run: Run, timer: Timer) -> None:
        self.run, self.timer = run, timer
        self.sampler = run.sampler(0, 1)  # the whole batch: the data position (epoch, checkpoint), no prompts
        self._metrics: dict[str, float] = {}

    def next_batch(self, step: int) -> Batch:
        self.sampler.next_batch()
        with self.timer("gen"):  # the wait for the rollout ranks
            table, parts = transfer_rollout(self.run, {}, group_rows([]))
        self._metrics = {
            "rollout/staleness": float((step - 1) - table[:, ROW_VERSION].min().item()),
            "timing_s/gen_engine": table[:, ROW_GEN_MS].max().item() / 1000,
        }
        if self.run.cfg.algorithm.rejection_sample.enable:  # each engine's counts sit on all of its rows
            engines = {int(row[ROW_OWNER]): row for row in table}
            for name, col in (
                ("dropped_groups", ROW_DROPPED),
                ("extra_rounds", ROW_ROUNDS),
                ("short_groups", ROW_SHORT),
            ):
                self._metrics[f"filter/rejection/{name}"] = float(sum(int(r[col]) for r in engines.values()))
        return Batch.concat([Batch.from_wire(parts[g]) for g in sorted(parts)], self.run.tokenizer.pad_token_id)

    def metrics(self) -> dict[str, float]:
        return self._metrics

    @property
    def epoch(self) -> int:
        return self.sampler.epoch

    def validation_totals(self, data: PromptDataset, sources: list[str]) -> torch.Tensor:
        return torch.zeros(VAL_TOTALS, len(sources), dtype=torch.float64)  # the rollout ranks generate

    val_samples: list[dict[str, Any]] = []  # (kept on the rollout ranks)

    def state_dict(self) -> dict[str, Any]:
        return {"sampler": self.sampler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state["sampler"])

    def shutdown(self) -> None:
        pass


class RemoteReference:
    def __init__(self, link: RoleLink) -> None:
        self.link = link

    def log_probs(self, batch: Batch) -> torch.Tensor:
        self.link.send_batch(batch)
        out = self.link.to_actor(batch, "ref_log_probs")
        assert out is not None  # the actor side receives
        return out


class RemoteCritic:
    def __init__(self, link: RoleLink) -> None:
        self.link = link

    def values(self, batch: Batch) -> torch.Tensor:
        self.link.send_batch(batch)
        out = self.link.to_actor(batch, "values")
        assert out is not None
        return out

    def start_update(self, batch: Batch) -> Callable[[], dict[str, float]]:
        """Send the returns; the critic's ranks update while the actor does; the call waits for its metrics."""
        self.link.to_role(batch, "returns")
        return lambda: self.link.metrics_to_actor(None)

    def trained(self) -> dict[str, Trained]:
        return {}  # saved by the critic's own ranks

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
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

    def __init__(self, run: Run) -> None:
        self.run, cfg = run, run.cfg
        self.timer = Timer()
        tp = cfg.rollout.tensor_parallel_size
        rollout = run.topo.placement.ranks["rollout"]
        sampler = run.sampler(rollout.index(run.env.rank) // tp, len(rollout) // tp)
        self.source = run.engine_source(sampler, self.timer)
        self.sync = BroadcastSync(
            run.topo.sync, run.env.device, cfg.rollout.sync_bucket_mb << 20, getattr(torch, cfg.rollout.dtype)
        )
        self.lag = cfg.trainer.max_off_policy_steps
        self.ahead: deque[Ahead] = deque()
        self.version = 0
        self.sent_state: dict[str, Any] = self.source.state_dict()

    def step(self, step: int) -> dict[str, float]:
        total = self.run.total_steps
        nxt = self.ahead[-1][0] + 1 if self.ahead else step
        while nxt <= min(step + max(self.lag, 1) - 1, total):  # after a start or resume
            self._generate_ahead(nxt)
            nxt += 1
        got, items, rows, source_state = self.ahead.popleft()
        assert got == step, f"rollout queue holds step {got}, the actor is at {step}"
        transfer_rollout(self.run, items, rows)
        self.sent_state = source_state
        if self.lag and step + self.lag <= total:
            self._generate_ahead(step + self.lag)  # overlaps the actor's update of `step`
        self.sync.receive(self.source.engine)
        self.version = step
        return {}

    def _generate_ahead(self, step: int) -> None:
        """Draw this engine's share of batch `step`, generate and score it, queue its groups."""
        self.timer.reset()
        batch = self.source.produce(step)
        ms = int(sum(self.timer.seconds.values()) * 1000)
        items: dict[int, dict[str, torch.Tensor]] = {}
        rows = group_rows([])
        if self.source.engine_leader:  # the other ranks of a tensor-parallel engine hold the same samples
            parts = batch.split_groups()
            items = {g: part.to_wire() for g, part in parts.items()}
            rank, counts = self.run.env.rank, self.source.filter_counts
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


class RoleServer:
    """Rank program of a critic or reference on ranks of its own: answer the actor's groups, update the critic.

    Mirrors the actor's calls: the rollout transfer (it holds nothing there), then its link's exchanges."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.critic = build_critic(run) if run.topo.has("critic") else None
        self.reference = build_reference(run) if run.topo.has("reference") else None
        self.link = link(run, "critic" if self.critic is not None else "reference")

    def step(self, step: int) -> dict[str, float]:
        if self.run.disaggregated:
            transfer_rollout(self.run, {}, group_rows([]))
        batch = self.link.send_batch(None)
        assert batch is not None  # the role side receives
        if self.reference is not None:
            batch.ref_log_probs = self.reference.log_probs(batch)
            self.link.to_actor(batch, "ref_log_probs")
        if self.critic is not None:
            batch.values = self.critic.values(batch)
            self.link.to_actor(batch, "values")
            batch.returns = self.link.to_role(batch, "returns")
            self.link.metrics_to_actor(self.critic.update(batch))
        return {}

    def validation_totals(self, data: PromptDataset, sources: list[str]) -> torch.Tensor:
        return torch.zeros(VAL_TOTALS, len(sources), dtype=torch.float64)

    def val_samples(self) -> list[dict[str, Any]]:
        return []

    def trained_roles(self) -> dict[str, Trained]:
        return self.critic.trained() if self.critic is not None else {}

    def state_dict(self) -> dict[str, Any]:
        return {"critic": self.critic.state_dict()} if self.critic is not None else {}

    def load_state_dict(self, state: dict[str, Any], step: int) -> None:
        if self.critic is not None:
            self.critic.load_state_dict(state["critic"])

    def after_resume(self) -> None:
        pass

    def write_hf(self, ckpt_tmp: Path) -> None:
        pass

    def shutdown(self) -> None:
        pass
