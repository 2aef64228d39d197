"""HF export: a checkpoint's policy as safetensors + config + tokenizer that transformers and vLLM load.

    python -m torchrl_post.export <run>/checkpoints/global_step_N <out_dir>

Every checkpoint carries `hf/` with the model config and tokenizer (small); with trainer.save_hf=true it
also holds the weights, gathered from the FSDP2 shards at save time. Otherwise `export_checkpoint` reads
the model part of the DCP shards in one process, no process group needed.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file
from torch.distributed.checkpoint.api import CheckpointException
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from torchrl_post.config.errors import ConfigError

WEIGHTS = "model.safetensors"


def write_hf_meta(model_config: Any, tokenizer: Any, out: Path) -> None:
    """config.json and the tokenizer files (rank 0)."""
    out.mkdir(parents=True, exist_ok=True)
    model_config.save_pretrained(out)
    tokenizer.save_pretrained(out)


def write_hf_weights(weights: Iterable[tuple[str, torch.Tensor]], out: Path, is_main: bool) -> None:
    """Consume the (collective) full-weight iterator on every rank; rank 0 writes one safetensors file."""
    tensors = {name: t.detach().to("cpu", copy=True).contiguous() for name, t in weights} if is_main else None
    if not is_main:
        for _ in weights:  # the gathers are collectives: every rank must walk them
            pass
        return
    assert tensors is not None
    save_file(tensors, str(out / WEIGHTS), metadata={"format": "pt"})


def export_checkpoint(ckpt_dir: Path, out_dir: Path) -> Path:
    """Write an HF model directory for the policy in `ckpt_dir` (a global_step_N directory)."""
    meta = ckpt_dir / "hf"
    if not (meta / "config.json").is_file():
        raise ConfigError(f"{ckpt_dir} is not a torchrl_post checkpoint (no hf/config.json)")
    out_dir.mkdir(parents=True, exist_ok=True)
    if (meta / WEIGHTS).is_file():
        for f in meta.iterdir():
            shutil.copy2(f, out_dir / f.name)
        return out_dir
    config = AutoConfig.from_pretrained(meta)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    state = {"model": model.state_dict()}
    try:
        dcp.load(state, checkpoint_id=str(ckpt_dir / "actor"))
    except (Exception, CheckpointException) as e:  # CheckpointException is a BaseException
        raise ConfigError(f"{ckpt_dir}: cannot read the actor shards ({' '.join(str(e).split())[:300]})") from e
    model.load_state_dict(state["model"])
    model.save_pretrained(out_dir, safe_serialization=True)
    AutoTokenizer.from_pretrained(meta).save_pretrained(out_dir)
    return out_dir
