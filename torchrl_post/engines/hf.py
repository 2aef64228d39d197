"""The transformers engine: `generate` on a full (unsharded) replica of the policy on each rollout rank.

The fallback when vLLM is unavailable, and the reference for parity. Logprobs come from one forward pass
over the finished sequences, at the sampling temperature, exactly as the trainer computes them; with top-k / top-p
they are renormalised on the kept set, as vLLM's processed logprobs are (generate's warpers cut as vLLM's sampler
does: temperature, then top-k keeping ties, then top-p dropping cumulative mass <= 1 - top_p).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

import torch
from transformers import AutoConfig

from torchrl_post.algos.sampling_support import sampler_truncation
from torchrl_post.config.schema import ModelConfig, RolloutConfig
from torchrl_post.engines.base import EngineSpec, SamplingParams, StepOutput
from torchrl_post.engines.batch import collate
from torchrl_post.multimodal.vision import NEVER_GENERATED_BIAS, VisionSpec, image_inputs, load_processor, model_inputs
from torchrl_post.sync.lora import lora_scale, merged_weights
from torchrl_post.types import Generation, PromptBatch
from torchrl_post.workers.loading import expert_pieces
from torchrl_post.workers.logprobs import batched_log_probs
from torchrl_post.workers.models import load_pretrained, model_class


def _prompts(prompt_ids: list[list[int]], mm_inputs: list[dict[str, Any]]) -> PromptBatch:
    """Prompts for `collate`: ids and image inputs only."""
    n = len(prompt_ids)
    return PromptBatch(prompt_ids, [None] * n, [""] * n, [{}] * n, list(range(n)), [], [], mm_inputs)


class HFEngine:
    def __init__(
        self,
        m: ModelConfig,
        rollout: RolloutConfig,
        spec: EngineSpec,
        device: torch.device,
        pad_id: int,
        eos_ids: list[int],
    ) -> None:
        dtype = getattr(torch, spec.dtype)
        config = AutoConfig.from_pretrained(m.path, trust_remote_code=m.trust_remote_code)
        if spec.load_format == "dummy":  # the first sync brings weights
            model = model_class(config).from_config(config, dtype=dtype, trust_remote_code=m.trust_remote_code)
        else:
            model = load_pretrained(m, dtype)
        self.vision = VisionSpec.of(model.config)
        self.processor = load_processor(m.path, m.trust_remote_code) if self.vision else None
        self.model = model.to(device)  # type: ignore[arg-type]  # transformers' stub types .to() oddly
        self.model.eval()
        self.device = device
        self.pad_id = pad_id
        self.eos_ids = eos_ids
        self.lora_scale = lora_scale(m.lora_rank, m.lora_alpha) if spec.lora_sync != "none" else 0.0
        self._queue: list[tuple[str, list[int], SamplingParams, int, list[Any]]] = []

    @torch.no_grad()
    def _batch(
        self,
        prompt_ids: list[list[int]],
        uids: list[int],
        params: SamplingParams,
        images: list[list[Any]] | None = None,
    ) -> Generation:
        if images is not None and self.vision is not None:
            return self._generate_with_images(prompt_ids, uids, params, images)
        width = max(map(len, prompt_ids))
        ids = torch.tensor([[self.pad_id] * (width - len(p)) + p for p in prompt_ids], device=self.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompt_ids], device=self.device)
        out = self._sample(params, uids, input_ids=ids, attention_mask=mask, num_return_sequences=params.n)
        prompts = _prompts(prompt_ids, [{}] * len(prompt_ids))
        return self._finish(out[:, width:].tolist(), prompts, params.n, params)

    def _generate_with_images(
        self, prompt_ids: list[list[int]], uids: list[int], params: SamplingParams, images: list[list[Any]]
    ) -> Generation:
        """A vision-language model: each prompt repeated n times with its images through `generate`; the kept
        tokens' logprobs from one forward of the finished rows (with their images and M-RoPE positions)."""
        assert self.vision is not None
        n = params.n
        rows = [p for p in prompt_ids for _ in range(n)]
        per_prompt = [image_inputs(self.processor, imgs) for imgs in images]  # once per prompt, not per sample
        mm = [inputs for inputs in per_prompt for _ in range(n)]
        prompts = _prompts(rows, mm)
        empty = Generation([[] for _ in rows], [[] for _ in rows], ["length"] * len(rows))
        batch = collate(prompts, empty, 1, self.pad_id, self.vision)
        width = batch.prompt_width
        inputs = model_inputs(batch, slice(None), 0, width, self.device)
        inputs["mm_token_type_ids"] = (inputs["input_ids"] == self.vision.image_token_id).int()
        del inputs["position_ids"]  # generate derives M-RoPE positions (and their deltas for new tokens)
        bias = {(t,): NEVER_GENERATED_BIAS for t in self.vision.never_generated}
        out = self._sample(params, uids, **inputs, sequence_bias=bias)
        return self._finish(out[:, width:].tolist(), prompts, 1, params)

    def _sample(self, params: SamplingParams, uids: list[int], **inputs: Any) -> torch.Tensor:
        """transformers' generate with `params`, seeded by the first prompt's uid without touching the trainer's
        RNG stream."""
        sample = params.temperature > 0
        with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
            torch.manual_seed(params.prompt_seed(uids[0] if uids else 0))
            return self.model.generate(  # type: ignore[no-any-return]
                **inputs,
                do_sample=sample,
                temperature=params.temperature if sample else None,
                top_p=params.top_p if sample else None,
                top_k=params.top_k if sample and params.top_k > 0 else None,
                max_new_tokens=params.max_tokens,
                pad_token_id=self.pad_id,
                eos_token_id=self.eos_ids,
            )

    def _finish(self, rows: list[list[int]], prompts: PromptBatch, n: int, params: SamplingParams) -> Generation:
        """Generated rows cut after their first stop token; the kept tokens' logprobs from one forward pass
        (with the prompts' images, for a vision-language model), exactly as the trainer computes them, on the
        distribution `params` sampled from (renormalised on its top-k / top-p set)."""
        gen = Generation([], [], [])
        for row in rows:
            stop = next((i for i, t in enumerate(row) if t in self.eos_ids), None)
            gen.response_ids.append(row[: stop + 1] if stop is not None else row)
            gen.finish_reasons.append("stop" if stop is not None else "length")
        gen.logprobs = [[0.0] * len(r) for r in gen.response_ids]
        batch = collate(prompts, gen, n, self.pad_id, self.vision if any(prompts.mm_inputs) else None)
        truncation = sampler_truncation(params.temperature, params.top_k, params.top_p)
        logp = batched_log_probs(self.model, batch, params.temperature, len(batch), self.device, truncation=truncation)
        gen.logprobs = [logp[i, : len(r)].tolist() for i, r in enumerate(gen.response_ids)]
        return gen

    # ---- step-driven generation (the agent loop): one step answers every queued turn in one batch ----------
    def add_request(
        self,
        request_id: str,
        prompt_ids: list[int],
        params: SamplingParams,
        uid: int,
        images: list[Any] | None = None,
    ) -> None:
        self._queue.append((request_id, list(prompt_ids), params, uid, list(images or [])))

    def step(self) -> list[StepOutput]:
        """Every queued request to its end, as one batch (with the prompts' images, where any has some): per-turn
        batches, not continuous batching. No experts are recorded (routing replay needs the vLLM engine)."""
        if not self._queue:
            return []
        queue, self._queue = self._queue, []
        longest = max(q[2].max_tokens for q in queue)
        params = replace(queue[0][2], n=1, max_tokens=longest)
        images = [q[4] for q in queue] if any(q[4] for q in queue) else None
        gen = self._batch([q[1] for q in queue], [q[3] for q in queue], params, images)
        out = []
        for (rid, _, p, _, _), ids, lps in zip(queue, gen.response_ids, gen.logprobs, strict=True):
            ids, lps = ids[: p.max_tokens], lps[: p.max_tokens]
            out.append(StepOutput(rid, ids, lps, "stop" if ids and ids[-1] in self.eos_ids else "length"))
        return out

    def abort(self, request_ids: list[str]) -> None:
        gone = set(request_ids)
        self._queue = [q for q in self._queue if q[0] not in gone]

    def reset_prefix_cache(self) -> bool:
        return True  # generate keeps no cache between calls

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy (HF name, full tensor) pairs into the model (a LoRA model's merged here); a fused experts
        parameter may come as its experts' checkpoint tensors (`...experts.{e}.gate_proj.weight`, as an
        expert-parallel trainer sends it: `sync/weights.py: ExpertBlocks`). Every parameter must arrive, under any
        of its names (tied embeddings: `lm_head.weight` is `model.embed_tokens.weight`): a name the model does
        not have, or a parameter the sync left out, is an error naming it."""
        params = dict(self.model.named_parameters(remove_duplicate=False))
        pieces: dict[str, tuple[str, int, int, int]] | None = None
        loaded: set[int] = set()
        for name, tensor in merged_weights(weights, self.lora_scale) if self.lora_scale else weights:
            param, target = params.get(name), None
            if param is None:  # one expert's checkpoint tensor, as an expert-parallel trainer sends them
                pieces = expert_pieces(self.model) if pieces is None else pieces
                if name in pieces:
                    fused, expert, part, parts = pieces[name]
                    param, target = params[fused], params[fused][expert].chunk(parts)[part]
            if param is None:
                raise RuntimeError(f"weight sync: the engine's model has no parameter {name!r} (sent by the trainer)")
            (param if target is None else target).copy_(tensor)
            loaded.add(id(param))
        missed = [name for name, p in self.model.named_parameters() if id(p) not in loaded]
        if missed:
            shown = ", ".join(missed[:8]) + (f" and {len(missed) - 8} more" if len(missed) > 8 else "")
            raise RuntimeError(
                f"weight sync: the engine's model did not get {len(missed)} parameter(s): {shown}. The sync "
                "missed them, so the engine would sample with their old values (the trainer's weights never "
                "reach them)"
            )

    def sleep(self) -> None:
        pass

    def wake_up(self) -> None:
        pass

    def shutdown(self, process_ends: bool = False) -> None:
        del self.model
