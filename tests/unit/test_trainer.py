"""Tests of torchrl_post/trainer.py: the warning when engine and trainer logprobs drift apart; the step's
composition (Trainer.train_step / Trainer.step) over stand-in roles."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import torch

import torchrl_post.trainer as trainer_module
from tests.unit.batch_helpers import PAD, _two_prompt_batch
from torchrl_post.config.errors import TrainingError
from torchrl_post.config.load import load_config
from torchrl_post.config.schema import Config
from torchrl_post.logging.timing import Timer
from torchrl_post.plan import plan_run
from torchrl_post.trainer import RankInfo, StepRoles, Trainer, logprob_diff_warning
from torchrl_post.types import Batch

# --- the trainer's warning --------------------------------------------------------------------------------------


def _warning(cfg: Config, diff: float, device: str = "cpu", **metrics: float) -> str | None:
    return logprob_diff_warning({"rollout/logprob_diff": diff, **metrics}, plan_run(cfg, 2, device), cfg.rollout)


def test_logprob_diff_far_above_float32_noise_warns_naming_value_threshold_and_key() -> None:
    cfg = Config()
    assert cfg.trainer.max_logprob_diff is None  # by precision: float32 on CPU agrees to about 1e-6
    assert _warning(cfg, 5e-6) is None
    text = _warning(cfg, 2.2e-4, **{"rollout/staleness": 0.0})  # the stale head: 1.5e-4
    assert text is not None
    for part in ("0.00022", "0.0001", "trainer.max_logprob_diff", "missed a parameter", "tied embeddings"):
        assert part in text, part
    cfg.trainer.max_logprob_diff = 1e-3
    assert _warning(cfg, 2.2e-4) is None


@pytest.mark.parametrize(
    ("device", "key", "value", "quiet", "loud"),
    [
        ("cuda", None, None, 1.2e-3, 2e-2),  # float32 on CUDA: vLLM's TF32 attention puts its noise near 1e-3
        ("cuda", "rollout.dtype", "float32", 1.2e-3, 2e-2),
        ("cuda", None, "defaults", 3e-2, 0.5),  # bf16 engine and compute (the CUDA defaults): noise near 1e-2
        ("cpu", "rollout.dtype", "bfloat16", 3e-2, 0.5),
        ("cpu", "actor.fsdp.param_dtype", "bfloat16", 3e-2, 0.5),
    ],
    ids=["cuda-fp32", "cuda-fp32-engine", "cuda-bf16", "bf16-engine", "bf16-trainer"],
)
def test_logprob_diff_threshold_follows_the_precision(
    device: str, key: str | None, value: object, quiet: float, loud: float
) -> None:
    """A correct sync never warns (its noise stays under the threshold of its precision), a missed one does."""
    cfg = Config()
    if value != "defaults":
        cfg.rollout.dtype, cfg.actor.fsdp.param_dtype = "float32", "float32"
    if key is not None:
        section, *rest = key.split(".")
        node: object = getattr(cfg, section)
        for part in rest[:-1]:
            node = getattr(node, part)
        setattr(node, rest[-1], value)
    assert _warning(cfg, quiet, device) is None
    assert _warning(cfg, loud, device) is not None


def _set(cfg: Config, settings: dict[str, object]) -> Config:
    for key, value in settings.items():
        *path, last = key.split(".")
        node: object = cfg
        for part in path:
            node = getattr(node, part)
        setattr(node, last, value)
    return cfg


FULL_VOCABULARY = {"actor.renormalize_logprobs_on_support": False}


@pytest.mark.parametrize(
    ("settings", "metrics"),
    [
        ({"trainer.max_logprob_diff": 0.0}, {}),
        ({"rollout.top_p": 0.9} | FULL_VOCABULARY, {}),
        ({"rollout.top_k": 20} | FULL_VOCABULARY, {}),
        ({}, {"rollout/staleness": 1.0}),
    ],
    ids=["off", "top_p", "top_k", "look-ahead"],
)
def test_logprob_diff_check_stays_off_where_engine_and_trainer_differ_by_design(
    settings: dict[str, object], metrics: dict[str, float]
) -> None:
    assert _warning(_set(Config(), settings), 0.5, **metrics) is None


@pytest.mark.parametrize("settings", [{"rollout.top_p": 0.9}, {"rollout.top_k": 20}], ids=["top_p", "top_k"])
def test_logprob_diff_check_stays_on_where_the_trainer_renormalises_on_the_kept_set(
    settings: dict[str, object],
) -> None:
    """Truncated sampling with the plan's renormalisation (the default) compares like with like."""
    assert _warning(_set(Config(), settings), 0.5) is not None


