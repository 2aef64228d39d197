"""Build the demo: a tiny Qwen2 model with a character tokenizer, warm-started on the arithmetic task.

    python -m torchrl_post.demo.build [--out outputs/demo_model] [--data outputs/demo_data]

The warm start is a brief supervised pass on prompt -> answer that stops as soon as greedy exact-match
accuracy on training prompts reaches `--target-acc` (0.3). Half of its targets are written "=<answer>", a
format the exact-match reward rejects, so the warm-started model is unsure of both the format and the sums:
RL has signal from the first step and room to improve on both.
The same model, bit for bit, on every machine (`deterministic`: float64 and gradients on a grid; its
`fingerprint` is printed), and cached: nothing is rebuilt when the model directory is already complete.
Tests call `build_tiny_model` directly for untrained models of any size.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoTokenizer,
    GenerationMixin,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from torchrl_post.demo.task import write_task
from torchrl_post.demo.tokenizer import build_char_tokenizer


def build_tiny_model(
    out_dir: Path,
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 256,
    vocab_size: int = 128,
    seed: int = 0,
    extra_special: list[str] | None = None,
    max_position_embeddings: int = 256,
) -> tuple[Qwen2ForCausalLM, PreTrainedTokenizerBase]:
    """Save a randomly initialised Qwen2 model (head_dim = hidden/heads, keep it 32 or 64) and tokenizer
    (`extra_special`: special tokens added after the character vocabulary, see `build_char_tokenizer`;
    `max_position_embeddings`: the longest row the config declares)."""
    tok = build_char_tokenizer(vocab_size, extra_special)
    cfg = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(cfg)
    save_model(model, tok, out_dir)
    return model, tok


def save_model(model: PreTrainedModel, tok: PreTrainedTokenizerBase, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(out_dir, safe_serialization=True)
    tok.save_pretrained(out_dir)


def _encode(tok: PreTrainedTokenizerBase, prompt: str) -> list[int]:
    msgs = [{"role": "user", "content": prompt}]
    enc: Any = tok.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True)
    return list(enc["input_ids"])


@torch.no_grad()
def greedy_accuracy(model: GenerationMixin, tok: PreTrainedTokenizerBase, rows: list[dict]) -> float:
    from torchrl_post.reward.builtin import arithmetic

    prompts = [_encode(tok, r["prompt"]) for r in rows]
    width = max(map(len, prompts))
    ids = torch.tensor([[tok.pad_token_id] * (width - len(p)) + p for p in prompts])
    mask = (ids != tok.pad_token_id).long()
    out = model.generate(  # type: ignore[misc]
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=4,
        do_sample=False,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
    )
    texts = tok.batch_decode(out[:, width:], skip_special_tokens=True)
    return sum(arithmetic("arithmetic", t, r["answer"]) for t, r in zip(texts, rows, strict=True)) / len(rows)


def warm_start(
    model: Qwen2ForCausalLM,
    tok: PreTrainedTokenizerBase,
    rows: list[dict],
    target_acc: float,
    max_steps: int = 2000,
    lr: float = 3e-3,
    batch_size: int = 64,
    seed: int = 0,
    wordy_frac: float = 0.0,
) -> float:
    """SFT on prompt -> answer until greedy accuracy reaches target_acc; returns the accuracy reached.

    A `wordy_frac` share of the targets is written "=<answer>", which the exact-match reward rejects: the
    model starts out unsure of the format as well as of the sums.
    """
    gen = torch.Generator().manual_seed(seed)
    wordy = torch.rand(len(rows), generator=gen) < wordy_frac
    seqs, masks = [], []
    for r, w in zip(rows, wordy.tolist(), strict=True):
        p = _encode(tok, r["prompt"])
        target = ("=" if w else "") + r["answer"]
        a = tok(target, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        seqs.append(p + a)
        masks.append([0] * len(p) + [1] * len(a))
    probe = rows[:200]
    acc = 0.0

    def evaluate() -> tuple[bool, str]:
        nonlocal acc
        acc = greedy_accuracy(model, tok, probe)
        return acc >= target_acc, f"greedy acc {acc:.2f}"

    with deterministic(model):
        sft(model, tok, seqs, masks, evaluate, gen, max_steps=max_steps, lr=lr, batch_size=batch_size, grad_grid=GRID)
    return acc


GRID = 2.0**-24
"""The warm start's gradient grid (~6e-8): far below the gradients that train (1e-4 and up), far above the float64
differences between machines (~1e-16 relative)."""


@contextmanager
def deterministic(model: torch.nn.Module) -> Iterator[None]:
    """The same model on every machine. Matrix products and reductions sum in an order that depends on the CPU
    (AVX2 or AVX-512 kernels, thread count), and AdamW, which divides each gradient by its own running scale,
    turns a last-bit difference in a near-zero gradient into a whole step: two machines' float32 warm starts
    end 0.3 apart in some weight. Inside this block the model computes in float64 and `sft` rounds the
    gradients to `GRID` before each step, so the machines' differences (~1e-16 relative) vanish in the rounding
    (a gradient within 1e-16 of a grid midpoint rounds apart: about one chance in 1e8 per value and step), and
    the optimizer's element-wise arithmetic, exact in IEEE floats, gives the same weights bit for bit. The model
    is float32 again after the block."""
    model.double()
    try:
        yield
    finally:
        model.float()


def sft(
    model: Qwen2ForCausalLM,
    tok: PreTrainedTokenizerBase,
    seqs: list[list[int]],
    masks: list[list[int]],
    evaluate: Callable[[], tuple[bool, str]],
    gen: torch.Generator,
    max_steps: int,
    lr: float,
    batch_size: int,
    eval_every: int = 5,
    trim: bool = False,
    label: str = "warm start",
    lr_scale: Callable[[int], float] | None = None,
    grad_grid: float = 0.0,
) -> int:
    """Supervised steps on token rows (`masks`: 1 where a token is a target) until `evaluate` says done
    (it runs before the first step and every `eval_every` steps, and returns (done, progress text)).
    Batches are drawn with `gen`; `trim` cuts a batch's padding columns (right padding: the loss is the
    same); `lr_scale(step)` multiplies the learning rate (a schedule); `grad_grid` > 0 (a power of two) rounds
    every gradient to multiples of it before the step (`deterministic`). Returns the number of steps taken."""
    width = max(map(len, seqs))
    ids = torch.tensor([s + [tok.pad_token_id] * (width - len(s)) for s in seqs])
    loss_mask = torch.tensor([m + [0] * (width - len(m)) for m in masks], dtype=torch.float32)
    attn = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs])
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_scale) if lr_scale is not None else None
    done, _ = evaluate()
    steps = 0
    for step in range(max_steps):
        if done:
            break
        idx = torch.randint(len(seqs), (batch_size,), generator=gen)
        cols = int(attn[idx].sum(1).max()) if trim else width
        batch_ids, batch_attn = ids[idx, :cols], attn[idx, :cols]
        logits = model(input_ids=batch_ids, attention_mask=batch_attn).logits[:, :-1]
        nll = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), batch_ids[:, 1:].reshape(-1), reduction="none"
        )
        m = loss_mask[idx, 1:cols].reshape(-1)
        loss = (nll * m).sum() / m.sum()
        opt.zero_grad()
        loss.backward()
        if grad_grid > 0:
            for p in model.parameters():
                if p.grad is not None:  # exact in binary floating point: a power-of-two scale and an integer
                    p.grad.div_(grad_grid).round_().mul_(grad_grid)
        opt.step()
        if sched is not None:
            sched.step()
        steps = step + 1
        if step % eval_every == eval_every - 1:
            done, progress = evaluate()
            print(f"{label} step {step + 1}: loss {loss.item():.3f} {progress}", flush=True)
        if not math.isfinite(loss.item()):
            raise RuntimeError(f"{label} diverged (non-finite loss)")
    return steps


RECIPE = 3
"""The warm start's version: a cached model built by another recipe is rebuilt (3: the deterministic warm start, MODEL_SEED)."""


