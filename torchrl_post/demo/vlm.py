"""Build the vision-language demo: a tiny Qwen-VL model with a character tokenizer, warm-started on a colour task.

    python -m torchrl_post.demo.vlm --arch qwen2_vl [--out outputs/vlm_model_qwen2_vl] [--data outputs/vlm_data]

Three architectures (`ARCHS`): Qwen2-VL, Qwen2.5-VL and Qwen3-VL, each float32 with a 2-layer, hidden-64 language
model (head_dim 32, which vLLM's CPU attention supports) and a 1-2 block vision tower. Every image is resized
to one square size (56 px for patch-14 archs, 64 px for Qwen3-VL's patch 16): a 4x4 patch grid, 4 image tokens
after the 2x2 merge.

The task: an image of a shape (or a solid fill) in one of 4 colours, "<image>What colour is it?", answer the
colour word; the reward (`colour_reward`) is exact match, so it depends on the image (a model blind to it
scores at most 0.25). The warm start is a brief supervised pass; half its targets are written "=<colour>", a
format the reward rejects. It stops once greedy validation accuracy is within [target_acc, max_acc] (0.3-0.5)
and temperature-1 samples score at least 0.15: the model names the colour and spells it well enough for RL to
get signal, but often in the wrong format (greedy picks one format per colour, so greedy accuracy moves in
steps of about 0.25).
Deterministic (seeded) and cached: nothing is rebuilt when the model directory's marker file is there.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForImageTextToText, PreTrainedModel, PreTrainedTokenizerBase

from torchrl_post.demo.tokenizer import build_char_tokenizer
from torchrl_post.demo.vlm_task import COLOURS, DATA_SOURCE, colour_reward, read_rows, write_vlm_task
from torchrl_post.multimodal import compat
from torchrl_post.multimodal.vision import load_processor, with_image_items

ARCHS = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")
VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]

# ChatML; a content list renders item by item, an image item as the vision markers around one image pad (the
# processor expands the pad to the image's tokens).
VLM_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for item in message['content'] %}"
    "{% if item['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
MARKER = "demo_build.json"


def image_size(arch: str) -> int:
    """The side every image is resized to: a 4x4 patch grid (patch 14, or 16 for Qwen3-VL)."""
    _check_arch(arch)
    return 64 if arch == "qwen3_vl" else 56


def _check_arch(arch: str) -> None:
    if arch not in ARCHS:
        raise ValueError(f"unknown arch {arch!r}; one of {', '.join(ARCHS)}")


def _config(arch: str, tok: PreTrainedTokenizerBase) -> Any:
    """The tiny model config of `arch` (language model: hidden 64, 2 layers, 2 heads of 32)."""
    ids = {t: tok.convert_tokens_to_ids(t) for t in VISION_TOKENS}
    special: dict[str, Any] = dict(
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False,
    )
    text: dict[str, Any] = dict(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=None,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        dtype="float32",
    )
    if arch == "qwen2_vl":
        from transformers import Qwen2VLConfig

        text["rope_parameters"] = {"rope_type": "default", "mrope_section": [4, 6, 6], "rope_theta": 10000.0}
        vision: dict[str, Any] = dict(
            depth=1,
            embed_dim=32,
            hidden_size=64,
            num_heads=2,
            mlp_ratio=2,
            patch_size=14,
            spatial_merge_size=2,
            temporal_patch_size=2,
        )
        return Qwen2VLConfig(text_config=text, vision_config=vision, dtype="float32", **special)
    if arch == "qwen2_5_vl":
        from transformers import Qwen2_5_VLConfig

        text["rope_parameters"] = {"rope_type": "default", "mrope_section": [4, 6, 6], "rope_theta": 10000.0}
        vision = dict(
            depth=2,
            hidden_size=32,
            intermediate_size=64,
            out_hidden_size=64,
            num_heads=2,
            patch_size=14,
            spatial_merge_size=2,
            temporal_patch_size=2,
            window_size=56,
            fullatt_block_indexes=[1],
        )
        return Qwen2_5_VLConfig(text_config=text, vision_config=vision, dtype="float32", **special)
    from transformers import Qwen3VLConfig

    text["head_dim"] = 32
    text["rope_parameters"] = {
        "rope_type": "default",
        "mrope_section": [6, 5, 5],
        "mrope_interleaved": True,
        "rope_theta": 10000.0,
    }
    vision = dict(
        depth=1,
        hidden_size=32,
        intermediate_size=64,
        out_hidden_size=64,
        num_heads=2,
        patch_size=16,
        spatial_merge_size=2,
        temporal_patch_size=2,
        num_position_embeddings=64,
        deepstack_visual_indexes=[0],
    )
    return Qwen3VLConfig(text_config=text, vision_config=vision, dtype="float32", **special)


def _processor(arch: str, tok: PreTrainedTokenizerBase) -> Any:
    """The arch's processor: the PIL image processor (every image resized to `image_size`) and `tok`."""
    compat.install()
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    side = image_size(arch)
    image_processor = Qwen2VLImageProcessorPil(
        size={"shortest_edge": side * side, "longest_edge": side * side},
        patch_size=16 if arch == "qwen3_vl" else 14,
        temporal_patch_size=2,
        merge_size=2,
    )
    if arch == "qwen2_vl":
        from transformers import Qwen2VLProcessor as cls
    elif arch == "qwen2_5_vl":
        from transformers import Qwen2_5_VLProcessor as cls  # type: ignore[assignment]
    else:
        from transformers import Qwen3VLProcessor as cls  # type: ignore[assignment]
    return cls(image_processor=image_processor, tokenizer=tok, chat_template=VLM_CHAT_TEMPLATE)


