"""The run's LLM judge (reward.judge): served by URL (`RemoteJudge`) or co-hosted on this rank (`LocalJudge`)."""

from __future__ import annotations

from typing import Protocol

import torch

from torchrl_post.config.schema import JudgeConfig
from torchrl_post.reward.judge_client import JudgeScores, RemoteJudge
from torchrl_post.reward.judge_local import LocalJudge


class Judge(Protocol):
    def score(self, questions: list[str], responses: list[str], ground_truths: list[object]) -> JudgeScores: ...

    def close(self) -> None: ...


def build_judge(cfg: JudgeConfig, device: torch.device, seed: int = 0) -> Judge | None:
    """The judge reward.judge describes (None when off): a server by `url`, else the model at `model` on `device`."""
    if not cfg.enable:
        return None
    if cfg.url is not None:
        return RemoteJudge.from_config(cfg)
    judge = LocalJudge.from_config(cfg, device)
    judge.seed = seed
    return judge
