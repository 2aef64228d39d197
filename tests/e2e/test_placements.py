"""The real entrypoint under torchrun with roles on their own ranks (3 and 4 processes, gloo).

Every placement samples the same responses (per-prompt seeds, the same weights), so its per-step numbers
must equal a colocated 2-rank run's: the batch transfer, the broadcast sync, HSDP and the role links change
where the work happens, not what is computed. Runs that stop and resume must still match, so each of those
checks exact resume too. Async rollout is checked for its staleness bound, its correction and its resume.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from tests.conftest import assert_ok, read_jsonl, torchrun, train_overrides

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]
TRAIN = ["-m", "torchrl_post.train"]
EXACT = ["critic/score/mean", "response_length/mean"]
CLOSE = ["actor/pg_loss", "actor/grad_norm", "actor/entropy"]
CRITIC = ["critic/values/mean", "critic/loss", "critic/grad_norm", "actor/kl_loss"]
THREE = ["placement.actor=[0,1]", "placement.rollout=[2]"]
ASYNC = [
    "placement.actor=[0,1]",
    "placement.rollout=[2,3]",
    "rollout.tensor_parallel_size=2",
    "rollout.mode=async",
    "trainer.max_off_policy_steps=1",
]
GAE_KL = ["algorithm.adv_estimator=gae", "actor.use_kl_loss=true"]


def _train(nproc: int, model: Path, data: tuple[Path, Path], run: Path, steps: int, *extra: str) -> dict[int, dict]:
    proc = torchrun(nproc, TRAIN + train_overrides(model, data, run, steps) + list(extra))
    assert_ok(proc)
    rows: dict[int, dict] = {}
    for r in read_jsonl(run / "metrics.jsonl"):
        rows.setdefault(r["training/global_step"], {}).update(r)
    return rows


def _same(a: dict[int, dict], b: dict[int, dict], steps: list[int], extra: tuple[str, ...] = ()) -> None:
    for step in steps:
        # The same samples; sums over a different number of ranks differ only in the last float bits.
        for key in EXACT:
            assert b[step][key] == pytest.approx(a[step][key], rel=1e-6), f"{key} differs at step {step}"
        for key in [*CLOSE, *extra]:
            assert b[step][key] == pytest.approx(a[step][key], rel=1e-3, abs=1e-5), f"{key} differs at step {step}"
        vals = [k for k in a[step] if k.startswith("val/")]
        assert [b[step][k] for k in vals] == pytest.approx([a[step][k] for k in vals], rel=1e-6)


@pytest.fixture(scope="module")
def colocated(tiny_model: Path, task_data: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> dict:
    return _train(2, tiny_model, task_data, tmp_path_factory.mktemp("colocated"), 4)


def test_rollout_on_its_own_rank_matches_colocated_through_a_resume(
    colocated: dict, tiny_model: Path, task_data: tuple[Path, Path], tmp_path: Path
) -> None:
    """3 processes: 2 steps, a restart that resumes from the step-2 checkpoint, 2 more: equal to colocated."""
    _train(3, tiny_model, task_data, tmp_path, 2, *THREE)
    rows = _train(3, tiny_model, task_data, tmp_path, 4, *THREE)
    _same(colocated, rows, [1, 2, 3, 4])
    assert all(rows[s]["rollout/staleness"] == 0 for s in (1, 2, 3, 4))
    assert rows[1]["perf/sync_bytes"] > 0
    # Weights moved: the final checkpoint's actor differs from the initial model.
    initial = load_file(str(tiny_model / "model.safetensors"))
    dcp_to_torch_save(str(tmp_path / "checkpoints" / "global_step_4" / "actor"), str(tmp_path / "final.pt"))
    final = torch.load(tmp_path / "final.pt", weights_only=True)["model"]
    assert max((final[k] - initial[k]).abs().max().item() for k in initial) > 1e-3


def test_two_engines_on_two_rollout_ranks(
    colocated: dict, tiny_model: Path, task_data: tuple[Path, Path], tmp_path: Path
) -> None:
    """4 processes: actor [0,1], an engine each on ranks 2 and 3 (the batch split between them)."""
    rows = _train(4, tiny_model, task_data, tmp_path, 2, "placement.actor=[0,1]", "placement.rollout=[2,3]")
    _same(colocated, rows, [1, 2])


def test_hsdp_actor_with_tensor_parallel_engines_over_its_ranks(
    colocated: dict, tiny_model: Path, task_data: tuple[Path, Path], tmp_path: Path
) -> None:
    """4 processes, all colocated: the actor as HSDP (2 replicas x 2 shards) and two vLLM engines of TP=2 over
    its ranks, whose ranks draw the engine's prompts together and each train every other group."""
    rows = _train(4, tiny_model, task_data, tmp_path, 2, "actor.fsdp.fsdp_size=2", "rollout.tensor_parallel_size=2")
    _same(colocated, rows, [1, 2])


