"""Tests of torchrl_post/rollout/episodes.py and rollout/groups.py's groups of agent episodes (the turn logic of
agent/loop.py): groups of multi-turn agent episodes streamed over a stepped stand-in engine. Each prompt's episodes last a scripted number of turns of a
scripted number of tokens; each token's logprob names the weights that produced it. The streamed training run is
tests/e2e/test_streaming.py."""

from __future__ import annotations

import io
import re
import time
from dataclasses import replace
from typing import Any

import pytest
import torch

from tests.unit.rollout.test_groups import SteppedEngine, _run, partial
from tests.unit.rollout.test_source import TOK, TRAIN, _settings
from torchrl_post.agent.chat import ChatAgent
from torchrl_post.agent.loop import AgentLoop, LoopLimits
from torchrl_post.data.sampler import ShardedBatchSampler
from torchrl_post.engines.base import SamplingParams
from torchrl_post.logging.timing import Timer
from torchrl_post.reward.samples import SampleScoring
from torchrl_post.rollout.episodes import Episodes
from torchrl_post.rollout.groups import Groups
from torchrl_post.rollout.source import EngineSource

# Each prompt's episodes: (turns, tokens per turn). q3 runs 3 turns of 2 tokens: it spans weight updates.
SCRIPT = {
    "q0": (1, 1),
    "q1": (1, 2),
    "q2": (1, 1),
    "q3": (3, 2),
    "q4": (1, 1),
    "q5": (2, 1),
    "q6": (1, 1),
    "q7": (1, 2),
}
ASSISTANT = "<|im_start|>assistant\n"


def version_of(logprob: float) -> int:
    return round(-logprob / 0.1) - 1


class TurnsEnv:
    """Ends after its prompt's scripted turns; reward 1 at the end."""

    def reset(self, task: dict[str, Any]) -> str:
        self.name, self.turns = f"q{task['i']}", 0
        return self.name

    def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        self.turns += 1
        done = self.turns == SCRIPT[self.name][0]
        return "go", float(done), done, {}


class EpisodeEngine(SteppedEngine):
    """test_groups.py's stepped engine (one token per request and step: "1" as a turn's last token, "x" before
    it), for chat prompts: the first user message names the script; a re-added turn (its tokens so far after the
    last generation prompt) goes on where it stopped."""

    def __init__(self) -> None:
        super().__init__()
        self.resets = 0

    def add_request(
        self, request_id: str, prompt_ids: list[int], params: SamplingParams, uid: int, images: Any = None
    ) -> None:
        text = TOK.decode(prompt_ids)
        name = re.search(r"user\n(q\d)", text)
        assert name is not None
        done = len(text.rpartition(ASSISTANT)[2])
        self._queue(request_id, prompt_ids, min(SCRIPT[name.group(1)][1] - done, params.max_tokens), uid, images)

    def reset_prefix_cache(self) -> None:
        assert not self.running, "nothing in flight"
        self.resets += 1


def _loop(engine: EpisodeEngine) -> AgentLoop:
    limits = LoopLimits(max_turns=4, max_response_length=16, max_model_len=512, timeout_s=1e9)
    return AgentLoop(engine, TOK, TurnsEnv, ChatAgent(), limits, env_workers=0)


def _groups(
    in_flight: int = 4, max_staleness: int | None = None, recompute: bool = False
) -> tuple[Groups, EpisodeEngine]:
    engine = EpisodeEngine()
    settings = replace(_settings(prompts=2), max_response_length=16)
    sampler = ShardedBatchSampler(len(TRAIN), 2, 0, 1, seed=0, shuffle=False)
    loop = _loop(engine)
    source = EngineSource(
        settings, engine, TOK, TRAIN, SampleScoring(None, TOK), sampler, Timer(), engine_index=0, n_engines=1,
        engine_leader=True, episodes=loop,
    )  # type: ignore[arg-type]  # fmt: skip
    return Groups(source, partial(in_flight, max_staleness, recompute)), engine


