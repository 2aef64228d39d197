"""The distillation demo's models: a teacher of the demo's shape and a student of half its width, both loadable as the
trainer loads them, over the very same tokenizer, the teacher strong and the student weak on the held-out sums (what
the demo needs to show a rise), and cached by their markers."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from torchrl_post.demo import distill
from torchrl_post.demo.build import fingerprint
from torchrl_post.engines.base import VLLM_CPU_HEAD_SIZES


def _marker(model_dir: Path) -> dict:
    return json.loads((model_dir / distill.MARKER).read_text())


def test_the_teacher_has_the_demos_width_and_the_student_half_with_heads_vllm_takes(
    demo_distill_models: tuple[Path, Path],
) -> None:
    teacher, student = (AutoConfig.from_pretrained(d) for d in demo_distill_models)
    assert (teacher.hidden_size, student.hidden_size) == (128, 64)
    assert teacher.num_hidden_layers == student.num_hidden_layers == 2
    for cfg in (teacher, student):
        assert cfg.hidden_size // cfg.num_attention_heads in VLLM_CPU_HEAD_SIZES
    assert student.num_attention_heads == 2


def test_both_load_over_the_same_tokenizer_and_agree_on_the_vocabulary(
    demo_distill_models: tuple[Path, Path], demo: tuple[Path, Path]
) -> None:
    toks = [AutoTokenizer.from_pretrained(d) for d in (*demo_distill_models, demo[0])]
    for tok in toks[1:]:
        assert tok.get_vocab() == toks[0].get_vocab()
        assert tok.chat_template == toks[0].chat_template
        assert (tok.eos_token_id, tok.pad_token_id) == (toks[0].eos_token_id, toks[0].pad_token_id)
    enc = toks[0].apply_chat_template([{"role": "user", "content": "What is 3+4?"}], add_generation_prompt=True)
    ids = torch.tensor([list(enc["input_ids"])])
    vocab = AutoConfig.from_pretrained(demo[0]).vocab_size  # the demo's embedding rows, more than the tokens
    for d in demo_distill_models:
        model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
        with torch.no_grad():
            logits = model(input_ids=ids).logits
        assert logits.shape == (1, ids.shape[1], vocab) and len(toks[0]) <= vocab
        assert torch.isfinite(logits).all()


def test_the_teacher_is_strong_and_the_student_weak_on_held_out_sums(
    demo_distill_models: tuple[Path, Path], demo: tuple[Path, Path]
) -> None:
    teacher, student = (_marker(d) for d in demo_distill_models)
    assert teacher["val_greedy_accuracy"] >= 0.9
    assert student["val_greedy_accuracy"] <= 0.3  # room for distillation to lift it by 0.2 and more
    assert teacher["demo_fingerprint"] == fingerprint(demo[0])
    for marker, d in zip((teacher, student), demo_distill_models, strict=True):
        assert marker["recipe"] == distill.RECIPE and marker["fingerprint"] == fingerprint(d)


def test_a_second_build_is_the_cached_one(demo_distill_models: tuple[Path, Path], demo: tuple[Path, Path]) -> None:
    before = {d: (d / "model.safetensors").stat().st_mtime_ns for d in demo_distill_models}
    infos = distill.build_distill(*demo_distill_models, *demo)
    assert [infos["teacher"], infos["student"]] == [_marker(d) for d in demo_distill_models]
    assert {d: (d / "model.safetensors").stat().st_mtime_ns for d in demo_distill_models} == before
