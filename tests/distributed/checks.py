"""What the distributed workers share: the actor [0,1] + rollout [2..] topology, an actor, engine-vs-trainer parity."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch

from torchrl_post.algos.rollout_correction import RolloutCorrection
from torchrl_post.config.schema import Config
from torchrl_post.distributed.env import DistEnv
from torchrl_post.distributed.placement import Topology, plan_placement
from torchrl_post.multimodal.vision import (
    NEVER_GENERATED_BIAS,
    VisionSpec,
    encode,
    load_processor,
    model_inputs,
    with_image_items,
)
from torchrl_post.types import Batch, PromptBatch
from torchrl_post.workers.actor import Actor
from torchrl_post.workers.logprobs import logits_to_logprobs


def actor_rollout_topology(env: DistEnv, timeout_s: int = 1800) -> Topology:
    """Actor on ranks [0, 1], rollout on the rest: the real cells and cross-cell groups."""
    rollout = list(range(2, env.world_size))
    spec = SimpleNamespace(actor=[0, 1], rollout=rollout, critic=None, reference=None)
    topo = Topology(plan_placement(spec, env.world_size), env, {"actor": -1}, timeout_s=timeout_s)
    assert topo.world is not None
    return topo


def make_actor(
    cfg: Config,
    mesh: Any,
    mini_batch_samples: int = 1 << 30,
    device: torch.device | None = None,
    correction: RolloutCorrection | None = None,
    skip_zero_advantage: bool = False,
) -> Actor:
    """The actor at temperature 1 with `mini_batch_samples` per optimizer step (default: the whole batch), on
    `device` (default the CPU), with a rollout `correction` (default none), skipping rows of advantage 0 or not."""
    return Actor(
        cfg.model,
        cfg.actor,
        mesh,
        device or torch.device("cpu"),
        temperature=1.0,
        mini_batch_samples=mini_batch_samples,
        micro_batch_samples=cfg.actor.ppo_micro_batch_size_per_gpu,
        max_response_length=cfg.data.max_response_length,
        total_steps=1,
        correction=correction,
        skip_zero_advantage=skip_zero_advantage,
    )


@torch.no_grad()
def engine_vs_trainer(model: torch.nn.Module, rb: Batch) -> dict[str, Any]:
    """Greedy engine samples against the trainer: argmax agreement and the largest logprob difference."""
    model.eval()
    inputs = model_inputs(rb, slice(None), 0, rb.input_ids.shape[1], torch.device("cpu"))
    logits = model(**inputs).logits[:, -rb.response_width - 1 : -1].float()
    spec = VisionSpec.of(model.config)
    if spec is not None:  # the engines never emit the vision placeholders (biased in both)
        logits[..., list(spec.never_generated)] += NEVER_GENERATED_BIAS
    logp, _ = logits_to_logprobs(logits, rb.responses, 0.0)
    mask = rb.response_mask.bool()
    return {
        "argmax_match": bool((logits.argmax(-1) == rb.responses)[mask].all()),
        "max_logprob_diff": (logp - rb.rollout_log_probs)[mask].abs().max().item(),
        "tokens": rb.responses[mask].tolist(),
    }


def parity_prompts(model_dir: str, gen: torch.Generator) -> tuple[PromptBatch, VisionSpec | None, int]:
    """Four prompts for a parity check and (vision spec, pad id): random token prompts for a text model; for a
    vision-language model, the colour task's chat prompts, each with its own generated image."""
    from transformers import AutoConfig

    spec = VisionSpec.of(AutoConfig.from_pretrained(model_dir))
    if spec is None:
        prompts = [torch.randint(5, 100, (int(k),), generator=gen).tolist() for k in (5, 9, 7, 12)]
        return PromptBatch(prompts, ["0"] * 4, ["arithmetic"] * 4, [{}] * 4, [0, 1, 2, 3]), None, 0
    from PIL import Image

    processor = load_processor(model_dir)
    size = processor.image_processor.patch_size * processor.image_processor.merge_size * 2
    ids, images, mm = [], [], []
    for k in range(4):
        rgb = tuple(int(v) for v in torch.randint(0, 256, (3,), generator=gen))
        img = Image.new("RGB", (size, size), rgb)  # type: ignore[arg-type]
        msgs = with_image_items([{"role": "user", "content": f"<image>Colour {k}?"}], 1, "parity")
        p, inputs = encode(processor, msgs, [img])
        ids.append(p)
        images.append([img])
        mm.append(inputs)
    pb = PromptBatch(ids, ["red"] * 4, ["vlm_colour"] * 4, [{}] * 4, [0, 1, 2, 3], [], images, mm)
    return pb, spec, int(processor.tokenizer.pad_token_id)
