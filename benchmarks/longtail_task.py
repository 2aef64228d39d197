"""A long-tailed task on the demo model: "Write 12 digits from 7." asks for "789012345678" (`answer`).

The asked length is `target_length` of a uniform draw (half the prompts at most 4, one in ten 90 or more); the model is
the demo model warm-started on these rows (`warm_start`); `score` is 1 at exactly the length, 0 at none or twice it.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import torch

from benchmarks import common

DATA_SOURCE = "longtail"
MAX_TARGET = 200  # the longest asked length; responses may run to data.max_response_length (256)
MAX_RESPONSE_LENGTH = 256
TEMPLATES = ("Write {n} digits from {d}.", "{n} digits from {d}.", "Count {n} from {d}.")
MODEL = common.MODELS / "longtail"
DATA = common.DATA / "longtail"
RECIPE = 1  # the warm start's version: a cached model of another recipe is rebuilt


def target_length(u: float) -> int:
    """The asked length for a uniform draw u in [0, 1): round(256 ** (u * u)) within [1, MAX_TARGET]."""
    return max(1, min(MAX_TARGET, round(256 ** (u * u))))


def answer(n: int, d: int) -> str:
    """The digits counting up from d, wrapping at 9, n of them: answer(12, 7) == "789012345678"."""
    return "".join(str((d + i) % 10) for i in range(n))


def make_rows(count: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        n, d = target_length(rng.random()), rng.randrange(10)
        prompt = rng.choice(TEMPLATES).format(n=n, d=d)
        rows.append({"prompt": prompt, "answer": answer(n, d), "length": n, "data_source": DATA_SOURCE})
    return rows


def score(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None) -> float:
    """1 at exactly the asked length (the answer's), linearly down to 0 at none or twice it (verl's signature)."""
    want = len(ground_truth)
    return max(0.0, 1.0 - abs(len(solution_str.strip()) - want) / want)


def build(model_dir: Path = MODEL, data_dir: Path = DATA) -> tuple[Path, Path]:
    """(the warm-started model, the task's train.jsonl and val.jsonl), each built once."""
    from torchrl_post.demo.task import write_splits

    if not (data_dir / "val.jsonl").is_file():
        write_splits(data_dir, make_rows(2000, seed=0), make_rows(128, seed=1))
    marker = model_dir / "longtail_build.json"
    if marker.is_file() and json.loads(marker.read_text()).get("recipe") == RECIPE:
        return model_dir, data_dir
    rows = [json.loads(line) for line in (data_dir / "train.jsonl").read_text().splitlines()]
    info = warm_start(common.demo_model(), model_dir, rows)
    marker.write_text(json.dumps({"recipe": RECIPE, **info}) + "\n")
    return model_dir, data_dir


def warm_start(demo: Path, out: Path, rows: list[dict[str, Any]], steps: int = 200) -> dict[str, Any]:
    """The demo model fine-tuned `steps` steps on prompt -> answer rows, saved to `out` (512 positions); returns
    what the record keeps (steps, the sampled lengths' median error on 64 prompts)."""
    from transformers import AutoTokenizer, Qwen2ForCausalLM

    from torchrl_post.demo.build import _encode, save_model, sft

    torch.manual_seed(0)
    model = Qwen2ForCausalLM.from_pretrained(demo, dtype=torch.float32)
    model.config.max_position_embeddings = 512  # rotary positions: nothing learned depends on it
    tok = AutoTokenizer.from_pretrained(demo)
    seqs, masks = [], []
    for r in rows:
        p = _encode(tok, r["prompt"])
        a = tok(r["answer"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        seqs.append(p + a)
        masks.append([0] * len(p) + [1] * len(a))
    gen = torch.Generator().manual_seed(0)
    sft(model, tok, seqs, masks, lambda: (False, ""), gen, max_steps=steps, lr=3e-3, batch_size=16, eval_every=25,
        trim=True, label="longtail warm start", lr_scale=lambda s: min(1.0, (s + 1) / 20))  # fmt: skip
    errors = length_errors(model, tok, rows[:64])
    save_model(model, tok, out)
    print(f"longtail model written to {out} (median |length - asked| / asked {errors:.2f})", flush=True)
    return {"steps": steps, "median_rel_length_error": errors}


@torch.no_grad()
def length_errors(model: Any, tok: Any, rows: list[dict[str, Any]]) -> float:
    """The median of |sampled length - asked| / asked over `rows` (temperature 1)."""
    from torchrl_post.demo.build import _encode

    prompts = [_encode(tok, r["prompt"]) for r in rows]
    width = max(map(len, prompts))
    ids = torch.tensor([[tok.pad_token_id] * (width - len(p)) + p for p in prompts])
    out = model.generate(
        input_ids=ids, attention_mask=(ids != tok.pad_token_id).long(), max_new_tokens=MAX_RESPONSE_LENGTH,
        do_sample=True, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
    )  # fmt: skip
    texts = tok.batch_decode(out[:, width:], skip_special_tokens=True)
    errs = sorted(abs(len(t.strip()) - r["length"]) / r["length"] for t, r in zip(texts, rows, strict=True))
    return errs[len(errs) // 2] if errs else math.nan


if __name__ == "__main__":
    print(build())
