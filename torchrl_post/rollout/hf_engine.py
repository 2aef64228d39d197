"""The transformers engine: `generate` on a full (unsharded) replica of the policy on each rollout rank.

The fallback when vLLM is unavailable, and the reference for parity. Logprobs come from one forward pass
over the finished sequences, at the sampling temperature, exactly as the trainer computes them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

import torch
from transformers import AutoModelForCausalLM

from torchrl_post.config.schema import Config
from torchrl_post.rollout.base import SamplingParams
from torchrl_post.sync.lora import lora_scale, merged_weights
from torchrl_post.types import Generation
from torchrl_post.workers.logprobs import response_log_probs


class HFEngine:
    def __init__(self, cfg: Config, device: torch.device, pad_id: int, eos_ids: list[int]) -> None:
        model = AutoModelForCausalLM.from_pretrained(
            cfg.model.path,
            dtype=getattr(torch, cfg.rollout.dtype),
            trust_remote_code=cfg.model.trust_remote_code,
            use_safetensors=True,
        )
        self.model = model.to(device)  # type: ignore[arg-type]  # transformers' stub types .to() oddly
        self.model.eval()
        self.device = device
        self.pad_id = pad_id
        self.eos_ids = eos_ids
        m = cfg.model
        self.lora_scale = lora_scale(m.lora_rank, m.lora_alpha) if m.lora_rank > 0 else 0.0
        self._queue: list[tuple[str, list[int], SamplingParams, int]] = []

    @torch.no_grad()
    def generate(self, prompt_ids: list[list[int]], uids: list[int], params: SamplingParams) -> Generation:
        width = max(map(len, prompt_ids))
        ids = torch.tensor([[self.pad_id] * (width - len(p)) + p for p in prompt_ids], device=self.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompt_ids], device=self.device)
        sample = params.temperature > 0
        # Seeded without touching the trainer's RNG stream.
        with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
            torch.manual_seed(params.prompt_seed(uids[0] if uids else 0))
            out = self.model.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=sample,
                temperature=params.temperature if sample else None,
                top_p=params.top_p if sample else None,
                top_k=params.top_k if sample and params.top_k > 0 else None,
                num_return_sequences=params.n,
                max_new_tokens=params.max_tokens,
                pad_token_id=self.pad_id,
                eos_token_id=self.eos_ids,
            )
        gen = Generation([], [], [])
        for row in out[:, width:].tolist():
            stop = next((i for i, t in enumerate(row) if t in self.eos_ids), None)
            gen.response_ids.append(row[: stop + 1] if stop is not None else row)
            gen.finish_reasons.append("stop" if stop is not None else "length")
        # Logprobs of exactly the kept tokens, from one forward pass.
        seqs = out[:, : width + max(1, max(map(len, gen.response_ids)))]
        resp_w = seqs.shape[1] - width
        attn = torch.cat([mask.repeat_interleave(params.n, 0), torch.zeros_like(seqs[:, width:])], 1)
        for i, r in enumerate(gen.response_ids):
            attn[i, width : width + len(r)] = 1
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        logp, _ = response_log_probs(self.model, seqs, attn, pos, resp_w, params.temperature)
        gen.logprobs = [logp[i, : len(r)].tolist() for i, r in enumerate(gen.response_ids)]
        return gen

    # ---- step-driven generation (the agent loop): one step answers every queued turn in one batch ----------
    def add_request(self, request_id: str, prompt_ids: list[int], params: SamplingParams, uid: int) -> None:
        self._queue.append((request_id, list(prompt_ids), params, uid))

    def step(self) -> list[tuple[str, list[int], list[float], str | None]]:
        """Every queued request to its end, as one batch: per-turn batches, not continuous batching."""
        if not self._queue:
            return []
        queue, self._queue = self._queue, []
        longest = max(p.max_tokens for _, _, p, _ in queue)
        gen = self.generate([q[1] for q in queue], [q[3] for q in queue], replace(queue[0][2], n=1, max_tokens=longest))
        out: list[tuple[str, list[int], list[float], str | None]] = []
        for (rid, _, p, _), ids, lps in zip(queue, gen.response_ids, gen.logprobs, strict=True):
            ids, lps = ids[: p.max_tokens], lps[: p.max_tokens]
            out.append((rid, ids, lps, "stop" if ids and ids[-1] in self.eos_ids else "length"))
        return out

    def abort(self, request_ids: list[str]) -> None:
        gone = set(request_ids)
        self._queue = [q for q in self._queue if q[0] not in gone]

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        params = dict(self.model.named_parameters())
        for name, tensor in merged_weights(weights, self.lora_scale) if self.lora_scale else weights:
            params[name].copy_(tensor)

    def sleep(self) -> None:
        pass

    def wake_up(self) -> None:
        pass

    def shutdown(self) -> None:
        del self.model
