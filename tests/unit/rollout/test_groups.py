"""Tests of torchrl_post/rollout/groups.py with partial rollouts (and the stream of rollout/inflight.py under it):
groups streamed over a stepped stand-in engine whose responses have scripted lengths (a long tail), each token's logprob naming the
weights that produced it. The real vLLM engine's in-flight update is tests/distributed/test_inflight.py; the
streamed training runs are tests/e2e/test_streaming.py."""

from __future__ import annotations

import io
import threading
from collections.abc import Callable, Iterable
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
import torch
import torch.distributed as dist

from tests.unit.rollout.test_source import TOK, TRAIN, N, _settings, reward
from torchrl_post.config.errors import ConfigError
from torchrl_post.config.schema import RejectionSampleConfig
from torchrl_post.data.dataset import PromptDataset
from torchrl_post.data.sampler import ShardedBatchSampler
from torchrl_post.distributed.mailbox import Mailbox
from torchrl_post.engines.base import SamplingParams, StepOutput, generate
from torchrl_post.logging.timing import Timer
from torchrl_post.reward.judge_client import JudgeScores, collect_scores
from torchrl_post.reward.samples import SampleScoring
from torchrl_post.rollout.episodes import Episodes, OneTurn
from torchrl_post.rollout.groups import Groups
from torchrl_post.rollout.inflight import InflightSample, InflightStream, sample_from_state, sample_state
from torchrl_post.rollout.scores import GroupScores, ScoreServer
from torchrl_post.rollout.source import EngineSource
from torchrl_post.rollout.taken import Fill

# Response length of each prompt's samples (tokens): most short, q3 long (it spans weight updates).
LENGTHS = {"q0": 1, "q1": 2, "q2": 1, "q3": 7, "q4": 1, "q5": 3, "q6": 1, "q7": 2}
PROMPT_CHARS = 2  # "q0" ... "q7"


def logprob_of(version: int) -> float:
    """The stand-in engine's logprob of every token it samples with weights `version`."""
    return -0.1 * (version + 1)


class SteppedEngine:
    """One token per request and step: "1" as the last token, "x" before it; a re-added request (its tokens so far
    appended to the prompt) goes on where it stopped. `weights` counts the loads. With `record_routes`, a finished
    request's "experts" ([prompt + tokens - 1, 1, 1]) are the weights that computed each position: its first step
    prefills the prompt, each later one feeds the last token."""

    def __init__(self, record_routes: bool = False) -> None:
        self.weights = 0
        self.record_routes = record_routes
        self.running: dict[str, tuple[list[int], int]] = {}  # id -> (tokens so far in this request, tokens left)
        self.added: list[tuple[str, int]] = []  # (request id, seed uid)
        self.images: dict[str, list[tuple[str, list[Any]]]] = {}  # request id -> (prompt, images) of each add
        self.aborted: list[str] = []
        self.resets = 0  # prefix cache resets
        self._prompt: dict[str, int] = {}  # request id -> its prompt's length
        self._rows: dict[str, list[int]] = {}  # request id -> the weights that computed each position

    def add_request(
        self, request_id: str, prompt_ids: list[int], params: SamplingParams, uid: int, images: Any = None
    ) -> None:
        text = TOK.decode(prompt_ids)
        done = len(text) - PROMPT_CHARS
        self._queue(request_id, prompt_ids, min(LENGTHS[text[:PROMPT_CHARS]] - done, params.max_tokens), uid, images)

    def _queue(self, request_id: str, prompt_ids: list[int], left: int, uid: int, images: Any) -> None:
        self.running[request_id] = ([], left)
        self.added.append((request_id, uid))
        self.images.setdefault(request_id, []).append((TOK.decode(prompt_ids[:PROMPT_CHARS]), list(images or [])))
        self._prompt[request_id], self._rows[request_id] = len(prompt_ids), []

    def step(self) -> list[StepOutput]:
        out = []
        for rid, (ids, left) in list(self.running.items()):
            rows = self._rows[rid]
            rows += [self.weights] * (1 if rows else self._prompt[rid])
            ids.append(TOK.encode("1" if left == 1 else "x")[0])
            left -= 1
            self.running[rid] = (ids, left)
            step = StepOutput(rid, ids[-1:], [logprob_of(self.weights)])  # the token this step gave
            if not left:
                del self.running[rid]
                step.finish_reason = "stop"
                routes = torch.tensor(self._rows.pop(rid), dtype=torch.int16).view(-1, 1, 1)
                step.routes = routes if self.record_routes else None
            out.append(step)
        return out

    def abort(self, request_ids: list[str]) -> None:
        self.aborted += request_ids
        for rid in request_ids:
            self.running.pop(rid, None)
            self._rows.pop(rid, None)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        list(weights)
        self.weights += 1

    def reset_prefix_cache(self) -> bool:
        assert not self.running, "nothing in flight"
        self.resets += 1
        return True

    def sleep(self) -> None:
        pass


