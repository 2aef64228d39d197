"""The rollout source: an engine, the training prompts it draws from, and how samples are scored, on the side
that generated them, so anything that filters a group acts before it is shipped.

`EngineSource` holds what the producer (rollout/groups.py) draws, samples and scores with, and runs validation.
What a step's actor sees is a `RolloutSource`: rollout/local.py's on the engine's own ranks, rollout/remote.py's
`RemoteRollouts` on others. It takes its settings (`SourceSettings`: the rollout section and the plan's values) and
an agent loop already built.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.distributed as dist

from torchrl_post.agent.base import Trajectory, trajectories_to_batch
from torchrl_post.config.schema import RejectionSampleConfig, RewardConfig, RolloutConfig
from torchrl_post.data.dataset import PromptDataset
from torchrl_post.data.sampler import ShardedBatchSampler
from torchrl_post.engines.base import RolloutEngine, SamplingParams, generate
from torchrl_post.engines.batch import collate
from torchrl_post.logging.timing import Timer
from torchrl_post.multimodal.vision import VisionSpec, image_inputs
from torchrl_post.program import VAL_TOTALS
from torchrl_post.reward import score_batch
from torchrl_post.reward.model_inputs import reward_model_ids
from torchrl_post.reward.scoring import RewardFn, Scores
from torchrl_post.rollout.filters import compact_filter
from torchrl_post.types import Batch, PromptBatch

if TYPE_CHECKING:
    from torchrl_post.rollout.episodes import Episodes


@dataclass(frozen=True)
class SourceSettings:
    """What the rollout source reads: the rollout section and the run plan's values."""

    rollout: RolloutConfig
    group_size: int
    """Samples per prompt (the plan's group size)."""
    prompts_per_step: int
    max_response_length: int
    seed: int
    rejection: RejectionSampleConfig
    masked: tuple[str, ...]
    """Termination reasons whose samples compact filtering masks (rollout.filters.masked_reasons)."""
    reward_timeout_s: float
    val_batch_size: int
    log_val_generations: int
    reward: RewardConfig = field(default_factory=RewardConfig)
    """How training scores become rewards (reward.overlong_buffer, reward.clip: reward/shaping.py)."""
    mixes_rewards: bool = False
    """The plan's mixes_rewards: the actor's ranks mix and shape the training scores (trainer.py), not the producer."""
    reward_weights: dict[str, float] = field(default_factory=dict)
    """The plan's reward_weights and reward_combine: with rejection sampling, a group is uniform by the mix of the
    sources scored as it finishes (the rule, the judge), as the actor's ranks will mix them."""
    reward_combine: str = "sum_then_normalize"
    reward_tokenizer: Any = None
    """The reward model's tokenizer (reward_model.enable): each training sample's conversation is re-tokenised
    with it into `batch.reward_inputs` as its group is scored."""
    reward_max_length: int = 0
    judge: Any = None
    """The LLM judge (reward.judge.enable; build.py `build_judge`): each training sample is scored by it too, into
    `batch.judge_scores`, as its group is scored."""
    judge_on_error: str = "zero"
    reward_server: Any = None
    """A reward server (reward.server.url; reward/server.py): the rule's scores come from it."""


class EpisodeRunner(Protocol):
    """The agent loop as the source drives it (agent/loop.py: AgentLoop)."""

    env_seconds: float

    def run(self, tasks: list[tuple[int, dict[str, Any]]], params: SamplingParams) -> list[Trajectory]:
        """`params.n` episodes per task, driven to their end (validation)."""
        ...

    def episodes(self, recompute: bool = False, version: int = 0, mirrored: bool = False) -> Episodes:
        """Episodes stepped one engine step at a time (rollout/groups.py); `mirrored`: run alike on every rank of
        a tensor-parallel engine."""
        ...


def episode_tasks(prompts: PromptBatch) -> list[tuple[int, dict[str, Any]]]:
    """Each prompt as an agent task: (its uid, the row's answer, data source, question and extra fields)."""
    return [
        (uid, {"answer": ans, "data_source": src, "question": q, **extra})
        for uid, ans, src, q, extra in zip(
            prompts.uids,
            prompts.answers,
            prompts.data_sources,
            prompts.questions or [""] * len(prompts),
            prompts.extra_infos,
            strict=True,
        )
    ]


