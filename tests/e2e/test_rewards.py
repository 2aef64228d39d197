"""Rewards from models, end to end: the rule, a reward model and a remote judge mixed by reward.weights (the mixed
score is the weighted sum of the sources'), a reward model on ranks of its own scoring as the colocated one does,
and a run with both resuming exactly (2 steps, a restart with the reward model moved to its own rank, 2 more equal
4 straight)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import BIN, REPO, assert_ok, read_jsonl, resumed_from, torchrun, train_overrides

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]
TRAIN = ["-m", "torchrl_post.train"]
WEIGHTS = {"rule": 0.5, "reward_model": 0.25, "judge": 1.0}
COMPARED = ["actor/loss", "actor/grad_norm", "critic/score/mean", "reward/reward_model/mean", "reward/judge/mean"]


@pytest.fixture(scope="module")
def judge_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """tests/e2e/judge_server.py: a chat-completions server that grades by exact match (\\boxed{10} or {0})."""
    port_file = tmp_path_factory.mktemp("judge") / "port"
    server = subprocess.Popen([str(BIN / "python"), "tests/e2e/judge_server.py", str(port_file)], cwd=REPO)
    try:
        deadline = time.monotonic() + 30
        while not port_file.is_file() or not port_file.read_text():
            assert server.poll() is None and time.monotonic() < deadline, "the judge server did not start"
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port_file.read_text()}/v1"
    finally:
        server.kill()


def _mixed(model: Path, data: tuple[Path, Path], run: Path, reward_model: Path, url: str) -> list[str]:
    from tests.e2e.judge_server import TEMPLATE

    skip = ("trainer.test_freq", "reward.function")  # the rule: the reward server's digit fraction
    return [
        *(o for o in train_overrides(model, data, run, 4) if not o.startswith(skip)),
        "trainer.test_freq=0",
        f"reward.server.url=[{url.removesuffix('/v1')}/get_reward]",
        "reward_model.enable=true",
        f"reward_model.model.path={reward_model}",
        "reward_model.micro_batch_size_per_gpu=3",
        "reward.judge.enable=true",
        f"reward.judge.url={url}",
        "reward.judge.model=grader",
        f"reward.judge.template='{TEMPLATE}'",
        *(f"reward.weights.{k}={w}" for k, w in WEIGHTS.items()),
    ]


def test_rule_reward_model_and_judge_mix_resume_exactly_and_the_reward_model_on_its_own_rank_agrees(
    tiny_model: Path, tiny_reward_model: Path, task_data: tuple[Path, Path], judge_url: str, tmp_path: Path
) -> None:
    straight, split, own = tmp_path / "straight", tmp_path / "split", tmp_path / "own"
    args = lambda run: TRAIN + _mixed(tiny_model, task_data, run, tiny_reward_model, judge_url)  # noqa: E731
    assert_ok(torchrun(2, args(straight)))
    proc = torchrun(2, args(split) + resumed_from(straight, 2))
    assert_ok(proc)
    assert "resumed from" in proc.stdout + proc.stderr
    on_own_rank = ["placement.actor=[0,1]", "placement.reward_model=[2]", "trainer.total_training_steps=2"]
    assert_ok(torchrun(3, args(own) + on_own_rank))
    a, b, c = (
        {r["training/global_step"]: r for r in read_jsonl(run / "metrics.jsonl")} for run in (straight, split, own)
    )
    assert sorted(a) == [1, 2, 3, 4] and sorted(b) == [3, 4] and sorted(c) == [1, 2]
    for step, row in a.items():
        # the trained score is the weighted sum of the sources' (each mean over the same samples)
        mixed = sum(w * row[f"reward/{k}/mean"] for k, w in WEIGHTS.items())
        assert row["critic/score/mean"] == pytest.approx(mixed, abs=1e-5), step
        assert row["reward/judge/mean"] == pytest.approx(row["reward/rule/mean"], abs=0.2)  # both grade the sum
        assert row["reward/judge/failed"] == 0 and row["reward/errors"] == 0
        assert row["reward/served"] == 1.0  # the rule's scores came from the reward server
        assert row["reward/reward_model/max"] > row["reward/reward_model/min"]  # it tells samples apart
    # exact resume; the reward model on a rank of its own scores as the colocated one
    for other in (b, c):
        for step in other:
            for key in COMPARED:
                assert other[step][key] == pytest.approx(a[step][key], abs=1e-6), f"{key} differs at step {step}"


def test_the_demo_judge_on_a_vllm_engine_of_its_own_grades_as_the_rule(
    demo_judge_model: Path, demo: tuple[Path, Path], tmp_path: Path
) -> None:
    """configs/judge.yaml as `make train ARGS="--config-name judge"` runs it, for 3 steps: the judge, co-hosted on
    each rank on an in-process vLLM engine beside the policy's, agrees with the exact-match rule on 0.98 of the demo
    policy's responses, so the two sources' means over a step's 128 samples are close; none fails."""
    run = tmp_path / "judge"
    model, data = demo
    overrides = [
        "--config-name", "judge", f"model.path={model}", f"data.train_files={data / 'train.jsonl'}",
        f"data.val_files={data / 'val.jsonl'}", f"reward.judge.model={demo_judge_model}",
        "trainer.total_training_steps=3", "trainer.test_freq=0", "trainer.save_freq=0", f"trainer.default_local_dir={run}",
    ]  # fmt: skip
    assert_ok(torchrun(2, TRAIN + overrides))
    assert "judge: co-hosted on every rollout rank: a vllm engine of its own" in (run / "plan.txt").read_text()
    rows = read_jsonl(run / "metrics.jsonl")
    assert [r["training/global_step"] for r in rows] == [1, 2, 3]
    for row in rows:
        assert row["reward/judge/failed"] == 0 and row["reward/errors"] == 0
        assert row["reward/judge/mean"] == pytest.approx(row["reward/rule/mean"], abs=0.06)
        assert row["critic/score/mean"] == pytest.approx(row["reward/judge/mean"], abs=1e-6)  # the judge alone trains