def _groups(
    in_flight: int = 4,
    max_staleness: int | None = None,
    recompute: bool = False,
    rejection: RejectionSampleConfig | None = None,
    record_routes: bool = False,
    data: PromptDataset = TRAIN,
) -> tuple[Groups, SteppedEngine]:
    engine = SteppedEngine(record_routes)
    settings = replace(_settings(prompts=2, rejection=rejection), max_response_length=8)
    sampler = ShardedBatchSampler(len(TRAIN), 2, 0, 1, seed=0, shuffle=False)
    source = EngineSource(
        settings,
        engine,
        TOK,
        data,
        SampleScoring(lambda _: reward, TOK),
        sampler,
        Timer(),
        engine_index=0,
        n_engines=1,
        engine_leader=True,
    )  # type: ignore[arg-type]
    return Groups(source, partial(in_flight, max_staleness, recompute)), engine


def _stream(groups: Groups) -> InflightStream:
    return groups.stream


def partial(in_flight: int, max_staleness: int | None = None, recompute: bool = False) -> Fill:
    """The fill policy of partial rollouts: `in_flight` groups on the one engine."""
    return Fill(True, 0, in_flight, in_flight, recompute, max_staleness, on_arrival=False)


def _texts(batch: Any) -> list[str]:
    return [TOK.decode(row[m.bool()].tolist()) for row, m in zip(batch.input_ids, batch.attention_mask, strict=True)]


def _run(
    groups: Groups, steps: range, lag: int = 1, name: Callable[[Any], Any] = _texts
) -> list[tuple[Any, list[int], list[list[float]]]]:
    """What a rollout rank does per step (rollout/remote.py: RolloutServer): take, fill ahead, update; each taken
    group as (`name` of its batch, group ids, rollout logprobs)."""
    out = []
    for step in steps:
        taken = groups.take(step)
        out += [(name(d.batch), d.batch.group_ids.tolist(), d.batch.rollout_log_probs.tolist()) for d in taken.groups]
        if lag:
            groups.fill(lag, step + 1)
        groups.update(iter(()), version=step)
    return out


def test_a_step_takes_the_first_groups_to_complete_and_long_ones_carry_on_across_updates() -> None:
    groups, engine = _groups(in_flight=4)
    first = groups.take(1)
    # Draws of 2 prompts up to 4 in flight: q0 q1 (draw 1), q2 q3 (draw 2). q0 and q2 finish in the first engine
    # step; q1 after two, q3 (7 tokens) is still generating.
    assert [_texts(d.batch)[0] for d in first.groups] == ["q01", "q21"]
    assert [d.batch.group_ids.tolist() for d in first.groups] == [[0, 0], [1, 1]]  # relabelled: the step's positions
    assert first.in_flight == 2 * 2  # q1 and q3 still generating
    taken = []
    for step in range(2, 9):  # q3 continues under versions 1, 2, ...: each token with its own version's logprob
        groups.update(iter(()), version=step - 1)
        taken += [d for d in groups.take(step).groups if _texts(d.batch)[0].startswith("q3")]
    q3 = taken[0]
    assert _texts(q3.batch) == ["q3xxxxxx1"] * 2
    assert q3.oldest == 0 and q3.partial == 2
    versions = [round(-lp / 0.1) - 1 for lp in q3.batch.rollout_log_probs[0].tolist()]
    assert versions[0] == 0 and versions[-1] >= 1, "the behaviour logprobs follow the weights of each token"
    assert engine.aborted == []  # keep: the KV cache stays, nothing re-added


