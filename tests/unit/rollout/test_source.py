"""Tests of torchrl_post/rollout/source.py: EngineSource over a scripted stand-in engine, the demo tokenizer, a small
PromptDataset, a plain reward function and the sharded sampler (the real vLLM engine is tests/e2e's)."""

from __future__ import annotations

import io
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

import pytest
import torch

from torchrl_post.config.schema import (
    OverlongBufferConfig,
    RejectionSampleConfig,
    RewardConfig,
    RolloutConfig,
    ValKwargs,
)
from torchrl_post.data.dataset import PromptDataset
from torchrl_post.data.sampler import ShardedBatchSampler
from torchrl_post.demo.tokenizer import build_char_tokenizer
from torchrl_post.engines.base import SamplingParams, StepOutput
from torchrl_post.logging.timing import Timer
from torchrl_post.reward.samples import SampleScoring
from torchrl_post.rollout.groups import Groups
from torchrl_post.rollout.local import LocalRollouts
from torchrl_post.rollout.source import EngineSource, SourceSettings
from torchrl_post.rollout.taken import Fill
from torchrl_post.types import Batch

TOK = build_char_tokenizer()
N = 2  # samples per prompt
SEED = 3
ANSWERS = {"q1": "2"}  # each prompt's answer: "1" unless named here

# Each prompt's scripted responses (sample j gets RESPONSES[prompt][j % len]). With the reward and answers, q0, q6
# and q7 are uniform groups (no GRPO signal), the others informative.
RESPONSES = {
    "q0": ["1", "1"],
    "q1": ["1", "2"],
    "q2": ["22", "1"],
    "q3": ["1", "333"],
    "q4": ["x", "1"],
    "q5": ["1", "yy"],
    "q6": ["2", "2"],
    "q7": ["3", "3"],
}


def reward(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None) -> float:
    """1 for the answer, else a tenth of the response's length."""
    return 1.0 if solution_str == ground_truth else len(solution_str) / 10


def _logprobs(tokens: list[int]) -> list[float]:
    return [-0.25 * (k + 1) for k in range(len(tokens))]


class ScriptedEngine:
    """The RolloutEngine protocol: each prompt's scripted responses (sample j gets the j-th), deterministic logprobs,
    every request finished at the next step; records each batch of requests added between two steps as one call
    (its prompts, their uids, the sampling parameters of its first sample with n samples per prompt)."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[list[int]], list[int], SamplingParams]] = []
        self.sleeps = 0
        self.shut = ""
        self._added: list[tuple[str, list[int], SamplingParams, int]] = []

    def add_request(
        self, request_id: str, prompt_ids: list[int], params: SamplingParams, uid: int, images: Any = None
    ) -> None:
        self._added.append((request_id, list(prompt_ids), params, uid))

    def step(self) -> list[StepOutput]:
        added, self._added = self._added, []
        if added:
            firsts = [a for a in added if a[2].sample == 0]
            n = len(added) // len(firsts)
            self.calls.append(([a[1] for a in firsts], [a[3] for a in firsts], replace(firsts[0][2], n=n)))
        out = []
        for rid, prompt, params, _ in added:
            script = RESPONSES[TOK.decode(prompt)]
            ids = TOK.encode(script[params.sample % len(script)])
            out.append(StepOutput(rid, ids, _logprobs(ids), "stop"))
        return out

    def abort(self, request_ids: list[str]) -> None:
        pass

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        pass

    def reset_prefix_cache(self) -> bool:
        return True

    def sleep(self) -> None:
        self.sleeps += 1

    def wake_up(self) -> None:
        pass

    def shutdown(self, process_ends: bool = False) -> None:
        self.shut = "process ends" if process_ends else "torn down"


def _data(names: list[str], sources: list[str] | None = None) -> PromptDataset:
    k = len(names)
    return PromptDataset(
        prompt_ids=[TOK.encode(q) for q in names],
        answers=[ANSWERS.get(q, "1") for q in names],
        data_sources=sources or ["src"] * k,
        extra_infos=[{"i": i} for i in range(k)],
    )


TRAIN = _data(list(RESPONSES))


def _settings(
    prompts: int = 2, rejection: RejectionSampleConfig | None = None, val_n: int = 1, keep: int = 0
) -> SourceSettings:
    return SourceSettings(
        rollout=RolloutConfig(temperature=0.7, val_kwargs=ValKwargs(n=val_n)),
        group_size=N,
        prompts_per_step=prompts,
        max_response_length=5,
        seed=SEED,
        rejection=rejection or RejectionSampleConfig(),
        masked=(),
        val_batch_size=0,
        log_val_generations=keep,
    )


def whole_batches(lag: int = 0) -> Fill:
    """The fill policy of whole batches (no partial rollouts), `lag` batches ahead."""
    return Fill(False, lag, 0, 0, recompute=False, max_staleness=None, on_arrival=False)


def _source(
    settings: SourceSettings | None = None,
    dp_rank: int = 0,
    dp_size: int = 1,
    engine_index: int = 0,
    n_engines: int = 1,
) -> tuple[LocalRollouts, ScriptedEngine]:
    """The source as a colocated step drives it: whole batches (rollout/groups.py) through rollout/local.py."""
    settings = settings or _settings()
    engine = ScriptedEngine()
    sampler = ShardedBatchSampler(len(TRAIN), settings.prompts_per_step, dp_rank, dp_size, seed=0, shuffle=False)
    source = EngineSource(
        settings,
        engine,
        TOK,
        TRAIN,
        SampleScoring(lambda data_source: reward, TOK),
        sampler,
        Timer(),
        engine_index=engine_index,
        n_engines=n_engines,
        engine_leader=True,
    )
    groups = Groups(source, whole_batches())
    return LocalRollouts(source, groups, streaming=False), engine


def _texts(batch: Batch) -> list[str]:
    """Each row's response, decoded from its real tokens."""
    return [TOK.decode(r[m.bool()].tolist()) for r, m in zip(batch.responses, batch.response_mask, strict=True)]


