"""A critic, reference, reward model or distillation teacher on ranks of its own: the actor-side proxies (`RemoteCritic`,
`RemoteReference`, `RemoteRewardModel`, with the interface of the local `Critic` / `Reference` / `RewardModel`, so
the step never asks where a role sits) and the program of those ranks (`RoleServer`, serving a critic or one
`Frozen` role). Both sides of a pair make the
same collectives in the same order: the rollout transfer at the start of the step (rollout ranks only), then the
link's exchanges in the actor's order (reward-model scores, reference logprobs, critic values, returns out, critic
metrics back).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from torchrl_post.checkpoint.dcp import Trained
from torchrl_post.data.dataset import PromptDataset
from torchrl_post.distributed import liveness
from torchrl_post.distributed.role_link import RoleLink
from torchrl_post.program import no_validation
from torchrl_post.rollout.scores import ScoreServer
from torchrl_post.types import Batch
from torchrl_post.workers.critic import Critic


class ReferenceRole(Protocol):
    """A reference policy here (`workers.reference.Reference`) or on its own ranks (`RemoteReference`)."""

    field: str
    """The batch field its answer fills: ref_log_probs, teacher_log_probs or teacher_topk."""

    def log_probs(self, batch: Batch) -> torch.Tensor: ...


class RewardModelRole(Protocol):
    """A reward model here (`workers.reward_model.RewardModel`) or on its own ranks (`RemoteRewardModel`)."""

    def start_scores(self, batch: Batch) -> Callable[[], torch.Tensor]:
        """Start scoring the batch; the call returns its [B] scores. On ranks of its own the reward model scores
        while the actor goes on with its step (its old and reference logprobs; the next step's generation on
        rollout ranks); colocated, the scores are computed before this returns."""
        ...


class CriticRole(Protocol):
    """A critic here (`workers.critic.Critic`) or on its own ranks (`RemoteCritic`)."""

    def values(self, batch: Batch) -> torch.Tensor: ...

    def start_update(self, batch: Batch) -> Callable[[], dict[str, float]]: ...

    def trained(self) -> dict[str, Trained]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class RemoteReference:
    def __init__(self, link: RoleLink, field: str = "ref_log_probs") -> None:
        """`field`: the batch field its answer fills (the distillation teacher's: teacher_log_probs)."""
        self.link, self.field = link, field

    def log_probs(self, batch: Batch) -> torch.Tensor:
        self.link.send_batch(batch)
        out = self.link.to_actor(batch, self.field)
        assert out is not None  # the actor side receives
        return out


class RemoteRewardModel:
    def __init__(self, link: RoleLink) -> None:
        self.link = link

    def start_scores(self, batch: Batch) -> Callable[[], torch.Tensor]:
        """Send the step's groups; the reward model's ranks score them while the actor goes on; the call waits for
        the scores."""
        self.link.send_batch(batch)

        def scores() -> torch.Tensor:
            out = self.link.sample_to_actor(batch, "rm_scores")
            assert out is not None  # the actor side receives
            return out

        return scores


class RemoteCritic:
    def __init__(self, link: RoleLink) -> None:
        self.link = link

    def values(self, batch: Batch) -> torch.Tensor:
        self.link.send_batch(batch)
        out = self.link.to_actor(batch, "values")
        assert out is not None
        return out

    def start_update(self, batch: Batch) -> Callable[[], dict[str, float]]:
        """Send the returns; the critic's ranks update while the actor does; the call waits for its metrics."""
        self.link.to_role(batch, "returns")
        return lambda: self.link.metrics_to_actor(None)

    def trained(self) -> dict[str, Trained]:
        return {}  # saved by the critic's own ranks

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


@dataclass(frozen=True)
class Frozen:
    """A frozen role served from ranks of its own: the stage its ranks report (liveness), the batch field its answer
    fills, the answer, and whether it is one value per sample ([B]: a reward model's scores) or per token ([B, R,
    ...]: logprobs, a teacher's top-k). A new frozen role is one of these (build.py `frozen_role`)."""

    stage: str
    field: str
    answer: Callable[[Batch], torch.Tensor]
    per_sample: bool = False


class RoleServer:
    """Rank program of a critic or a frozen role (reference, reward model, distillation teacher) on ranks of its own:
    answer the actor's groups, update the critic. The placement gives each served role ranks of its own, so one
    server holds one role, over that role's link.

    Mirrors the actor's calls: the rollout transfer (it holds nothing there), then its link's exchanges."""

    def __init__(
        self,
        link: RoleLink,
        rollout_transfer: Callable[[], None] | None,
        critic: Critic | None = None,
        frozen: Frozen | None = None,
        scores: ScoreServer | None = None,
    ) -> None:
        """`rollout_transfer`: this rank's part in the rollout ranks' transfer (None when colocated); `scores`: a
        reward model that scores each group as it finishes on the rollout ranks' side (rollout/scores.py), not the
        step's batch over the link."""
        assert [critic, frozen, scores].count(None) == 2, "a role server holds one role"
        self.link, self.critic, self.frozen, self.rollout_transfer = link, critic, frozen, rollout_transfer
        self.scores = scores

    def step(self, step: int) -> dict[str, float]:
        if self.scores is not None:  # scoring the groups as they finish until the rollout ranks hand them over ...
            liveness.enter("reward_model", step)
            self.scores.serve(f"take{step}")
        liveness.enter("transfer", step)
        if self.rollout_transfer is not None:
            self.rollout_transfer()
        if self.scores is not None:  # ... and while they fill ahead, until they load the step's update
            liveness.enter("reward_model")
            self.scores.serve(f"update{step}")
            return {}
        batch = self.link.send_batch(None)
        assert batch is not None  # the role side receives
        if (f := self.frozen) is not None:  # the actor asks each frozen role over its own link (trainer.py)
            liveness.enter(f.stage)
            setattr(batch, f.field, f.answer(batch))
            (self.link.sample_to_actor if f.per_sample else self.link.to_actor)(batch, f.field)
            return {}
        if self.critic is not None:
            liveness.enter("values")
            batch.values = self.critic.values(batch)
            self.link.to_actor(batch, "values")
            batch.returns = self.link.to_role(batch, "returns")
            liveness.enter("update_critic")
            metrics = self.critic.update(batch)
            liveness.enter("wait_critic")
            self.link.metrics_to_actor(metrics)
        return {}

    def validation_totals(self, data: PromptDataset, sources: list[str]) -> torch.Tensor:
        return no_validation(sources)

    def val_samples(self) -> list[dict[str, Any]]:
        return []

    def trained_roles(self) -> dict[str, Trained]:
        return self.critic.trained() if self.critic is not None else {}

    def state_dict(self) -> dict[str, Any]:
        return {"critic": self.critic.state_dict()} if self.critic is not None else {}

    def load_state_dict(self, state: dict[str, Any], step: int) -> None:
        if self.critic is not None:
            self.critic.load_state_dict(state["critic"])

    def after_resume(self) -> None:
        pass

    def write_hf(self, ckpt_tmp: Path) -> None:
        pass

    def shutdown(self, process_ends: bool = False) -> None:
        pass
