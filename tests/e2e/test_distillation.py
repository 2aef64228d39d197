"""On-policy distillation through the training entrypoint (distillation.*; docs/distillation.md): a Qwen2 student
learns from a Llama teacher of another size with the same tokenizer, colocated and resumed exactly (k1), and over
the teacher's top-k, colocated or with the teacher on a rank of its own (forward_kl_topk, whose [B, R, k, 2] answer
crosses the role link as the estimators' [B, R] logprobs would). The task's policy loss runs under clip_cov for its metrics (distillation.use_task_rewards=false
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


def test_a_student_learns_from_a_teacher_of_another_architecture_and_resumes_exactly(
    tiny_model: Path, tiny_tied_model: Path, task_data: tuple[Path, Path], tmp_path: Path
) -> None:
    straight, split = tmp_path / "straight", tmp_path / "split"
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
    a, b = ({int(r["training/global_step"]): r for r in read_jsonl(run / "metrics.jsonl")} for run in (straight, split))
    assert sorted(a) == [1, 2, 3, 4] and sorted(b) == [3, 4]
    # the student moves toward the teacher: the reverse KL estimate of its own samples falls
    assert a[1]["distill/loss"] > 0.01 and a[4]["distill/loss"] < a[1]["distill/loss"]
    assert all(row["distill/coef"] == 1.0 and row["timing_s/teacher"] > 0 for row in a.values())
    assert any(row["actor/pg_clipfrac"] > 0 for row in a.values())  # clip_cov drew tokens to detach
    for step in b:  # exact resume
        for key in COMPARED:
            assert b[step][key] == pytest.approx(a[step][key], abs=1e-6), f"{key} differs at step {step}"


def test_forward_kl_over_the_teachers_top_k_trains_the_student_and_the_teacher_serves_it_from_its_own_rank(
    tiny_model: Path, tiny_tied_model: Path, task_data: tuple[Path, Path], tmp_path: Path
) -> None:
    """distillation.loss_mode=forward_kl_topk, backpropagated (use_policy_gradient=false) and alone: the teacher
    answers its top-8 tokens at every response position (`Batch.teacher_topk`), the student scores those ids in its
    update's forward. On a rank of its own the teacher's [B, R, k, 2] answer crosses the role link and the run
    equals the colocated one."""
    colocated, own = tmp_path / "colocated", tmp_path / "own"
    args = lambda run: TRAIN + train_overrides(tiny_model, task_data, run, 3) + [  # noqa: E731
        "distillation.enable=true", f"distillation.teacher.path={tiny_tied_model}",
        "distillation.loss_mode=forward_kl_topk", "distillation.topk=8", "distillation.use_policy_gradient=false",
        "distillation.use_task_rewards=false", "trainer.test_freq=0", "trainer.save_freq=0",
    ]  # fmt: skip
    assert_ok(torchrun(2, args(colocated)))
    assert "(its top-8 tokens per position)" in (colocated / "plan.txt").read_text()
    assert_ok(torchrun(3, args(own) + ["placement.actor=[0,1]", "placement.teacher=[2]"]))
    a, c = ({int(r["training/global_step"]): r for r in read_jsonl(run / "metrics.jsonl")} for run in (colocated, own))
    assert sorted(a) == sorted(c) == [1, 2, 3]
    for row in a.values():
        # the teacher's 8 of 128 tokens hold part of its mass; the student's share of them is its own, below 1
        assert 0.05 < row["distill/teacher_mass"] < 1 and 0 < row["distill/student_mass"] < 1
        assert row["distill/loss"] > 0 and row["timing_s/teacher"] > 0
    # the student moves toward the teacher: the forward KL over its top-k falls, its mass there rises
    assert a[3]["distill/loss"] < a[1]["distill/loss"] and a[3]["distill/student_mass"] > a[1]["distill/student_mass"]
    for step in a:
        for key in (*COMPARED, "distill/student_mass", "distill/teacher_mass"):
            assert c[step][key] == pytest.approx(a[step][key], abs=1e-6), f"{key} differs at step {step}"
