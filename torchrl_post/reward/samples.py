"""A batch's samples scored where they were generated: the rule (a reward function, or a reward server), and what
the models need of training samples (a reward model's tokens of each conversation, a judge's scores).

    scoring = SampleScoring(reward_fn_for, tokenizer, timeout_s, judge=judge)
    scoring.score(batch, prompts, n)     # batch.scores, reward_errors, reward_extra (+ reward_inputs, judge_scores)

The rollout producer (rollout/groups.py) calls it as each group completes, so anything that reads the scores
(compact filtering, rejection sampling) acts before the group is shipped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from torchrl_post.reward.model_inputs import reward_model_ids
from torchrl_post.reward.scoring import RewardFn, Scores, score_batch
from torchrl_post.types import Batch, PromptBatch


@dataclass(frozen=True)
class SampleScoring:
    reward_fn_for: Callable[[str], RewardFn]
    tokenizer: Any
    """The policy's: responses are decoded with it."""
    timeout_s: float = 0.0
    """reward.timeout_s, per sample."""
    server: Any = None
    """A reward server (reward.server.url; reward/server.py): the rule's scores come from it."""
    reward_tokenizer: Any = None
    """The reward model's (reward_model.enable): each training conversation is re-tokenised with it."""
    max_length: int = 0
    """reward_model.max_length."""
    judge: Any = None
    """The LLM judge (reward.judge.enable): it scores each training sample too."""
    judge_on_error: str = "zero"

    @property
    def models(self) -> bool:
        """A reward model or a judge scores the training samples."""
        return self.reward_tokenizer is not None or self.judge is not None

    def score(self, batch: Batch, prompts: PromptBatch, n: int, training: bool = True) -> None:
        """The rule's score of every sample (`n` per prompt): `batch.scores`, `reward_errors`, per-key
        `reward_extra`; in training, what the models need too (`models_inputs`)."""
        texts = self.tokenizer.batch_decode(batch.responses.tolist(), skip_special_tokens=True)
        rep = [i // n for i in range(len(batch))]
        if self.server is not None:
            scores = self._served(batch, prompts, n)
        else:
            scores = score_batch(
                self.reward_fn_for,
                texts,
                [prompts.answers[j] for j in rep],
                [prompts.data_sources[j] for j in rep],
                [prompts.extra_infos[j] for j in rep],
                self.timeout_s,
            )
        batch.scores, batch.reward_errors, batch.reward_extra = scores.scores, scores.failed, scores.extra
        if training:
            self.models_inputs(batch, prompts, texts, rep)

    def models_inputs(self, batch: Batch, prompts: PromptBatch, texts: list[str], rep: list[int]) -> None:
        """What the models need of training samples whose responses read `texts` (sample i answers prompt `rep[i]`):
        the reward model's tokens of each conversation (`batch.reward_inputs`), the judge's scores (its failures in
        `reward_errors`). An agent's trajectory comes here with its transcript as the response."""
        if batch.reward_errors is None:
            batch.reward_errors = torch.zeros(len(batch))
        tok = self.reward_tokenizer
        if tok is not None:
            rows = [
                reward_model_ids(tok, prompts.messages[j], text, self.max_length)
                for j, text in zip(rep, texts, strict=True)
            ]
            width = max(len(r.ids) for r in rows)
            batch.reward_inputs = torch.tensor([r.ids + [-1] * (width - len(r.ids)) for r in rows], dtype=torch.long)
            batch.reward_extra["reward_model/truncated"] = torch.tensor([float(r.truncated) for r in rows])
        if self.judge is not None:
            self._judged(batch, prompts, texts, rep)

    def _served(self, batch: Batch, prompts: PromptBatch, n: int) -> Scores:
        """The rule's scores from the reward server: one request per prompt's `n` samples, each sent as OpenRLHF
        sends it, the prompt and the prompt + response decoded with their special tokens."""
        parts = []
        for j, ids in enumerate(prompts.prompt_ids):
            prompt = self.tokenizer.decode(ids, skip_special_tokens=False)
            rows = range(j * n, (j + 1) * n)
            responses = [batch.responses[i][batch.response_mask[i].bool()].tolist() for i in rows]
            queries = [prompt + self.tokenizer.decode(r, skip_special_tokens=False) for r in responses]
            parts.append(self.server.score(queries, [prompt] * n, [prompts.answers[j]] * n))
        keys = {k for p in parts for k in p.extra}
        nan = torch.full((n,), float("nan"))
        return Scores(
            torch.cat([p.scores for p in parts]),
            torch.cat([p.failed for p in parts]),
            {k: torch.cat([p.extra.get(k, nan) for p in parts]) for k in keys},
        )

    def _judged(self, batch: Batch, prompts: PromptBatch, texts: list[str], rep: list[int]) -> None:
        """The judge's score of every sample; a sample it failed on scores 0 and counts in reward/errors, and with
        reward.judge.on_error=skip_group its whole group leaves the update (weight 0)."""
        questions = [prompts.questions[j] if prompts.questions else "" for j in rep]
        judged = self.judge.score(questions, texts, [prompts.answers[j] for j in rep])
        batch.judge_scores = judged.scores.float()
        failed = judged.failed.float()
        assert batch.reward_errors is not None
        batch.reward_errors = torch.maximum(batch.reward_errors, failed)
        batch.reward_extra["judge/failed"] = failed
        if self.judge_on_error == "skip_group":
            for j in {rep[i] for i in failed.nonzero().flatten().tolist()}:
                batch.weights[torch.tensor(rep) == j] = 0.0

    def close(self) -> None:
        if self.judge is not None:
            self.judge.close()
