"""MetricsLogger: metrics.jsonl rows, the console line, and an offline wandb run when trainer.logger lists it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from torchrl_post.logging.metrics import MetricsLogger
from torchrl_post.logging.plots import plot_run


def test_jsonl_console_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    logger = MetricsLogger(tmp_path, ["console"], True, 2, {}, "p", "e")
    logger.log({"training/global_step": 0, "val/test_score/arithmetic": 0.25})
    logger.log(
        {
            "training/global_step": 1,
            "critic/score/mean": 0.5,
            "timing_s/step": 0.3,
            "_private": 1.0,
            "actor/grad_norm": float("nan"),
        }
    )
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows[1] == {
        "training/global_step": 1,
        "critic/score/mean": 0.5,
        "timing_s/step": 0.3,
        "actor/grad_norm": None,
    }
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "step 0/2 | arithmetic val 0.250"
    assert out[1] == "step 1/2 | reward 0.500 | step_s 0.30"
    png = plot_run(tmp_path)
    assert png is not None and png.read_bytes()[:4] == b"\x89PNG"


def test_non_main_rank_writes_nothing(tmp_path: Path) -> None:
    MetricsLogger(tmp_path / "run", ["console"], False, 1, {}, "p", "e").log({"training/global_step": 1})
    assert not (tmp_path / "run").exists()


def test_wandb_offline_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    logger = MetricsLogger(tmp_path, ["wandb"], True, 1, {"actor": {"lr": 0.1}}, "proj", "exp")
    logger.log({"training/global_step": 1, "critic/score/mean": 0.5})
    logger.close()
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb")), "wandb wrote no offline run"
