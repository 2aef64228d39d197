"""Tests of torchrl_post/demo/vlm_task.py: the colour task's rows and images, and its reward."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from torchrl_post.demo import vlm_task


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return vlm_task.write_vlm_task(tmp_path_factory.mktemp("vlm_data"), seed=0, n_train=8, n_val=4)


def test_write_vlm_task(task: tuple[Path, Path]) -> None:
    train_path, val_path = task
    train = [json.loads(line) for line in train_path.read_text().splitlines()]
    val = [json.loads(line) for line in val_path.read_text().splitlines()]
    assert (len(train), len(val)) == (8, 4)
    assert sorted(r["answer"] for r in val) == sorted(vlm_task.COLOURS)  # balanced
    for r in train + val:
        assert set(r) == {"prompt", "images", "answer", "data_source"}
        assert r["prompt"].count("<image>") == 1 and r["data_source"] == vlm_task.DATA_SOURCE
        (rel,) = r["images"]
        assert rel.startswith("images/") and not Path(rel).is_absolute()
        with Image.open(train_path.parent / rel) as img:
            assert img.size == (56, 56) and img.mode == "RGB"
            # the answer's colour is in the image
            assert vlm_task.COLOURS[r["answer"]] in {c for _, c in img.getcolors(4096) or []}
    # same seed, same data
    again = vlm_task.write_vlm_task(train_path.parent.parent / "again", seed=0, n_train=8, n_val=4)
    assert again[0].read_text() == train_path.read_text()


def test_colour_reward() -> None:
    assert vlm_task.colour_reward("vlm_colour", "red", "red") == 1.0
    assert vlm_task.colour_reward("vlm_colour", " blue\n", "blue") == 1.0
    assert vlm_task.colour_reward("vlm_colour", "=red", "red") == 0.0
    assert vlm_task.colour_reward("vlm_colour", "green", "red") == 0.0
    assert vlm_task.colour_reward("vlm_colour", "", "yellow") == 0.0
    assert vlm_task.colour_reward("vlm_colour", "Red", "red") == 0.0