# --- Trainer.train_step / Trainer.step with stand-in roles ------------------------------------------------------
# The composition, not the roles: a fake actor, rollout source, weight sync, critic and reference record every
# call into one shared log, and the batch is a real collated Batch (tests/unit/batch_helpers.py). No process
# group: the actor's mesh is a 1-D stand-in whose get_group() is None (distributed/placement.py: dp_group).

SCORES = [1.0, 0.0, 0.25, 0.75]  # _two_prompt_batch: group 3 = rows 0, 1; group 4 = rows 2, 3
SYNC_BYTES = 12345
OLD_LP, REF_LP = -0.5, -0.75


def _values(loss_mask: torch.Tensor) -> torch.Tensor:
    """The stand-in critic's values: 0.1, 0.2, ... along each response (not constant, so whitening keeps them)."""
    return 0.1 * torch.arange(1, loss_mask.shape[1] + 1).float().expand_as(loss_mask) * loss_mask


def _scored_batch() -> Batch:
    batch = _two_prompt_batch()
    batch.scores = torch.tensor(SCORES)
    batch.reward_errors = torch.zeros(len(batch))
    return batch


class _Mesh:
    ndim = 1

    def get_group(self) -> None:
        return None


class _Actor:
    def __init__(self, calls: list[str], skip_updates: bool = False) -> None:
        self.calls, self.skip_updates = calls, skip_updates
        self.model = torch.nn.Linear(2, 2)
        self.mesh = _Mesh()
        self.optimizer = None
        self.consecutive_skips = 0
        self.updated: list[Batch] = []  # the batch as update saw it (fields copied at the call)
        self.seen: dict[str, torch.Tensor | None] = {}

    def log_probs(self, batch: Batch) -> torch.Tensor:
        self.calls.append("actor.log_probs")
        return torch.full_like(batch.loss_mask, OLD_LP)

    def update(self, batch: Batch) -> dict[str, float]:
        self.calls.append("actor.update")
        fields_now = ("old_log_probs", "ref_log_probs", "values", "advantages", "returns")
        self.seen = {k: None if getattr(batch, k) is None else getattr(batch, k).clone() for k in fields_now}
        if self.skip_updates:  # a non-finite loss: the actor skips the update and counts it
            self.consecutive_skips += 1
        return {"actor/pg_loss": 0.125}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def offload(self) -> None:
        self.calls.append("actor.offload")

    def onload(self) -> None:
        self.calls.append("actor.onload")


class _Rollouts:
    epoch = 2
    val_samples: list[dict[str, Any]] = []

    def __init__(self, calls: list[str]) -> None:
        self.calls = calls
        self.steps: list[int] = []

    def next_batch(self, step: int) -> Batch:
        self.calls.append("rollouts.next_batch")
        self.steps.append(step)
        return _scored_batch()

    def metrics(self) -> dict[str, float]:
        self.calls.append("rollouts.metrics")
        return {"rollout/staleness": 0.0}


class _Weights:
    def __init__(self, calls: list[str]) -> None:
        self.calls = calls
        self.pushed: list[torch.nn.Module] = []

    def push(self, model: torch.nn.Module) -> int:
        self.calls.append("weights.push")
        self.pushed.append(model)
        return SYNC_BYTES


class _Reference:
    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    def log_probs(self, batch: Batch) -> torch.Tensor:
        self.calls.append("reference.log_probs")
        return torch.full_like(batch.loss_mask, REF_LP)


class _Critic:
    def __init__(self, calls: list[str]) -> None:
        self.calls = calls
        self.returns_at_update: torch.Tensor | None = None

    def values(self, batch: Batch) -> torch.Tensor:
        self.calls.append("critic.values")
        return _values(batch.loss_mask)

    def start_update(self, batch: Batch) -> Callable[[], dict[str, float]]:
        self.calls.append("critic.start_update")
        self.returns_at_update = None if batch.returns is None else batch.returns.clone()

        def wait() -> dict[str, float]:
            self.calls.append("critic.wait")
            return {"critic/vf_loss": 0.5}

        return wait

    def trained(self) -> dict[str, Any]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


