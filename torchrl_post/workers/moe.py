"""Mixture-of-experts routers in the trainer's forwards: routing replay (the engine's recorded experts used in
place of the router's own top-k), what the routers chose, and their load-balancing loss.

A token's experts are picked by its router's top-k; the gate weights are the softmax of the router's logits at
those experts, renormalised (`route_top_k`). Replay takes the experts from the rollout engine's record and keeps
the gate weights computed from the current logits, so the router still learns (rollout routing replay, R3).
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F


def expert_count(config: Any) -> int:
    """Routed experts per MoE layer of an HF config (0: a dense model)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return int(getattr(text, "num_experts", 0) or getattr(text, "n_routed_experts", 0) or 0)


def is_router(module: torch.nn.Module) -> bool:
    """A softmax top-k router as transformers writes them (Qwen2-MoE's and Qwen3-MoE's `TopKRouter`): logits
    = hidden @ weight.T, the top `top_k` of their softmax, renormalised when `norm_topk_prob`."""
    return (
        type(module).__name__.endswith("TopKRouter")
        and isinstance(getattr(module, "top_k", None), int)
        and isinstance(getattr(module, "weight", None), torch.Tensor)
        and hasattr(module, "norm_topk_prob")
    )


def routers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's MoE routers, in layer order (the order of the engine's recorded layers)."""
    return [m for m in model.modules() if is_router(m)]


def unsupported_router(model: torch.nn.Module) -> str | None:
    """The class of a router-like module replay cannot drive (another routing rule), or None."""
    for m in model.modules():
        name = type(m).__name__
        if ("Router" in name or name.endswith("Gate")) and not is_router(m) and hasattr(m, "top_k"):
            return name
    return None


def route_top_k(
    logits: torch.Tensor, top_k: int, normalise: bool, replay: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Router logits [N, E] -> (gate weights [N, k] in the logits' dtype, experts used [N, k], the router's own
    top-k [N, k]). `replay` [N, k]: recorded experts; a row with any -1 (nothing recorded) keeps the router's own.
    The gate weights are the softmax (float32) at the experts used, renormalised over them when `normalise`."""
    probs = torch.softmax(logits, dim=-1, dtype=torch.float)
    own = torch.topk(probs, top_k, dim=-1).indices
    used = own
    if replay is not None:
        recorded = (replay >= 0).all(-1, keepdim=True)
        used = torch.where(recorded, replay.long(), own)
    weights = probs.gather(-1, used)
    if normalise:
        weights = weights / weights.sum(-1, keepdim=True)
    return weights.to(logits.dtype), used, own


def load_balancing_loss(
    logits: list[torch.Tensor], used: list[torch.Tensor], num_experts: int, real: torch.Tensor | None = None
) -> torch.Tensor:
    """The auxiliary load-balancing loss (Switch Transformer; transformers' `load_balancing_loss_func` with the
    layers' tokens pooled): num_experts x sum over experts and top-k slots of (the fraction of tokens whose slot
    picks the expert) x (the expert's mean router probability). 1 x top_k when balanced. `logits` / `used`: one
    [N, E] / [N, k] per layer; `real` [N] bool: the tokens counted (padding and packing slack left out)."""
    probs = torch.cat([torch.softmax(x.float(), dim=-1) for x in logits])  # [L*N, E]
    picks = F.one_hot(torch.cat(used), num_experts).float()  # [L*N, k, E]
    if real is None:
        share, mean_prob = picks.mean(0), probs.mean(0)
    else:
        w = real.float().repeat(len(logits))
        total = w.sum().clamp(min=1.0)
        share = (picks * w[:, None, None]).sum(0) / total
        mean_prob = (probs * w[:, None]).sum(0) / total
    return num_experts * (share * mean_prob[None]).sum()