def _episodes(groups: Groups) -> Episodes:
    return groups.episodes


def _name(batch: Any) -> str:
    return re.search(r"user\n(q\d)", TOK.decode(batch.input_ids[0].tolist())).group(1)  # type: ignore[union-attr]


def test_groups_come_in_completion_order_and_turns_spanning_an_update_carry_both_versions() -> None:
    groups, engine = _groups(in_flight=4)
    first = groups.take(1)
    # Draws of 2 prompts up to 4 in flight: q0 q1, q2 q3. One engine step ends q0 and q2 (one 1-token turn each).
    assert [_name(d.batch) for d in first.groups] == ["q0", "q2"]
    assert [d.batch.group_ids.tolist() for d in first.groups] == [[0, 0], [1, 1]]
    assert [d.oldest for d in first.groups] == [0, 0] and first.in_flight == 2 * 2  # q1 and q3 run on
    groups.update(iter(()), version=1)
    # Step 2 draws q4 q5. Engine step 2: q1's second token (version 1) and q4's only one end those groups; q3's
    # first turn ends with its second token (version 1), so its second turn starts in engine step 3.
    second = groups.take(2)
    assert [_name(d.batch) for d in second.groups] == ["q1", "q4"]
    assert [d.partial for d in second.groups] == [2, 0] and [d.oldest for d in second.groups] == [0, 1]
    q3 = _episodes(groups).live["2.1.0"].traj
    assert [s.versions for s in q3.steps] == [[0, 1]], "the first turn spans the update"
    taken = []
    for step in range(3, 8):
        groups.update(iter(()), version=step - 1)
        taken += [d for d in groups.take(step).groups if _name(d.batch) == "q3"]
    (done,) = taken
    assert done.oldest == 0 and done.partial == 2
    # One engine step per step from here, its update before it: turn 2 in engine steps 3-4 (versions 2, 3), turn 3
    # in 5-6 (4, 5); q3 ends in step 6 and is taken then. Each token's behaviour logprob is its version's.
    trained = done.batch.loss_mask[0].bool()
    assert TOK.decode(done.batch.responses[0][trained].tolist()) == "x1x1x1"
    assert [version_of(lp) for lp in done.batch.rollout_log_probs[0][trained].tolist()] == [0, 1, 2, 3, 4, 5]
    assert engine.aborted == []  # keep: nothing re-added


def test_colocated_turns_leave_the_engine_for_the_update_and_come_back_with_their_tokens() -> None:
    """What a colocated step does (rollout/local.py: LocalRollouts): take, suspend (the engine sleeps and the
    sync loads the weights outside the stream), then the next step at the new version re-adds the turns in flight
    with their tokens so far."""
    groups, engine = _groups(in_flight=4, recompute=True)
    assert [_name(d.batch) for d in groups.take(1).groups] == ["q0", "q2"]
    groups.suspend()
    assert sorted(engine.aborted) == ["1.1.0", "1.1.1", "2.1.0", "2.1.1"] and not engine.running
    engine.weights += 1
    groups.at_version(1)
    before = len(engine.added)
    second = groups.take(2)
    readded = dict(engine.added[before:])
    # q1 and q3 had one token each: re-added with it (a seed of their own), then q4 and q5 start.
    assert list(readded) == ["1.1.0", "1.1.1", "2.1.0", "2.1.1", "3.0.0", "3.0.1", "3.1.0", "3.1.1"]
    first = dict(engine.added[:before])
    assert all(readded[rid] != first[rid] for rid in ("1.1.0", "1.1.1", "2.1.0", "2.1.1"))
    assert [_name(d.batch) for d in second.groups] == ["q1", "q4"] and second.groups[0].partial == 2
    assert [s.versions for s in _episodes(groups).live["2.1.0"].traj.steps] == [[0, 1]]


