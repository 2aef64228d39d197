"""A mixture-of-experts model through the whole loop with routing replay: the vLLM engine colocated and on a rank of
its own, the engine's recorded experts replayed in the trainer, the load-balancing loss, and exact resume."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.conftest import assert_ok, read_jsonl, resumed_from, torchrun, train_overrides
from tests.e2e.test_agent import AGENT
from tests.e2e.test_recovery import _role_weights

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]
TRAIN = ["-m", "torchrl_post.train"]
MOE = ["actor.router_replay=true", "actor.router_aux_loss_coef=0.01", "trainer.test_freq=0", "trainer.save_freq=1"]
COMPARED = ["actor/loss", "actor/grad_norm", "actor/entropy", "actor/moe_aux_loss", "critic/score/mean"]


def _args(model: Path, data: tuple[Path, Path], run: Path, steps: int, *extra: str) -> list[str]:
    base = [
        o for o in train_overrides(model, data, run, steps) if not o.startswith(("trainer.test_freq", "trainer.save"))
    ]
    return TRAIN + base + MOE + list(extra)


@pytest.fixture(scope="module")
def runs(
    tiny_moe_model: Path, task_data: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    """4 steps straight, and a restart from its step-2 checkpoint trained to step 4, colocated on 2 ranks."""
    root = tmp_path_factory.mktemp("moe")
    straight, split = root / "straight", root / "split"
    assert_ok(torchrun(2, _args(tiny_moe_model, task_data, straight, 4)))
    proc = torchrun(2, _args(tiny_moe_model, task_data, split, 4, *resumed_from(straight, 2)))
    assert_ok(proc)
    assert "resumed from" in proc.stdout + proc.stderr
    return {"straight": straight, "split": split}


def _check_routing(rows: list[dict]) -> None:
    """In float32 the engine's routes are the trainer's own (a misplaced record would disagree about half the
    time), and with them replayed the logprobs match as a dense model's do."""
    for r in rows:
        assert r["rollout/router_mismatch"] < 0.01, r
        assert r["rollout/logprob_diff"] < 1e-5, r
        assert 1.0 < r["actor/moe_aux_loss"] < 4.0, r  # top-2 of 4 experts: 2 when balanced, 4 at most


def test_moe_replay_trains_and_resumes_exactly(runs: dict[str, Path], tmp_path: Path) -> None:
    a = {r["training/global_step"]: r for r in read_jsonl(runs["straight"] / "metrics.jsonl")}
    b = {r["training/global_step"]: r for r in read_jsonl(runs["split"] / "metrics.jsonl")}
    assert sorted(a) == [1, 2, 3, 4] and sorted(b) == [3, 4]
    _check_routing(list(a.values()))
    for step in b:
        for key in COMPARED:
            assert b[step][key] == pytest.approx(a[step][key], abs=1e-6), f"{key} differs at step {step}"
    wa = _role_weights(runs["straight"] / "checkpoints" / "global_step_4", tmp_path, "actor")
    wb = _role_weights(runs["split"] / "checkpoints" / "global_step_4", tmp_path, "actor")
    experts = [k for k in wa if "experts" in k]
    assert experts and any("gate.weight" in k for k in wa)  # the experts and the routers are checkpointed
    assert max((wa[k] - wb[k]).abs().max().item() for k in wa) <= 1e-6
    w0 = _role_weights(runs["straight"] / "checkpoints" / "global_step_1", tmp_path, "actor")
    assert all(not torch.equal(w0[k], wa[k]) for k in experts)  # every expert tensor trained


def test_moe_replay_of_agent_turns_on_a_rollout_rank(
    tiny_moe_model: Path, task_data: tuple[Path, Path], tmp_path: Path
) -> None:
    """The engine on a rank of its own running multi-turn agent episodes: each turn records the experts of its whole
    sequence (it reads no cached prefix), a trajectory's row takes its last turn's, the routes cross to the actor with
    the batch and the experts' weights reach the engine by broadcast. (Plain samples on a rollout rank:
    tests/e2e/test_streaming.py's streamed routing replay.)"""
    run = tmp_path / "run"
    agent = [a for a in AGENT if a != "rollout.mode=async"]
    place = ["placement.actor=[0]", "placement.rollout=[1]"]
    assert_ok(torchrun(2, _args(tiny_moe_model, task_data, run, 2, *place, *agent)))
    rows = [r for r in read_jsonl(run / "metrics.jsonl") if r.get("training/global_step", 0) >= 1]
    assert len(rows) == 2
    _check_routing(rows)
    assert all(r["agent/num_turns/mean"] > 1 for r in rows), "multi-turn episodes"


