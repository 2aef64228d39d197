"""Tests of torchrl_post/trainer.py: the warning when engine and trainer logprobs drift apart."""

from __future__ import annotations

import pytest

from torchrl_post.config.schema import Config
from torchrl_post.trainer import logprob_diff_warning

# --- the trainer's warning --------------------------------------------------------------------------------------


def test_logprob_diff_far_above_float32_noise_warns_naming_value_threshold_and_key() -> None:
    cfg = Config()
    assert cfg.trainer.max_logprob_diff == 1e-4  # float32 parity is about 1e-6; the stale head: 1.5e-4
    assert logprob_diff_warning({"rollout/logprob_diff": 5e-6}, cfg) is None
    text = logprob_diff_warning({"rollout/logprob_diff": 2.2e-4, "rollout/staleness": 0.0}, cfg)
    assert text is not None
    for part in ("0.00022", "0.0001", "trainer.max_logprob_diff", "missed a parameter", "tied embeddings"):
        assert part in text, part
    cfg.trainer.max_logprob_diff = 1e-3
    assert logprob_diff_warning({"rollout/logprob_diff": 2.2e-4}, cfg) is None


@pytest.mark.parametrize(
    ("key", "value", "metrics"),
    [
        ("trainer.max_logprob_diff", 0.0, {}),
        ("rollout.dtype", "bfloat16", {}),
        ("actor.fsdp.param_dtype", "bfloat16", {}),
        ("rollout.top_p", 0.9, {}),
        ("rollout.top_k", 20, {}),
        (None, None, {"rollout/staleness": 1.0}),
    ],
    ids=["off", "bf16-engine", "bf16-trainer", "top_p", "top_k", "look-ahead"],
)
def test_logprob_diff_check_stays_off_where_engine_and_trainer_differ_by_design(
    key: str | None, value: object, metrics: dict[str, float]
) -> None:
    cfg = Config()
    if key is not None:
        *path, last = key.split(".")
        node: object = cfg
        for part in path:
            node = getattr(node, part)
        setattr(node, last, value)
    assert logprob_diff_warning({"rollout/logprob_diff": 0.5, **metrics}, cfg) is None