class RolloutSource(Protocol):
    """What the actor's step asks of its rollouts, whether generated here or on rollout ranks."""

    def next_batch(self, step: int) -> Batch:
        """This rank's share of step `step`'s samples, scored (and filtered, where a filter is set)."""
        ...

    def metrics(self) -> dict[str, float]:
        """rollout/* (and timing) metrics of the last batch."""
        ...

    @property
    def epoch(self) -> int: ...

    def validation_totals(self, data: PromptDataset, sources: list[str]) -> torch.Tensor: ...

    @property
    def val_samples(self) -> list[dict[str, Any]]:
        """The last validation's first samples (trainer.log_val_generations), on the rank that kept them."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def shutdown(self, process_ends: bool = False) -> None: ...


class EngineSource:
    def __init__(
        self,
        settings: SourceSettings,
        engine: RolloutEngine,
        tokenizer: Any,
        data: PromptDataset,
        reward_fn_for: Any,
        sampler: ShardedBatchSampler,
        timer: Timer,
        *,
        engine_index: int,
        n_engines: int,
        engine_leader: bool,
        engine_group: dist.ProcessGroup | None = None,
        processor: Any = None,
        vision: VisionSpec | None = None,
        episodes: EpisodeRunner | None = None,
        stepwise: bool = False,
    ) -> None:
        """`sampler` draws this engine's prompts (the ranks of a tensor-parallel engine, `engine_group`, draw
        alike); `engine_leader`: the first rank of its engine, which counts the engine's validation samples.
        `episodes`: the agent loop over this engine (agent.env set), trained per step with `stepwise`
        (algorithm.stepwise_advantage.enable)."""
        self.settings, self.engine, self.tokenizer, self.data = settings, engine, tokenizer, data
        self.reward_fn_for: RewardFn = reward_fn_for
        self.sampler, self.timer = sampler, timer
        self.engine_index, self.n_engines, self.engine_leader = engine_index, n_engines, engine_leader
        self.engine_group = engine_group
        self.pad_id = tokenizer.pad_token_id
        self.processor, self.vision = processor, vision
        self.loop, self.stepwise = episodes, stepwise
        self.masked = list(settings.masked)
        self.rejection = settings.rejection
        self.val_samples: list[dict[str, Any]] = []  # the last validation's first samples (log_val_generations)

    # ---- one step ---------------------------------------------------------------------------------
    @property
    def epoch(self) -> int:
        return self.sampler.epoch

    def _episodes(self, prompts: PromptBatch, params: SamplingParams) -> Batch:
        """`params.n` agent trajectories per prompt, one row each, turns of all of them decoding together."""
        assert self.loop is not None
        env_before = self.loop.env_seconds
        trajectories = self.loop.run(episode_tasks(prompts), params)
        self.timer.seconds["env"] = self.loop.env_seconds - env_before
        batch = trajectories_to_batch(trajectories, self.pad_id)
        if self.masked:
            compact_filter(batch, self.masked)
        return batch

    def sampling(self, step: int, validation: bool) -> SamplingParams:
        r, v = self.settings.rollout, self.settings.rollout.val_kwargs
        sample = v.do_sample and v.temperature > 0  # validation: greedy unless val_kwargs.do_sample
        return SamplingParams(
            n=v.n if validation else self.settings.group_size,
            temperature=(v.temperature if sample else 0.0) if validation else r.temperature,
            top_p=(v.top_p if sample else 1.0) if validation else r.top_p,
            top_k=(v.top_k if sample else -1) if validation else r.top_k,
            max_tokens=self.settings.max_response_length,
            seed=self.settings.seed * 7919 + step,
        )

    def prompt_batch(self, idx: list[int], uids: list[int], data: PromptDataset | None = None) -> PromptBatch:
        d = data or self.data
        images = [d.images[i] for i in idx] if d.images else []
        if d.mm_inputs:
            mm = [d.mm_inputs[i] for i in idx]
        else:  # data.return_multi_modal_inputs=false: this batch's images are processed now
            mm = [image_inputs(self.processor, imgs) for imgs in images]
        return PromptBatch(
            [d.prompt_ids[i] for i in idx],
            [d.answers[i] for i in idx],
            [d.data_sources[i] for i in idx],
            [d.extra_infos[i] for i in idx],
            uids,
            [d.questions[i] for i in idx] if d.questions else [],
            images,
            mm,
            [d.messages[i] for i in idx] if d.messages else [],
        )

    def generate(self, prompts: PromptBatch, params: SamplingParams) -> Batch:
        """`params.n` samples of each prompt through this engine, as one batch (validation)."""
        gen = generate(self.engine, prompts.prompt_ids, prompts.uids, params, prompts.images or None)
        return collate(prompts, gen, params.n, self.pad_id, self.vision)

    def score(self, batch: Batch, prompts: PromptBatch, n: int, training: bool = True) -> None:
        """The reward of every sample (`n` per prompt): `batch.scores`, `reward_errors`, per-key `reward_extra`;
        in training with a reward model, its tokens of each conversation (`batch.reward_inputs`)."""
        texts = self.tokenizer.batch_decode(batch.responses.tolist(), skip_special_tokens=True)
        rep = [i // n for i in range(len(batch))]
        if self.settings.reward_server is not None:
            scores = self._served(batch, prompts, n)
        else:
            scores = score_batch(
                self.reward_fn_for,
                texts,
                [prompts.answers[j] for j in rep],
                [prompts.data_sources[j] for j in rep],
                [prompts.extra_infos[j] for j in rep],
                self.settings.reward_timeout_s,
            )
        batch.scores, batch.reward_errors, batch.reward_extra = scores.scores, scores.failed, scores.extra
        if training:
            self.score_models(batch, prompts, texts, rep)

    @property
    def scores_models(self) -> bool:
        """A reward model or a judge scores the training samples."""
        return self.settings.reward_tokenizer is not None or self.settings.judge is not None

    def score_models(self, batch: Batch, prompts: PromptBatch, texts: list[str], rep: list[int]) -> None:
        """What the models need of training samples whose responses read `texts` (sample i answers prompt
        `rep[i]`): the reward model's tokens of each conversation (`batch.reward_inputs`), the judge's scores (with
        its failures in `reward_errors`). An agent's trajectory comes here with its transcript as the response."""
        if batch.reward_errors is None:
            batch.reward_errors = torch.zeros(len(batch))
        tok = self.settings.reward_tokenizer
        if tok is not None:
            rows = [
                reward_model_ids(tok, prompts.messages[j], text, self.settings.reward_max_length)
                for j, text in zip(rep, texts, strict=True)
            ]
            width = max(len(r.ids) for r in rows)
            batch.reward_inputs = torch.tensor([r.ids + [-1] * (width - len(r.ids)) for r in rows], dtype=torch.long)
            batch.reward_extra["reward_model/truncated"] = torch.tensor([float(r.truncated) for r in rows])
        if self.settings.judge is not None:
            self._judged(batch, prompts, texts, rep)

    def _served(self, batch: Batch, prompts: PromptBatch, n: int) -> Scores:
        """The rule's scores from the reward server (reward.server.url): one request per prompt's `n` samples, each
        sent as OpenRLHF sends it, the prompt and the prompt + response decoded with their special tokens."""
        parts = []
        for j, ids in enumerate(prompts.prompt_ids):
            prompt = self.tokenizer.decode(ids, skip_special_tokens=False)
            rows = range(j * n, (j + 1) * n)
            responses = [batch.responses[i][batch.response_mask[i].bool()].tolist() for i in rows]
            queries = [prompt + self.tokenizer.decode(r, skip_special_tokens=False) for r in responses]
            parts.append(self.settings.reward_server.score(queries, [prompt] * n, [prompts.answers[j]] * n))
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
        judged = self.settings.judge.score(questions, texts, [prompts.answers[j] for j in rep])
        batch.judge_scores = judged.scores.float()
        failed = judged.failed.float()
        assert batch.reward_errors is not None
        batch.reward_errors = torch.maximum(batch.reward_errors, failed)
        batch.reward_extra["judge/failed"] = failed
        if self.settings.judge_on_error == "skip_group":
            for j in {rep[i] for i in failed.nonzero().flatten().tolist()}:
                batch.weights[torch.tensor(rep) == j] = 0.0

    # ---- validation ---------------------------------------------------------------------------------
    @torch.no_grad()
    def validation_totals(self, data: PromptDataset, sources: list[str]) -> torch.Tensor:
        """[VAL_TOTALS, sources]: score sums, sample counts and sums of each prompt's best score over its
        rollout.val_kwargs.n samples, for this engine's share of the validation set (greedy by default); zeros
        on the other ranks of a tensor-parallel engine. The first `trainer.log_val_generations` samples of the
        first engine are kept in `val_samples`."""
        totals = torch.zeros(VAL_TOTALS, len(sources), dtype=torch.float64)
        self.val_samples = []
        keep = self.settings.log_val_generations if self.engine_index == 0 and self.engine_leader else 0
        mine = list(range(self.engine_index, len(data), self.n_engines))
        chunk = self.settings.val_batch_size or max(1, len(mine))
        params = self.sampling(0, validation=True)
        for start in range(0, len(mine), chunk):
            idx = mine[start : start + chunk]
            prompts = self.prompt_batch(idx, idx, data)
            if self.loop is not None:
                batch = self._episodes(prompts, params)
            else:
                batch = self.generate(prompts, params)
                self.score(batch, prompts, params.n, training=False)
            if not self.engine_leader:
                continue
            assert batch.scores is not None
            n = params.n
            per_prompt = batch.scores.view(len(prompts), n)
            for row, src in zip(per_prompt, prompts.data_sources, strict=True):
                j = sources.index(src)
                totals[0, j] += row.sum()
                totals[1, j] += n
                totals[2, j] += row.max()
            if len(self.val_samples) < keep:
                self.val_samples += self._samples(batch, prompts, n, keep - len(self.val_samples))
        return totals

    def _samples(self, batch: Batch, prompts: PromptBatch, n: int, k: int) -> list[dict[str, Any]]:
        """The first `k` validation samples, readable: prompt, response, answer, data source, score."""
        assert batch.scores is not None
        out = []
        for i in range(min(k, len(batch))):
            p = i // n
            out.append(
                {
                    "prompt": self.tokenizer.decode(prompts.prompt_ids[p]),
                    "response": self.tokenizer.decode(batch.responses[i][batch.response_mask[i].bool()].tolist()),
                    "answer": prompts.answers[p],
                    "data_source": prompts.data_sources[p],
                    "score": float(batch.scores[i]),
                }
            )
        return out

    def shutdown(self, process_ends: bool = False) -> None:
        if self.settings.judge is not None:
            self.settings.judge.close()
        self.engine.shutdown(process_ends)
