"""What the distributed workers share: the actor [0,1] + rollout [2..] topology, an actor, engine-vs-trainer parity."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch

from torchrl_post.config.schema import Config
from torchrl_post.distributed.env import DistEnv
from torchrl_post.distributed.placement import Topology, plan_placement
from torchrl_post.types import Batch
from torchrl_post.workers.actor import Actor
from torchrl_post.workers.logprobs import logits_to_logprobs


def actor_rollout_topology(env: DistEnv) -> Topology:
    """Actor on ranks [0, 1], rollout on the rest: the real cells and cross-cell groups."""
    rollout = list(range(2, env.world_size))
    spec = SimpleNamespace(actor=[0, 1], rollout=rollout, critic=None, reference=None)
    topo = Topology(plan_placement(spec, env.world_size), env, {"actor": -1})
    assert topo.world is not None
    return topo


def make_actor(cfg: Config, mesh: Any, mini_batch_samples: int = 1 << 30) -> Actor:
    """The actor at temperature 1 with `mini_batch_samples` per optimizer step (default: the whole batch)."""
    return Actor(
        cfg.model,
        cfg.actor,
        mesh,
        torch.device("cpu"),
        temperature=1.0,
        mini_batch_samples=mini_batch_samples,
        max_response_length=cfg.data.max_response_length,
    )


@torch.no_grad()
def engine_vs_trainer(model: torch.nn.Module, rb: Batch) -> dict[str, Any]:
    """Greedy engine samples against the trainer: argmax agreement and the largest logprob difference."""
    model.eval()
    logits = model(input_ids=rb.input_ids, attention_mask=rb.attention_mask, position_ids=rb.position_ids).logits[
        :, -rb.response_width - 1 : -1
    ]
    logp, _ = logits_to_logprobs(logits, rb.responses, 0.0)
    mask = rb.response_mask.bool()
    return {
        "argmax_match": bool((logits.argmax(-1) == rb.responses)[mask].all()),
        "max_logprob_diff": (logp - rb.rollout_log_probs)[mask].abs().max().item(),
        "tokens": rb.responses[mask].tolist(),
    }
