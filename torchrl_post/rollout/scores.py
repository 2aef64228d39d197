"""A reward model on ranks of its own scoring each group as its last sample finishes (verl's standalone reward loop),
while the rollout ranks go on generating: both sides of the exchange, through the run's store (distributed/mailbox.py).

    rollout rank, engine e (the producer, rollout/groups.py):
        ticket = scores.post(batch.reward_inputs)     # as the group completes; no wait
        batch.rm_scores = scores.get(ticket)          # when a step takes it (rejection sampling: at once)
        scores.ready(f"take{step}")                   # every taken group scored: on to the step's transfer
        scores.ready(f"update{step}")                 # the fill after it is done: on to the step's end
    reward-model ranks (workers/remote.py: RoleServer), in step k:
        server.serve(f"take{k}"); transfer; server.serve(f"update{k}")   # scoring what arrives until then

A ticket is the engine's count of groups posted, so both sides agree on what is owed without a collective; the
reward model's first rank takes what arrived from every engine, its ranks score it together (FSDP gathers each layer
over them) and the first posts each group's scores back. What a rank waits for is bounded by the store's timeout.
A checkpoint keeps a complete group's inputs in its batch until its scores came; the resumed processes count tickets
from 0 again and post those groups first, and the reward model is deterministic, so a run resumes exactly.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from torchrl_post.distributed.mailbox import Mailbox
from torchrl_post.engines.lockstep import agreed

IDLE_S = 0.005
"""How long the reward model's ranks sleep when nothing arrived."""


def _pad_rows(parts: list[torch.Tensor]) -> torch.Tensor:
    """Right-padded [n_i, L_i] reward-model inputs (-1: no token) as one [sum n_i, max L_i]."""
    width = max(p.shape[1] for p in parts)
    return torch.cat([torch.nn.functional.pad(p, (0, width - p.shape[1]), value=-1) for p in parts])


class GroupScores:
    """An engine's side: its groups' reward-model inputs out, their scores back. Every rank of a tensor-parallel
    engine calls it alike; its first rank (`leader`) posts and waits, and hands the others what came (`group`)."""

    def __init__(self, box: Mailbox, engine: int, leader: bool, group: dist.ProcessGroup | None = None) -> None:
        self.box, self.engine, self.leader, self.group = box, engine, leader, group
        self.sent = 0

    def post(self, inputs: torch.Tensor | None) -> int:
        """A complete group's [n, L] inputs to the reward model (`batch.reward_inputs`); returns its ticket."""
        assert inputs is not None, "the source re-tokenises each sample for the reward model (reward/samples.py)"
        ticket, self.sent = self.sent, self.sent + 1
        if self.leader:
            self.box.post(f"in/{self.engine}/{ticket}", inputs)
        return ticket

    def get(self, ticket: int) -> torch.Tensor:
        """The [n] scores of the group with `ticket` (waits for them)."""
        what = f"the reward model's scores of engine {self.engine}'s group {ticket}"
        got = agreed(self.box.wait(f"out/{self.engine}/{ticket}", what) if self.leader else None, self.group)
        assert isinstance(got, torch.Tensor)
        return got

    def ready(self, point: str) -> None:
        """This engine reached `point` of the ranks' common program (`take{k}`: step k took its groups, all scored;
        `update{k}`: it loaded update k): the reward model may go there too once it has scored all posted so far."""
        if self.leader:
            self.box.post(f"ready/{self.engine}/{point}", self.sent)


class ScoreServer:
    """The reward model's ranks' side: every rank calls `serve` alike; the first reads the mailbox and tells the
    others (`group`) what to score."""

    def __init__(
        self,
        box: Mailbox,
        engines: int,
        score: Callable[[torch.Tensor], torch.Tensor],
        first: bool,
        group: dist.ProcessGroup | None = None,
    ) -> None:
        """`score`: [B, L] inputs -> [B] scores (workers/reward_model.py: RewardModel.score_ids)."""
        self.box, self.engines, self.score, self.first, self.group = box, engines, score, first, group
        self.next = [0] * engines
        """Per engine: the ticket of the next group to score."""
        self.owed: dict[int, int] = {}
        """Per engine that is ready for this step: the groups it posted by then."""
        self.scored = 0

    def serve(self, point: str) -> None:
        """Score the groups as they arrive until every engine reached `point` (GroupScores.ready) and all it posted
        by then is scored."""
        self.owed = {}
        while True:
            work = agreed(self._look(point) if self.first else None, self.group)
            if work is None:
                return
            if not work:
                time.sleep(IDLE_S)
                continue
            scores = self._scores(_pad_rows([inputs for _, _, inputs in work]))
            self.scored += len(work)
            if self.first:
                at = 0
                for engine, ticket, inputs in work:
                    self.box.post(f"out/{engine}/{ticket}", scores[at : at + len(inputs)].clone())
                    at += len(inputs)

    def _scores(self, rows: torch.Tensor) -> torch.Tensor:
        """Every row's score: each rank of the reward model scores every n-th row, and the first gathers them."""
        if self.group is None or (n := dist.get_world_size(self.group)) == 1:
            return self.score(rows)
        mine = self.score(rows[dist.get_rank(self.group) :: n])
        parts: list[torch.Tensor | None] = [None] * n
        dist.gather_object(mine, parts if self.first else None, group=self.group, group_dst=0)
        out = torch.zeros(len(rows))
        for r, part in enumerate(parts if self.first else []):
            assert part is not None
            out[r::n] = part
        return out

    def _look(self, point: str) -> list[tuple[int, int, torch.Tensor]] | None:
        """What arrived (engine, ticket, inputs); None once every engine is ready and nothing is owed."""
        work = []
        for e in range(self.engines):
            while (inputs := self.box.take(f"in/{e}/{self.next[e]}")) is not None:
                work.append((e, self.next[e], inputs))
                self.next[e] += 1
            if e not in self.owed and (count := self.box.take(f"ready/{e}/{point}")) is not None:
                self.owed[e] = int(count)
        done = len(self.owed) == self.engines and all(self.next[e] >= n for e, n in self.owed.items())
        return None if done and not work else work
