"""Tests of torchrl_post/multimodal/vision.py: M-RoPE positions by hand and as the models' own, image placeholders."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from PIL import Image
from transformers import AutoModelForImageTextToText

from tests.unit.vision_helpers import BLUE, IMG, RED, SPEC, _batch
from torchrl_post.engines.batch import collate
from torchrl_post.multimodal.vision import (
    VisionSpec,
    collapse_image_tokens,
    encode,
    load_processor,
    mrope_position_ids,
    with_image_items,
)
from torchrl_post.types import Generation, PromptBatch


def test_mrope_positions_by_hand() -> None:
    b = _batch()
    assert b.position_ids.shape == (6, 3, b.input_ids.shape[1])
    row = b.position_ids[0][:, b.attention_mask[0].bool()]
    # text 1, 2 at 0, 1; the image's 2 tokens: t = 2, h = 2 + (0, 1), w = 2 + 0 (grid 4x2 merged by 2 -> 2x1);
    # the text after it continues at 2 + max(2, 1) = 4; the response after that.
    assert row.tolist() == [[0, 1, 2, 2, 4, 5, 6], [0, 1, 2, 3, 4, 5, 6], [0, 1, 2, 2, 4, 5, 6]]
    text_row = b.position_ids[2][:, b.attention_mask[2].bool()]
    assert text_row.tolist() == [[0, 1, 2]] * 3  # no image: the same sequential position in all three
    first_image = b.position_ids[4][:, b.attention_mask[4].bool()]
    assert first_image.tolist() == [[0, 1, 2]] * 3  # a 1x1 merged grid at 0, then text at 0 + 1
    assert b.position_ids[2, :, 0].tolist() == [0, 0, 0] and b.position_ids[2, :, -1].tolist() == [2, 2, 2]


def test_mrope_matches_trimmed_and_padded_layouts() -> None:
    """Positions survive `trimmed` and `concat`'s re-padding on real tokens."""
    b = _batch()
    t = b.select(torch.tensor([2, 3])).trimmed()
    for i, row in enumerate((2, 3)):
        real, real_t = b.attention_mask[row].bool(), t.attention_mask[i].bool()
        assert torch.equal(b.position_ids[row][:, real], t.position_ids[i][:, real_t])
    fresh = mrope_position_ids(b.input_ids, b.attention_mask, b.image_grid_thw, b.image_counts, SPEC)
    assert torch.equal(fresh, b.position_ids)


def test_collapse_image_tokens() -> None:
    assert collapse_image_tokens([1, IMG, IMG, IMG, 2, IMG, 3, IMG, IMG], IMG) == [1, IMG, 2, IMG, 3, IMG]
    assert collapse_image_tokens([IMG, IMG], IMG) == [IMG]
    assert collapse_image_tokens([1, 2], IMG) == [1, 2]


@pytest.mark.parametrize("arch", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_mrope_positions_equal_the_models_own(arch: str, tiny_vlms: dict[str, Path]) -> None:
    """Rows of different prompt lengths (left padding), one without an image, with responses: our positions
    equal the model's get_rope_index on every real token, and the forward's logits with them equal the logits
    of the model computing its own positions."""
    processor = load_processor(str(tiny_vlms[arch]))
    model = AutoModelForImageTextToText.from_pretrained(tiny_vlms[arch], dtype=torch.float32).eval()
    spec = VisionSpec.of(model.config)
    assert spec is not None
    size = processor.image_processor.patch_size * 4
    ids, mm = [], []
    for k, (text, rgb) in enumerate((("What colour is it?", RED), ("Colour?", BLUE), ("No image here", None))):
        images = [Image.new("RGB", (size, size + 2 * processor.image_processor.patch_size * k), rgb)] if rgb else []
        msgs = with_image_items([{"role": "user", "content": ("<image>" if rgb else "") + text}], len(images), "t")
        p, inputs = encode(processor, msgs, images)
        ids.append(p)
        mm.append(inputs)
    prompts = PromptBatch(ids, [""] * 3, [""] * 3, [{}] * 3, [0, 1, 2], [], [], mm)
    gen = Generation([[40, 41, 42], [50], [60, 61]], [[0.0] * 3, [0.0], [0.0] * 2], ["length"] * 3)
    batch = collate(prompts, gen, 1, processor.tokenizer.pad_token_id, spec)
    assert batch.image_grid_thw is not None and batch.image_grid_thw[1].tolist() != batch.image_grid_thw[0].tolist()
    token_types = (batch.input_ids == spec.image_token_id).int()
    theirs, _ = model.model.get_rope_index(
        batch.input_ids,
        mm_token_type_ids=token_types,
        image_grid_thw=batch.image_grid_thw,
        attention_mask=batch.attention_mask,
    )
    real = batch.attention_mask.bool()
    assert torch.equal(batch.position_ids.transpose(0, 1)[:, real], theirs[:, real])
    assert not torch.equal(theirs[0], theirs[1])  # image rows: the three position rows differ
    with torch.no_grad():
        inputs = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask}
        pixels = {"pixel_values": batch.pixel_values, "image_grid_thw": batch.image_grid_thw}
        ours = model(**inputs, **pixels, position_ids=batch.position_ids.transpose(0, 1)).logits
        own = model(**inputs, **pixels, mm_token_type_ids=token_types).logits
    torch.testing.assert_close(ours[real], own[real], atol=1e-5, rtol=0)
