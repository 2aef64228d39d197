"""What engines return as a `Batch`: prompts left-padded, responses right-padded, masks and positions (`collate`,
`pad_samples`), with each token's policy version (`version_rows`, `stamp_versions`)."""

from __future__ import annotations

import torch

from torchrl_post.multimodal.vision import VisionSpec, attach_images
from torchrl_post.types import Batch, Generation, PromptBatch, termination_codes


def collate(prompts: PromptBatch, gen: Generation, n: int, pad_id: int, vision: VisionSpec | None = None) -> Batch:
    """Left-pad prompts, right-pad responses, build masks and positions; every sample weight 1, unscored.
    A vision-language model's batch carries each sample's images and M-RoPE positions."""
    num = len(gen.response_ids)
    assert num == len(prompts) * n, "engines return n samples per prompt"
    batch = pad_samples(
        [prompts.prompt_ids[i // n] for i in range(num)],
        gen.response_ids,
        gen.logprobs,
        [[1.0] * len(r) for r in gen.response_ids],
        [prompts.uids[i // n] for i in range(num)],
        gen.finish_reasons,
        pad_id,
        gen.routed_experts,
    )
    if vision is not None:
        attach_images(batch, [prompts.mm_inputs[i // n] if prompts.mm_inputs else {} for i in range(num)], vision)
    return batch


def pad_samples(
    prompt_ids: list[list[int]],
    response_ids: list[list[int]],
    logprobs: list[list[float]],
    loss_masks: list[list[float]],
    group_ids: list[int],
    terminations: list[str],
    pad_id: int,
    routes: list[torch.Tensor] | None = None,
    versions: list[list[int]] | None = None,
) -> Batch:
    """One row per sample: the prompt left-padded, the response (with any observation tokens, loss mask 0)
    right-padded; positions count real tokens. `routes`: each sample's recorded experts ([tokens - 1, L, k],
    `Generation.routed_experts`), laid out under the tokens they routed (`Batch.routed_experts`). `versions`: the
    policy version of each response token (-1: none, an observation token), `Batch.behavior_versions`."""
    num = len(response_ids)
    p_width = max(len(p) for p in prompt_ids)
    r_width = max(1, max(len(r) for r in response_ids))
    input_ids = torch.full((num, p_width + r_width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((num, p_width + r_width), dtype=torch.long)
    rollout_lp = torch.zeros((num, r_width), dtype=torch.float32)
    loss_mask = torch.zeros((num, r_width), dtype=torch.float32)
    for i in range(num):
        p, r = prompt_ids[i], response_ids[i]
        input_ids[i, p_width - len(p) : p_width] = torch.tensor(p)
        attention_mask[i, p_width - len(p) : p_width] = 1
        if r:
            input_ids[i, p_width : p_width + len(r)] = torch.tensor(r)
            attention_mask[i, p_width : p_width + len(r)] = 1
            rollout_lp[i, : len(r)] = torch.tensor(logprobs[i], dtype=torch.float32)
            loss_mask[i, : len(r)] = torch.tensor(loss_masks[i], dtype=torch.float32)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    routed = None
    if routes is not None:
        layers, k = routes[0].shape[1:]
        routed = torch.full((num, layers, k, p_width + r_width), -1, dtype=torch.int16)
        for i, route in enumerate(routes):
            start = p_width - len(prompt_ids[i])
            routed[i, :, :, start : start + route.shape[0]] = route.permute(1, 2, 0)
    return Batch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        loss_mask=loss_mask,
        rollout_log_probs=rollout_lp,
        behavior_versions=None if versions is None else version_rows(versions, r_width),
        group_ids=torch.tensor(group_ids, dtype=torch.long),
        termination=termination_codes(terminations),
        weights=torch.ones(num),
        routed_experts=routed,
    )


def version_rows(versions: list[list[int]], width: int) -> torch.Tensor:
    """Each sample's per-token policy versions as [B, width] long, -1 past its tokens."""
    out = torch.full((len(versions), width), -1, dtype=torch.long)
    for i, v in enumerate(versions):
        out[i, : len(v)] = torch.tensor(v, dtype=torch.long)
    return out


def stamp_versions(batch: Batch, version: int) -> None:
    """Every trained response token of `batch` sampled by policy `version` (a batch generated whole with one set
    of weights); observation tokens and padding -1."""
    batch.behavior_versions = torch.where(batch.loss_mask > 0, version, -1).long()
