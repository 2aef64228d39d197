"""A judge served elsewhere: an OpenAI-compatible chat-completions client that scores a batch of responses.

`RemoteJudge.score` renders each sample's prompt (reward/judge.py: JudgeTemplate), sends it with at most
`max_concurrency` requests in flight (one thread pool per judge), retries connection errors, timeouts, HTTP 429 and
5xx with exponential backoff (other HTTP errors fail at once), and reads the score from the reply (parse_score).
A sample without a reply, or whose reply holds no score, is failed (scored 0 here; what a failure costs is the
caller's choice, JudgeConfig.on_error) and counted; `score` itself does not raise. The API key is read from the
environment variable the config names and is replaced by `<redacted>` in every error text this module keeps or logs.
Standard library only (urllib): one POST per sample, no streaming.
"""

from __future__ import annotations

import json
import logging
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http.client import HTTPException
from typing import Any

import torch

from torchrl_post.config.errors import ConfigError
from torchrl_post.reward.judge import JudgeConfig, JudgeTemplate, parse_score

log = logging.getLogger(__name__)
MAX_BACKOFF_S = 10.0


@dataclass
class JudgeScores:
    """A batch's judge scores, from either judge (RemoteJudge here, LocalJudge in reward/judge_local.py)."""

    scores: torch.Tensor  # [B] float32, in [0, 1] with a scale; 0.0 where failed
    failed: torch.Tensor  # [B] bool: no reply (after the retries), or a reply without a score
    replies: list[str]
    """The judge's reply per sample ("" where none)."""
    retries: int
    """Requests sent again after a retryable failure, summed over the batch (0 for a co-hosted judge)."""
    errors: int
    """Samples without a reply: the request failed after its retries or its reply was malformed (remote); the
    generation raised or the prompt was too long for the judge (co-hosted)."""
    parse_failures: int
    """Samples whose reply held no score."""
    latency_s: float
    """Mean seconds per sample from its first request to its reply or last failure, backoff included (co-hosted:
    its chunk's generation)."""
    first_error: str | None = None
    """The first failed sample's error (key redacted), for a log line."""

    def metrics(self) -> dict[str, float]:
        return {
            "reward/judge/errors": float(self.errors),
            "reward/judge/parse_failures": float(self.parse_failures),
            "reward/judge/retries": float(self.retries),
            "reward/judge/latency_s": self.latency_s,
        }


def collect_scores(
    replies: list[str | None],
    errors: list[str | None],
    parser: str,
    labels: dict[str, float] | None,
    scale: tuple[float, float] | list[float] | None,
    retries: int = 0,
    latency_s: float = 0.0,
) -> JudgeScores:
    """A batch's JudgeScores from each sample's reply (None where there is none, and `errors` says why), read with
    `parser`; a reply without a score is a parse failure. Logs one warning line per kind of failure. Both judges,
    remote and co-hosted (reward/judge_local.py), end their `score` here."""
    values = [parse_score(text, parser, labels, scale) if text is not None else None for text in replies]
    unparsed = [text for text, v in zip(replies, values, strict=True) if text is not None and v is None]
    failures = [e for e in errors if e is not None]
    if unparsed:
        log.warning("judge: %d replies without a score (scored 0), e.g. %r", len(unparsed), unparsed[0][:300])
    if failures:
        log.warning("judge failed on %d of %d samples (scored 0): %s", len(failures), len(replies), failures[0])
    return JudgeScores(
        scores=torch.tensor([0.0 if v is None else v for v in values], dtype=torch.float32),
        failed=torch.tensor([v is None for v in values], dtype=torch.bool),
        replies=[text or "" for text in replies],
        retries=retries,
        errors=len(failures),
        parse_failures=len(unparsed),
        latency_s=latency_s,
        first_error=failures[0] if failures else None,
    )


@dataclass
class _Reply:
    text: str | None
    error: str | None
    retries: int
    seconds: float


class _Retryable(Exception):
    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        """The server's Retry-After, in seconds, if it sent one."""