def test_max_staleness_drops_episode_groups_too_old_and_stops_them() -> None:
    plain = _run(_groups(in_flight=6)[0], range(1, 9), lag=1, name=_name)
    stale, engine = _groups(in_flight=6, max_staleness=1)
    kept = _run(stale, range(1, 9), lag=1, name=_name)
    assert [name for name, _, _ in plain].count("q3") == 1, "unbounded, the long group is trained"
    assert "q3" not in [name for name, _, _ in kept], "bounded at 1, it is dropped"
    # q3 (draw 2, position 1) was dropped between two turns: its episodes stop, nothing to abort. q7 (draw 4,
    # position 1) was dropped in the middle of a turn: its requests are aborted.
    assert "2.1" not in stale.pending and not {"2.1.0", "2.1.1"} & set(_episodes(stale).live)
    assert {"4.1.0", "4.1.1"} <= set(engine.aborted) and "2.1.0" not in engine.aborted
    assert len(kept) == len(plain) == 8 * 2  # every step still takes its share


@pytest.mark.parametrize("recompute", [False, True])
def test_a_checkpoint_mid_stream_continues_as_the_uninterrupted_stream(recompute: bool) -> None:
    """4 steps straight against 2 steps, a checkpoint (through torch.save and a weights_only load) into a fresh
    stream, 2 more: the same groups, tokens, versions and logprobs. The saving run restarts its running episodes
    from their first turn, as the resumed one does."""
    straight, straight_engine = _groups(in_flight=6, recompute=recompute)
    first_half = _run(straight, range(1, 3), name=_name)
    assert straight.pending, "episodes are running at the checkpoint"
    state = straight.state_dict()
    assert straight_engine.resets == 1  # its prefix cache (blocks of earlier weights) goes, as a new engine's is empty
    second_half = _run(straight, range(3, 5), name=_name)
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    resumed, engine = _groups(in_flight=6, recompute=recompute)
    resumed.load_state_dict(torch.load(buf, weights_only=True))
    engine.weights = 1  # the straight engine loaded update 1 before the checkpoint; update 2 follows
    resumed.update(iter(()), version=2)  # the first sync after a resume: the step-2 weights
    assert _run(resumed, range(3, 5), name=_name) == second_half
    assert first_half != second_half


def test_agent_loop_run_drives_the_episodes_to_their_end() -> None:
    """AgentLoop.run over the same episodes: task-major order, each prompt's scripted turns, one version."""
    trajectories = _loop(EpisodeEngine()).run([(0, {"i": 3}), (1, {"i": 5})], SamplingParams(2, 1.0, 1.0, -1, 16, 0))
    assert [(t.uid, len(t.steps), t.termination, t.reward) for t in trajectories] == [
        (0, 3, "env_done", 1.0),
        (0, 3, "env_done", 1.0),
        (1, 2, "env_done", 1.0),
        (1, 2, "env_done", 1.0),
    ]
    assert [s.response_ids for s in trajectories[0].steps] == [TOK.encode("x1")] * 3
    assert all(s.versions == [0] * len(s.response_ids) for t in trajectories for s in t.steps)


def test_the_timeout_counts_the_time_episodes_are_advanced_not_the_waits_between() -> None:
    """agent.timeout_s of a streamed episode: the trainer's update between two steps does not count."""
    engine = EpisodeEngine()
    limits = LoopLimits(max_turns=4, max_response_length=16, max_model_len=512, timeout_s=0.2)
    episodes = AgentLoop(engine, TOK, TurnsEnv, ChatAgent(), limits, env_workers=0).episodes()
    episodes.start([("a", 0, {"i": 3}, 0)], SamplingParams(1, 1.0, 1.0, -1, 16, 0))
    assert episodes.advance() == []
    time.sleep(0.3)  # (an update elsewhere)
    ended = []
    while episodes.running:
        ended += episodes.advance()
    assert [(rid, t.termination, len(t.steps)) for rid, t in ended] == [("a", "env_done", 3)]
