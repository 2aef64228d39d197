"""Multi-turn agent episodes through the real entrypoint (guess-the-number with higher/lower hints): colocated
and with the engine on a rollout rank; turns, terminations and environment time reach the metrics."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests import prebuild
from tests.conftest import assert_ok, math_agent_dir, read_jsonl, run_config, run_example, torchrun, train_overrides

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]
AGENT = [
    "agent.env=torchrl_post.agent.guess_number:GuessNumberEnv",
    "agent.agent=torchrl_post.agent.guess_number:GuessAgent",
    "agent.max_turns=3",
    "agent.max_tokens_per_turn=4",
    "data.max_response_length=12",
    "data.max_prompt_length=160",  # the context: room for observations (character tokens) of three turns
    "rollout.mode=async",
]


def _rows(nproc: int, model: Path, data: tuple[Path, Path], run: Path, *extra: str) -> list[dict]:
    assert_ok(torchrun(nproc, ["-m", "torchrl_post.train", *train_overrides(model, data, run, 2), *AGENT, *extra]))
    return read_jsonl(run / "metrics.jsonl")


@pytest.mark.parametrize(
    "placement", [[], ["placement.actor=[0,1]", "placement.rollout=[2]"]], ids=["colocated", "rollout_rank"]
)
def test_agent_episodes_train(
    placement: list[str], tiny_model: Path, tiny_reward_model: Path, task_data: tuple[Path, Path], tmp_path: Path
) -> None:
    """Colocated, a reward model also scores each trajectory's transcript, mixed with the environment's reward."""
    weights = {"rule": 1.0, "reward_model": 0.5}
    rm = ["reward_model.enable=true", f"reward_model.model.path={tiny_reward_model}"]
    rm += [f"reward.weights.{k}={w}" for k, w in weights.items()]
    rows = _rows(3 if placement else 2, tiny_model, task_data, tmp_path, *(placement or rm))
    steps = [r for r in rows if r["training/global_step"] >= 1 and "actor/loss" in r]
    assert len(steps) == 2
    for r in steps:
        if not placement:
            mixed = sum(w * r[f"reward/{k}/mean"] for k, w in weights.items())
            assert r["critic/score/mean"] == pytest.approx(mixed, abs=1e-5)
            assert r["reward/reward_model/max"] > r["reward/reward_model/min"]  # transcripts told apart
        assert r["agent/num_turns/mean"] > 1.5  # a random model rarely guesses at once
        assert r["agent/termination/max_turns"] > 0
        ends = sum(v for k, v in r.items() if k.startswith("agent/termination/"))
        assert ends == pytest.approx(1.0)
        assert math.isfinite(r["actor/loss"]) and r["response_length/mean"] > 4  # observations included
        if not placement:
            assert r["timing_s/env"] >= 0
    assert "val/test_score/arithmetic" in rows[0]  # validation runs episodes too


def test_stepwise_training_through_the_entrypoint(
    tiny_model: Path, task_data: tuple[Path, Path], tmp_path: Path
) -> None:
    """Each step its own sample (per_step advantages): ranks hold different numbers of step rows (padded even
    at weight 0 so FSDP runs the same micro-batches); trajectory metrics count trajectories, not rows."""
    sw = ["algorithm.stepwise_advantage.enable=true", "algorithm.stepwise_advantage.mode=per_step"]
    rows = _rows(2, tiny_model, task_data, tmp_path, *sw)
    steps = [r for r in rows if r["training/global_step"] >= 1 and "actor/loss" in r]
    assert len(steps) == 2
    for r in steps:
        assert math.isfinite(r["actor/loss"]) and math.isfinite(r["critic/advantages/mean"])
        assert r["agent/num_turns/mean"] > 1.5
        assert sum(v for k, v in r.items() if k.startswith("agent/termination/")) == pytest.approx(1.0)
        assert r["response_length/mean"] <= 4  # one turn's response per row, no observations


def test_guess_number_example_learns(demo: tuple[Path, Path], tmp_path: Path) -> None:
    """configs/guess_number.yaml through the entrypoint: its greedy validation score rises."""
    rows, _ = run_config("guess_number", demo, tmp_path, 20, "trainer.save_freq=0")
    val = [r["val/test_score/arithmetic"] for r in rows if "val/test_score/arithmetic" in r]
    # 0.25 -> 0.47 / 0.63 / 0.64 at step 20 over seeds 0 / 1 / 2; the margin is half the smallest rise
    assert len(val) == 2 and val[1] >= val[0] + 0.11, val
    last = [r for r in rows if "agent/num_turns/mean" in r][-1]
    assert last["agent/num_turns/mean"] > 1.0  # wrong answers get hints and another turn


@pytest.fixture(scope="session")
def math_agent(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The math agent's warm-started model and its data (built in the background: tests/prebuild.py)."""
    from torchrl_post.demo.math_agent import build_math_agent

    prebuild.wait(prebuild.MATH_AGENT)
    root = math_agent_dir(tmp_path_factory)
    build_math_agent(root / "model", root / "data")
    return root / "model", root / "data"


def test_math_agent_example_learns_to_use_its_calculator(math_agent: tuple[Path, Path], tmp_path: Path) -> None:
    """examples/train_math_agent.py (configs/math_agent.yaml; the environment, agent, calculator and datasets
    passed as Python objects): the calculator is called in hermes format, parsed by vLLM's parser, and the
    greedy validation score rises by more than 0.25 (0.25 -> 0.77 / 0.89 / 0.91 in 10 steps over seeds 0 / 1 / 2
    through the entrypoint: half the smallest rise)."""
    rows, _ = run_example("train_math_agent.py", math_agent[0], tmp_path, 10, "trainer.save_freq=0")
    val = [r["val/test_score/math_agent"] for r in rows if "val/test_score/math_agent" in r]
    assert len(val) == 2 and val[1] >= val[0] + 0.25, val
    last = [r for r in rows if "agent/tool_calls/mean" in r][-1]
    # tool calls per trajectory: about 0.3 at step 1, 0.96 / 1.02 / 1.02 at step 10 over seeds 0 / 1 / 2
    assert last["agent/num_turns/mean"] > 1.0 and last["agent/tool_calls/mean"] >= 0.8
    assert last["agent/tool_errors"] >= 0 and last["timing_s/env"] >= 0
