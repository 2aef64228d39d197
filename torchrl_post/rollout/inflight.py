"""Generation that survives a weight update: requests stepped through the in-process engine (`add_request`, `step`,
`abort`), new weights loaded between two engine steps, the unfinished requests continued with them.

    stream = InflightStream(engine, recompute=False)
    stream.add("7-0", prompt_ids, params, uid=7)
    while stream.live:
        for sample in stream.step():            # the requests that finished in this engine step
            ...                                  # sample.versions[t]: the policy version of token t
        stream.update(weights, version)          # at an engine-step boundary: nothing is lost

Every token keeps the policy version that sampled it and the engine's logprob of it (the behaviour policy). At an
update the running requests keep their KV cache (`recompute` False) or are re-added with their tokens so far (a seed
of their own); docs/async.md says what each choice means. Routed experts (`InflightSample.routes`) are those of a
request's last add.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch

from torchrl_post.engines.base import SamplingParams, Stepped


@dataclass
class InflightSample:
    """One request's response so far: its tokens, the engine's logprob of each and the policy version that
    generated each."""

    request_id: str
    prompt_ids: list[int]
    uid: int
    params: SamplingParams
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    """stop or length once finished."""
    restarts: int = 0
    """Times the request was re-added after an update (recompute)."""
    images: list[Any] = field(default_factory=list)
    """The prompt's images (PIL; vision-language models), sent again with each re-add. Not in `sample_state`: they
    are the data set's, and whoever adopts the state attaches them again (rollout/groups.py: `Groups`)."""
    routes: torch.Tensor | None = None
    """Once finished, where the engine records them: the experts of each position, [prompt + tokens - 1, layers,
    k], from its last add (see the module docstring)."""


def sample_state(s: InflightSample) -> dict[str, Any]:
    """A sample as plain values (what `torch.load(weights_only=True)` reads back), without its images."""
    state = asdict(s)
    del state["images"]
    if s.routes is None:
        del state["routes"]
    return state


def sample_from_state(state: dict[str, Any]) -> InflightSample:
    return InflightSample(**(state | {"params": SamplingParams(**state["params"])}))


class InflightStream:
    """Requests in the engine, with the policy `version` their next tokens will come from."""

    def __init__(self, engine: Stepped, recompute: bool = False) -> None:
        self.engine, self.recompute, self.version = engine, recompute, 0
        self.live: dict[str, InflightSample] = {}
        self.engine_steps = 0
        self.suspended = False
        """The live requests are out of the engine (`suspend`) until `resume`."""

    def add(
        self,
        request_id: str,
        prompt_ids: list[int],
        params: SamplingParams,
        uid: int,
        images: list[Any] | None = None,
    ) -> None:
        if request_id in self.live:
            raise ValueError(f"request {request_id!r} is already in flight")
        sample = InflightSample(request_id, list(prompt_ids), uid, replace(params, n=1), images=list(images or []))
        self.live[request_id] = sample
        if not self.suspended:
            self.engine.add_request(request_id, list(prompt_ids), sample.params, uid, sample.images or None)

    def step(self) -> list[InflightSample]:
        """One engine step: the tokens each running request gained carry the current version; returns the
        requests that finished."""
        self.resume()
        self.engine_steps += 1
        finished = []
        for out in self.engine.step():
            rid, ids, lps = out.request_id, out.token_ids, out.logprobs
            s = self.live.get(rid)
            if s is None:
                continue
            if ids:  # the tokens this engine step (or, reported at its end, its whole response) gave
                s.tokens += ids
                s.logprobs += lps
                s.versions += [self.version] * len(ids)
            if out.finish_reason is not None:
                s.finish_reason, s.routes = out.finish_reason, out.routes
                finished.append(self.live.pop(rid))
        return finished

    def update(self, weights: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Load new weights at this engine-step boundary; the running requests continue under `version`."""
        if self.recompute:
            self.suspend()  # frees their KV blocks before the reload
        self.engine.load_weights(weights)
        self.version = version
        self.resume()

    def drop(self, request_ids: list[str]) -> None:
        """Stop these requests for good (their samples are not wanted any more)."""
        gone = [rid for rid in request_ids if self.live.pop(rid, None) is not None]
        if gone and not self.suspended:
            self.engine.abort(gone)
        self.suspended = self.suspended and bool(self.live)

    def suspend(self) -> None:
        """Abort every running request, keeping what it generated (the engine is about to sleep, or to serve
        something else: a validation); `resume` adds them again."""
        if self.live and not self.suspended:
            self.engine.abort(list(self.live))
        self.suspended = bool(self.live)

    def resume(self) -> None:
        """Add the suspended requests again, in the order they were first added, each with its tokens so far
        appended to its prompt: the engine prefills them with its current weights and they go on from there."""
        if not self.suspended:
            return
        self.suspended = False
        for s in self.live.values():
            self._readd(s)

    def _readd(self, s: InflightSample) -> None:
        left = s.params.max_tokens - len(s.tokens)
        assert left > 0, "a request at its budget finished in the step that reached it"
        # A request that has no tokens yet starts as it first would; one with tokens draws from a seed of its own,
        # the same in every run that updates at the same engine step.
        uid = s.uid * 7_919 + len(s.tokens) * 104_729 + 1 if s.tokens else s.uid
        s.restarts += bool(s.tokens)
        params = replace(s.params, max_tokens=left)
        self.engine.add_request(s.request_id, s.prompt_ids + s.tokens, params, uid, s.images or None)

    # ---- checkpoints: the requests in flight as plain values ------------------------------------------
    def export(self) -> list[dict[str, Any]]:
        """Every request in flight, as plain values (a checkpoint's); `adopt` takes them back, suspended."""
        return [sample_state(s) for s in self.live.values()]

    def adopt(self, states: list[dict[str, Any]]) -> None:
        """Requests exported by `export`, held suspended (`resume` adds them to the engine)."""
        for state in states:
            s = sample_from_state(state)
            self.live[s.request_id] = s
            self.suspended = bool(self.live)

    def run(self, until: Any = None) -> list[InflightSample]:
        """Step until every request finished; `until(stream)` is asked after each engine step and may call
        `update` (a test's or a trainer's hook). Returns the samples in the order they finished."""
        done: list[InflightSample] = []
        while self.live:
            done += self.step()
            if until is not None:
                until(self)
        return done
