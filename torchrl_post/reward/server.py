"""A reward server: the rule's scores from an HTTP service, OpenRLHF's remote reward protocol (`--reward.remote_url`).

Each group is one request, as it finishes: `POST <url>` with the JSON

    {"query": [prompt + response, ...], "prompts": [prompt, ...], "labels": [ground truth, ...]}

(the query and the prompt decoded with their special tokens, as OpenRLHF sends them) and a reply of
`{"rewards": [...]}` (or `"scores"`, or a bare list), one number per query; numeric lists under `"extra_logs"` are
logged beside the reward (`reward_extra`). With several URLs the groups go round-robin. A request is retried as the
judge's are (reward/judge_client.py `post_json`: connection errors, timeouts, HTTP 429 and 5xx); a group without a
usable reply scores 0 and counts in `reward/errors`, and the run goes on.
"""

from __future__ import annotations

import itertools
import logging
import math
from typing import Any

import torch

from torchrl_post.config.schema import RewardServerConfig
from torchrl_post.reward.judge_client import post_json
from torchrl_post.reward.scoring import Scores

log = logging.getLogger(__name__)


class RewardServer:
    def __init__(self, urls: list[str], timeout_s: float = 180.0, max_retries: int = 5, backoff_s: float = 0.5):
        self.urls, self.timeout_s, self.max_retries, self.backoff_s = urls, timeout_s, max_retries, backoff_s
        self._next = itertools.cycle(urls)
        self.retries = 0
        """Requests sent again after a retryable failure, so far."""

    @classmethod
    def from_config(cls, cfg: RewardServerConfig) -> RewardServer | None:
        return cls(list(cfg.url), cfg.timeout_s, cfg.max_retries) if cfg.url else None

    def __repr__(self) -> str:
        return f"RewardServer(urls={self.urls!r})"

    def score(self, queries: list[str], prompts: list[str], labels: list[Any]) -> Scores:
        """One request for these samples (a group); every sample fails together when it does."""
        n = len(queries)
        out = Scores(torch.zeros(n), torch.zeros(n))
        url = next(self._next)
        body = {"query": queries, "prompts": prompts, "labels": [_jsonable(x) for x in labels]}
        posted = post_json(url, body, self.timeout_s, self.max_retries, self.backoff_s)
        self.retries += posted.retries
        try:
            if posted.error is not None:
                raise RuntimeError(posted.error)
            values, extra = _rewards(posted.data, n)
        except Exception as e:  # no reply, a malformed one: the group scores 0, counted
            log.warning("reward server %s failed on a group of %d (scored 0): %s", url, n, e)
            out.failed[:] = 1.0
            return out
        out.scores = torch.tensor(values, dtype=torch.float32)
        out.extra = {k: torch.tensor(v, dtype=torch.float32) for k, v in extra.items()}
        return out


def _jsonable(x: Any) -> Any:
    """A label as JSON carries it (a tensor or a numpy value as a number or list)."""
    return x.tolist() if hasattr(x, "tolist") else x


def _rewards(data: Any, n: int) -> tuple[list[float], dict[str, list[float]]]:
    """The `n` rewards of a reply, and its extra_logs of `n` numbers each; a malformed reply raises ValueError."""
    extra: dict[str, list[float]] = {}
    if isinstance(data, dict):
        logs = data.get("extra_logs") or {}
        extra = {
            k: [float(x) for x in v]
            for k, v in logs.items()
            if isinstance(v, list) and len(v) == n and all(isinstance(x, (int, float)) for x in v)
        }
        data = data.get("rewards", data.get("scores"))
    if not isinstance(data, list) or len(data) != n:
        raise ValueError(f"expected {n} rewards (a list, or a dict with 'rewards'), got {str(data)[:200]}")
    values = [float(x) for x in data]
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"non-finite rewards {values}")
    return values, extra