def _same(a: Batch, b: Batch) -> bool:
    wa, wb = a.to_wire(), b.to_wire()
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


# --- one step ---------------------------------------------------------------------------------------------------


def test_next_batch_gives_group_size_rows_per_prompt_scored_by_the_reward() -> None:
    source, engine = _source()
    batch = source.next_batch(1)
    assert len(batch) == 2 * N
    assert batch.group_ids.tolist() == [0, 0, 1, 1]  # the prompts' uids (positions in the step's batch)
    assert _texts(batch) == ["1", "1", "1", "2"]  # q0's and q1's scripted responses, prompt-major
    assert batch.scores is not None and batch.reward_errors is not None
    by_hand = [reward("src", t, a) for t, a in zip(["1", "1", "1", "2"], ["1", "1", "2", "2"], strict=True)]
    assert by_hand == [1.0, 1.0, 0.1, 1.0]  # q1's answer is "2"
    assert batch.scores.tolist() == pytest.approx(by_hand)
    assert batch.reward_errors.tolist() == [0.0] * 4
    expected_lp = torch.tensor([_logprobs([0])] * 4)  # one token each
    torch.testing.assert_close(batch.rollout_log_probs, expected_lp)
    assert batch.weights.tolist() == [1.0] * 4
    ((prompt_ids, uids, _),) = engine.calls
    assert prompt_ids == [TOK.encode("q0"), TOK.encode("q1")] and uids == [0, 1]
    assert engine.sleeps == 1  # colocated: the engine frees its memory before the update
    second = source.next_batch(2)
    assert _texts(second) == ["22", "1", "1", "333"]  # the sampler moved on: q2, q3
    assert second.group_ids.tolist() == [0, 0, 1, 1]


def test_a_ranks_share_keeps_its_positions_in_the_global_batch_as_group_ids() -> None:
    source, engine = _source(_settings(prompts=4), dp_rank=1, dp_size=2)
    batch = source.next_batch(1)
    assert batch.group_ids.tolist() == [2, 2, 3, 3]
    assert engine.calls[0][0] == [TOK.encode("q2"), TOK.encode("q3")] and engine.calls[0][1] == [2, 3]


