"""A collated batch with images and image colours, shared by the types, data and multimodal tests."""

from __future__ import annotations

import torch

from torchrl_post.engines.batch import collate
from torchrl_post.multimodal.vision import VisionSpec
from torchrl_post.types import Batch, Generation, PromptBatch

PAD, IMG = 99, 7
SPEC = VisionSpec("qwen2_vl", IMG, 2, (IMG,))


def _image(grid: tuple[int, int, int], value: float) -> dict[str, torch.Tensor]:
    t, h, w = grid
    return {"pixel_values": torch.full((t * h * w, 3), value), "image_grid_thw": torch.tensor([grid])}


def _batch() -> Batch:
    """Prompt 0: text, an image of grid (1, 4, 2) (2 merged tokens), text; prompt 1: no image; prompt 2: an
    image of grid (1, 2, 2) (1 token) first. n = 2."""
    prompts = PromptBatch(
        [[1, 2, IMG, IMG, 3], [4, 5], [IMG, 6]], ["a", "b", "c"], ["s"] * 3, [{}, {}, {}], [10, 11, 12]
    )
    prompts.mm_inputs = [_image((1, 4, 2), 1.0), {}, _image((1, 2, 2), 3.0)]
    gen = Generation(
        [[20, 21], [22], [23], [24, 25, 26], [27], []], [[0.0] * k for k in (2, 1, 1, 3, 1, 0)], ["stop"] * 6
    )
    return collate(prompts, gen, 2, PAD, SPEC)


RED, BLUE = (220, 40, 40), (40, 70, 220)
