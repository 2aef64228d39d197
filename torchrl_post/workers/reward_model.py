"""The reward model: a frozen sequence classifier (HF *ForSequenceClassification, one label) under FSDP2, scoring
each sample's conversation in its own tokens (`batch.reward_inputs`, reward/model_inputs.py).

The score is the head's output at the last real token of each row. It is read from the head's per-position
output (a hook on `score`) at the last position the attention mask keeps, not from transformers' pooling, which
finds that position by searching for the pad token id, and so misreads a conversation that ends in a token equal
to it (many tokenizers pad with their end-of-turn token). Rows are right-padded: real tokens take positions
0..n-1, as in a forward of the row alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
from torch.distributed.device_mesh import DeviceMesh
from transformers import AutoConfig, AutoModelForSequenceClassification

from torchrl_post.config.schema import FSDPConfig, ModelConfig, RewardModelConfig
from torchrl_post.distributed.placement import all_reduce_max, dp_group
from torchrl_post.types import Batch
from torchrl_post.workers.frozen import frozen_model
from torchrl_post.workers.fsdp import reshard
from torchrl_post.workers.models import empty_model, model_dtype


def reward_model_cfg(model_cfg: ModelConfig, cfg: RewardModelConfig) -> ModelConfig:
    """The policy's model settings (dtype, load format, attention) for the reward model's checkpoint."""
    assert cfg.model.path is not None  # validate.py: reward_model.model.path with reward_model.enable
    return replace(model_cfg, path=cfg.model.path, trust_remote_code=cfg.model.trust_remote_code, lora_rank=0)


def load_reward_model(cfg: ModelConfig, empty: bool) -> Any:
    """The sequence classifier at `cfg.path` in `model.dtype` (parameters on the meta device when `empty`)."""
    config = AutoConfig.from_pretrained(cfg.path, trust_remote_code=cfg.trust_remote_code)
    if config.pad_token_id is None:  # transformers' pooling needs one to run; the score is read here (module doc)
        config.pad_token_id = 0
    if empty:
        model = empty_model(cfg, config, AutoModelForSequenceClassification)
    else:
        model = AutoModelForSequenceClassification.from_pretrained(
            cfg.path, config=config, dtype=model_dtype(cfg), trust_remote_code=cfg.trust_remote_code,
            use_safetensors=True,
        )  # fmt: skip
    return model.requires_grad_(False)


def last_positions(mask_bl: torch.Tensor) -> torch.Tensor:
    """[B] the column of each row's last real token (0 for a row without any).

    >>> last_positions(torch.tensor([[1, 1, 0], [1, 1, 1], [0, 0, 0]])).tolist()
    [1, 2, 0]
    """
    cols = torch.arange(mask_bl.shape[1], device=mask_bl.device)
    return (cols * mask_bl.long()).argmax(-1)


class RewardModel:
    def __init__(
        self, model_cfg: ModelConfig, cfg: RewardModelConfig, fsdp: FSDPConfig, mesh: DeviceMesh, device: torch.device
    ) -> None:
        """`fsdp`: the actor's FSDP settings but for the offload (reward_model.param_offload): workers/frozen.py."""
        self.cfg, self.device = cfg, device
        self.group = dp_group(mesh)
        rm_cfg = reward_model_cfg(model_cfg, cfg)
        model: Any = frozen_model(
            lambda empty: load_reward_model(rm_cfg, empty),
            rm_cfg,
            mesh,
            fsdp,
            device,
            role="reward_model",
            param_offload=cfg.param_offload,
            path=rm_cfg.path,
        )
        self.model = model
        self.pad_id = int(model.config.pad_token_id)
        self._head: torch.Tensor | None = None
        model.score.register_forward_hook(self._keep_head)

    def _keep_head(self, module: torch.nn.Module, args: Any, out: torch.Tensor) -> None:
        self._head = out

    @torch.no_grad()
    def start_scores(self, batch: Batch) -> Callable[[], torch.Tensor]:
        """Colocated: the scores are computed now (the actor's ranks are this model's), the call returns them."""
        out = self.scores(batch)
        return lambda: out

    def scores(self, batch: Batch) -> torch.Tensor:
        """[B] the reward model's score of every row's `reward_inputs` (`score_ids`)."""
        assert batch.reward_inputs is not None  # the rollout source sets them when a reward model scores
        return self.score_ids(batch.reward_inputs)

    @torch.no_grad()
    def score_ids(self, ids: torch.Tensor) -> torch.Tensor:
        """[B] the score of each row of [B, L] ids right-padded with -1, float32 on CPU. Every rank of the mesh
        runs the same number of forwards (FSDP2 gathers each layer over the mesh): a rank with fewer rows runs
        empty micro-batches of one padding row."""
        micro = self.cfg.micro_batch_size_per_gpu
        out = torch.zeros(len(ids), dtype=torch.float32)
        forwards = int(all_reduce_max(float(-(-len(ids) // micro)), self.group))
        for start in range(0, forwards * micro, micro):
            rows = ids[start : start + micro]
            if not len(rows):  # past this rank's rows: a padding row keeps the mesh's collectives in step
                rows = torch.full((1, 1), -1, dtype=torch.long)
            mask = rows >= 0
            inputs = torch.where(mask, rows, self.pad_id).to(self.device)
            self.model(input_ids=inputs, attention_mask=mask.long().to(self.device))
            assert self._head is not None
            head = self._head[..., 0].float()  # [b, L]
            picked = head.gather(1, last_positions(mask.to(self.device)).unsqueeze(1)).squeeze(1)
            out[start : start + len(picked)] = picked.cpu()[: len(ids) - start]
            self._head = None
        reshard(self.model)
        return out
