"""The tiny vision-language demo models: they save, load, expand images to the right tokens and see them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image

from torchrl_post.demo import vlm
from torchrl_post.multimodal.vision import load_processor


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return vlm.write_vlm_task(tmp_path_factory.mktemp("vlm_data"), seed=0, n_train=8, n_val=4)


def test_write_vlm_task(task: tuple[Path, Path]) -> None:
    train_path, val_path = task
    train = [json.loads(line) for line in train_path.read_text().splitlines()]
    val = [json.loads(line) for line in val_path.read_text().splitlines()]
    assert (len(train), len(val)) == (8, 4)
    assert sorted(r["answer"] for r in val) == sorted(vlm.COLOURS)  # balanced
    for r in train + val:
        assert set(r) == {"prompt", "images", "answer", "data_source"}
        assert r["prompt"].count("<image>") == 1 and r["data_source"] == vlm.DATA_SOURCE
        (rel,) = r["images"]
        assert rel.startswith("images/") and not Path(rel).is_absolute()
        with Image.open(train_path.parent / rel) as img:
            assert img.size == (56, 56) and img.mode == "RGB"
            # the answer's colour is in the image
            assert vlm.COLOURS[r["answer"]] in {c for _, c in img.getcolors(4096) or []}
    # same seed, same data
    again = vlm.write_vlm_task(train_path.parent.parent / "again", seed=0, n_train=8, n_val=4)
    assert again[0].read_text() == train_path.read_text()


def test_colour_reward() -> None:
    assert vlm.colour_reward("vlm_colour", "red", "red") == 1.0
    assert vlm.colour_reward("vlm_colour", " blue\n", "blue") == 1.0
    assert vlm.colour_reward("vlm_colour", "=red", "red") == 0.0
    assert vlm.colour_reward("vlm_colour", "green", "red") == 0.0
    assert vlm.colour_reward("vlm_colour", "", "yellow") == 0.0
    assert vlm.colour_reward("vlm_colour", "Red", "red") == 0.0


def _forward(model: Any, processor: Any, text: str, image: Image.Image) -> tuple[torch.Tensor, Any]:
    enc = processor(text=[text], images=[image], return_tensors="pt")
    with torch.no_grad():
        return model(**enc).logits[0, -1], enc


@pytest.mark.parametrize("arch", vlm.ARCHS)
def test_build_vlm(arch: str, task: tuple[Path, Path], tmp_path: Path) -> None:
    from transformers import AutoModelForImageTextToText

    out = vlm.build_vlm(tmp_path / arch, arch, seed=0)
    model = AutoModelForImageTextToText.from_pretrained(out).eval()
    processor = load_processor(str(out))
    assert model.config.model_type == arch
    assert processor.tokenizer.eos_token == "<|im_end|>"

    (row,) = vlm.read_rows(task[1])[:1]
    text = vlm.prompt_text(processor, row)
    assert text.startswith("<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>What colour is it?")
    logits, enc = _forward(model, processor, text, row["pil"][0])
    grid = enc["image_grid_thw"]
    assert grid.tolist() == [[1, 4, 4]]  # every image is resized to a 4x4 patch grid
    pads = int((enc["input_ids"] == model.config.image_token_id).sum())
    assert pads == int(grid.prod()) // 4 == 4

    other = next(c for name, c in vlm.COLOURS.items() if name != row["answer"])
    changed, _ = _forward(model, processor, text, Image.new("RGB", (56, 56), other))
    assert not torch.allclose(logits, changed)  # the image reaches the language model

    # the greedy path used by the warm start runs on the saved model
    (answer,) = vlm.answers(model, processor, [row])
    assert isinstance(answer, str)