def test_a_reward_model_on_its_own_rank_scores_each_group_as_it_finishes_and_resumes_exactly(
    tiny_model: Path, tiny_reward_model: Path, task_data: tuple[Path, Path], tmp_path: Path
) -> None:
    """Rollout ranks with partial rollouts and look-ahead, the reward model on a rank of its own scoring each group as
    its last sample finishes (rollout/scores.py): the same metrics as the reward model on the actor's rank scoring the
    step's batch; 2 steps + a resume + 2 equal 4 straight, though the checkpoint holds groups filled ahead whose
    scores had not come (they are posted again)."""
    own, resumed, coloc = tmp_path / "own", tmp_path / "resumed", tmp_path / "coloc"
    args = lambda run, steps: [  # noqa: E731
        *TRAIN,
        *train_overrides(tiny_model, task_data, run, steps),
        "reward_model.enable=true",
        f"reward_model.model.path={tiny_reward_model}",
        "reward.weights.rule=1",
        "reward.weights.reward_model=0.5",
        "placement.actor=[0]",
        "placement.rollout=[1]",
        "rollout.partial_rollout=true",
        "trainer.max_off_policy_steps=1",
    ]
    assert_ok(torchrun(3, args(own, 4) + ["placement.reward_model=[2]"]))
    assert "reward model: own_ranks (scores each group as it finishes)" in (own / "plan.txt").read_text()
    assert_ok(torchrun(3, args(resumed, 4) + ["placement.reward_model=[2]", *resumed_from(own, 2)]))
    assert_ok(torchrun(2, args(coloc, 2)))
    a, b, c = ({r["training/global_step"]: r for r in read_jsonl(run / "metrics.jsonl") if "actor/loss" in r}
               for run in (own, resumed, coloc))  # fmt: skip
    assert sorted(a) == [1, 2, 3, 4] and sorted(b) == [3, 4] and sorted(c) == [1, 2]
    for step, row in a.items():
        assert row["reward/reward_model/max"] > row["reward/reward_model/min"], step  # it tells samples apart
        mixed = row["reward/rule/mean"] + 0.5 * row["reward/reward_model/mean"]
        assert row["critic/score/mean"] == pytest.approx(mixed, abs=1e-5), step
    assert a[2]["rollout/staleness_mean"] > 0  # groups generated ahead: scored before the step that took them
    for other in (b, c):
        for step in other:
            for key in ("actor/loss", "actor/grad_norm", "critic/score/mean", "reward/reward_model/mean"):
                assert other[step][key] == pytest.approx(a[step][key], abs=1e-6), f"{key} differs at step {step}"