def save_vlm(model: PreTrainedModel, processor: Any, out_dir: Path) -> None:
    """Model, tokenizer and processor into `out_dir`."""
    tok = processor.tokenizer
    out_dir.mkdir(parents=True, exist_ok=True)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.bos_token_id = None
    model.save_pretrained(out_dir, safe_serialization=True)
    tok.save_pretrained(out_dir)
    processor.save_pretrained(out_dir)


def build_vlm(out_dir: Path, arch: str, seed: int = 0) -> Path:
    """Save a randomly initialised tiny model of `arch` with its tokenizer and processor; returns out_dir."""
    _check_arch(arch)
    tok = build_char_tokenizer(128, VISION_TOKENS)
    tok.chat_template = VLM_CHAT_TEMPLATE
    processor = _processor(arch, tok)
    torch.manual_seed(seed)
    model = AutoModelForImageTextToText.from_config(_config(arch, tok))
    save_vlm(model, processor, out_dir)
    return out_dir


def prompt_text(processor: Any, row: dict[str, Any]) -> str:
    """The chat-templated prompt of a row (one image pad per image, before the processor expands it)."""
    messages = with_image_items([{"role": "user", "content": row["prompt"]}], len(row["pil"]), "row")
    return str(processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False))


@torch.no_grad()
def answers(
    model: PreTrainedModel, processor: Any, rows: list[dict[str, Any]], sample: bool = False, batch_size: int = 64
) -> list[str]:
    """Responses (HF generate, up to 8 new tokens) to the rows' prompts: greedy, or sampled at temperature 1
    with no top-k/top-p cut (from the global torch RNG)."""
    tok = processor.tokenizer
    side, tok.padding_side = tok.padding_side, "left"
    sampling = {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0} if sample else {"do_sample": False}
    texts: list[str] = []
    try:
        for start in range(0, len(rows), batch_size):
            part = rows[start : start + batch_size]
            enc = processor(
                text=[prompt_text(processor, r) for r in part],
                images=[img for r in part for img in r["pil"]],
                padding=True,
                return_tensors="pt",
            )
            out = model.generate(  # type: ignore[operator]
                **enc, max_new_tokens=8, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, **sampling
            )
            texts += tok.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    finally:
        tok.padding_side = side
    return texts


