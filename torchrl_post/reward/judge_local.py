"""A co-hosted judge: a judge model served by an in-process engine on this rank, beside the policy's.

`LocalJudge` holds an engine of its own (engines/: `vllm` or `hf`, `reward.judge.engine`, the rollout's by
default) over the judge model (a model directory, `JudgeConfig.model` when `url` is null), built with the run plan's
`judge_engine` spec; every rollout rank holds its own copy and scores its own samples, so there is no process group
here. `score` renders each sample's prompt (reward/judge.py: JudgeTemplate) with the judge's own tokenizer - its
chat template with the generation prompt, or without one the messages' text joined by newlines - and generates
every reply of the batch together through the engine's stepped calls (engines/base.py `generate`): greedy at
temperature 0, else sampled from the full distribution at `temperature`, each sample seeded by the judge's seed, the
call's number and its position, so that a run samples the same replies again. The replies are read as
RemoteJudge's are (judge_client.py: `collect_scores`): a reply without a score is a counted failure; a prompt longer
than the engine's max_model_len minus max_tokens fails its sample, and an exception while generating fails every
sample of the call. `score` itself does not raise.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, cast

from transformers import AutoConfig, AutoTokenizer, PreTrainedTokenizerBase

from torchrl_post.config.errors import ConfigError
from torchrl_post.config.schema import SELF_JUDGE, ModelConfig, RolloutConfig
from torchrl_post.engines.base import EngineSpec, RolloutEngine, SamplingParams, generate
from torchrl_post.reward.judge import JudgeConfig, JudgeTemplate
from torchrl_post.reward.judge_client import JudgeScores, collect_scores


def judge_engine_args(
    cfg: JudgeConfig, spec: EngineSpec, rollout: RolloutConfig, policy: ModelConfig | None = None
) -> tuple[ModelConfig, RolloutConfig, EngineSpec, PreTrainedTokenizerBase]:
    """What the co-hosted judge's engine is built from (engines/build.py `build_engine`): the judge's model
    section, the run's rollout section made the judge's (reward.judge.engine, or the rollout's; one rank;
    reward.judge.max_concurrency sequences; never freed for the update), `spec` (the plan's `judge_engine`) with
    a max_model_len of 0 resolved to the judge's max_position_embeddings, and the judge's tokenizer; a self-judge
    (reward.judge.model=policy) is `policy`, the run's model section. A max_tokens that leaves no room for a prompt
    is a ConfigError."""
    model = policy if policy is not None and cfg.model == SELF_JUDGE else ModelConfig(path=cfg.model)
    tokenizer = AutoTokenizer.from_pretrained(model.path, trust_remote_code=model.trust_remote_code)
    config = AutoConfig.from_pretrained(model.path, trust_remote_code=model.trust_remote_code)
    positions = getattr(config.get_text_config(), "max_position_embeddings", None)
    max_len = spec.max_model_len or positions or 0
    if max_len <= cfg.max_tokens:
        where = f"max_model_len={max_len}" if spec.max_model_len else f"max_position_embeddings={positions}"
        raise ConfigError(
            f"reward.judge.max_tokens={cfg.max_tokens} leaves no room for a prompt: the judge {model.path} has "
            f"{where}; set reward.judge.max_tokens below it (a reply's length)"
        )
    judge_rollout = replace(
        rollout,
        engine=cfg.engine or rollout.engine,
        tensor_parallel_size=1,
        max_num_seqs=cfg.max_concurrency,
        free_cache_engine=False,
    )
    return model, judge_rollout, replace(spec, max_model_len=max_len), tokenizer


class LocalJudge:
    """The judge behind `engine` (its tokenizer `tokenizer`), scoring with `template`; prompts of more than
    `max_prompt_tokens` tokens fail their sample."""

    def __init__(
        self,
        engine: RolloutEngine,
        tokenizer: PreTrainedTokenizerBase,
        template: JudgeTemplate,
        max_prompt_tokens: int,
        parser: str = "boxed",
        labels: dict[str, float] | None = None,
        scale: tuple[float, float] | list[float] | None = None,
        temperature: float = 0.0,
        max_tokens: int = 1024,
        seed: int = 0,
    ) -> None:
        self.engine: RolloutEngine | None = engine
        self.tokenizer, self.template, self.max_prompt_tokens = tokenizer, template, max_prompt_tokens
        self.parser, self.labels, self.scale = parser, labels, scale
        self.temperature, self.max_tokens, self.seed = temperature, max_tokens, seed
        self.calls = 0
        """`score` calls so far: a call's samples are seeded by (seed, calls, position)."""

    @classmethod
    def from_config(
        cls, cfg: JudgeConfig, engine: RolloutEngine, tokenizer: PreTrainedTokenizerBase, max_model_len: int, seed: int
    ) -> LocalJudge:
        """The judge `cfg` names behind `engine` (built by `judge_engine_args`' arguments)."""
        return cls(
            engine,
            tokenizer,
            JudgeTemplate.load(cfg.template, cfg.system),
            max_model_len - cfg.max_tokens,
            parser=cfg.parser,
            labels=dict(cfg.labels) if cfg.labels else None,
            scale=list(cfg.scale) if cfg.scale is not None else None,
            temperature=cfg.temperature,
            max_tokens=cfg.max_tokens,
            seed=seed,
        )

    def __repr__(self) -> str:
        return f"LocalJudge(engine={type(self.engine).__name__})"

    def close(self) -> None:
        """Shut the judge's engine down (its memory goes back to the device's allocator)."""
        if self.engine is not None:
            self.engine.shutdown()
        self.engine = None

    def __enter__(self) -> LocalJudge:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def prompt_ids(self, messages: list[dict[str, str]]) -> list[int]:
        """The token ids the judge reads for one sample's chat messages."""
        tok = self.tokenizer
        if tok.chat_template:
            text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            return list(tok(cast(str, text), add_special_tokens=False)["input_ids"])
        return list(tok("\n".join(m["content"] for m in messages))["input_ids"])

    def score(self, questions: list[Any], responses: list[str], ground_truths: list[Any]) -> JudgeScores:
        """Each response's score in the order given; failures are flagged and counted, never raised."""
        assert self.engine is not None, "this LocalJudge is closed"
        prompts = [
            self.prompt_ids(self.template.render(q, r, g))
            for q, r, g in zip(questions, responses, ground_truths, strict=True)
        ]
        replies: list[str | None] = [None] * len(prompts)
        errors: list[str | None] = [None] * len(prompts)
        limit = self.max_prompt_tokens
        fits = []
        for i, ids in enumerate(prompts):
            if len(ids) > limit:
                errors[i] = (
                    f"the judge's prompt has {len(ids)} tokens, more than its max_model_len minus max_tokens ({limit})"
                )
            else:
                fits.append(i)
        self.calls += 1
        began = time.monotonic()
        if fits:
            params = SamplingParams(
                n=1,
                temperature=self.temperature,
                top_p=1.0,
                top_k=-1,
                max_tokens=self.max_tokens,
                seed=self.seed * 7919 + self.calls,
                progress=False,
            )
            try:
                gen = generate(self.engine, [prompts[i] for i in fits], fits, params)
                texts = self.tokenizer.batch_decode(gen.response_ids, skip_special_tokens=True)
                for i, text in zip(fits, texts, strict=True):
                    replies[i] = text
            except Exception as e:  # out of memory, a broken engine, anything: the call's samples fail, the run goes on
                self.engine.abort([f"batch-{k}-0" for k in range(len(fits))])
                for i in fits:
                    errors[i] = f"{type(e).__name__}: {e}"
        return collect_scores(replies, errors, self.parser, self.labels, self.scale, latency_s=time.monotonic() - began)
