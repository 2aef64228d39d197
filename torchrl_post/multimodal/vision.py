"""Images of a data row -> processor inputs; M-RoPE positions; the vision fields of a `Batch`."""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from torchrl_post.config.errors import DataError
from torchrl_post.types import Batch

IMAGE_MARKER = "<image>"
"""verl's placeholder for an image inside a prompt string (one per image of the row, in order)."""


NEVER_GENERATED_BIAS = -100.0
"""Added to the logits of the vision placeholder tokens, in the engines and the trainer alike (vLLM clamps a
logit bias to [-100, 100]): a response holding an image token would make the forward place image features
there. Trained models never emit them; tiny random ones do."""


@dataclass(frozen=True)
class VisionSpec:
    """What the data path needs to know of a vision-language model."""

    model_type: str
    image_token_id: int
    merge_size: int
    never_generated: tuple[int, ...]
    """The vision placeholder tokens (image, video, vision start and end): biased by NEVER_GENERATED_BIAS."""

    @staticmethod
    def of(config: Any) -> VisionSpec | None:
        """The spec of an HF model config, or None for a text-only model."""
        vision = getattr(config, "vision_config", None)
        if vision is None:
            return None
        keys = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")
        special = tuple(int(getattr(config, k)) for k in keys if getattr(config, k, None) is not None)
        return VisionSpec(str(config.model_type), int(config.image_token_id), int(vision.spatial_merge_size), special)


def load_processor(path: str, trust_remote_code: bool = False) -> Any:
    """The model directory's processor (image processor + tokenizer), also without torchvision."""
    from transformers import AutoProcessor

    from torchrl_post.multimodal import compat

    compat.install()
    return AutoProcessor.from_pretrained(path, trust_remote_code=trust_remote_code)


def load_image(src: Any, base: Path, where: str) -> Any:
    """A PIL RGB image from a path (relative to the data file's folder), bytes, or an HF datasets image dict
    ({"bytes": ..., "path": ...})."""
    from PIL import Image

    if isinstance(src, Image.Image):
        return src.convert("RGB")
    if isinstance(src, dict):
        src = src.get("bytes") or src.get("path")
    try:
        if isinstance(src, (bytes, bytearray)):
            return Image.open(io.BytesIO(src)).convert("RGB")
        if isinstance(src, str) and src:
            path = Path(src) if Path(src).is_absolute() else base / src
            with Image.open(path) as img:
                return img.convert("RGB")
    except (OSError, ValueError) as e:  # PIL: missing file, unknown format, truncated data
        raise DataError(f"{where}: cannot read image {str(src)[:80]!r} ({e})") from e
    raise DataError(f"{where}: an image must be a file path, bytes or {{'bytes', 'path'}}, got {type(src).__name__}")


def with_image_items(messages: list[dict[str, Any]], num_images: int, where: str) -> list[dict[str, Any]]:
    """Chat messages whose content lists image items: a string's `<image>` markers become image items, and
    lists of items are kept. The number of image items must equal the row's images."""
    out: list[dict[str, Any]] = []
    found = 0
    for m in messages:
        content = m["content"]
        if isinstance(content, str):
            parts = content.split(IMAGE_MARKER)
            items: list[dict[str, Any]] = []
            for i, text in enumerate(parts):
                if i:
                    items.append({"type": "image"})
                if text:
                    items.append({"type": "text", "text": text})
            content = items if len(parts) > 1 else content
        else:
            content = [dict(item) for item in content]
        found += sum(1 for item in content if isinstance(item, dict) and item.get("type") == "image")
        out.append({"role": m["role"], "content": content})
    if found != num_images:
        raise DataError(
            f"{where}: {num_images} images but {found} image placeholders in the messages; put one "
            f"'{IMAGE_MARKER}' (or a {{'type': 'image'}} item) per image of the row, in order"
        )
    return out


def encode(processor: Any, messages: list[dict[str, Any]], images: list[Any]) -> tuple[list[int], dict[str, Any]]:
    """Token ids with every image's placeholder expanded to its patch tokens, and the processor's image inputs
    ({} without images)."""
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    out = processor(text=[text], images=images or None, return_tensors="pt")
    mm = {k: out[k] for k in ("pixel_values", "image_grid_thw")} if images else {}
    return out["input_ids"][0].tolist(), mm


