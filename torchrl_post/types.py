"""The data contracts that cross stages: prompts -> generations -> rollout batch -> train batch.

Tensors keep verl's layout: prompts left-padded to a common width P, responses right-padded to R, so
`input_ids = [prompt | response]` is [B, P + R] and response token t sits at column P + t.
Samples are prompt-major: the n samples of prompt i are rows i*n .. i*n + n - 1.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

import torch


@dataclass
class PromptBatch:
    """This rank's prompts for one step (or one validation chunk)."""

    prompt_ids: list[list[int]]
    answers: list[Any]
    data_sources: list[str]
    extra_infos: list[dict[str, Any]]
    uids: list[int]
    """Position of each prompt in the global step batch: the group id of its samples."""

    def __len__(self) -> int:
        return len(self.prompt_ids)


@dataclass
class Generation:
    """What a rollout engine returns, one entry per sample (prompt-major)."""

    response_ids: list[list[int]]
    logprobs: list[list[float]]
    """The engine's logprob of each generated token (after temperature)."""
    finish_reasons: list[str]
    """`stop` (EOS or a stop token) or `length` (hit data.max_response_length)."""


@dataclass
class RolloutBatch:
    """Prompt and response tokens of every sample on this rank, padded into tensors."""

    input_ids: torch.Tensor  # [B, P+R]
    attention_mask: torch.Tensor  # [B, P+R]
    position_ids: torch.Tensor  # [B, P+R]
    response_mask: torch.Tensor  # [B, R] float
    rollout_log_probs: torch.Tensor  # [B, R]
    group_ids: torch.Tensor  # [B]
    finish_reasons: list[str]
    answers: list[Any]
    data_sources: list[str]
    extra_infos: list[dict[str, Any]]

    @property
    def response_width(self) -> int:
        return self.response_mask.shape[1]

    @property
    def responses(self) -> torch.Tensor:
        return self.input_ids[:, -self.response_width :]

    def __len__(self) -> int:
        return self.input_ids.shape[0]


@dataclass
class TrainBatch:
    """What the actor update consumes."""

    input_ids: torch.Tensor  # [B, P+R]
    attention_mask: torch.Tensor  # [B, P+R]
    position_ids: torch.Tensor  # [B, P+R]
    response_mask: torch.Tensor  # [B, R]
    advantages: torch.Tensor  # [B, R]
    old_log_probs: torch.Tensor | None  # [B, R]; None: on-policy, the update's own detached logprobs
    rollout_log_probs: torch.Tensor  # [B, R]
    ref_log_probs: torch.Tensor | None = None  # [B, R]; for the KL loss

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def select(self, idx: torch.Tensor | slice) -> TrainBatch:
        picked: dict[str, Any] = {
            f.name: (None if getattr(self, f.name) is None else getattr(self, f.name)[idx]) for f in fields(self)
        }
        return replace(self, **picked)
