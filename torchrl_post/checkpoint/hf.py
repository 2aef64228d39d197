"""HF export: a checkpoint's policy as safetensors + config + tokenizer that transformers and vLLM load.

    python -m torchrl_post.export <run>/checkpoints/global_step_N <out_dir> [--merge]

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
from transformers import AutoConfig

from torchrl_post.config.errors import ConfigError
from torchrl_post.workers.models import model_class

WEIGHTS = "model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"


def write_hf_meta(model_config: Any, tokenizer: Any, out: Path) -> None:
    """config.json and the tokenizer files (rank 0); a vision-language model's processor (`tokenizer` is then
    the processor: its image processor config and chat template are saved too)."""
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


def write_adapter_config(peft_model: Any, base_path: str, out: Path) -> None:
    """PEFT's adapter_config.json for a LoRA actor (its base model: `model.path`)."""
    config = peft_model.peft_config["default"]
    config.base_model_name_or_path = base_path
    config.save_pretrained(str(out))


def export_checkpoint(ckpt_dir: Path, out_dir: Path, merge: bool = False) -> Path:
    """Write an HF model directory for the policy in `ckpt_dir` (a global_step_N directory). A LoRA
    checkpoint exports as a PEFT adapter directory (adapter_config.json, adapter_model.safetensors), or with
    `merge` as the merged HF model."""
    meta = ckpt_dir / "hf"
    if not (meta / "config.json").is_file():
        raise ConfigError(f"{ckpt_dir} is not a torchrl_post checkpoint (no hf/config.json)")
    lora = (meta / ADAPTER_CONFIG).is_file()
    if merge and not lora:
        raise ConfigError(f"{ckpt_dir}: --merge is for LoRA checkpoints; this one holds the full model already")
    out_dir.mkdir(parents=True, exist_ok=True)
    if (meta / WEIGHTS).is_file() and (merge or not lora):  # gathered (merged) at save time
        for f in meta.iterdir():
            if f.name != ADAPTER_CONFIG:
                shutil.copy2(f, out_dir / f.name)
        return out_dir
    config = AutoConfig.from_pretrained(meta)
    model: Any = model_class(config).from_config(config, dtype=torch.float32)
    if lora:
        from peft import LoraConfig, get_peft_model

        lora_config = LoraConfig.from_pretrained(str(meta))
        base_path = lora_config.base_model_name_or_path  # PEFT renames it to the directory it was built from
        model = get_peft_model(model, lora_config)
        model.peft_config["default"].base_model_name_or_path = base_path
    state = {"model": model.state_dict()}
    try:
        dcp.load(state, checkpoint_id=str(ckpt_dir / "actor"))
    except (Exception, CheckpointException) as e:  # CheckpointException is a BaseException
        raise ConfigError(f"{ckpt_dir}: cannot read the actor shards ({' '.join(str(e).split())[:300]})") from e
    model.load_state_dict(state["model"])
    if lora and merge:
        model = model.merge_and_unload()
    model.save_pretrained(out_dir, safe_serialization=True)
    for f in meta.iterdir():  # tokenizer (and a vision model's processor) files
        if f.suffix in (".json", ".jinja", ".txt", ".model") and f.name not in ("config.json", ADAPTER_CONFIG):
            if not (out_dir / f.name).exists():
                shutil.copy2(f, out_dir / f.name)
    return out_dir
