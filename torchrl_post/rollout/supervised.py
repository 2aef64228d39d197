"""Supervised fine-tuning's rollouts (sft.enable): the data's own responses, no engine.

`SupervisedSource` is the actor's `RolloutSource` (rollout/source.py) in an SFT run: a step's batch is this rank's
share of the step's rows (the sampler's, as an RL step's prompts are drawn, so exact resume is the same), each
row its prompt and its response with the loss mask of the trained tokens (data/sft.py). Every sample has weight 1
and advantage 0, which the actor's SFT loss does not read (algos/policy_loss.py `sft_loss`).

Validation is the token negative log-likelihood of the validation rows under the actor (`val/loss`, and per data
source): every actor rank forwards the same number of rows (the last rank's share padded with rows of weight 0),
as FSDP's gathers need.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from torchrl_post.data.dataset import PromptDataset
from torchrl_post.data.sampler import SamplerHeld, ShardedBatchSampler
from torchrl_post.data.sft import SftDataset
from torchrl_post.engines.batch import pad_samples
from torchrl_post.program import VAL_TOTALS
from torchrl_post.types import Batch


def sft_batch(data: SftDataset, rows: list[int], uids: list[int], pad_id: int, live: list[bool] | None = None) -> Batch:
    """The rows' prompts and responses as one batch: loss mask from the data (0 on a row not `live`), advantage 0."""
    live = live or [True] * len(rows)
    masks = [[float(m) * float(on) for m in data.response_masks[i]] for i, on in zip(rows, live, strict=True)]
    batch = pad_samples(
        [data.prompt_ids[i] for i in rows],
        [data.response_ids[i] for i in rows],
        [[0.0] * len(data.response_ids[i]) for i in rows],
        masks,
        uids,
        ["stop"] * len(rows),
        pad_id,
    )
    batch.advantages = torch.zeros_like(batch.loss_mask)
    batch.scores = torch.zeros(len(rows))
    batch.reward_errors = torch.zeros(len(rows))
    return batch


class SupervisedSource(SamplerHeld):
    """The data's responses as each step's batch; validation as the actor's loss on the validation rows."""

    def __init__(
        self,
        data: SftDataset,
        sampler: ShardedBatchSampler,
        pad_id: int,
        log_probs: Callable[[Batch], torch.Tensor],
        share: int,
        shares: int,
        val_batch_size: int = 0,
    ) -> None:
        """`log_probs`: the actor's (workers/actor.py); `share` of `shares`: this rank's part of the validation set."""
        self.data, self.sampler, self.pad_id, self.log_probs = data, sampler, pad_id, log_probs
        self.share, self.shares, self.val_batch_size = share, shares, val_batch_size
        self._metrics: dict[str, float] = {}

    def next_batch(self, step: int) -> Batch:
        rows, uids = self.sampler.next_batch()
        batch = sft_batch(self.data, rows, uids, self.pad_id)
        self._metrics = {"data/truncated_responses": float(self.data.num_truncated)}
        return batch

    @torch.no_grad()
    def validation_totals(self, data: PromptDataset, sources: list[str]) -> torch.Tensor:
        """[VAL_TOTALS, sources]: this rank's summed token NLL, trained tokens and rows of each data source."""
        assert isinstance(data, SftDataset), "an SFT run loads its validation rows with their responses"
        out = torch.zeros(VAL_TOTALS, len(sources), dtype=torch.float64)
        per_rank = -(-len(data) // self.shares)
        mine = [self.share + k * self.shares for k in range(per_rank)]
        chunk = self.val_batch_size or per_rank
        for start in range(0, per_rank, chunk):
            picked = mine[start : start + chunk]
            live = [i < len(data) for i in picked]
            rows = [i if on else 0 for i, on in zip(picked, live, strict=True)]
            batch = sft_batch(data, rows, list(range(len(rows))), self.pad_id, live)
            logp = self.log_probs(batch).double().cpu()
            mask = batch.loss_mask.double()
            nll, tokens = -(logp * mask).sum(-1), mask.sum(-1)
            for j, (i, on) in enumerate(zip(rows, live, strict=True)):
                if on:
                    col = sources.index(data.data_sources[i])
                    out[:, col] += torch.stack([nll[j], tokens[j], torch.ones((), dtype=torch.float64)])
        return out