def _metrics_equal(a: dict[int, dict], b: dict[int, dict], steps: list[int]) -> None:
    """Every metric but timings and throughput equal to 1e-6 at `steps`."""
    for step in steps:
        keys = [k for k in a[step] if isinstance(a[step][k], float) and not k.startswith(("timing_s/", "perf/"))]
        assert len(keys) > 30
        for key in keys:
            assert b[step][key] == pytest.approx(a[step][key], abs=1e-6), f"{key} differs at step {step}"


def _by_step(run: Path) -> dict[int, dict]:
    return {int(r["training/global_step"]): r for r in read_jsonl(run / "metrics.jsonl")}


def test_expert_parallel_training_equals_ep1_and_resumes_across_ep(
    runs: dict[str, Path], tiny_moe_model: Path, task_data: tuple[Path, Path], tmp_path: Path
) -> None:
    """actor.fsdp.expert_parallel_size through the whole loop (the experts split by expert over ep, tokens sent to
        them by all-to-all, FSDP over the rest, the weight sync gathering every expert into the engine, routing replay
        and the load-balancing loss): on 2 ranks, ep = 2 gives the ep = 1 run's metrics at every step (the engine's
        logprobs after each sync included); on 4 ranks with Ulysses sp = 2, a run saved at ep = 2 (with HSDP: 2 replicas
    of 2 shards) resumes at ep = 1, whose
        checkpoint resumes at ep = 4, each equal to 4 straight steps at ep = 1 (DCP reshards the experts across the
        change)."""
    ep = "actor.fsdp.expert_parallel_size="
    two = tmp_path / "ep2"
    assert_ok(torchrun(2, _args(tiny_moe_model, task_data, two, 4, f"{ep}2")))
    _metrics_equal(_by_step(runs["straight"]), _by_step(two), [1, 2, 3, 4])
    wa = _role_weights(runs["straight"] / "checkpoints" / "global_step_4", tmp_path, "actor")
    wb = _role_weights(two / "checkpoints" / "global_step_4", tmp_path, "actor")
    assert set(wa) == set(wb) and wb["model.layers.0.mlp.experts.gate_up_proj"].shape[0] == 4  # saved whole
    # Gradients agree to float32 rounding; AdamW's update g / (|g| + 1e-8) magnifies that rounding only where a
    # gradient is near its eps (1e-9 here), so a few expert entries differ by up to ~1e-5 of a 1e-2 step.
    assert max((wa[k] - wb[k]).abs().max().item() for k in wa) < 1e-4

    chain = {name: tmp_path / name for name in ("straight4", "at_ep2", "at_ep1", "at_ep4")}
    sp = "model.ulysses_sequence_parallel_size=2"  # each row's tokens over 2 ranks, routed wherever they sit
    assert_ok(torchrun(4, _args(tiny_moe_model, task_data, chain["straight4"], 4, sp)))
    hsdp = "actor.fsdp.fsdp_size=2"  # the first link with HSDP too: ep = 2 within each replica's 2 shards
    assert_ok(torchrun(4, _args(tiny_moe_model, task_data, chain["at_ep2"], 2, sp, f"{ep}2", hsdp)))
    assert "experts (dp_replicate, efsdp, ep) = (2, 1, 2)" in (chain["at_ep2"] / "plan.txt").read_text()
    assert_ok(torchrun(4, _args(tiny_moe_model, task_data, chain["at_ep1"], 3, sp, *resumed_from(chain["at_ep2"], 2))))
    at4 = _args(tiny_moe_model, task_data, chain["at_ep4"], 4, sp, f"{ep}4", *resumed_from(chain["at_ep1"], 3))
    assert_ok(torchrun(4, at4))
    assert "experts (efsdp, ep) = (1, 4)" in (chain["at_ep4"] / "plan.txt").read_text()
    straight = _by_step(chain["straight4"])
    _metrics_equal(straight, _by_step(chain["at_ep2"]), [1, 2])
    _metrics_equal(straight, _by_step(chain["at_ep1"]), [3])
    _metrics_equal(straight, _by_step(chain["at_ep4"]), [4])


