"""Vision-language data: rows' images (paths, bytes, HF image dicts) through the processor, image tokens counted
against data.max_prompt_length, one clear error per bad row, data.return_multi_modal_inputs both ways, and our
M-RoPE positions equal to the models' own (each architecture) with left padding and responses."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch
from PIL import Image
from transformers import AutoModelForImageTextToText

from torchrl_post.config.errors import DataError
from torchrl_post.config.schema import DataConfig
from torchrl_post.data.dataset import load_prompts
from torchrl_post.multimodal.vision import VisionSpec, encode, image_inputs, load_processor, with_image_items
from torchrl_post.rollout.base import collate
from torchrl_post.types import Generation, PromptBatch

RED, BLUE = (220, 40, 40), (40, 70, 220)


def _png(rgb: tuple[int, int, int]) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (56, 56), rgb).save(buf, format="PNG")
    return buf.getvalue()


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture(scope="module")
def qwen2_vl(tiny_vlms: dict[str, Path]) -> tuple[Path, Any]:
    return tiny_vlms["qwen2_vl"], load_processor(str(tiny_vlms["qwen2_vl"]))


def test_images_from_paths_bytes_and_dicts(qwen2_vl: tuple[Path, Any], tmp_path: Path) -> None:
    _, processor = qwen2_vl
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "red.png").write_bytes(_png(RED))
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Colour?"}]}]
    # HF datasets' image dicts in parquet: a path (relative to the file's folder) or the bytes.
    frame = pd.DataFrame(
        {
            "prompt": ["<image>Colour?", "<image>Colour?"],
            "images": [[{"bytes": None, "path": "img/red.png"}], [{"bytes": _png(RED), "path": None}]],
            "answer": ["red", "red"],
        }
    )
    frame.to_parquet(tmp_path / "rows.parquet")
    (tmp_path / "img" / "blue.png").write_bytes(_png(BLUE))  # chat messages with an image item; a plain path
    rows = _jsonl(tmp_path / "rows.jsonl", [{"messages": messages, "images": ["img/blue.png"], "answer": "blue"}])
    files = [str(tmp_path / "rows.parquet"), rows]
    cfg = DataConfig(max_prompt_length=64)
    data = load_prompts(files, cfg, processor.tokenizer, "train", processor)
    assert len(data) == 3 and data.prompt_ids[0] == data.prompt_ids[1] == data.prompt_ids[2]
    image_pad = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert data.prompt_ids[0].count(image_pad) == 4  # a 4x4 patch grid merged 2x2
    assert torch.equal(data.mm_inputs[0]["pixel_values"], data.mm_inputs[1]["pixel_values"])  # path == bytes
    assert not torch.equal(data.mm_inputs[0]["pixel_values"], data.mm_inputs[2]["pixel_values"])  # red vs blue
    assert data.questions == ["Colour?"] * 3
    # return_multi_modal_inputs=false keeps only the images; the step's batch processes them to the same inputs.
    lazy = load_prompts(
        files,
        DataConfig(max_prompt_length=64, return_multi_modal_inputs=False),
        processor.tokenizer,
        "train",
        processor,
    )
    assert lazy.mm_inputs == [] and len(lazy.images) == 3
    again = image_inputs(processor, lazy.images[2])
    assert torch.equal(again["pixel_values"], data.mm_inputs[2]["pixel_values"])


def test_image_tokens_count_against_the_prompt_budget(qwen2_vl: tuple[Path, Any], tmp_path: Path) -> None:
    _, processor = qwen2_vl
    (tmp_path / "red.png").write_bytes(_png(RED))
    rows = [{"prompt": "<image>" + "x" * 10, "images": ["red.png"], "answer": "red"}] * 2
    rows.append({"prompt": "<image>short", "images": ["red.png"], "answer": "red"})
    path = _jsonl(tmp_path / "rows.jsonl", rows)
    template = processor.apply_chat_template(
        [{"role": "user", "content": "x" * 10}], add_generation_prompt=True, tokenize=False
    )
    text_only = len(processor.tokenizer(template)["input_ids"])
    limit = text_only + 3 + 1  # the text and the vision markers (start, one pad, end) fit; not 4 image tokens
    data = load_prompts([path], DataConfig(max_prompt_length=limit), processor.tokenizer, "train", processor)
    assert len(data) == 1 and data.num_filtered == 2
    with pytest.raises(DataError, match=r"rows.jsonl row 1: prompt is \d+ tokens with its images' tokens"):
        load_prompts(
            [path],
            DataConfig(max_prompt_length=limit, filter_overlong_prompts=False),
            processor.tokenizer,
            "t",
            processor,
        )


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"prompt": "Colour?", "images": ["red.png"]}, r"row 1: 1 images but 0 image placeholders"),
        ({"prompt": "<image><image>?", "images": ["red.png"]}, r"row 1: 1 images but 2 image placeholders"),
        ({"prompt": "<image>?", "images": ["missing.png"]}, r"row 1: cannot read image 'missing.png'"),
        ({"prompt": "<image>?", "images": [12]}, r"row 1: an image must be a file path, bytes"),
        ({"prompt": "<image><image>?", "images": ["red.png"] * 2}, r"2 images, over rollout.limit_images=1"),
    ],
    ids=["no-marker", "extra-marker", "missing-file", "not-an-image", "too-many"],
)
def test_bad_image_rows_name_the_row(
    qwen2_vl: tuple[Path, Any], tmp_path: Path, row: dict[str, Any], message: str
) -> None:
    _, processor = qwen2_vl
    (tmp_path / "red.png").write_bytes(_png(RED))
    path = _jsonl(tmp_path / "rows.jsonl", [{**row, "answer": "red"}])
    with pytest.raises(DataError, match=message):
        load_prompts([path], DataConfig(), processor.tokenizer, "train", processor)
    skipped = load_prompts(
        [path, _jsonl(tmp_path / "ok.jsonl", [{"prompt": "<image>?", "images": ["red.png"], "answer": "red"}])],
        DataConfig(skip_bad_rows=True),
        processor.tokenizer,
        "train",
        processor,
    )
    assert (len(skipped), skipped.num_bad) == (1, 1)


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