def test_sampling_seed_follows_the_trainer_seed_and_the_draw() -> None:
    source, engine = _source()
    for step in (1, 2, 3):
        source.next_batch(step)
    assert [c[2].seed for c in engine.calls] == [SEED * 7919 + k for k in (1, 2, 3)]  # one draw per step
    params = engine.calls[0][2]
    assert (params.n, params.temperature, params.max_tokens) == (N, 0.7, 5)


# --- validation -------------------------------------------------------------------------------------------------


def test_validation_totals_sum_by_data_source_with_best_of_n() -> None:
    source, engine = _source(_settings(val_n=2, keep=3))
    val = _data(["q1", "q2", "q6", "q0"], sources=["b", "a", "b", "a"])
    totals = source.validation_totals(val, ["a", "b"])
    # scores: q1 [.1, 1] (its answer is "2"); q2 [.2, 1]; q6 [.1, .1]; q0 [1, 1]
    a_sum, b_sum = (0.2 + 1.0) + (1.0 + 1.0), (1.0 + 0.1) + (0.1 + 0.1)
    expected = torch.tensor([[a_sum, b_sum], [4.0, 4.0], [1.0 + 1.0, 1.0 + 0.1]], dtype=torch.float64)
    torch.testing.assert_close(totals, expected)
    ((_, uids, params),) = engine.calls  # greedy, n = val_kwargs.n, the step-0 seed; uids are dataset indices
    assert (params.n, params.temperature, params.top_k, params.seed) == (2, 0.0, -1, SEED * 7919)
    assert uids == [0, 1, 2, 3]
    assert [s["response"] for s in source.val_samples] == ["1", "2", "22"]
    assert [s["score"] for s in source.val_samples] == pytest.approx([0.1, 1.0, 0.2])
    assert [s["prompt"] for s in source.val_samples] == ["q1", "q1", "q2"]


def test_validation_splits_the_set_over_engines() -> None:
    source, engine = _source(_settings(val_n=1), engine_index=1, n_engines=2)
    val = _data(["q1", "q2", "q6", "q0"], sources=["b", "a", "b", "a"])
    totals = source.validation_totals(val, ["a", "b"])
    assert engine.calls[0][0] == [TOK.encode("q2"), TOK.encode("q0")]  # this engine's share: items 1 and 3
    torch.testing.assert_close(totals, torch.tensor([[0.2 + 1.0, 0.0], [2.0, 0.0], [0.2 + 1.0, 0.0]]).double())


# --- rejection sampling -----------------------------------------------------------------------------------------


def test_rejection_drops_uniform_groups_as_they_complete_draws_more_and_counts_them() -> None:
    source, engine = _source(_settings(rejection=RejectionSampleConfig(enable=True, max_extra_rounds=2)))
    batch = source.next_batch(1)
    # q0 is uniform: dropped; another share is drawn (q2, q3: the draw's own seed, the same positions); q1 and q2
    # are taken in the order drawn, as groups 0 and 1; q3 waits for the next step.
    assert [c[1] for c in engine.calls] == [[0, 1], [0, 1]]
    assert [c[2].seed for c in engine.calls] == [SEED * 7919 + 1, SEED * 7919 + 2]
    assert _texts(batch) == ["1", "2", "22", "1"]
    assert batch.group_ids.tolist() == [0, 0, 1, 1] and batch.weights.tolist() == [1.0] * 4
    metrics = dict(source.metrics())
    for timing in ("timing_s/gen_engine", "timing_s/rollout_wait"):
        metrics.pop(timing, None)
    assert metrics == {
        "rollout/staleness": 0.0,
        "rollout/staleness_mean": 0.0,
        "rollout/staleness_groups/0": 2.0,
        **{f"rollout/staleness_groups/{b}": 0.0 for b in ("1", "2", "3", "4+")},
        "filter/rejection/dropped_groups": 1.0,
        "filter/rejection/extra_rounds": 1.0,
        "filter/rejection/short_groups": 0.0,
    }
    assert [_texts(d.batch) for d in source.producer.ready] == [["1", "333"]]  # type: ignore[attr-defined]
    batch = source.next_batch(2)  # q3 first, then q4 (q5 left over)
    assert _texts(batch) == ["1", "333", "x", "1"]
    assert batch.group_ids.tolist() == [0, 0, 1, 1]
    assert source.metrics()["filter/rejection/dropped_groups"] == 0.0
    assert len(engine.calls) == 3 and [_texts(d.batch) for d in source.producer.ready] == [["1", "yy"]]  # type: ignore[attr-defined]


