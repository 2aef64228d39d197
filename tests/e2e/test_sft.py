"""Supervised fine-tuning through the training entrypoint (sft.enable; docs/sft.md): the demo, exact resume of a
multi-turn conversation file, and the SFT result loaded straight into an RL run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import assert_ok, read_jsonl, resumed_from, run_config, torchrun

TRAIN = ["-m", "torchrl_post.train"]
COMPARED = ("train/loss", "actor/grad_norm", "actor/entropy", "response_length/mean")


def test_sft_demo_learns_the_sums_from_scratch_and_its_export_is_an_rl_runs_model(
    demo_untrained: Path, demo: tuple[Path, Path], tmp_path: Path
) -> None:
    """configs/sft.yaml as `make train ARGS="--config-name sft"` runs it: the untrained demo model, 100 steps on the
    answers; its val/loss falls from ~5 nats to under 0.6, and the exported checkpoint, given to an RL run as
    model.path, answers the validation sums at least as well as the demo's warm start (0.3 greedy; 0.65 here)."""
    run = tmp_path / "sft"
    rows, out = run_config("sft", (demo_untrained, demo[1]), run, 100, "trainer.save_freq=100")
    assert "supervised fine-tuning (sft.enable): no engine" in (run / "plan.txt").read_text()
    assert "vllm" not in out.lower().replace("vllm_", "")  # no engine was built
    val = {int(r["training/global_step"]): r["val/loss"] for r in rows if "val/loss" in r}
    assert sorted(val) == [0, 100]
    assert val[0] > 4.0 and val[100] < 0.6, val
    train = [r["train/loss"] for r in rows if "train/loss" in r]
    assert len(train) == 100 and sum(train[-10:]) / 10 < sum(train[:10]) / 10 / 4
    hf = run / "checkpoints" / "global_step_100" / "hf"
    assert (hf / "model.safetensors").is_file()
    rl = tmp_path / "rl"
    proc = torchrun(
        2, TRAIN + [f"model.path={hf}", f"data.train_files={demo[1] / 'train.jsonl'}",
                    f"data.val_files={demo[1] / 'val.jsonl'}", "trainer.val_only=true", f"trainer.default_local_dir={rl}"],
    )  # fmt: skip
    assert_ok(proc)
    score = json.loads((rl / "val_only.jsonl").read_text().splitlines()[-1])["val/test_score/arithmetic"]
    warm = json.loads((demo[0] / "demo_build.json").read_text())["target_acc"]
    assert score >= warm, (score, warm)


CONVERSATIONS = [
    {
        "messages": [
            {"role": "user", "content": f"{a}+{b}"},
            {"role": "assistant", "content": str(a + b)},
            {"role": "user", "content": "and doubled?"},
            {"role": "assistant", "content": str(2 * (a + b))},
        ],
        "data_source": "doubling" if a % 2 else "sums",
    }
    for a in range(6)
    for b in range(4)
]


def test_sft_on_conversations_resumes_exactly_and_validates_per_source(tiny_model: Path, tmp_path: Path) -> None:
    """Multi-turn chat rows (loss on both assistant turns), two data sources: 4 steps straight equal 2 + a restart
    from the step-2 checkpoint + 2, to float32 noise, metrics and validation losses alike."""
    data = tmp_path / "chats.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in CONVERSATIONS))
    straight, split = tmp_path / "straight", tmp_path / "split"
    args = lambda run: TRAIN + [  # noqa: E731
        f"model.path={tiny_model}", f"data.train_files={data}", f"data.val_files={data}", "sft.enable=true",
        "data.train_batch_size=8", "data.max_response_length=32", "actor.lr=1e-2", "trainer.total_training_steps=4",
        "trainer.test_freq=2", "trainer.save_freq=2", f"trainer.default_local_dir={run}",
    ]  # fmt: skip
    assert_ok(torchrun(2, args(straight)))
    proc = torchrun(2, args(split) + resumed_from(straight, 2))
    assert_ok(proc)
    assert "resumed from" in proc.stdout + proc.stderr
    a, b = ({int(r["training/global_step"]): r for r in read_jsonl(run / "metrics.jsonl")} for run in (straight, split))
    assert sorted(a) == [0, 1, 2, 3, 4] and sorted(b) == [3, 4]  # step 0: the validation before training
    assert a[4]["train/loss"] < a[1]["train/loss"] and a[4]["val/loss"] < a[0]["val/loss"]
    for step in (3, 4):
        for key in COMPARED:
            assert b[step][key] == pytest.approx(a[step][key], abs=1e-6), f"{key} differs at step {step}"
    assert b[4]["val/loss"] == pytest.approx(a[4]["val/loss"], abs=1e-6)
    # the overall loss is the token-weighted mean of the sources' (both sources have the same trained tokens here)
    per_source = (a[4]["val/loss/doubling"], a[4]["val/loss/sums"])
    assert min(per_source) <= a[4]["val/loss"] <= max(per_source)
    assert "ppo_ratio_mean" not in " ".join(a[4]) and "critic/score/mean" not in a[4]
