"""The demo task: sums of two single-digit numbers, asked in a few phrasings, with a verifiable answer.

Rows are `{"prompt": str, "answer": str, "data_source": "arithmetic"}`; the reward is exact match on the
integer the response gives (see `torchrl_post.reward.builtin.arithmetic`).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

TEMPLATES = [
    "What is {a}+{b}?",
    "{a}+{b}=?",
    "Add {a} and {b}.",
    "Sum {a} and {b}.",
    "Compute {a} plus {b}.",
]
DATA_SOURCE = "arithmetic"


def make_rows(seed: int = 0) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """All (a, b, phrasing) prompts, split 80/20 into train and a held-out validation split."""
    rows = [
        {"prompt": t.format(a=a, b=b), "answer": str(a + b), "data_source": DATA_SOURCE}
        for a in range(10)
        for b in range(10)
        for t in TEMPLATES
    ]
    random.Random(seed).shuffle(rows)
    n_val = len(rows) // 5
    return rows[n_val:], rows[:n_val]


def write_jsonl(rows: list[dict[str, str]], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tmp.replace(path)


def write_task(out_dir: Path, seed: int = 0) -> tuple[Path, Path]:
    """Write train.jsonl and val.jsonl under out_dir; returns their paths."""
    return write_splits(out_dir, *make_rows(seed))


def write_splits(out_dir: Path, train: list[dict[str, str]], val: list[dict[str, str]]) -> tuple[Path, Path]:
    """train.jsonl and val.jsonl under out_dir; returns their paths."""
    train_path, val_path = out_dir / "train.jsonl", out_dir / "val.jsonl"
    write_jsonl(train, train_path)
    write_jsonl(val, val_path)
    return train_path, val_path
