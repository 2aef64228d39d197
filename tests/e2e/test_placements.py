"""The real entrypoint under torchrun with roles on their own ranks (3 and 4 processes, gloo).

Every placement samples the same responses (per-prompt seeds, the same weights), so each run's per-step
numbers must equal a colocated 2-rank run's: the batch transfer, the broadcast sync and HSDP change where
the work happens, not what is computed. Async rollout is checked for its staleness bound and correction.
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
THREE = ["placement.actor=[0,1]", "placement.rollout=[2]"]
FOUR = ["placement.actor=[0,1]", "placement.rollout=[2,3]"]


def _train(nproc: int, model: Path, data: tuple[Path, Path], run: Path, steps: int, *extra: str) -> dict[int, dict]:
    proc = torchrun(nproc, TRAIN + train_overrides(model, data, run, steps) + list(extra))
    assert_ok(proc)
    rows: dict[int, dict] = {}
    for r in read_jsonl(run / "metrics.jsonl"):
        rows.setdefault(r["training/global_step"], {}).update(r)
    return rows


def _same(a: dict[int, dict], b: dict[int, dict], steps: list[int]) -> None:
    for step in steps:
        for key in EXACT:
            # The same samples; sums over a different number of ranks differ only in the last float bits.
            assert b[step][key] == pytest.approx(a[step][key], rel=1e-6), f"{key} differs at step {step}"
        for key in CLOSE:
            assert b[step][key] == pytest.approx(a[step][key], rel=1e-3, abs=1e-5), f"{key} differs at step {step}"
        vals = [k for k in a[step] if k.startswith("val/")]
        assert [b[step][k] for k in vals] == pytest.approx([a[step][k] for k in vals], rel=1e-6)


@pytest.fixture(scope="module")
def colocated(tiny_model: Path, task_data: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> dict:
    return _train(2, tiny_model, task_data, tmp_path_factory.mktemp("colocated"), 4)


def test_rollout_on_its_own_rank_matches_colocated_and_resumes_exactly(
    colocated: dict, tiny_model: Path, task_data: tuple[Path, Path], tmp_path: Path
) -> None:
    straight = _train(3, tiny_model, task_data, tmp_path / "straight", 4, *THREE)
    _same(colocated, straight, [1, 2, 3, 4])
    assert all(straight[s]["rollout/staleness"] == 0 for s in (1, 2, 3, 4))
    assert straight[1]["perf/sync_bytes"] > 0
    # Weights moved: the final checkpoint's actor differs from the initial model.
    initial = load_file(str(tiny_model / "model.safetensors"))
    out = tmp_path / "final.pt"
    dcp_to_torch_save(str(tmp_path / "straight" / "checkpoints" / "global_step_4" / "actor"), str(out))
    final = torch.load(out, weights_only=True)["model"]
    assert max((final[k] - initial[k]).abs().max().item() for k in initial) > 1e-3
    # 2 steps, then a restart that resumes from the step-2 checkpoint and runs to 4.
    _train(3, tiny_model, task_data, tmp_path / "split", 2, *THREE)
    split = _train(3, tiny_model, task_data, tmp_path / "split", 4, *THREE)
    for step in (3, 4):
        for key in EXACT + CLOSE:
            assert split[step][key] == pytest.approx(straight[step][key], abs=1e-6), f"{key} differs at {step}"


def test_tensor_parallel_engine_on_two_rollout_ranks(
    colocated: dict, tiny_model: Path, task_data: tuple[Path, Path], tmp_path: Path
) -> None:
    rows = _train(4, tiny_model, task_data, tmp_path, 2, *FOUR, "rollout.tensor_parallel_size=2")
    _same(colocated, rows, [1, 2])


def test_hsdp_actor_matches_fsdp(
    colocated: dict, tiny_model: Path, task_data: tuple[Path, Path], tmp_path: Path
) -> None:
    rows = _train(4, tiny_model, task_data, tmp_path, 2, "actor.fsdp.fsdp_size=2")
    _same(colocated, rows, [1, 2])


def test_async_rollout_bounds_staleness_and_corrects(
    colocated: dict, tiny_model: Path, task_data: tuple[Path, Path], tmp_path: Path
) -> None:
    rows = _train(4, tiny_model, task_data, tmp_path, 4, *FOUR, "rollout.mode=async", "trainer.max_off_policy_steps=1")
    # Batch 1 comes from the initial weights (as in sync mode); batch k+1 is generated during update k.
    assert [rows[s]["rollout/staleness"] for s in (1, 2, 3, 4)] == [0, 1, 1, 1]
    _same(colocated, rows, [1])
    for s in (2, 3, 4):
        assert rows[s]["rollout/logprob_diff"] > 1e-4, "a stale batch differs from the current policy"
        assert 0 < rows[s]["rollout_corr/is_weight_mean"] < 2.0
        assert 0 <= rows[s]["rollout_corr/is_clipfrac"] < 1
    assert rows[1]["rollout_corr/is_weight_mean"] == pytest.approx(1.0, abs=1e-4)  # on-policy: weight 1
    assert rows[2]["critic/score/mean"] != colocated[2]["critic/score/mean"] or rows[2]["actor/grad_norm"] != (
        pytest.approx(colocated[2]["actor/grad_norm"], rel=1e-6)
    ), "a stale batch must differ from the on-policy one"
