"""The engines behind one interface (`RolloutEngine`): vllm (in-process) and hf (transformers); `build_engine`;
`Followed`: an engine whose weight loads a second engine repeats (a self-judge follows the policy)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch

from torchrl_post.engines.base import EngineSpec, RolloutEngine

if TYPE_CHECKING:
    from torchrl_post.config.schema import ModelConfig, RolloutConfig


def build_engine(
    model: ModelConfig,
    rollout: RolloutConfig,
    spec: EngineSpec,
    device: torch.device,
    seed: int,
    pad_id: int,
    eos_ids: list[int],
    reserve_bytes: int = 0,
) -> RolloutEngine:
    """The engine `rollout.engine` names, with its weights as `spec.load_format` says (`dummy`: random until
    the caller's first sync; see `plan.RunPlan.engine_spec`); `reserve_bytes`: GPU memory vLLM must leave to a
    colocated trainer beyond what it holds when the engine starts."""
    if rollout.engine == "vllm":
        from torchrl_post.engines.vllm import VLLMEngine

        return VLLMEngine(model, rollout, spec, device, seed, reserve_bytes)
    from torchrl_post.engines.hf import HFEngine

    return HFEngine(model, rollout, spec, device, pad_id, eos_ids)


class Followed:
    """`engine`, whose every weight load `follower` repeats: the policy's engine with a co-hosted judge of the policy
    itself (reward.judge.model=policy). Everything else is the engine's. A load's tensors are copied to host memory
    first (the stream's buckets are reused as it goes) and handed to the follower after the engine has its own."""

    def __init__(self, engine: RolloutEngine, follower: RolloutEngine) -> None:
        self.engine, self.follower = engine, follower

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        kept: list[tuple[str, torch.Tensor]] = []

        def keeping() -> Iterable[tuple[str, torch.Tensor]]:
            for name, tensor in weights:
                kept.append((name, tensor.detach().to("cpu", copy=True)))
                yield name, tensor

        self.engine.load_weights(keeping())
        self.follower.load_weights(kept)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)
