"""Deadlines on the waits between ranks: every rank beats into the rendezvous store, watches the others' beats, and
a rank silent for `trainer.wait_timeout_s` ends the run on every live rank with one line.

A rank that stops answering (SIGSTOP, a frozen process, a dead NIC, a node gone) leaves the others in whatever
wait they are in: a gloo or NCCL collective, a point-to-point receive, vLLM's own groups, a store key. Rather than a
timeout per call site (a wait that spans a peer's generation would need one longer than the longest generation), a
thread per rank beats (`beat/<rank>`, a counter in the store: no clocks compared across nodes) and reads the beats
of the ranks it watches. A watched rank whose counter has not moved for the deadline is *silent*: this rank prints

    error: rank 1 (rollout) last in 'gen' at step 2: silent for 15 s (trainer.wait_timeout_s=15); this rank 0
    (actor) was in 'sync' at step 2: ending with exit code 3 ...

and exits with code 3 once every other watcher of the silent rank has written its line too (three beats, at least
10 s, at most). A watcher on the silent rank's host SIGKILLs it first: torchrun sees the failure at once and, with `--max-restarts`,
restarts every rank, which resume exactly from the last checkpoint. Stages (`enter`) name what a rank is doing: the step's timed stages
(logging/timing.py), the rollout ranks' and role ranks' own, checkpointing, validation.

A rank that is alive but never arrives (a deadlock among collectives) still beats: the process groups' own timeout
(`Deadlines.collective_s`) bounds that case, and a stage's own limit bounds a stuck call (reward.timeout_s,
agent.timeout_s).
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import NoReturn

import torch.distributed as dist

from torchrl_post import faults
from torchrl_post.config.errors import stderr_line

EXIT_SILENT = 3
"""The exit code of a rank that ended because another went silent."""


@dataclass
class _Here:
    stage: str = "start"
    step: int = 0
    rank: int = -1


_here = _Here()
"""This process's current stage and step (`enter`, from the main thread) and its rank (the watch's)."""
_moved = threading.Event()
"""Set by `enter`: the watch thread publishes the new stage at once (not at its next beat)."""


@dataclass(frozen=True)
class Deadlines:
    """The run plan's deadlines (plan.deadlines)."""

    silence_s: float
    """A rank silent this long ends the run (trainer.wait_timeout_s)."""
    collective_s: int
    """Every process group's and the store's timeout: the bound for a rank that beats but never arrives."""

    @property
    def beat_s(self) -> float:
        """Seconds between two beats (and two reads of the watched ranks' beats)."""
        return min(10.0, max(0.5, self.silence_s / 10))

    @property
    def watchers_s(self) -> float:
        """How long the first watcher of a silent rank waits at most for the other watchers' lines: three beats, and
        at least 10 s (a short deadline's beats are short, and a watcher slowed on a busy host is not faster: with
        4.5 s, one run of the 3-rank stall test on 2 busy cores lost a watcher's line). The wait ends as soon as
        every other watcher has written its line, so a longer bound costs nothing when they keep up."""
        return max(3 * self.beat_s, 10.0)

    def describe(self) -> str:
        return (
            f"deadlines: a rank silent for {self.silence_s:g} s ends the run (trainer.wait_timeout_s; a beat every "
            f"{self.beat_s:g} s); collectives time out after {self.collective_s} s"
        )


def deadlines(wait_timeout_s: float) -> Deadlines:
    return Deadlines(wait_timeout_s, max(1800, int(wait_timeout_s)))


def enter(stage: str, step: int | None = None) -> None:
    """This rank now does `stage` (of step `step`, or the current step)."""
    if step is not None:
        _here.step = step
    _here.stage = stage
    _moved.set()
    faults.maybe_stall(stage, _here.step, _here.rank)


def stage() -> tuple[str, int]:
    return _here.stage, _here.step


def watched(rank: int, world: int, most: int = 64) -> list[int]:
    """The ranks `rank` watches: every other rank in a world of up to `most + 1`, else the `most` next ones (a
    ring: every rank is watched by `most` others, and the store serves `world * most` reads per beat)."""
    if world - 1 <= most:
        return [r for r in range(world) if r != rank]
    return [(rank + k) % world for k in range(1, most + 1)]


def silent(last_change: dict[int, float], now: float, limit_s: float) -> list[int]:
    """The ranks whose beat has not moved for more than `limit_s` (times on this rank's own clock)."""
    return sorted(r for r, t in last_change.items() if now - t > limit_s)


def silence_line(me: int, roles: dict[int, str], gone: dict[int, tuple[str, int]], waited: float, limit: float) -> str:
    """The one line every live rank prints: who went silent, where it was, where this rank was."""
    here, step = stage()
    who = "; ".join(f"rank {r} ({roles.get(r, '?')}) last in '{s}' at step {k}" for r, (s, k) in gone.items())
    return (
        f"error: {who}: silent for {waited:.0f} s (trainer.wait_timeout_s={limit:g}); this rank {me} "
        f"({roles.get(me, '?')}) was in '{here}' at step {step}: ending with exit code {EXIT_SILENT} (under torchrun "
        "--max-restarts every rank restarts and resumes from the last checkpoint)"
    )


