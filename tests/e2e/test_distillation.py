"""On-policy distillation through the training entrypoint (distillation.*; docs/distillation.md): a Qwen2 student
learns from a Llama teacher of another size with the same tokenizer, the teacher colocated or on a rank of its
own, resumed exactly. The task's policy loss runs under clip_cov for its metrics (distillation.use_task_rewards=false
adds none of it), so its random token draw is resumed exactly too."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import assert_ok, read_jsonl, resumed_from, torchrun, train_overrides

TRAIN = ["-m", "torchrl_post.train"]
COMPARED = (
    "distill/loss", "actor/pg_loss", "actor/grad_norm", "actor/pg_clipfrac", "critic/score/mean",
    "response_length/mean", "actor/entropy",
)  # fmt: skip


def test_a_student_learns_from_a_teacher_of_another_architecture_colocated_or_on_its_own_rank_and_resumes(
    tiny_model: Path, tiny_tied_model: Path, task_data: tuple[Path, Path], tmp_path: Path
) -> None:
    straight, split, own = tmp_path / "straight", tmp_path / "split", tmp_path / "own"
    args = lambda run: TRAIN + train_overrides(tiny_model, task_data, run, 4) + [  # noqa: E731
        "distillation.enable=true", f"distillation.teacher.path={tiny_tied_model}", "distillation.loss_mode=k1",
        "distillation.use_task_rewards=false", "actor.policy_loss=clip_cov", "actor.clip_cov_ratio=0.2", "actor.clip_cov_lb=-5", "trainer.test_freq=0",
    ]  # fmt: skip
    assert_ok(torchrun(2, args(straight)))
    plan = (straight / "plan.txt").read_text()
    assert "teacher   ranks [0, 1] (colocated with actor)" in plan and "distillation teacher: colocated" in plan
    proc = torchrun(2, args(split) + resumed_from(straight, 2))
    assert_ok(proc)
    assert "resumed from" in proc.stdout + proc.stderr
    on_own_rank = ["placement.actor=[0,1]", "placement.teacher=[2]", "trainer.total_training_steps=2"]
    assert_ok(torchrun(3, args(own) + on_own_rank))
    a, b, c = (
        {int(r["training/global_step"]): r for r in read_jsonl(run / "metrics.jsonl")} for run in (straight, split, own)
    )
    assert sorted(a) == [1, 2, 3, 4] and sorted(b) == [3, 4] and sorted(c) == [1, 2]
    # the student moves toward the teacher: the reverse KL estimate of its own samples falls
    assert a[1]["distill/loss"] > 0.01 and a[4]["distill/loss"] < a[1]["distill/loss"]
    assert all(row["distill/coef"] == 1.0 and row["timing_s/teacher"] > 0 for row in a.values())
    assert any(row["actor/pg_clipfrac"] > 0 for row in a.values())  # clip_cov drew tokens to detach
    for other in (b, c):  # exact resume; the teacher on a rank of its own scores as the colocated one
        for step in other:
            for key in COMPARED:
                assert other[step][key] == pytest.approx(a[step][key], abs=1e-6), f"{key} differs at step {step}"