def test_rejection_keeps_uniform_groups_at_weight_zero_once_its_budget_is_spent() -> None:
    settings = _settings(rejection=RejectionSampleConfig(enable=True, max_extra_rounds=1))
    source, engine = _source(settings)
    source.source.sampler.batch_in_epoch = 3  # q6, q7 (both uniform), then the next epoch: q0 (uniform), q1
    batch = source.next_batch(1)
    assert len(engine.calls) == 2
    # The budget (1 round x a share of 2) drops q6 and q7; q0, drawn after, is kept at weight 0, in draw order.
    assert _texts(batch) == ["1", "1", "1", "2"]
    assert batch.weights.tolist() == [0.0, 0.0, 1.0, 1.0]
    m = source.metrics()
    counts = [m[f"filter/rejection/{k}"] for k in ("dropped_groups", "extra_rounds", "short_groups")]
    assert counts == [2.0, 1.0, 1.0]


# --- checkpoints ------------------------------------------------------------------------------------------------


def _through_checkpoint(state: dict[str, Any]) -> dict[str, Any]:
    """As the checkpoint keeps it: torch.save, then a weights_only load."""
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def test_state_dict_round_trips_the_sampler_position_and_the_groups_left_over() -> None:
    settings = _settings(rejection=RejectionSampleConfig(enable=True, max_extra_rounds=2))
    source, _ = _source(settings)
    source.next_batch(1)
    state = _through_checkpoint(source.state_dict())
    restored, _ = _source(settings)
    restored.load_state_dict(state)
    assert (
        restored.source.sampler.state_dict()
        == source.source.sampler.state_dict()
        == {"epoch": 0, "batch_in_epoch": 2, "num_items": 8}
    )
    left, kept = restored.producer.ready, source.producer.ready  # type: ignore[attr-defined]
    assert len(left) == 1 and _same(left[0].batch, kept[0].batch)
    for step in (2, 3, 4):  # the resumed source makes the batches the uninterrupted one makes
        assert _same(restored.next_batch(step), source.next_batch(step)), step


def test_shutdown_shuts_the_engine_down() -> None:
    source, engine = _source()
    source.shutdown()
    assert engine.shut == "torn down"
    source.shutdown(process_ends=True)  # the command line: only what outlives the process
    assert engine.shut == "process ends"


# --- reward shaping (reward/shaping.py) -------------------------------------------------------------------------


def test_training_scores_get_the_overlong_penalty_and_the_clamp_validation_scores_do_not() -> None:
    shaping = RewardConfig(overlong_buffer=OverlongBufferConfig(enable=True, len=3), clip=0.5)
    source, _ = _source(replace(_settings(val_n=2), reward=shaping))
    source.next_batch(1)
    batch = source.next_batch(2)
    assert _texts(batch) == ["22", "1", "1", "333"]  # q2 and q3, both answered by "1"
    # raw scores 0.2, 1, 1, 0.3; max 5, buffer 3: expected 2 tokens, "333" loses (3 - 2) / 3; then clamp to 0.5
    assert batch.reward_extra["overlong_reward"].tolist() == pytest.approx([0.0, 0.0, 0.0, -1 / 3])
    assert batch.scores is not None and batch.scores.tolist() == pytest.approx([0.2, 0.5, 0.5, 0.3 - 1 / 3])
    totals = source.validation_totals(_data(["q3"], sources=["a"]), ["a"])
    assert totals[0, 0].item() == pytest.approx(1.0 + 0.3), "validation: q3's '1' and '333', their own scores"