class Watchdog:
    """This rank's beat and its watch over the others (a daemon thread with a store connection of its own)."""

    def __init__(self, store: dist.Store, rank: int, world: int, roles: dict[int, str], limits: Deadlines) -> None:
        self.store, self.rank, self.roles, self.limits = store, rank, roles, limits
        self.world = world
        _here.rank = rank
        self.watching = watched(rank, world)
        self.verdict: str | None = None
        self._stop = threading.Event()
        self._seen: dict[int, tuple[int, float]] = {}
        self._thread = threading.Thread(target=self._run, name="torchrl_post-liveness", daemon=True)

    def start(self) -> None:
        self.store.set(f"who/{self.rank}", f"{socket.gethostname()}|{os.getpid()}")
        self._beat()
        self._thread.start()

    def stop(self) -> None:
        """This rank is done (a finished run, or an error on its own path): its silence from now on is no stall.
        The watch thread says so in the store (its connection is its own) and ends; this waits for that."""
        self._stop.set()
        _moved.set()  # wake the thread now, not at its next beat
        self._thread.join(self.limits.beat_s + 1)

    def explains(self, error: BaseException) -> bool:
        """Whether `error` (raised on this rank's main thread) is a wait that a silent rank broke: a peer's
        SIGKILL closes its sockets, so a watcher's collective may fail a moment before its own verdict. Then the
        watch thread prints the line and ends the process; this waits for it. False at once for other errors."""
        if not isinstance(error, RuntimeError) or not self._thread.is_alive():
            return False
        # A rank killed by a watcher was silent for the deadline first: without one nearly that silent, the error
        # is this rank's own and is raised at once (no crash waits out a beat period for nothing).
        now, nearly = time.monotonic(), self.limits.silence_s - 2 * self.limits.beat_s
        if not any(now - t > nearly for _, t in list(self._seen.values())):
            return False
        self._thread.join(self.limits.watchers_s + 1)
        return self.verdict is not None

    def _publish(self) -> None:
        here, step = stage()
        self.store.set(f"stage/{self.rank}", f"{here}|{step}")

    def _beat(self) -> None:
        self._publish()
        self.store.add(f"beat/{self.rank}", 1)

    def _run(self) -> None:
        try:
            due = time.monotonic() + self.limits.beat_s
            while not self._stop.is_set():
                if _moved.wait(max(0.0, due - time.monotonic())):
                    _moved.clear()
                    self._publish()
                if time.monotonic() >= due and not self._stop.is_set():
                    due += self.limits.beat_s
                    self._beat()
                    late = self.late()
                    if late:
                        self._end(late)
            self.store.set(f"done/{self.rank}", "1")
        except Exception as e:  # noqa: BLE001  # the store itself unreachable: the collectives' timeout remains
            if not self._stop.is_set():
                stderr_line(f"warning: rank {self.rank}'s liveness watch stopped: {e}")

    def late(self) -> list[int]:
        """The watched ranks silent for longer than the deadline (those that said they are done excepted)."""
        now = time.monotonic()
        for r in self.watching:
            count = int(self.store.add(f"beat/{r}", 0))
            if r not in self._seen or self._seen[r][0] != count:
                self._seen[r] = (count, now)
        late = silent({r: t for r, (_, t) in self._seen.items()}, now, self.limits.silence_s)
        return [r for r in late if not self.store.check([f"done/{r}"])]

    def _end(self, late: list[int]) -> NoReturn:
        """The one line, the other watchers of the silent ranks given time to write theirs, the silent ranks on
        this host killed, exit code 3."""
        gone = {r: _parse_stage(self.store.get(f"stage/{r}").decode()) for r in late}
        waited = time.monotonic() - min(self._seen[r][1] for r in late)
        self.verdict = silence_line(self.rank, self.roles, gone, waited, self.limits.silence_s)
        stderr_line(self.verdict)
        self.store.set(f"verdict/{self.rank}", "1")
        self._await_watchers(late)
        self._kill_local(late)
        sys.stdout.flush()
        os._exit(EXIT_SILENT)

    def _await_watchers(self, late: list[int]) -> None:
        """Until every other live watcher of the `late` ranks has written its line too (its `verdict/` key), or has
        finished, for `Deadlines.watchers_s` at most: killing a silent rank ends the attempt (torchrun stops every
        rank), so a watcher a beat behind this one, or slowed on a busy host, would otherwise end without its line.
        A fixed beat and a half was not always enough on 2 busy cores."""
        others = [
            r for r in range(self.world)
            if r != self.rank and r not in late and any(x in watched(r, self.world) for x in late)
        ]  # fmt: skip
        deadline = time.monotonic() + self.limits.watchers_s
        while others and time.monotonic() < deadline:
            others = [
                r for r in others if not self.store.check([f"verdict/{r}"]) and not self.store.check([f"done/{r}"])
            ]
            time.sleep(0.05)

    def _kill_local(self, ranks: list[int]) -> None:
        """SIGKILL the silent ranks on this host (a stopped process ignores SIGTERM: torchrun would wait 30 s)."""
        host = socket.gethostname()
        for r in ranks:
            where, _, pid = self.store.get(f"who/{r}").decode().partition("|")
            if where == host:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass


def _parse_stage(text: str) -> tuple[str, int]:
    name, _, step = text.rpartition("|")
    return name, int(step)
