"""The sharded reward model against transformers' own forward: scores equal a single-process
AutoModelForSequenceClassification forward of each row alone, with uneven rows per rank (a rank past its rows runs
padding forwards) and micro-batches that split them."""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from transformers import AutoConfig, AutoModelForSequenceClassification

from torchrl_post.config.schema import Config
from torchrl_post.types import Batch
from torchrl_post.workers.reward_model import RewardModel


def _classifier(model_dir: str, out: Path) -> Path:
    """model_dir's architecture as a sequence classifier (one label, a random head), the same on every rank."""
    config = AutoConfig.from_pretrained(model_dir)
    config.num_labels, config.pad_token_id = 1, 0
    config.architectures = [type(AutoModelForSequenceClassification.from_config(config)).__name__]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        model = AutoModelForSequenceClassification.from_config(config)
    # save_pretrained writes on the first rank of a process group only: each rank writes its own copy
    out.mkdir()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, out / "model.safetensors")
    config.to_json_file(out / "config.json")
    return out


def _rows(rank: int, world: int, vocab: int) -> list[list[int]]:
    """Rank r's conversations: 5 - r rows (uneven across ranks) of 3..14 tokens, none the pad id 0."""
    gen = torch.Generator().manual_seed(100 + rank)
    lengths = torch.randint(3, 15, (5 - rank % 2,), generator=gen)
    return [torch.randint(1, vocab, (int(n),), generator=gen).tolist() for n in lengths]


def reward_model_parity(cfg: Config, mesh: DeviceMesh, rank: int, world: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        path = _classifier(cfg.model.path, Path(tmp) / "rm")
        cfg.reward_model.enable, cfg.reward_model.model.path = True, str(path)
        cfg.reward_model.micro_batch_size_per_gpu = 2  # micro-batches split a rank's rows; ranks differ in count
        rm = RewardModel(cfg.model, cfg.reward_model, cfg.actor.fsdp, mesh, torch.device("cpu"))
        vocab = AutoConfig.from_pretrained(path).vocab_size
        rows = _rows(rank, world, vocab)
        width = max(map(len, rows))
        ids = torch.tensor([r + [-1] * (width - len(r)) for r in rows])
        batch = Batch(
            input_ids=torch.zeros(len(rows), 2, dtype=torch.long),
            attention_mask=torch.ones(len(rows), 2, dtype=torch.long),
            position_ids=torch.zeros(len(rows), 2, dtype=torch.long),
            loss_mask=torch.ones(len(rows), 1),
            rollout_log_probs=torch.zeros(len(rows), 1),
            group_ids=torch.zeros(len(rows), dtype=torch.long),
            termination=torch.zeros(len(rows), dtype=torch.long),
            weights=torch.ones(len(rows)),
            reward_inputs=ids,
        )
        got = rm.scores(batch)
        sharded = any(isinstance(p, DTensor) for p in rm.model.parameters())
        plain = AutoModelForSequenceClassification.from_pretrained(path).eval()
        with torch.no_grad():
            want = torch.cat([plain(input_ids=torch.tensor([r])).logits[:, 0] for r in rows])
        cfg.reward_model.enable = False
    return {"rm_max_diff": float((got - want).abs().max()), "rm_rows": len(rows), "rm_sharded": sharded}
