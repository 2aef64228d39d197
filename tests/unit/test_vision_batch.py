"""Images in a `Batch`: each row's patches and grids follow it through `select`, `split_groups` -> `concat`
and the wire; M-RoPE positions ([B, 3, L]) by hand; vLLM's one-placeholder-per-image prompt form."""

from __future__ import annotations

import torch

from torchrl_post.multimodal.vision import VisionSpec, collapse_image_tokens, mrope_position_ids
from torchrl_post.rollout.base import collate
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


def test_rows_keep_their_images() -> None:
    b = _batch()
    assert b.image_counts.tolist() == [1, 1, 0, 0, 1, 1]
    assert b.image_grid_thw.tolist() == [[1, 4, 2], [1, 4, 2], [1, 2, 2], [1, 2, 2]]
    assert len(b.pixel_values) == 8 + 8 + 4 + 4
    picked = b.select(torch.tensor([5, 2, 0]))
    assert picked.image_counts.tolist() == [1, 0, 1]
    assert picked.image_grid_thw.tolist() == [[1, 2, 2], [1, 4, 2]]
    assert picked.pixel_values[:, 0].tolist() == [3.0] * 4 + [1.0] * 8
    parts = b.split_groups()
    again = Batch.concat([Batch.from_wire(parts[g].to_wire()) for g in sorted(parts)], PAD)
    for name in ("input_ids", "attention_mask", "position_ids", "pixel_values", "image_grid_thw", "image_counts"):
        assert torch.equal(getattr(again, name), getattr(b, name)), name


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