def test_recompute_re_adds_the_requests_in_flight_at_an_update_with_their_tokens() -> None:
    groups, engine = _groups(in_flight=4, recompute=True)
    groups.take(1)
    live = {rid: len(s.tokens) for rid, s in _stream(groups).live.items()}
    before = len(engine.added)
    groups.update(iter(()), version=1)
    assert sorted(engine.aborted) == sorted(live)
    readded = dict(engine.added[before:])
    assert readded.keys() == live.keys()
    # A request with tokens draws from a seed of its own; one that has none starts as it first would.
    first_uid = dict(engine.added[:before])
    for rid, tokens in live.items():
        assert (readded[rid] != first_uid[rid]) == (tokens > 0)


def test_max_staleness_drops_groups_too_old_and_stops_generating_them() -> None:
    plain = _run(_groups(in_flight=6)[0], range(1, 9), lag=1)
    stale, engine = _groups(in_flight=6, max_staleness=1)
    kept = _run(stale, range(1, 9), lag=1)
    q3_plain = [t for t, _, _ in plain if t[0].startswith("q3")]
    assert q3_plain, "unbounded, the long group is trained"
    assert not [t for t, _, _ in kept if t[0].startswith("q3")], "bounded at 1, it is dropped"
    assert {"2.1.0", "2.1.1"} <= set(engine.aborted), "its requests stopped generating (draw 2, position 1: q3)"
    assert len(kept) == len(plain) == 8 * 2  # every step still takes its share


def _earlier_layout(state: dict[str, Any]) -> dict[str, Any]:
    """The state as checkpoints before 2026-11-30 wrote it: version and groups generating (each with its finished
    samples, as whole request states) in the members' part."""
    members = state["members"]
    params = {"n": 1, "temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_tokens": 8, "seed": 0}
    request = {"request_id": "", "prompt_ids": [], "uid": 0, "params": params, "restarts": 0}
    done = {key: {j: request | d for j, d in ds.items()} for key, ds in members["done"].items()}
    pending = [g | {"done": done.get(g["key"], {})} for g in state["pending"]]
    rest = {k: v for k, v in state.items() if k not in ("version", "pending", "members")}
    return rest | {"members": {"version": state["version"], "pending": pending, "live": members["live"]}}


@pytest.mark.parametrize(("recompute", "earlier"), [(False, False), (True, False), (False, True)])
def test_a_checkpoint_mid_stream_resumes_exactly(recompute: bool, earlier: bool) -> None:
    """4 steps straight against 2 steps, a checkpoint (through torch.save and weights_only load) into a fresh
    stream, 2 more: the same groups, tokens, versions and logprobs. The saving run re-adds its requests in flight
    too, as the resumed one does. `earlier`: the checkpoint in the layout of before 2026-11-30 loads the same."""
    straight, straight_engine = _groups(in_flight=6, recompute=recompute)
    first_half = _run(straight, range(1, 3))
    state = straight.state_dict()
    assert straight.pending and state["members"]["done"], "groups generating, some samples of them finished"
    assert straight_engine.resets == 1  # its prefix cache goes, as a new engine's is empty
    state = _earlier_layout(state) if earlier else state
    second_half = _run(straight, range(3, 5))
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    resumed, engine = _groups(in_flight=6, recompute=recompute)
    resumed.load_state_dict(torch.load(buf, weights_only=True))
    engine.weights = 1
    resumed.update(iter(()), version=2)  # the first sync after a resume: the step-2 weights
    assert _run(resumed, range(3, 5)) == second_half
    assert first_half != second_half