def collapse_image_tokens(ids: list[int], image_token_id: int) -> list[int]:
    """Prompt ids with each run of image tokens cut to one: the form vLLM expands itself (given expanded ids,
    vLLM 0.32 expands them again)."""
    return [t for i, t in enumerate(ids) if t != image_token_id or i == 0 or ids[i - 1] != image_token_id]


def image_inputs(processor: Any, images: list[Any]) -> dict[str, Any]:
    """The processor's pixel values and grids of `images` alone (data.return_multi_modal_inputs=false)."""
    if not images:
        return {}
    out = processor.image_processor(images=images, return_tensors="pt")
    return {"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"]}


def mrope_position_ids(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    image_grid_thw: torch.Tensor,
    image_counts: torch.Tensor,
    spec: VisionSpec,
) -> torch.Tensor:
    """[B, L] rows -> [B, 3, L] (temporal, height, width) positions, as Qwen-VL models number them.

    Text tokens count up by one in all three. An image's merged patches sit on a grid starting at the
    current position (temporal index, row, column each added to it); the text after it continues from the
    current position plus the grid's larger side. Left padding gets 0, right padding the last position
    (the layout text positions have; the forward masks both).
    """
    b, length = input_ids.shape
    out = torch.zeros(b, 3, length, dtype=torch.long)
    grids = image_grid_thw.tolist()
    next_image = 0
    for row in range(b):
        cols = attention_mask[row].nonzero().flatten()
        ids = input_ids[row, cols].tolist()
        pos = torch.zeros(3, len(ids), dtype=torch.long)
        cur, i, left = 0, 0, int(image_counts[row])
        while i < len(ids):
            if ids[i] == spec.image_token_id and left:
                t, h, w = grids[next_image]
                h, w = h // spec.merge_size, w // spec.merge_size
                n = t * h * w
                grid = torch.stack(torch.meshgrid(torch.arange(t), torch.arange(h), torch.arange(w), indexing="ij"))
                pos[:, i : i + n] = grid.reshape(3, -1) + cur
                cur += max(h, w)
                i, next_image, left = i + n, next_image + 1, left - 1
            else:
                pos[:, i] = cur
                cur, i = cur + 1, i + 1
        out[row][:, cols] = pos
        if len(cols):  # right padding repeats the last position, as text positions do (`pad_samples`)
            out[row][:, int(cols[-1]) + 1 :] = pos[:, -1:]
    return out


def attach_images(batch: Batch, inputs: list[dict[str, Any]], spec: VisionSpec) -> None:
    """Give `batch` its rows' images (`inputs[i]`: row i's processor outputs, {} for none) and M-RoPE positions."""
    counts = [len(mm["image_grid_thw"]) if mm else 0 for mm in inputs]
    batch.image_counts = torch.tensor(counts, dtype=torch.long)
    grids = [mm["image_grid_thw"] for mm in inputs if mm]
    pixels = [mm["pixel_values"] for mm in inputs if mm]
    batch.image_grid_thw = torch.cat(grids).long() if grids else torch.zeros(0, 3, dtype=torch.long)
    batch.pixel_values = torch.cat(pixels).float() if pixels else torch.zeros(0, 0)
    batch.position_ids = mrope_position_ids(
        batch.input_ids, batch.attention_mask, batch.image_grid_thw, batch.image_counts, spec
    )


def model_inputs(
    batch: Batch, rows: slice | torch.Tensor, first: int, end: int, device: torch.device
) -> dict[str, torch.Tensor]:
    """The forward's keyword arguments for `rows`, columns first:end: ids, mask, positions ([3, b, L] for
    M-RoPE, as HF's Qwen-VL models take them) and the rows' images."""
    part = batch.select(rows) if batch.has_images else batch
    sl = slice(None) if batch.has_images else rows
    out = {
        "input_ids": part.input_ids[sl, first:end].to(device),
        "attention_mask": part.attention_mask[sl, first:end].to(device),
    }
    pos = part.position_ids[sl][..., first:end]
    out["position_ids"] = (pos.transpose(0, 1) if pos.dim() == 3 else pos).to(device)
    if part.has_images and part.pixel_values is not None and len(part.pixel_values):
        assert part.image_grid_thw is not None
        out["pixel_values"] = part.pixel_values.to(device)
        out["image_grid_thw"] = part.image_grid_thw.to(device)
    return out