def test_critic_and_reference_on_their_own_ranks(
    tiny_model: Path, task_data: tuple[Path, Path], tmp_path: Path
) -> None:
    """4 processes: actor [0,1] (with the rollout), critic [2], reference [3]; PPO + GAE + KL loss, through a
    resume (the critic's DCP shards live on its own ranks)."""
    base = _train(2, tiny_model, task_data, tmp_path / "colocated", 2, *GAE_KL)
    own = [*GAE_KL, "placement.actor=[0,1]", "placement.critic=[2]", "placement.reference=[3]"]
    _train(4, tiny_model, task_data, tmp_path / "own", 1, *own, "trainer.save_freq=1")
    rows = _train(4, tiny_model, task_data, tmp_path / "own", 2, *own, "trainer.save_freq=1")
    _same(base, rows, [1, 2], tuple(CRITIC))
    assert rows[2]["actor/kl_loss"] > 0, "the reference answered with its own logprobs"
    assert (tmp_path / "own" / "checkpoints" / "global_step_2" / "critic").is_dir()


def test_async_rollout_bounds_staleness_corrects_and_resumes_exactly(
    colocated: dict, tiny_model: Path, task_data: tuple[Path, Path], tmp_path: Path
) -> None:
    """4 processes, a tensor-parallel engine on ranks [2,3] generating one step ahead (max_off_policy_steps=1)."""
    straight = _train(4, tiny_model, task_data, tmp_path / "straight", 3, *ASYNC, "trainer.save_freq=1")
    # Batch 1 comes from the initial weights (as in sync mode); batch k+1 is generated during update k.
    assert [straight[s]["rollout/staleness"] for s in (1, 2, 3)] == [0, 1, 1]
    _same(colocated, straight, [1])
    assert straight[1]["rollout_corr/is_weight_mean"] == pytest.approx(1.0, abs=1e-4)  # on-policy: weight 1
    for s in (2, 3):
        assert straight[s]["rollout/logprob_diff"] > 1e-4, "a stale batch differs from the current policy"
        assert 0 < straight[s]["rollout_corr/is_weight_mean"] < 2.0
        assert 0 <= straight[s]["rollout_corr/is_clipfrac"] < 1
    assert straight[2]["critic/score/mean"] != colocated[2]["critic/score/mean"]
    # A restart from the step-2 checkpoint (what a crash during step 3 leaves; batch 3 was generated during step 2,
    # with the step-1 weights): the queued batch is restored, not regenerated, so step 3 is the same. (A crash
    # while saving is tests/e2e/test_recovery.py's.)
    ckpt = tmp_path / "straight" / "checkpoints" / "global_step_2"
    resume = ["trainer.resume_mode=resume_path", f"trainer.resume_from_path={ckpt}"]
    split = _train(4, tiny_model, task_data, tmp_path / "split", 3, *ASYNC, "trainer.save_freq=1", *resume)
    for key in EXACT + CLOSE + ["rollout/staleness", "rollout_corr/is_weight_mean"]:
        assert split[3][key] == pytest.approx(straight[3][key], abs=1e-6), f"{key} differs after the resume"
