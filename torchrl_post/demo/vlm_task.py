"""The vision-language demo's task: an image of a shape (or a solid fill) in one of 4 colours, the question
"<image>What colour is it?", and `colour_reward` (exact match on the colour word; a model blind to the image
scores at most 0.25). `make_vlm_rows` draws the images and makes the rows in memory (the Python API's
examples/train_vlm.py), `write_vlm_task` writes them as files; `read_rows` reads them back.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw

from torchrl_post.demo.task import write_jsonl
from torchrl_post.multimodal.vision import load_image

DATA_SOURCE = "vlm_colour"
PROMPT = "<image>What colour is it?"
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (40, 170, 60),
    "blue": (40, 70, 220),
    "yellow": (235, 210, 40),
}
BACKGROUNDS: list[tuple[int, int, int]] = [(255, 255, 255), (0, 0, 0), (128, 128, 128), (200, 200, 200)]


def colour_reward(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None) -> float:
    """1.0 when the stripped response is the colour word, else 0.0."""
    return float(solution_str.strip() == str(ground_truth).strip())


def _draw(rng: random.Random, colour: str, size: int) -> Image.Image:
    """A neutral background with a filled rectangle or ellipse of `colour`, or a solid fill of it."""
    fill = COLOURS[colour]
    kind = rng.choice(["fill", "rect", "ellipse"])
    img = Image.new("RGB", (size, size), fill if kind == "fill" else rng.choice(BACKGROUNDS))
    if kind != "fill":
        w, h = rng.randint(size // 2, size - 4), rng.randint(size // 2, size - 4)
        x, y = rng.randint(0, size - w), rng.randint(0, size - h)
        draw = ImageDraw.Draw(img)
        (draw.rectangle if kind == "rect" else draw.ellipse)((x, y, x + w - 1, y + h - 1), fill=fill)
    return img


def make_vlm_rows(
    seed: int = 0, n_train: int = 512, n_val: int = 64, size: int = 56
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Train and validation rows with their images in memory (`"images": [PIL image]`). Colours are balanced in
    each split (a constant answer scores 0.25). The same seed draws the same images as `write_vlm_task`."""
    rng = random.Random(seed)
    splits = []
    for n in (n_train, n_val):
        colours = [list(COLOURS)[i % len(COLOURS)] for i in range(n)]
        rng.shuffle(colours)
        rows = [
            {"prompt": PROMPT, "images": [_draw(rng, colour, size)], "answer": colour, "data_source": DATA_SOURCE}
            for colour in colours
        ]
        splits.append(rows)
    return splits[0], splits[1]


def write_vlm_task(
    data_dir: Path, seed: int = 0, n_train: int = 512, n_val: int = 64, size: int = 56
) -> tuple[Path, Path]:
    """`make_vlm_rows` as train.jsonl and val.jsonl under data_dir, with their PNGs under data_dir/images;
    returns the two paths."""
    (data_dir / "images").mkdir(parents=True, exist_ok=True)
    paths = []
    for split, rows in zip(("train", "val"), make_vlm_rows(seed, n_train, n_val, size), strict=True):
        for i, row in enumerate(rows):
            rel = f"images/{split}_{i:05d}.png"
            row["images"][0].save(data_dir / rel)
            row["images"] = [rel]
        path = data_dir / f"{split}.jsonl"
        write_jsonl(rows, path)  # type: ignore[arg-type]
        paths.append(path)
    return paths[0], paths[1]


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The JSONL rows of `path`, each with its images loaded (`"pil"`: PIL images)."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for i, r in enumerate(rows):
        r["pil"] = [load_image(src, path.parent, f"{path}:{i + 1}") for src in r["images"]]
    return rows