def fingerprint(model_dir: Path) -> str:
    """The first 12 hex digits of the weights file's SHA-256: the same on every machine for the same recipe."""
    return hashlib.sha256((model_dir / "model.safetensors").read_bytes()).hexdigest()[:12]


MODEL_SEED = 3
"""The demo model's initialisation and warm-start seed. The warm start is the same on every machine, so the seed
picks the model everyone gets: seed 3 learns the task as the README says (0.27 -> 0.89 at step 300 here); seed
0's model stalls near 0.5 (a seed picks what the model memorises first, and RL has to unlearn it)."""


def build_demo(
    model_dir: Path,
    data_dir: Path,
    target_acc: float = 0.3,
    seed: int = 0,
    wordy_frac: float = 0.5,
    model_seed: int = MODEL_SEED,
) -> None:
    """Write the demo data (split by `seed`) and the warm-started model (`model_seed`), unless both are already
    there (a model of an older recipe is rebuilt)."""
    train_path, _ = (data_dir / "train.jsonl", data_dir / "val.jsonl")
    if not train_path.exists() or not (data_dir / "val.jsonl").exists():
        train_path, _ = write_task(data_dir, seed)
    marker = model_dir / "demo_build.json"
    if marker.exists() and json.loads(marker.read_text()).get("recipe") == RECIPE:
        print(f"demo model ready at {model_dir} (fingerprint {fingerprint(model_dir)})")
        return
    if marker.exists():
        print(f"rebuilding the demo model at {model_dir}: built by an older recipe")
        marker.unlink()
    model, _ = build_tiny_model(model_dir, seed=model_seed)
    tok = AutoTokenizer.from_pretrained(model_dir)  # exactly the tokenizer the trainer and vLLM will load
    rows = [json.loads(line) for line in train_path.read_text().splitlines()]
    acc = warm_start(model, tok, rows, target_acc, seed=model_seed, wordy_frac=wordy_frac)
    save_model(model, tok, model_dir)
    info = {
        "recipe": RECIPE, "greedy_train_accuracy": acc, "target_acc": target_acc, "model_seed": model_seed,
        "wordy_frac": wordy_frac, "fingerprint": fingerprint(model_dir),
    }  # fmt: skip
    marker.write_text(json.dumps(info) + "\n")
    print(
        f"demo model written to {model_dir} (warm-start greedy accuracy {acc:.2f}, fingerprint {info['fingerprint']})"
    )


