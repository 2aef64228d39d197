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

from torchrl_post.agent.base import trajectories_to_batch
from torchrl_post.config.schema import RejectionSampleConfig, RewardConfig, RolloutConfig
from torchrl_post.data.dataset import PromptDataset
from torchrl_post.data.sampler import ShardedBatchSampler
from torchrl_post.engines.base import RolloutEngine, SamplingParams, generate
from torchrl_post.engines.batch import collate
from torchrl_post.logging.timing import Timer
from torchrl_post.multimodal.vision import VisionSpec
from torchrl_post.program import VAL_TOTALS
from torchrl_post.reward.samples import SampleScoring
from torchrl_post.types import Batch, PromptBatch

if TYPE_CHECKING:
    from torchrl_post.agent.loop import AgentLoop


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
        scoring: SampleScoring,
        sampler: ShardedBatchSampler,
        timer: Timer,
        *,
        engine_index: int,
        n_engines: int,
        engine_leader: bool,
        engine_group: dist.ProcessGroup | None = None,
        processor: Any = None,
        vision: VisionSpec | None = None,
        episodes: AgentLoop | None = None,
        stepwise: bool = False,
    ) -> None:
        """`scoring`: how this engine's samples are scored (reward/samples.py: the rule or a reward server, what a
        reward model and a judge need); `sampler` draws this engine's prompts (the ranks of a tensor-parallel
        engine, `engine_group`, draw alike); `engine_leader`: the first rank of its engine, which counts the
        engine's validation samples. `episodes`: the agent loop over this engine (agent.env set), trained per step
        with `stepwise` (algorithm.stepwise_advantage.enable)."""
        self.settings, self.engine, self.tokenizer, self.data = settings, engine, tokenizer, data
        self.scoring = scoring
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
            prompts = data.batch(idx, idx, self.processor)
            if self.loop is not None:  # params.n agent trajectories per prompt, one row each
                batch = trajectories_to_batch(self.loop.run(episode_tasks(prompts), params), self.pad_id)
            else:
                gen = generate(self.engine, prompts.prompt_ids, prompts.uids, params, prompts.images or None)
                batch = collate(prompts, gen, params.n, self.pad_id, self.vision)
                self.scoring.score(batch, prompts, params.n, training=False)
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
        self.scoring.close()
        self.engine.shutdown(process_ends)
