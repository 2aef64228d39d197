"""Build the distillation demo's two models: a strong teacher (hidden 128) and a weak student (hidden 64).

    python -m torchrl_post.demo.distill [--teacher outputs/distill_teacher] [--student outputs/distill_student]
        [--demo outputs/demo_model] [--data outputs/demo_data]
    make distill-models; make train ARGS="--config-name distill" distils the teacher into the student on-policy

- The teacher is the demo model (`torchrl_post.demo.build`) fine-tuned further on the train split's answers, as the
  exact-match rule wants them ("7", never the warm start's "=7"), until its greedy accuracy on the train split's
  first `PROBE` prompts reaches `TEACHER_TARGET`.
- The student is a fresh demo-shaped model at half the width (`STUDENT_SHAPE`: hidden 64, 2 heads of 32, which
  vLLM's CPU attention takes) over the same character tokenizer, warm-started only slightly: to `STUDENT_TARGET`
  greedy accuracy, with half its targets written "=7" like the demo's warm start, so that it is unsure of both the
  format and the sums and distillation has room to lift it.

Both steps are the demo's own deterministic supervised passes (`build.sft` inside `build.deterministic`: float64 on
a gradient grid), so the models are the same bit for bit on every machine (each marker records its `fingerprint`).
Each is cached by a marker written last that names the recipe and the data (the teacher's also the demo model's
fingerprint).
40-75 s on two cores (the teacher 24-49 s, the student 16-26 s); the demo model's own build comes first if missing.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from pathlib import Path
from typing import Any, TypedDict

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase, Qwen2ForCausalLM

from torchrl_post.demo.build import (
    GRID,
    _encode,
    build_demo,
    build_tiny_model,
    deterministic,
    fingerprint,
    greedy_accuracy,
    save_model,
    sft,
)
from torchrl_post.demo.judge import one_thread
from torchrl_post.demo.qwen import _staging, write_marker

RECIPE = 1
"""The builds' version: a cached teacher or student built by another recipe is rebuilt."""
MARKER = "distill_build.json"
SEED = 0
"""The student's initialisation and both passes' batches (and the student's "=7" targets)."""
PROBE = 200
"""Train prompts whose greedy accuracy stops each pass (as the demo's warm start)."""
TEACHER_TARGET = 0.95
"""The teacher's greedy accuracy on the probe: 0.98 there after 100 steps, 0.99 on the validation split."""
STUDENT_TARGET = 0.1
"""The student's greedy accuracy on the probe (checked every step: it jumps as the format flips): 0.10 after 76
steps, 0.13 on the validation split; low, so that distillation has room to lift it."""


class Shape(TypedDict):
    """`build_tiny_model`'s size arguments."""

    hidden_size: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int


STUDENT_SHAPE: Shape = {"hidden_size": 64, "num_heads": 2, "num_kv_heads": 2, "intermediate_size": 128}
"""The student's `build_tiny_model` arguments: the demo model's 2 layers at half the width, heads of 32."""
WORDY_FRAC = 0.5
"""The share of the student's targets written "=<answer>" (rejected by the exact-match rule)."""
LR = 3e-3
BATCH_SIZE = 64


def _rows(path: Path) -> list[dict[str, str]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:12]