def build_untrained(model_dir: Path, data_dir: Path, seed: int = 0, model_seed: int = MODEL_SEED) -> None:
    """The demo model as initialised, before its warm start (what configs/sft.yaml fine-tunes), and the demo data;
    cached like the demo model."""
    if not (data_dir / "train.jsonl").exists() or not (data_dir / "val.jsonl").exists():
        write_task(data_dir, seed)
    if (model_dir / "model.safetensors").exists():
        print(f"untrained demo model ready at {model_dir}")
        return
    build_tiny_model(model_dir, seed=model_seed)
    print(f"untrained demo model written to {model_dir} (fingerprint {fingerprint(model_dir)})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("outputs/demo_model"))
    ap.add_argument("--data", type=Path, default=Path("outputs/demo_data"))
    ap.add_argument("--target-acc", type=float, default=0.3)
    ap.add_argument("--seed", type=int, default=0, help="the data split's seed")
    ap.add_argument("--model-seed", type=int, default=MODEL_SEED, help="the model's initialisation and warm start")
    ap.add_argument("--untrained", action="store_true", help="the model as initialised, without the warm start")
    args = ap.parse_args()
    if args.untrained:
        build_untrained(args.out, args.data, args.seed, args.model_seed)
        return
    build_demo(args.out, args.data, args.target_acc, args.seed, model_seed=args.model_seed)


if __name__ == "__main__":
    main()