def test_expert_parallel_with_a_critic_padded_and_a_rollout_rank(
    tiny_moe_model: Path, task_data: tuple[Path, Path], tmp_path: Path
) -> None:
    """What the resume chain leaves out, in one placement on 3 ranks: the actor and a colocated critic (GAE) on
    ranks 0-1, both with ep = 2, padded micro-batches (`model.use_remove_padding=false`), and the engine on rank 2,
    which gets the experts by broadcast as per-expert checkpoint tensors (one ep block at a time). Every metric
    equals the ep = 1 run's at both steps, the engine's logprobs after each sync included."""
    common = ["algorithm.adv_estimator=gae", "model.use_remove_padding=false"]
    place = ["placement.actor=[0,1]", "placement.rollout=[2]"]
    ep2 = ["actor.fsdp.expert_parallel_size=2", "critic.fsdp.expert_parallel_size=2"]
    one, two = tmp_path / "ep1", tmp_path / "ep2"
    assert_ok(torchrun(3, _args(tiny_moe_model, task_data, one, 2, *common, *place)))
    assert_ok(torchrun(3, _args(tiny_moe_model, task_data, two, 2, *common, *place, *ep2)))
    plan = (two / "plan.txt").read_text()
    assert plan.count("experts (efsdp, ep) = (1, 2)") == 2, plan  # the actor's and the critic's
    _metrics_equal(_by_step(one), _by_step(two), [1, 2])
    assert all(r["rollout/logprob_diff"] < 1e-5 for r in _by_step(two).values())  # the engine got the new experts


def test_expert_parallel_with_lora_on_the_experts(
    tiny_moe_model: Path, task_data: tuple[Path, Path], tmp_path: Path
) -> None:
    """LoRA on the attention and the fused experts (PEFT's `target_parameters`) with ep = 2 on 2 ranks: each rank
    adds its own experts' share of the adapters' update, the adapters' gradients sum over the ranks, and the
    merged sync gives the engine the adapted experts. Every metric equals the ep = 1 run's at both steps."""
    lora = ["model.lora_rank=4", "model.lora_alpha=8"]
    one, two = tmp_path / "ep1", tmp_path / "ep2"
    assert_ok(torchrun(2, _args(tiny_moe_model, task_data, one, 2, *lora)))
    assert_ok(torchrun(2, _args(tiny_moe_model, task_data, two, 2, *lora, "actor.fsdp.expert_parallel_size=2")))
    _metrics_equal(_by_step(one), _by_step(two), [1, 2])
    assert all(r["rollout/logprob_diff"] < 1e-5 for r in _by_step(two).values())  # the engine got the adapted experts
    # at ep = 2 the experts leave merged, one ep block at a time (sync/weights.py: ExpertBlocks): their adapters
    # are not sent, so the sync moves fewer bytes than ep = 1's base experts plus adapters
    assert all(_by_step(two)[s]["perf/sync_bytes"] < _by_step(one)[s]["perf/sync_bytes"] for s in (1, 2))
    wa = _role_weights(one / "checkpoints" / "global_step_2", tmp_path, "actor")
    wb = _role_weights(two / "checkpoints" / "global_step_2", tmp_path, "actor")
    adapters = [k for k in wa if ".experts." in k and "lora_B" in k]  # zero at the start: trained since
    assert adapters and all(wa[k].abs().max() > 0 for k in adapters), sorted(wa)
    # AdamW's first steps move each entry by about lr (1e-2) whatever its gradient's size, so a wrong share of the
    # update would move most entries by that much; the rounding it magnifies where a gradient is near eps moves a
    # few entries by up to ~1e-5 (as in the resume chain above)
    assert max((wa[k] - wb[k]).abs().max().item() for k in adapters) < 1e-4
    assert sum(int((wa[k] - wb[k]).abs().gt(1e-7).sum()) for k in adapters) < 0.01 * sum(
        wa[k].numel() for k in adapters
    )
