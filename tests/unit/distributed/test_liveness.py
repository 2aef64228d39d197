"""The liveness watch's logic (distributed/liveness.py) on a real in-memory store: who watches whom, when a rank
is silent, the one line, the stall fault's spec. The whole path (SIGSTOP, the line on every live rank, the kill,
torchrun's restart and the resume) is tests/e2e/test_recovery.py's."""

from __future__ import annotations

import time

import pytest
import torch.distributed as dist

from torchrl_post import faults
from torchrl_post.config import load_config
from torchrl_post.distributed import liveness
from torchrl_post.plan import plan_run


def test_small_worlds_watch_everyone_large_ones_a_ring_of_64() -> None:
    assert liveness.watched(1, 3) == [0, 2]
    ring = liveness.watched(99, 100)
    assert len(ring) == 64 and ring[0] == 0 and ring[-1] == 63 and 99 not in ring
    # every rank is watched by exactly 64 others
    counts = [0] * 100
    for r in range(100):
        for w in liveness.watched(r, 100):
            counts[w] += 1
    assert set(counts) == {64}


def test_silent_means_no_beat_for_longer_than_the_limit() -> None:
    assert liveness.silent({0: 100.0, 1: 94.0, 2: 89.9}, now=100.0, limit_s=10.0) == [2]
    assert liveness.silent({0: 90.0}, now=100.0, limit_s=10.0) == []  # exactly the limit: not yet


def test_deadlines_and_the_beat_period() -> None:
    d = liveness.deadlines(300.0)
    assert (d.silence_s, d.collective_s, d.beat_s) == (300.0, 1800, 10.0)
    assert liveness.deadlines(15.0).beat_s == 1.5
    assert liveness.deadlines(2.0).beat_s == 0.5
    assert (liveness.deadlines(300.0).watchers_s, liveness.deadlines(2.0).watchers_s) == (30.0, 10.0)
    assert liveness.deadlines(3600.0).collective_s == 3600  # collectives never time out before silence does


def test_the_key_its_aliases_and_the_plan() -> None:
    cfg = load_config(["trainer.wait_timeout_s=42"])
    assert plan_run(cfg, 2).deadlines.silence_s == 42
    assert "a rank silent for 42 s ends the run" in plan_run(cfg, 2).describe("cpu", "gloo")
    assert load_config(["weight_sync_timeout=77"]).trainer.wait_timeout_s == 77
    assert load_config(["actor_rollout_ref.nccl_timeout=600"]).trainer.wait_timeout_s == 600


def test_the_line_names_the_silent_rank_its_role_and_stage_and_this_ranks() -> None:
    liveness.enter("update_actor", 7)
    line = liveness.silence_line(0, {0: "actor", 3: "rollout"}, {3: ("gen", 7)}, 31.4, 30.0)
    assert line.startswith("error: rank 3 (rollout) last in 'gen' at step 7: silent for 31 s")
    assert "(trainer.wait_timeout_s=30)" in line and "this rank 0 (actor) was in 'update_actor' at step 7" in line
    assert "exit code 3" in line


def test_a_watch_finds_the_rank_that_stopped_beating_not_one_that_is_done() -> None:
    store = dist.HashStore()
    limits = liveness.Deadlines(silence_s=0.3, collective_s=60)
    roles = {0: "actor", 1: "rollout", 2: "critic"}
    watches = [liveness.Watchdog(store, r, 3, roles, limits) for r in range(3)]
    for w in watches:
        w.store.set(f"who/{w.rank}", "host|1")
        w._beat()
    assert watches[0].late() == []  # first sight of every beat
    time.sleep(0.4)
    watches[1]._beat()  # rank 1 beats, rank 2 has not since: silent
    assert watches[0].late() == [2]
    store.set("done/2", "1")  # a rank that finished is no stall
    assert watches[0].late() == []


def test_the_stall_fault_applies_its_attempts_entry_only(monkeypatch: pytest.MonkeyPatch) -> None:
    stopped: list[int] = []
    monkeypatch.setattr(faults.os, "kill", lambda pid, sig: stopped.append(sig))
    monkeypatch.setattr(faults.time, "sleep", lambda s: None)
    monkeypatch.setenv("TORCHRL_POST_STALL", "gen:2:1,sync:3:0")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    faults.maybe_stall("gen", 2, 1)  # the first attempt's entry: not on the second attempt
    faults.maybe_stall("sync", 3, 1)  # another rank
    assert stopped == []
    faults.maybe_stall("sync", 3, 0)
    assert len(stopped) == 1
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")  # no third entry: never again
    faults.maybe_stall("sync", 3, 0)
    assert len(stopped) == 1


def test_an_error_of_the_ranks_own_is_raised_at_once_not_after_a_beat_period() -> None:
    """`explains` waits for the watch's verdict only when a watched rank has been nearly silent for the deadline
    (a peer a watcher killed); a crash of the rank's own (every peer beating) goes on at once."""
    store = dist.HashStore()
    limits = liveness.Deadlines(silence_s=60.0, collective_s=60)  # a beat every 6 s: a wait would take 19 s
    watch = liveness.Watchdog(store, 0, 2, {0: "actor", 1: "rollout"}, limits)
    watch.start()
    store.add("beat/1", 1)
    watch.late()
    start = time.monotonic()
    assert not watch.explains(RuntimeError("a corrupted checkpoint"))
    assert time.monotonic() - start < 1.0
    watch.stop()  # the watch thread says this rank is done, then ends
    assert store.check(["done/0"]) and not watch._thread.is_alive()


def test_the_first_watcher_waits_for_the_others_lines_before_the_silent_rank_is_killed() -> None:
    """Rank 2 is silent; rank 0 has written its line. It returns as soon as rank 1 (the other live watcher) has
    written its line or finished, and after three beats (at least 10 s) at most when rank 1 never does."""
    limits = liveness.Deadlines(silence_s=1.0, collective_s=60)  # a beat every 0.1 s
    for other in ("verdict/1", "done/1", None):
        store = dist.HashStore()
        watch = liveness.Watchdog(store, 0, 3, {0: "actor", 1: "rollout", 2: "critic"}, limits)
        if other is not None:
            store.set(other, "1")
        start = time.monotonic()
        watch._await_watchers([2])
        waited = time.monotonic() - start
        if other is None:
            assert limits.watchers_s == 10.0 and limits.watchers_s <= waited < limits.watchers_s + 1.0
        else:
            assert waited < limits.beat_s, other