def mean_reward(texts: list[str], rows: list[dict[str, Any]]) -> float:
    return sum(colour_reward(DATA_SOURCE, t, r["answer"]) for t, r in zip(texts, rows, strict=True)) / len(rows)


def greedy_accuracy(model: PreTrainedModel, processor: Any, rows: list[dict[str, Any]]) -> float:
    """Mean `colour_reward` of the greedy responses."""
    return mean_reward(answers(model, processor, rows), rows)


def sampled_reward(
    model: PreTrainedModel, processor: Any, rows: list[dict[str, Any]], samples: int = 2, seed: int = 0
) -> float:
    """Mean `colour_reward` of `samples` temperature-1 responses per row (seeded; the global RNG is restored)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return mean_reward(answers(model, processor, rows * samples, sample=True), rows * samples)


def _sft_tensors(processor: Any, rows: list[dict[str, Any]], targets: list[str]) -> dict[str, torch.Tensor]:
    """Right-padded prompt+target rows, their loss mask (1 on target tokens and the closing EOS), and images."""
    tok = processor.tokenizer
    side, tok.padding_side = tok.padding_side, "right"
    prompts = [prompt_text(processor, r) for r in rows]
    images = [img for r in rows for img in r["pil"]]
    try:
        texts = [p + t + tok.eos_token for p, t in zip(prompts, targets, strict=True)]
        enc = processor(text=texts, images=images, padding=True, return_tensors="pt")
        prompt_lens = processor(text=prompts, images=images, padding=True, return_tensors="pt")["attention_mask"].sum(1)
    finally:
        tok.padding_side = side
    cols = torch.arange(enc["input_ids"].shape[1])
    loss_mask = (cols[None] >= prompt_lens[:, None]) & enc["attention_mask"].bool()
    return {**enc, "loss_mask": loss_mask.float()}


def warm_start(
    model: PreTrainedModel,
    processor: Any,
    train: list[dict[str, Any]],
    val: list[dict[str, Any]],
    target_acc: float = 0.3,
    max_acc: float = 0.5,
    min_sampled: float = 0.15,
    seed: int = 0,
    wordy_frac: float = 0.5,
    max_steps: int = 300,
    lr: float = 1e-3,
    batch_size: int = 32,
    eval_every: int = 3,
    blind: bool = False,
) -> dict[str, Any]:
    """SFT on image+prompt -> colour until, on the validation rows, greedy accuracy is within
    [target_acc, max_acc] and the mean reward of temperature-1 samples is at least `min_sampled` (RL then
    has both signal and room). A `wordy_frac` share of targets is written "=<colour>", which the reward
    rejects. `blind`: every target is a colour drawn at random, whatever the image shows: the model learns to
    answer with a colour word but not which one (about 0.25), and RL has to teach it to look at the image.
    Returns the accuracies and steps (`"reached": False` when max_steps ran out first)."""
    gen = torch.Generator().manual_seed(seed)
    wordy = (torch.rand(len(train), generator=gen) < wordy_frac).tolist()
    names = list(COLOURS)
    guesses = [names[int(i)] for i in torch.randint(len(names), (len(train),), generator=gen)]
    colours = guesses if blind else [r["answer"] for r in train]
    data = _sft_tensors(processor, train, [("=" if w else "") + c for c, w in zip(colours, wordy, strict=True)])
    grids = data["image_grid_thw"]
    per_image = int(grids[0].prod())
    if not bool((grids.prod(1) == per_image).all()) or any(len(r["pil"]) != 1 for r in train):
        raise ValueError("warm start expects one image per row, all of one size")
    pixels = data["pixel_values"].reshape(len(train), per_image, -1)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)

    def evaluate() -> tuple[bool, float, float]:
        model.eval()
        acc, sampled = greedy_accuracy(model, processor, val), float("nan")
        if target_acc <= acc <= max_acc:
            sampled = sampled_reward(model, processor, val, seed=seed)
        return sampled >= min_sampled, acc, sampled

    done, acc, sampled = evaluate()
    steps = 0
    while not done and steps < max_steps:
        model.train()
        idx = torch.randint(len(train), (batch_size,), generator=gen)
        ids = data["input_ids"][idx]
        logits = model(
            input_ids=ids,
            attention_mask=data["attention_mask"][idx],
            mm_token_type_ids=data["mm_token_type_ids"][idx],
            pixel_values=pixels[idx].reshape(-1, pixels.shape[-1]),
            image_grid_thw=grids[idx],
        ).logits[:, :-1]
        nll = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="none"
        )
        m = data["loss_mask"][idx, 1:].reshape(-1)
        loss = (nll * m).sum() / m.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        steps += 1
        if not math.isfinite(loss.item()):
            raise RuntimeError("warm start diverged (non-finite loss)")
        if steps % eval_every == 0:
            done, acc, sampled = evaluate()
            extra = f", sampled reward {sampled:.2f}" if sampled == sampled else ""
            print(f"warm start step {steps}: loss {loss.item():.3f}, greedy val acc {acc:.2f}{extra}", flush=True)
    model.eval()
    return {"greedy_val_accuracy": acc, "sampled_val_reward": sampled, "steps": steps, "reached": done}


def build_vlm_demo(
    model_dir: Path,
    data_dir: Path,
    arch: str = "qwen2_vl",
    target_acc: float = 0.1,
    seed: int = 0,
    max_acc: float = 0.4,
    wordy_frac: float = 0.0,
    warm: bool = True,
    blind: bool = True,
) -> None:
    """Write the task data and the model (warm-started unless `warm` is False), unless they are there: the
    marker file `demo_build.json` in model_dir says the model is complete."""
    _check_arch(arch)
    train_path, val_path = data_dir / "train.jsonl", data_dir / "val.jsonl"
    if not train_path.exists() or not val_path.exists():
        train_path, val_path = write_vlm_task(data_dir, seed)
    marker = model_dir / MARKER
    if marker.exists() and json.loads(marker.read_text()).get("warm_start") == warm:
        print(f"vlm demo model ready at {model_dir}")
        return
    marker.unlink(missing_ok=True)
    start = time.perf_counter()
    build_vlm(model_dir, arch, seed)
    info: dict[str, Any] = {"arch": arch, "seed": seed, "warm_start": warm}
    if warm:
        # exactly what the trainer and vLLM will load
        processor = load_processor(str(model_dir))
        model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32)
        train, val = read_rows(train_path), read_rows(val_path)
        result = warm_start(
            model, processor, train, val, target_acc, max_acc, seed=seed, wordy_frac=wordy_frac, blind=blind
        )
        if not result["reached"]:
            print(f"warning: warm start stopped at max steps before reaching its targets: {result}")
        save_vlm(model, processor, model_dir)
        info.update(result, target_acc=target_acc, max_acc=max_acc, wordy_frac=wordy_frac, blind=blind)
    info["seconds"] = round(time.perf_counter() - start, 1)
    marker.write_text(json.dumps(info) + "\n")
    print(f"vlm demo model written to {model_dir}: {info}")


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--arch", choices=ARCHS, default="qwen2_vl")
    ap.add_argument("--out", type=Path, default=None, help="default outputs/vlm_model_<arch>")
    ap.add_argument("--data", type=Path, default=Path("outputs/vlm_data"))
    ap.add_argument("--target-acc", type=float, default=0.1)
    ap.add_argument("--max-acc", type=float, default=0.4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-warm-start", action="store_true", help="save the random model as it is")
    args = ap.parse_args()
    out = args.out or Path(f"outputs/vlm_model_{args.arch}")
    build_vlm_demo(out, args.data, args.arch, args.target_acc, args.seed, args.max_acc, warm=not args.no_warm_start)


if __name__ == "__main__":
    main()
