"""A co-hosted judge: a local Hugging Face causal LM that scores this rank's responses with `generate`.

`LocalJudge` loads the judge (a model directory, `JudgeConfig.model` when `url` is null) on the rank's device,
frozen; every rank holds its own copy and scores its own samples, so there is no process group here. `score`
renders each sample's prompt (reward/judge.py: JudgeTemplate) with the judge's own tokenizer - its chat template
with the generation prompt, or without one the messages' text joined by newlines - and generates up to
`max_tokens` tokens for at most `batch_size` left-padded prompts at a time: greedy at temperature 0, else sampled
from the full distribution at `temperature` (no top-k or top-p) with a seed drawn from `seed` and the call's
number, so that a run samples the same replies again. The replies are read as RemoteJudge's are
(judge_client.py: `collect_scores`): a reply without a score is a counted failure; a prompt longer than the
judge's max_position_embeddings minus max_tokens fails its sample, and an exception while generating fails its
chunk's samples. `score` itself does not raise.

Deliberately simple: prompts are chunked in the order given (no sorting by length), and the judge's whole
reply is generated before it is read (no stopping at the score).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from torchrl_post.config.errors import ConfigError
from torchrl_post.reward.judge import JudgeConfig, JudgeTemplate
from torchrl_post.reward.judge_client import JudgeScores, collect_scores


class LocalJudge:
    """The judge model at `model_path`, on `device` in `dtype`, scoring with `template`."""

    def __init__(
        self,
        model_path: str,
        template: JudgeTemplate,
        device: torch.device | str,
        parser: str = "boxed",
        labels: dict[str, float] | None = None,
        scale: tuple[float, float] | list[float] | None = None,
        temperature: float = 0.0,
        max_tokens: int = 1024,
        batch_size: int = 32,
        dtype: torch.dtype = torch.float32,
        seed: int = 0,
    ) -> None:
        self.model_path, self.template, self.device = model_path, template, torch.device(device)
        self.parser, self.labels, self.scale = parser, labels, scale
        self.temperature, self.max_tokens, self.batch_size, self.seed = temperature, max_tokens, batch_size, seed
        self.tokenizer: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(model_path)
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype)
        model.to(self.device)  # type: ignore[arg-type]  # transformers' stub types .to() oddly
        self.model: PreTrainedModel | None = model.eval().requires_grad_(False)
        positions = getattr(model.config, "max_position_embeddings", None)
        if positions is not None and max_tokens >= positions:
            raise ConfigError(
                f"reward.judge.max_tokens={max_tokens} leaves no room for a prompt: the judge {model_path} has "
                f"max_position_embeddings={positions}; set reward.judge.max_tokens below it (a reply's length)"
            )
        self.max_prompt_tokens: int | None = positions - max_tokens if positions is not None else None
        """The longest prompt the judge takes: its positions minus the reply's `max_tokens` (None: no limit)."""
        pad = self.tokenizer.pad_token_id
        self.pad_id: int = pad if pad is not None else cast(int, self.tokenizer.eos_token_id)
        self.calls = 0
        """`score` calls so far: the sampling seed of a call is (seed, calls)."""

    @classmethod
    def from_config(cls, cfg: JudgeConfig, device: torch.device | str, batch_size: int = 32) -> LocalJudge:
        assert cfg.url is None, "a co-hosted judge has no reward.judge.url"
        return cls(
            cfg.model,
            JudgeTemplate.load(cfg.template, cfg.system),
            device,
            parser=cfg.parser,
            labels=dict(cfg.labels) if cfg.labels else None,
            scale=list(cfg.scale) if cfg.scale is not None else None,
            temperature=cfg.temperature,
            max_tokens=cfg.max_tokens,
            batch_size=batch_size,
        )

    def __repr__(self) -> str:
        return f"LocalJudge(model={self.model_path!r}, device={str(self.device)!r})"

    def close(self) -> None:
        """Drop the model (its memory goes back to the device's allocator)."""
        self.model = None

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
        assert self.model is not None, "this LocalJudge is closed"
        prompts = [
            self.prompt_ids(self.template.render(q, r, g))
            for q, r, g in zip(questions, responses, ground_truths, strict=True)
        ]
        replies: list[str | None] = [None] * len(prompts)
        errors: list[str | None] = [None] * len(prompts)
        seconds = [0.0] * len(prompts)
        limit = self.max_prompt_tokens
        fits = []
        for i, ids in enumerate(prompts):
            if limit is not None and len(ids) > limit:
                errors[i] = (
                    f"the judge's prompt has {len(ids)} tokens, more than its max_position_embeddings minus "
                    f"max_tokens ({limit})"
                )
            else:
                fits.append(i)
        self.calls += 1
        for start in range(0, len(fits), self.batch_size):
            chunk = fits[start : start + self.batch_size]
            began = time.monotonic()
            try:
                texts = self._generate([prompts[i] for i in chunk], seed=self.seed + 1_000_003 * self.calls + start)
                for i, text in zip(chunk, texts, strict=True):
                    replies[i] = text
            except Exception as e:  # out of memory, a broken template, anything: this chunk fails, the batch goes on
                for i in chunk:
                    errors[i] = f"{type(e).__name__}: {e}"
            for i in chunk:
                seconds[i] = time.monotonic() - began
        return collect_scores(
            replies,
            errors,
            self.parser,
            self.labels,
            self.scale,
            latency_s=sum(seconds) / len(seconds) if seconds else 0.0,
        )

    @torch.no_grad()
    def _generate(self, prompts: list[list[int]], seed: int) -> list[str]:
        """The replies to left-padded `prompts`, special tokens dropped."""
        assert self.model is not None
        width = max(map(len, prompts))
        ids = torch.tensor([[self.pad_id] * (width - len(p)) + p for p in prompts], device=self.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=self.device)
        sample = self.temperature > 0
        eos = self.model.generation_config.eos_token_id
        kwargs: dict[str, Any] = dict(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=self.max_tokens,
            do_sample=sample,
            pad_token_id=self.pad_id,
            eos_token_id=eos if eos is not None else self.tokenizer.eos_token_id,
        )
        if sample:
            kwargs.update(temperature=self.temperature, top_k=0, top_p=1.0)
        with _seeded(self.device, seed):
            out = self.model.generate(**kwargs)  # type: ignore[operator]
        return self.tokenizer.batch_decode(out[:, width:], skip_special_tokens=True)


@contextmanager
def _seeded(device: torch.device, seed: int) -> Iterator[None]:
    """The default random generator of `device` (the one `generate` samples with) seeded with `seed`, and put back
    as it was afterwards: the run's own random state is untouched, on every device."""
    if device.type == "cpu":
        generator = torch.random.default_generator
    else:
        module = torch.get_device_module(device.type)
        generator = module.default_generators[device.index if device.index is not None else module.current_device()]
    state = generator.get_state()
    generator.manual_seed(seed)
    try:
        yield
    finally:
        generator.set_state(state)