@dataclass
class RouteTrace:
    """What the routers of one forward did, layer by layer (in `routers` order): their logits (in the graph, for
    the load-balancing loss), the experts used, and their own top-k."""

    logits: dict[int, torch.Tensor] = field(default_factory=dict)
    used: dict[int, torch.Tensor] = field(default_factory=dict)
    own: dict[int, torch.Tensor] = field(default_factory=dict)
    replay: torch.Tensor | None = None
    """[N, L, k] the recorded experts the forward replayed (or only compared with), -1 where none."""
    real: torch.Tensor | None = None
    """[N] bool: the cells that hold a token."""

    def aux_loss(self) -> torch.Tensor:
        layers = sorted(self.logits)
        num_experts = self.logits[layers[0]].shape[-1]
        return load_balancing_loss(
            [self.logits[i] for i in layers], [self.used[i] for i in layers], num_experts, self.real
        )

    def disagreement(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(routing decisions where the router's own top-k is not the recorded set, decisions compared): one
        decision per token and layer, over the real tokens with a record."""
        if self.replay is None or not self.own:
            zero = torch.zeros((), dtype=torch.float64)
            return zero, zero
        own = torch.stack([self.own[i] for i in sorted(self.own)], 1).sort(-1).values  # [N, L, k]
        rec = self.replay.to(own.device).long()
        has = (rec >= 0).all(-1)  # [N, L]
        if self.real is not None:
            has = has & self.real.to(own.device)[:, None]
        differ = (own != rec.sort(-1).values).any(-1) & has
        return differ.sum().double(), has.sum().double()


@dataclass
class _Call:
    """What one `routing` block asks of the routers."""

    trace: RouteTrace | None
    replay: torch.Tensor | None


_CALL: contextvars.ContextVar[_Call | None] = contextvars.ContextVar("moe_routing", default=None)


def _in_backward() -> bool:
    """Inside autograd's backward: where a checkpointed layer recomputes its forward."""
    return bool(torch._C._current_graph_task_id() != -1)


class _Replaying:
    """A router's forward while `routing` is installed on it: `route_top_k` with the block's replay rows; outside
    a block, in the backward (a checkpointed layer's recomputation), the rows of its last call again, so the
    recomputation routes as the forward did; anywhere else the router's own top-k (what its class computes)."""

    def __init__(self, index: int, router: Any) -> None:
        self.index, self.router = index, router
        self.last: torch.Tensor | None = None

    def __call__(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        router, call = self.router, _CALL.get()
        h = hidden_states.reshape(-1, router.weight.shape[-1])
        logits = F.linear(h, router.weight)
        if call is not None:
            self.last = None if call.replay is None else call.replay[:, self.index].to(h.device)
        rows = self.last if call is not None or _in_backward() else None
        weights, used, own = route_top_k(logits, router.top_k, bool(router.norm_topk_prob), rows)
        trace = call.trace if call is not None else None
        if trace is not None and self.index not in trace.logits:
            trace.logits[self.index], trace.used[self.index], trace.own[self.index] = logits, used, own
        return logits, weights, used


@contextmanager
def routing(
    model: torch.nn.Module,
    trace: RouteTrace | None,
    replay: torch.Tensor | None = None,
    real: torch.Tensor | None = None,
    recorded: torch.Tensor | None = None,
) -> Iterator[RouteTrace | None]:
    """One forward of `model` with its routers' top-k by `route_top_k`: with `replay` ([N, L, k], the cells in the
    order the routers see them: rows of the input flattened) the recorded experts are used; `trace` (None:
    nothing recorded) receives each router's first call (a checkpointed layer's recomputation is not recorded
    again), `real` [N] (the cells holding a token) and `recorded` (default `replay`: the engine's experts its
    disagreement compares with). The routers keep the replaying forward after the block (`_Replaying`): a
    checkpointed layer recomputed in the backward replays the same rows. A model without routers is left alone."""
    found = routers(model)
    if not found or (trace is None and replay is None):
        yield trace
        return
    for given in (replay, recorded):
        if given is not None and given.shape[1] != len(found):
            raise RuntimeError(
                f"routing replay: the batch records {given.shape[1]} MoE layers, the model has {len(found)} routers"
            )
    if trace is not None:
        trace.replay, trace.real = (replay if recorded is None else recorded), real
    for index, router in enumerate(found):
        if not isinstance(router.__dict__.get("forward"), _Replaying):
            router.forward = _Replaying(index, router)
    token = _CALL.set(_Call(trace, replay))
    try:
        yield trace
    finally:
        _CALL.reset(token)