def test_update_on_arrival_generates_until_the_weights_arrive_within_the_prompts_in_flight() -> None:
    groups, engine = _groups(in_flight=4)
    groups.take(1)  # q0 q2 taken; q1 (1 token of 2) and q3 (1 of 7) in flight
    polls = iter([False, False, False, True])
    assert groups.generate_until(lambda: next(polls), next_step=2) == 3
    # Step 1: q1 and q4 (draw 3, started as the first poll found room) finish; steps 2 and 3: q5's 3 tokens.
    assert [_texts(d.batch)[0] for d in groups.ready] == ["q1x1", "q41", "q5xx1"]
    assert engine.running.keys() == {"2.1.0", "2.1.1"}  # q3 goes on under the new weights

    groups, engine = _groups(in_flight=4)
    groups.take(1)
    # Weights that never come: it stops once the 4 groups it may hold are complete (q3's 6 tokens left) and idles.
    assert groups.generate_until(lambda: False, next_step=2) == 6
    assert [_texts(d.batch)[0] for d in groups.ready] == ["q1x1", "q41", "q5xx1", "q3xxxxxx1"]
    assert not engine.running and not groups.pending


def test_rejection_sampling_admits_complete_groups_within_its_budget() -> None:
    """The stand-in's two samples of a prompt are the same text, so every group is uniform. With one extra round (2
    groups: the engine's share) the first two to complete (q0, q2) are dropped and others drawn in their place;
    then the budget is spent and the next complete groups are kept at weight 0, counted short."""
    groups, _ = _groups(in_flight=4, rejection=RejectionSampleConfig(enable=True, max_extra_rounds=1))
    taken = groups.take(1)
    texts = sorted(_texts(d.batch)[0] for d in taken.groups)
    assert texts == ["q1x1", "q41"], "q0 and q2 were dropped; q4 was drawn after them"
    assert (taken.rejected, taken.short) == (2, 2)
    assert all(float(d.batch.weights.sum()) == 0 for d in taken.groups)
    rows = taken.rows(owner=0)
    assert [(r.dropped, r.rounds, r.short) for r in rows] == [(2, 1, 2)] * 2
    assert groups.take(2).rejected == 2, "each step has its own budget"


class AlternatingJudge:
    """A judge stand-in that grades a group's samples 0, 1, 0, ... (the stand-in engine's samples of a prompt are
    the same text, so the rule finds every group uniform and this judge none)."""

    def score(self, questions: list[str], responses: list[str], truths: list[object]) -> JudgeScores:
        return collect_scores(
            [str(i % 2) for i in range(len(responses))], [None] * len(responses), "number", None, None
        )

    def close(self) -> None:
        pass


