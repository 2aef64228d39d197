"""The tiny vision-language demo models: they save, load, expand images to the right tokens and see them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image

from torchrl_post.demo import vlm, vlm_task
from torchrl_post.multimodal.vision import load_processor


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return vlm_task.write_vlm_task(tmp_path_factory.mktemp("vlm_data"), seed=0, n_train=8, n_val=4)


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

    (row,) = vlm_task.read_rows(task[1])[:1]
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