class RemoteJudge:
    """An OpenAI-compatible judge server (`base_url` such as http://host:8000/v1) scoring with `template`."""

    def __init__(
        self,
        base_url: str,
        model: str,
        template: JudgeTemplate,
        parser: str = "boxed",
        labels: dict[str, float] | None = None,
        scale: tuple[float, float] | list[float] | None = None,
        api_key_env: str | None = None,
        timeout_s: float = 60.0,
        max_concurrency: int = 16,
        max_retries: int = 3,
        temperature: float = 0.0,
        max_tokens: int = 1024,
        backoff_s: float = 0.5,
    ) -> None:
        base = base_url.rstrip("/")
        self.url = base if base.endswith("/chat/completions") else f"{base}/chat/completions"
        self.model, self.template, self.parser = model, template, parser
        self.labels, self.scale = labels, scale
        self.api_key_env, self.timeout_s, self.max_retries = api_key_env, timeout_s, max_retries
        self.temperature, self.max_tokens, self.backoff_s = temperature, max_tokens, backoff_s
        self._key: str | None = None
        if api_key_env is not None:
            self._key = os.environ.get(api_key_env)
            if not self._key:
                raise ConfigError(
                    f"reward.judge.api_key_env={api_key_env!r}: that environment variable is not set; export it "
                    "or set null"
                )
        self._pool = ThreadPoolExecutor(max_concurrency, thread_name_prefix="judge")

    @classmethod
    def from_config(cls, cfg: JudgeConfig) -> RemoteJudge:
        assert cfg.url is not None, "a remote judge needs reward.judge.url"
        return cls(
            cfg.url,
            cfg.model,
            JudgeTemplate.load(cfg.template, cfg.system),
            parser=cfg.parser,
            labels=dict(cfg.labels) if cfg.labels else None,
            scale=list(cfg.scale) if cfg.scale is not None else None,
            api_key_env=cfg.api_key_env,
            timeout_s=cfg.timeout_s,
            max_concurrency=cfg.max_concurrency,
            max_retries=cfg.max_retries,
            temperature=cfg.temperature,
            max_tokens=cfg.max_tokens,
        )

    def __repr__(self) -> str:
        return f"RemoteJudge(url={self.url!r}, model={self.model!r}, api_key_env={self.api_key_env!r})"

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> RemoteJudge:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def score(self, questions: list[Any], responses: list[str], ground_truths: list[Any]) -> JudgeScores:
        """Each response's score in the order given; failures are flagged and counted, never raised."""
        prompts = [self.template.render(q, r, g) for q, r, g in zip(questions, responses, ground_truths, strict=True)]
        replies = [f.result() for f in [self._pool.submit(self._ask, m) for m in prompts]]
        return collect_scores(
            [self._redact(r.text) if r.error is None and r.text is not None else None for r in replies],
            [r.error for r in replies],
            self.parser,
            self.labels,
            self.scale,
            retries=sum(r.retries for r in replies),
            latency_s=sum(r.seconds for r in replies) / len(replies) if replies else 0.0,
        )

    def _redact(self, text: str) -> str:
        return text.replace(self._key, "<redacted>") if self._key else text

    def _ask(self, messages: list[dict[str, str]]) -> _Reply:
        """One sample's request with its retries; whatever goes wrong becomes the reply's error, redacted."""
        body = {
            "model": self.model,
            "messages": messages,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
        }
        headers = {"Authorization": f"Bearer {self._key}"} if self._key else {}
        reply = post_json(self.url, body, self.timeout_s, self.max_retries, self.backoff_s, headers, self._redact)
        if reply.error is not None:
            return _Reply(None, reply.error, reply.retries, reply.seconds)
        try:
            content = reply.data["choices"][0]["message"].get("content")
            if content is not None and not isinstance(content, str):
                raise ValueError(f"reply content is a {type(content).__name__}, not text")
        except Exception as e:  # a malformed reply: this sample fails, the batch goes on
            return _Reply(None, self._redact(f"{type(e).__name__}: {e}"), reply.retries, reply.seconds)
        return _Reply(content or "", None, reply.retries, reply.seconds)


@dataclass
class Posted:
    """One JSON request's outcome: the reply's JSON, or what went wrong (after the retries)."""

    data: Any
    error: str | None
    retries: int
    seconds: float
    """From the first request to the reply or the last failure, backoff included."""


def post_json(
    url: str,
    body: Any,
    timeout_s: float,
    max_retries: int,
    backoff_s: float = 0.5,
    headers: dict[str, str] | None = None,
    redact: Callable[[str], str] = lambda text: text,
) -> Posted:
    """POST `body` as JSON to `url`; connection errors, timeouts, HTTP 429 and 5xx are retried `max_retries` times
    with exponential backoff (at least the server's Retry-After); any other failure ends at once. Never raises:
    the error's text, passed through `redact`, is in the result."""
    start, retries = time.monotonic(), 0
    while True:
        try:
            return Posted(_post(url, body, timeout_s, headers or {}, redact), None, retries, time.monotonic() - start)
        except _Retryable as e:
            if retries >= max_retries:
                return Posted(None, redact(f"{e} (after {retries} retries)"), retries, time.monotonic() - start)
            time.sleep(min(MAX_BACKOFF_S, max(backoff_s * 2**retries, e.retry_after or 0.0)))
            retries += 1
        except Exception as e:  # a malformed reply, a 4xx, anything else
            return Posted(None, redact(f"{type(e).__name__}: {e}"), retries, time.monotonic() - start)


def _post(url: str, body: Any, timeout_s: float, headers: dict[str, str], redact: Callable[[str], str]) -> Any:
    """The reply's JSON; raises _Retryable for what a retry may fix."""
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json", **headers}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as e:
        detail = redact(" ".join(e.read().decode("utf-8", "replace").split()))[:300]  # redact, then cut
        message = f"HTTP {e.code} from {url}: {detail}"
        if e.code == 429 or e.code >= 500:
            after = (e.headers.get("Retry-After") if e.headers else None) or ""
            raise _Retryable(message, float(after) if after.replace(".", "", 1).isdigit() else None) from None
        raise RuntimeError(message) from None
    except (urllib.error.URLError, HTTPException, OSError) as e:  # refused, reset, DNS, timed out
        reason = e.reason if isinstance(e, urllib.error.URLError) else e
        raise _Retryable(f"{type(reason).__name__} from {url}: {reason}") from None