@pytest.mark.parametrize(("weights", "dropped"), [({"judge": 1.0}, 0), ({"rule": 1.0, "judge": 0.0}, 2)])
def test_rejection_sampling_reads_the_mix_of_the_sources_scored_as_groups_finish(
    weights: dict[str, float], dropped: int
) -> None:
    """With a judge, a group is uniform by the mix the actor's ranks will train on: the judge's grades tell the
    samples apart (kept), at weight 0 only the rule's count (dropped, as without a judge)."""
    groups, _ = _groups(in_flight=4, rejection=RejectionSampleConfig(enable=True, max_extra_rounds=1))
    groups.source.scoring = replace(groups.source.scoring, judge=AlternatingJudge())
    groups.source.settings = replace(groups.source.settings, mixes_rewards=True, reward_weights=weights)
    taken = groups.take(1)
    assert taken.rejected == dropped
    if not dropped:
        assert taken.short == 0 and all(float(d.batch.weights.sum()) == N for d in taken.groups)
        assert all(d.batch.judge_scores.tolist() == [0.0, 1.0] * (N // 2) for d in taken.groups)


def test_streamed_samples_carry_each_token_s_policy_version() -> None:
    """Batch.behavior_versions: each response token's version, the one whose logprob the stand-in gave it."""
    groups, _ = _groups(in_flight=4)
    seen = 0
    for step in range(1, 7):
        for d in groups.take(step).groups:
            mask = d.batch.loss_mask.bool()
            from_logprobs = (-d.batch.rollout_log_probs / 0.1).round().long() - 1
            assert torch.equal(d.batch.behavior_versions[mask], from_logprobs[mask])
            assert (d.batch.behavior_versions[~mask] == -1).all()
            seen += int(len(set(d.batch.behavior_versions[mask].tolist())) > 1)
        groups.update(iter(()), version=step)
    assert seen, "some group spanned an update"


def _saved(state: Any) -> Any:
    """`state` through torch.save and a weights_only load, as a checkpoint holds it."""
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def test_the_prompts_images_reach_the_engine_on_every_add_and_re_add() -> None:
    """A vision-language data set (stand-in images, no processor: its pixel inputs given empty): each request is
    added with its prompt's images, re-added with them after a recompute update, and after a resume from a
    checkpoint (which holds no images: they are attached again from the data set)."""
    names = [TOK.decode(p) for p in TRAIN.prompt_ids]
    data = replace(TRAIN, images=[[f"image of {q}"] for q in names], mm_inputs=[{}] * len(TRAIN))
    groups, engine = _groups(in_flight=4, recompute=True, data=data)
    groups.take(1)
    live = list(_stream(groups).live)
    groups.update(iter(()), version=1)
    groups.take(2)  # the re-adds happen at its first engine step
    assert live and all(len(engine.images[rid]) == 2 for rid in live), "re-added after the update"
    state = _saved(groups.state_dict())
    live = list(_stream(groups).live)
    resumed, engine_after = _groups(in_flight=4, recompute=True, data=data)
    resumed.load_state_dict(state)
    resumed.take(3)
    assert live and all(rid in engine_after.images for rid in live), "re-added after the resume"
    adds = [add for e in (engine, engine_after) for each in e.images.values() for add in each]
    assert len(adds) > 2 * 4 * 2 and all(images == [f"image of {q}"] for q, images in adds)


def _routes(batch: Any) -> list[list[int]]:
    """Each row's recorded "experts" (the weights that computed each position) under its real tokens but the last."""
    out = []
    for routed, mask in zip(batch.routed_experts, batch.attention_mask, strict=True):
        real = mask.nonzero().flatten()[:-1]
        assert (routed[0, 0, real[-1] + 1 :] == -1).all(), "nothing past the last computed position"
        out.append(routed[0, 0, real].tolist())
    return out


@pytest.mark.parametrize("recompute", [False, True])
def test_routes_cover_every_position_from_the_last_add(recompute: bool) -> None:
    """q3 (7 tokens) spans updates. Recompute: each update re-adds it, whose prefill computes every position again,
    so all its rows are the last weights'. Keep: one add, each position computed by the weights of its step."""
    groups, _ = _groups(in_flight=4, recompute=recompute, record_routes=True)
    taken = [(routes, lps) for routes, _, lps in _run(groups, range(1, 8), lag=0, name=_routes) if len(routes[0]) == 8]
    assert taken, "q3 was taken"
    (routes, lps) = taken[0]
    versions = sorted({round(-lp / 0.1) - 1 for lp in lps[0]})
    assert len(versions) > 1, "it spans updates"
    if recompute:
        assert routes == [[versions[-1]] * 8] * 2
    else:
        assert routes[0][:2] == [0, 0] and routes[0] == sorted(routes[0]) and routes[0][-1] == versions[-1]
        assert routes[1] == routes[0]


def test_routes_survive_a_checkpoint_and_a_resume() -> None:
    """Routes through the exact-resume check of the test above (a fresh stream from the state), and a finished
    sample's routes through its state."""
    straight, _ = _groups(in_flight=6, recompute=True, record_routes=True)
    _run(straight, range(1, 3), name=_routes)
    state = _saved(straight.state_dict())
    second_half = _run(straight, range(3, 5), name=_routes)
    resumed, engine = _groups(in_flight=6, recompute=True, record_routes=True)
    resumed.load_state_dict(state)
    engine.weights = 1
    resumed.update(iter(()), version=2)
    assert _run(resumed, range(3, 5), name=_routes) == second_half
    assert any(len(set(r[0])) == 1 and r[0][0] > 0 for r, _, _ in second_half), "some rows recomputed"

    routes = torch.tensor([[[3]], [[4]]], dtype=torch.int16)
    sample = InflightSample("1.0.0", [1, 2], 0, SamplingParams(1, 1.0, 1.0, 0, 4, 0), [5], [-0.1], [0], "stop")
    sample.routes = routes
    back = sample_from_state(_saved(sample_state(sample)))
    assert back.routes is not None and torch.equal(back.routes, routes) and back == replace(sample, routes=back.routes)


def _whole_batches(groups: Groups) -> Groups:
    """`groups` as rollout.partial_rollout=false builds them: whole batches of the engine's share (2 prompts)."""
    groups.policy = Fill(False, 0, 2, 2, False, None, on_arrival=False)
    turns = groups.episodes.loop
    assert isinstance(turns, OneTurn)
    turns.progress = False
    return groups


@pytest.mark.parametrize("saved_partial", [True, False])
def test_a_state_of_the_other_rollout_mode_is_refused_in_one_line(saved_partial: bool) -> None:
    """A checkpoint of partial rollouts resumed with whole batches (or the other way round) names the key and the
    fix instead of failing inside the other mode's state."""
    saving, _ = _groups(in_flight=6)
    if not saved_partial:
        _whole_batches(saving)
    _run(saving, range(1, 3))
    state = _saved(saving.state_dict())
    resumed, _ = _groups(in_flight=6)
    if saved_partial:
        _whole_batches(resumed)
    with pytest.raises(ConfigError) as info:
        resumed.load_state_dict(state)
    msg, was = str(info.value), "true" if saved_partial else "false"
    assert "\n" not in msg and msg.startswith(f"rollout.partial_rollout={'false' if saved_partial else 'true'}:")
    assert f"was saved with rollout.partial_rollout={was}" in msg and f"set rollout.partial_rollout={was} again" in msg
    assert "trainer.resume_mode=disable" in msg
    state.pop("partial_rollout")  # a checkpoint from before the mode was saved: taken as it is
    resumed.load_state_dict(state)


@pytest.mark.parametrize(
    ("scorer", "dropped"),
    [(lambda ids: torch.arange(len(ids), dtype=torch.float32), 0), (lambda ids: torch.zeros(len(ids)), 2)],
    ids=["telling_samples_apart", "uniform"],
)
def test_rejection_sampling_reads_a_reward_model_that_scores_groups_as_they_finish(
    scorer: Callable[[torch.Tensor], torch.Tensor], dropped: int
) -> None:
    """A reward model on ranks of its own (rollout/scores.py, over a real store; its ranks stand in as a thread)
    scores each group as it completes, so admission reads its scores: a group it tells apart is kept, a group it
    scores alike is dropped as the rule's uniform groups are."""
    store = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=timedelta(seconds=30))
    client = dist.TCPStore("127.0.0.1", store.port, 1, False, timeout=timedelta(seconds=30))
    server = ScoreServer(Mailbox(client, "rm_scores", 30), 1, scorer, first=True)
    thread = threading.Thread(target=server.serve, args=("take1",))
    thread.start()
    data = replace(TRAIN, messages=[[{"role": "user", "content": TOK.decode(p)}] for p in TRAIN.prompt_ids])
    groups, _ = _groups(in_flight=4, rejection=RejectionSampleConfig(enable=True, max_extra_rounds=1), data=data)
    groups.source.scoring = replace(groups.source.scoring, reward_tokenizer=TOK, max_length=64)
    groups.source.settings = replace(groups.source.settings, mixes_rewards=True, reward_weights={"reward_model": 1.0})
    groups.scores = GroupScores(Mailbox(store, "rm_scores", 30), 0, leader=True)
    taken = groups.take(1)
    thread.join(timeout=30)
    assert not thread.is_alive(), "the reward model's ranks leave once the engine took its groups"
    assert taken.rejected == dropped and server.scored == 2 + dropped
    assert all(d.batch.rm_scores is not None and len(d.batch.rm_scores) == N for d in taken.groups)
    if not dropped:
        assert all(float(d.batch.rm_scores.std()) > 0 for d in taken.groups)


class SeedsEngine(SteppedEngine):
    """The stand-in engine, recording each add's seed (`SamplingParams.prompt_seed`); a request without `progress`
    reports its tokens once, at its end (as the real engines do)."""

    def __init__(self) -> None:
        super().__init__(record_routes=True)
        self.seeds: list[int] = []
        self.held: dict[str, StepOutput] = {}  # requests reported at their end: what they gave so far

    def add_request(
        self, request_id: str, prompt_ids: list[int], params: SamplingParams, uid: int, images: Any = None
    ) -> None:
        self.seeds.append(params.prompt_seed(uid))
        if not params.progress:
            self.held[request_id] = StepOutput(request_id, [], [])
        super().add_request(request_id, prompt_ids, params, uid, images)

    def step(self) -> list[StepOutput]:
        out = []
        for o in super().step():
            held = self.held.get(o.request_id)
            if held is None:
                out.append(o)
                continue
            held.token_ids += o.token_ids
            held.logprobs += o.logprobs
            if o.finish_reason is not None:
                held.finish_reason, held.routes = o.finish_reason, o.routes
                out.append(self.held.pop(o.request_id))
        return out


@pytest.mark.parametrize("progress", [False, True])
def test_a_plain_prompt_is_a_one_turn_episode_with_generate_s_requests_and_samples(progress: bool) -> None:
    """The producer's plain members are episodes of one turn (rollout/episodes.py: OneTurn): run to their end they
    add the requests `generate` adds (order and seeds: sample j as vLLM seeds an n-sample request's j-th) and give
    its samples, tokens, logprobs, finish reasons and experts, one turn each."""
    prompts, uids = [TOK.encode("q3"), TOK.encode("q1"), TOK.encode("q5")], [10, 2, 30]
    params = SamplingParams(n=3, temperature=1.0, top_p=1.0, top_k=-1, max_tokens=5, seed=11)
    batch_engine, episode_engine = SeedsEngine(), SeedsEngine()
    gen = generate(batch_engine, prompts, uids, params)
    episodes = Episodes(OneTurn(progress), InflightStream(episode_engine))
    starts = [(f"{u}.{j}", u, {"prompt_ids": p}, j) for p, u in zip(prompts, uids, strict=True) for j in range(3)]
    episodes.start(starts, params)
    done: dict[str, Any] = {}
    while episodes.running:
        done.update(episodes.advance())
    trajectories = [done[rid] for rid, *_ in starts]
    assert episode_engine.seeds == batch_engine.seeds and len(set(batch_engine.seeds)) == 9
    assert all(len(t.steps) == 1 for t in trajectories)
    turns = [t.steps[0] for t in trajectories]
    assert [s.response_ids for s in turns] == gen.response_ids
    assert [s.logprobs for s in turns] == gen.logprobs
    assert [t.termination for t in trajectories] == gen.finish_reasons
    assert [len(ids) for ids in gen.response_ids] == [5] * 3 + [2] * 3 + [3] * 3  # q3 cut at max_tokens
    assert gen.routed_experts is not None
    assert all(torch.equal(s.routes, r) for s, r in zip(turns, gen.routed_experts, strict=True))  # type: ignore[arg-type]