def answer_rows(
    tok: PreTrainedTokenizerBase, rows: list[dict[str, str]], wordy: list[bool]
) -> tuple[list[list[int]], list[list[int]]]:
    """Prompt + answer token rows and their loss masks (the answer and the end-of-sequence token); a `wordy` row's
    answer is written "=<answer>"."""
    seqs, masks = [], []
    for r, w in zip(rows, wordy, strict=True):
        p = _encode(tok, r["prompt"])
        a = tok(("=" if w else "") + r["answer"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        seqs.append(p + a)
        masks.append([0] * len(p) + [1] * len(a))
    return seqs, masks


def supervise(
    model: Qwen2ForCausalLM,
    tok: PreTrainedTokenizerBase,
    rows: list[dict[str, str]],
    target: float,
    wordy_frac: float,
    eval_every: int,
    label: str,
) -> tuple[int, float]:
    """The demo's deterministic supervised pass on prompt -> answer until greedy accuracy on the first `PROBE` rows
    reaches `target`; returns (steps, accuracy reached)."""
    gen = torch.Generator().manual_seed(SEED)
    wordy = (torch.rand(len(rows), generator=gen) < wordy_frac).tolist()
    seqs, masks = answer_rows(tok, rows, wordy)
    acc = 0.0

    def evaluate() -> tuple[bool, str]:
        nonlocal acc
        acc = greedy_accuracy(model, tok, rows[:PROBE])
        return acc >= target, f"greedy acc {acc:.2f}"

    with deterministic(model):
        steps = sft(
            model, tok, seqs, masks, evaluate, gen, max_steps=2000, lr=LR, batch_size=BATCH_SIZE,
            eval_every=eval_every, trim=True, label=label, grad_grid=GRID,
        )  # fmt: skip
    return steps, acc


def _cached(out_dir: Path, want: dict[str, Any], what: str) -> dict[str, Any] | None:
    try:
        info: dict[str, Any] = json.loads((out_dir / MARKER).read_text())
    except (OSError, ValueError):
        return None
    if all(info.get(k) == v for k, v in want.items()) and (out_dir / "model.safetensors").exists():
        print(f"distillation {what} ready at {out_dir} (fingerprint {info['fingerprint']})")
        return info
    print(f"rebuilding the distillation {what} at {out_dir}: built by an older recipe, demo model or data")
    (out_dir / MARKER).unlink()
    return None


def _finish(
    out_dir: Path, model: Qwen2ForCausalLM, tok: PreTrainedTokenizerBase, info: dict, val: list, start: float
) -> dict[str, Any]:
    """Save, score on the validation split as saved, and write the marker."""
    with _staging(out_dir) as stage:
        save_model(model, tok, stage)
    saved = AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.float32).eval()
    info.update(
        val_greedy_accuracy=greedy_accuracy(saved, AutoTokenizer.from_pretrained(out_dir), val),
        seconds=round(time.perf_counter() - start, 1),
        fingerprint=fingerprint(out_dir),
    )
    write_marker(out_dir, MARKER, info)
    return info


def build_teacher(out_dir: Path, demo_dir: Path, data_dir: Path) -> dict[str, Any]:
    """Write the teacher to `out_dir` (building the demo model and data first if missing) unless one of this recipe,
    demo model and data is already there; returns its marker."""
    build_demo(demo_dir, data_dir)
    want = {
        "recipe": RECIPE, "role": "teacher", "demo_fingerprint": fingerprint(demo_dir),
        "data": [_digest(data_dir / "train.jsonl"), _digest(data_dir / "val.jsonl")],
    }  # fmt: skip
    if (info := _cached(out_dir, want, "teacher")) is not None:
        return info
    start = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(demo_dir)
    model = Qwen2ForCausalLM.from_pretrained(demo_dir, dtype=torch.float32)
    return _train_and_write(out_dir, model, tok, want, data_dir, start, TEACHER_TARGET, 0.0, 25, "teacher")


def _train_and_write(
    out_dir: Path,
    model: Qwen2ForCausalLM,
    tok: PreTrainedTokenizerBase,
    want: dict[str, Any],
    data_dir: Path,
    start: float,
    target: float,
    wordy: float,
    every: int,
    role: str,
) -> dict[str, Any]:
    """`supervise` the model on the train split to `target`, then save, score and mark it (`_finish`)."""
    with one_thread():
        steps, acc = supervise(model, tok, _rows(data_dir / "train.jsonl"), target, wordy, every, role)
        info = _finish(
            out_dir, model, tok, {**want, "steps": steps, "probe_greedy_accuracy": acc},
            _rows(data_dir / "val.jsonl"), start,
        )  # fmt: skip
    print(
        f"distillation {role} written to {out_dir} after {steps} steps: greedy accuracy {acc:.2f} on the probe, "
        f"{info['val_greedy_accuracy']:.2f} on validation; {info['seconds']:.0f} s, fingerprint {info['fingerprint']}"
    )
    return info


def build_student(out_dir: Path, data_dir: Path) -> dict[str, Any]:
    """Write the student to `out_dir` unless one of this recipe and data is already there; returns its marker."""
    want = {
        "recipe": RECIPE, "role": "student", "shape": STUDENT_SHAPE,
        "data": [_digest(data_dir / "train.jsonl"), _digest(data_dir / "val.jsonl")],
    }  # fmt: skip
    if (info := _cached(out_dir, want, "student")) is not None:
        return info
    start = time.perf_counter()
    model, _ = build_tiny_model(out_dir, seed=SEED, **STUDENT_SHAPE)
    tok = AutoTokenizer.from_pretrained(out_dir)  # exactly the tokenizer the trainer and vLLM will load
    return _train_and_write(out_dir, model, tok, want, data_dir, start, STUDENT_TARGET, WORDY_FRAC, 1, "student")


def build_distill(teacher_dir: Path, student_dir: Path, demo_dir: Path, data_dir: Path) -> dict[str, dict[str, Any]]:
    """Both models (each cached); returns their markers by role."""
    return {
        "teacher": build_teacher(teacher_dir, demo_dir, data_dir),
        "student": build_student(student_dir, data_dir),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--teacher", type=Path, default=Path("outputs/distill_teacher"))
    ap.add_argument("--student", type=Path, default=Path("outputs/distill_student"))
    ap.add_argument("--demo", type=Path, default=Path("outputs/demo_model"))
    ap.add_argument("--data", type=Path, default=Path("outputs/demo_data"))
    args = ap.parse_args()
    build_distill(args.teacher, args.student, args.demo, args.data)


if __name__ == "__main__":
    main()