@dataclass
class _Run:
    trainer: Trainer
    calls: list[str]
    actor: _Actor
    rollouts: _Rollouts
    weights: _Weights
    critic: _Critic | None
    reference: _Reference | None


def _trainer(tmp_path: Path, overrides: list[str], world_size: int = 1, skip_updates: bool = False) -> _Run:
    cfg = load_config(overrides)
    plan = plan_run(cfg, 1)
    calls: list[str] = []
    actor, rollouts, weights = _Actor(calls, skip_updates), _Rollouts(calls), _Weights(calls)
    critic = _Critic(calls) if plan.critic != "none" else None
    reference = _Reference(calls) if plan.reference != "none" else None
    roles = StepRoles(cast(Any, actor), cast(Any, rollouts), weights, cast(Any, critic), reference)
    info = RankInfo(0, world_size, True, tmp_path, PAD, None)
    return _Run(Trainer(cfg, plan, roles, Timer(), info), calls, actor, rollouts, weights, critic, reference)


@pytest.fixture(autouse=True)
def _no_fault(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TORCHRL_POST_FAULT", raising=False)


def _grpo_by_hand(scores: list[float], groups: list[int]) -> list[float]:
    """(r - group mean) / (unbiased group std + 1e-6), per sample."""
    out = []
    for s, g in zip(scores, groups, strict=True):
        mine = [x for x, h in zip(scores, groups, strict=True) if h == g]
        out.append((s - statistics.mean(mine)) / (statistics.stdev(mine) + 1e-6))
    return out


NEXT, OLD, REF = "rollouts.next_batch", "actor.log_probs", "reference.log_probs"
VALS, START, UPDATE, WAIT = "critic.values", "critic.start_update", "actor.update", "critic.wait"
PUSH, OFFLOAD, METRICS = "weights.push", "actor.offload", "rollouts.metrics"


@pytest.mark.parametrize(
    ("overrides", "plan_says", "order"),
    [
        ([], (False, "none", "none"), [NEXT, UPDATE, PUSH, METRICS]),
        (["actor.ppo_epochs=2"], (True, "none", "none"), [NEXT, OLD, UPDATE, PUSH, METRICS]),
        (["actor.use_kl_loss=true"], (False, "colocated", "none"), [NEXT, REF, UPDATE, PUSH, METRICS]),
        (
            ["algorithm.adv_estimator=gae"],
            (False, "none", "colocated"),
            [NEXT, VALS, START, UPDATE, WAIT, PUSH, METRICS],
        ),
        (
            ["algorithm.adv_estimator=gae", "algorithm.use_kl_in_reward=true"],
            (True, "colocated", "colocated"),
            [NEXT, OLD, REF, VALS, START, UPDATE, WAIT, PUSH, METRICS],
        ),
    ],
    ids=["grpo", "old-logprobs", "kl-loss-reference", "gae-critic", "everything"],
)
def test_train_step_calls_the_roles_the_plan_has_in_the_data_order(
    tmp_path: Path, overrides: list[str], plan_says: tuple[bool, str, str], order: list[str]
) -> None:
    run = _trainer(tmp_path, overrides)
    plan = run.trainer.plan
    assert (plan.needs_old_log_probs, plan.reference, plan.critic) == plan_says
    run.trainer.train_step(5)
    assert run.calls == [OFFLOAD, *order]  # the actor's host offload (where configured) before generating
    assert run.rollouts.steps == [5]
    seen = run.actor.seen  # what the update saw: every tensor an earlier stage put on the batch
    mask = _scored_batch().loss_mask
    if plan.needs_old_log_probs:
        assert seen["old_log_probs"] is not None and torch.equal(seen["old_log_probs"], torch.full_like(mask, OLD_LP))
    else:
        assert seen["old_log_probs"] is None
    if run.reference is not None:
        assert seen["ref_log_probs"] is not None and torch.equal(seen["ref_log_probs"], torch.full_like(mask, REF_LP))
    else:
        assert seen["ref_log_probs"] is None
    if run.critic is not None:
        assert seen["values"] is not None and torch.equal(seen["values"], _values(mask))
        # the critic regresses onto the returns the estimator made before its update started
        assert run.critic.returns_at_update is not None and seen["returns"] is not None
        assert torch.equal(run.critic.returns_at_update, seen["returns"])
    else:
        assert seen["values"] is None
    assert seen["advantages"] is not None and seen["returns"] is not None


def test_train_step_advantages_are_grpo_of_the_batch_scores_within_its_groups(tmp_path: Path) -> None:
    run = _trainer(tmp_path, [])
    run.trainer.train_step(1)
    batch = _scored_batch()
    by_hand = _grpo_by_hand(SCORES, batch.group_ids.tolist())
    assert by_hand[0] == pytest.approx(2**-0.5, abs=1e-5)  # group {1, 0}: +-0.5 / 0.7071
    expected = torch.tensor(by_hand).unsqueeze(-1) * batch.loss_mask
    adv = run.actor.seen["advantages"]
    assert adv is not None
    torch.testing.assert_close(adv, expected)
    assert run.actor.seen["returns"] is not None and torch.equal(run.actor.seen["returns"], adv)


def test_gae_advantages_use_the_critics_values(tmp_path: Path) -> None:
    run = _trainer(tmp_path, ["algorithm.adv_estimator=gae", "algorithm.gamma=1.0", "algorithm.lam=1.0"])
    run.trainer.train_step(1)
    batch = _scored_batch()
    # gamma = lam = 1: the raw advantage at each real token is the score minus that token's value (the values
    # vary along the response, so advantages computed without them differ after whitening); returns are the
    # score on every real token; advantages are whitened over the batch's real tokens.
    returns = run.actor.seen["returns"]
    assert returns is not None
    torch.testing.assert_close(returns, torch.tensor(SCORES).unsqueeze(-1) * batch.loss_mask)
    raw = (torch.tensor(SCORES).unsqueeze(-1) - _values(batch.loss_mask)) * batch.loss_mask
    m = batch.loss_mask.bool()
    mean, std = raw[m].mean(), raw[m].std()
    expected = (raw - mean) / torch.sqrt(std**2 + 1e-8) * batch.loss_mask
    adv = run.actor.seen["advantages"]
    assert adv is not None
    torch.testing.assert_close(adv, expected, atol=1e-5, rtol=1e-5)


def test_step_metrics_sync_bytes_throughput_and_batch_metrics(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter([100.0, 104.0])  # Trainer.step reads the clock twice: 4 s for the step
    monkeypatch.setattr(trainer_module, "time", SimpleNamespace(perf_counter=lambda: next(clock)))
    run = _trainer(tmp_path, ["actor.ppo_epochs=2"], world_size=2)
    metrics = run.trainer.step(7)
    batch = _scored_batch()
    tokens = float(batch.attention_mask.sum())
    assert tokens == (3 + 2) + (3 + 4) + (1 + 0) + (1 + 1)
    assert metrics["timing_s/step"] == 4.0
    assert metrics["perf/throughput"] == tokens / 4.0 / 2  # tokens / elapsed / world size
    assert metrics["perf/sync_bytes"] == float(SYNC_BYTES)
    assert run.weights.pushed == [run.actor.model]
    assert metrics["training/global_step"] == 7 and metrics["training/epoch"] == 2
    assert metrics["critic/score/mean"] == pytest.approx(sum(SCORES) / len(SCORES))
    assert metrics["critic/score/max"] == 1.0 and metrics["critic/score/min"] == 0.0
    assert metrics["response_length/mean"] == pytest.approx((2 + 4 + 0 + 1) / 4)
    assert metrics["response_length/clip_ratio"] == pytest.approx(1 / 4)  # one "length" termination
    assert metrics["prompt_length/mean"] == pytest.approx((3 + 3 + 1 + 1) / 4)
    for key in ("critic/rewards/mean", "critic/advantages/mean", "reward/errors", "response_length/max"):
        assert key in metrics, key
    assert metrics["actor/pg_loss"] == 0.125  # the update's metrics
    assert metrics["rollout/staleness"] == 0.0  # the source's metrics
    for stage in ("old_log_prob", "adv", "update_actor", "wait_critic", "sync"):
        assert f"timing_s/{stage}" in metrics, stage


def test_nonfinite_guard_stops_after_max_nonfinite_skips(tmp_path: Path) -> None:
    run = _trainer(tmp_path, ["trainer.max_nonfinite_skips=3"], skip_updates=True)
    run.trainer.train_step(1)
    run.trainer.train_step(2)
    assert run.calls.count(PUSH) == 2
    with pytest.raises(TrainingError, match=r"step 3: 3 consecutive .*trainer.max_nonfinite_skips=3.* is none"):
        run.trainer.train_step(3)
    assert run.calls.count(PUSH) == 2  # no sync of weights from a run of skipped updates
    assert run.calls[-1] == UPDATE
