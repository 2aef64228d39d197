"""Build the MoE demo: the dense demo model, sparsely upcycled into a tiny Qwen3-MoE (or Qwen2-MoE).

    python -m torchrl_post.demo.moe [--arch qwen3_moe|qwen2_moe] [--out outputs/moe_model_<arch>]
        [--dense outputs/demo_model] [--data outputs/demo_data]
    make moe-model [MOE_ARCH=qwen2_moe]; make moe (or make train ARGS="--config-name moe") trains it

Sparse upcycling (Komatsuzaki et al., 2022): the MoE model keeps the dense model's embeddings, attention, norms
and head; each decoder layer's dense MLP becomes `NUM_EXPERTS` copies, each multiplied element-wise by
(1 + `NOISE` * N(0, 1)) so that the experts differ and routing matters, behind a small random router (top-`TOP_K`,
renormalised: with identical experts the layer computes the dense MLP exactly, whatever the router says).

- Qwen2-MoE has Qwen2's attention (q/k/v biases, no q/k norm), so the upcycle is exact up to the perturbation.
  Its shared expert is a copy of the dense MLP too: its sigmoid gate starts at weight 0 (a factor of 1/2) and the
  routed experts' down projections are halved, so that the two halves add up to the dense MLP.
- Qwen3-MoE normalises each head's queries and keys (q_norm, k_norm) and its attention has no biases, so the
  dense Qwen2 attention cannot carry over exactly. A short distillation (`heal`: the dense model as teacher,
  KL on the warm start's answer positions) brings the MoE model back to the dense model's behaviour, and so
  its greedy accuracy near the dense model's (the build prints both).

The dense model is `torchrl_post.demo.build`'s (built here if missing); the task and data are the dense demo's.
Like the dense build, the result is the same bit for bit on every machine (float64 steps on a gradient grid,
`build.deterministic`; the `fingerprint` is printed) and cached: a marker with the recipe is written last.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Qwen2MoeConfig,
    Qwen2MoeForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

from torchrl_post.demo.build import GRID, _encode, build_demo, deterministic, fingerprint, greedy_accuracy, save_model

ARCHS = ("qwen3_moe", "qwen2_moe")
NUM_EXPERTS = 4
TOP_K = 2
NOISE = 0.05
"""Each expert's weights are the dense MLP's times (1 + NOISE * N(0, 1)), element-wise."""
ROUTER_STD = 0.02
"""The router's weights are N(0, ROUTER_STD^2): logits of a few tenths, so routing starts near uniform."""
HEAL_STEPS = 200
"""Distillation steps for an architecture whose attention differs from the dense model's (Qwen3-MoE)."""
RECIPE = 1
"""The MoE build's version: a cached model built by another recipe is rebuilt."""
MoeModel = Qwen3MoeForCausalLM | Qwen2MoeForCausalLM
VLLM_ALIGN = 32
"""vLLM's CPU MoE kernel needs the hidden size and the expert width to be multiples of 32."""


def moe_config(dense: PretrainedConfig, arch: str, num_experts: int = NUM_EXPERTS, top_k: int = TOP_K) -> Any:
    """The MoE config of `arch` with the dense config's sizes; each expert (and Qwen2-MoE's shared expert) is as wide
    as the dense MLP."""
    for key in ("hidden_size", "intermediate_size"):
        if getattr(dense, key) % VLLM_ALIGN:
            raise ValueError(
                f"the dense model's {key}={getattr(dense, key)} is not a multiple of {VLLM_ALIGN}: vLLM's CPU MoE "
                f"kernel needs one; build the dense model with a {key} divisible by {VLLM_ALIGN}"
            )
    common = dict(
        vocab_size=dense.vocab_size,
        hidden_size=dense.hidden_size,
        intermediate_size=dense.intermediate_size,
        moe_intermediate_size=dense.intermediate_size,
        num_hidden_layers=dense.num_hidden_layers,
        num_attention_heads=dense.num_attention_heads,
        num_key_value_heads=dense.num_key_value_heads,
        max_position_embeddings=dense.max_position_embeddings,
        rms_norm_eps=dense.rms_norm_eps,
        rope_parameters=dict(dense.rope_parameters),
        tie_word_embeddings=dense.tie_word_embeddings,
        bos_token_id=dense.bos_token_id,
        eos_token_id=dense.eos_token_id,
        pad_token_id=dense.pad_token_id,
        num_experts=num_experts,
        num_experts_per_tok=top_k,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        dtype="float32",
    )
    if arch == "qwen3_moe":  # head_dim is no declared field of Qwen3MoeConfig, but its attention reads it
        head_dim = getattr(dense, "head_dim", None) or dense.hidden_size // dense.num_attention_heads
        return Qwen3MoeConfig(attention_bias=False, **common, **{"head_dim": head_dim})
    if arch == "qwen2_moe":
        return Qwen2MoeConfig(shared_expert_intermediate_size=dense.intermediate_size, qkv_bias=True, **common)
    raise ValueError(f"arch={arch!r} is not an MoE architecture this demo builds; use one of {', '.join(ARCHS)}")


@torch.no_grad()
def upcycle(
    dense: PreTrainedModel,
    arch: str,
    num_experts: int = NUM_EXPERTS,
    top_k: int = TOP_K,
    noise: float = NOISE,
    router_std: float = ROUTER_STD,
    seed: int = 0,
) -> MoeModel:
    """The MoE model of `arch` upcycled from `dense` (a Qwen2 or Qwen3 causal LM; left unchanged). Every non-MLP
    parameter of the MoE model whose name and shape the dense model has is copied; the others keep their
    initialisation (Qwen3-MoE's q_norm/k_norm from a Qwen2: ones). With `noise=0` and the dense model's attention
    the MoE model computes the dense model's logits (up to float rounding)."""
    cfg = moe_config(dense.config, arch, num_experts, top_k)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model: MoeModel = (Qwen3MoeForCausalLM if arch == "qwen3_moe" else Qwen2MoeForCausalLM)(cfg)
    gen = torch.Generator().manual_seed(seed)
    dense_params = dict(dense.named_parameters())
    for name, p in model.named_parameters():
        src = dense_params.get(name)
        if ".mlp." not in name and src is not None and src.shape == p.shape:
            p.copy_(src)
    for i, layer in enumerate(model.model.layers):  # type: ignore[union-attr]
        mlp = dense.model.layers[i].mlp  # type: ignore[union-attr]
        gate_up_ih = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])  # (2I, H): gate first, as HF chunks it
        down_hi = mlp.down_proj.weight
        if arch == "qwen2_moe":
            shared = layer.mlp.shared_expert
            for n in ("gate_proj", "up_proj", "down_proj"):
                getattr(shared, n).weight.copy_(getattr(mlp, n).weight)
            layer.mlp.shared_expert_gate.weight.zero_()  # sigmoid(0) = 1/2 of the shared expert ...
            down_hi = down_hi / 2  # ... plus 1/2 from the routed experts: the dense MLP
        experts = layer.mlp.experts
        for name, w in (("gate_up_proj", gate_up_ih), ("down_proj", down_hi)):
            eps = torch.randn((num_experts, *w.shape), generator=gen)
            getattr(experts, name).copy_(w * (1 + noise * eps))
        layer.mlp.gate.weight.copy_(torch.randn(layer.mlp.gate.weight.shape, generator=gen) * router_std)
    return model


def heal(
    model: PreTrainedModel,
    teacher: PreTrainedModel,
    tok: PreTrainedTokenizerBase,
    rows: list[dict],
    steps: int = HEAL_STEPS,
    lr: float = 1e-3,
    batch_size: int = 64,
    seed: int = 0,
) -> float:
    """Distil `teacher` into `model`: AdamW steps on KL(teacher || model) at the positions that predict an answer
    (answers as the dense warm start wrote them, half of them "=<answer>"), in float64 with gradients on `GRID`
    (the same bits on every machine). Returns the last batch's mean KL per position."""
    seqs, starts = [], []
    for i, r in enumerate(rows):
        p = _encode(tok, r["prompt"])
        target = ("=" if i % 2 else "") + r["answer"]
        seqs.append(p + tok(target, add_special_tokens=False)["input_ids"] + [tok.eos_token_id])
        starts.append(len(p) - 1)  # the position whose logits predict the first answer token
    width = max(map(len, seqs))
    ids = torch.tensor([s + [tok.pad_token_id] * (width - len(s)) for s in seqs])
    attn = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs])
    pos = torch.arange(width)
    answer = (pos >= torch.tensor(starts)[:, None]) & (pos < torch.tensor([len(s) - 1 for s in seqs])[:, None])
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    kl = float("nan")
    experts_impl = model.config._experts_implementation
    model.set_experts_implementation("eager")  # grouped_mm has no float64 kernel
    with deterministic(model), deterministic(teacher):
        for step in range(steps):
            idx = torch.randint(len(seqs), (batch_size,), generator=gen)
            batch_ids, batch_attn, m = ids[idx], attn[idx], answer[idx].double()
            with torch.no_grad():
                logp_teacher = teacher(input_ids=batch_ids, attention_mask=batch_attn).logits.log_softmax(-1)
            logp = model(input_ids=batch_ids, attention_mask=batch_attn).logits.log_softmax(-1)
            kl_tok = (logp_teacher.exp() * (logp_teacher - logp)).sum(-1)
            loss = (kl_tok * m).sum() / m.sum()
            opt.zero_grad()
            loss.backward()
            for param in model.parameters():
                if param.grad is not None:  # see build.deterministic: the same bits on every machine
                    param.grad.div_(GRID).round_().mul_(GRID)
            opt.step()
            kl = loss.item()
            if step % 50 == 49:
                print(f"heal step {step + 1}: KL {kl:.4f}", flush=True)
    model.set_experts_implementation(experts_impl)
    return kl


def build_moe(
    model_dir: Path, dense_dir: Path, data_dir: Path, arch: str = "qwen3_moe", heal_steps: int = HEAL_STEPS
) -> None:
    """Write the upcycled MoE demo model of `arch` to `model_dir` (building the dense demo model and data first if
    missing), unless one of this recipe and from this dense model is already there."""
    build_demo(dense_dir, data_dir)
    marker = model_dir / "moe_build.json"
    want = {"recipe": [RECIPE, arch], "dense_fingerprint": fingerprint(dense_dir)}
    if marker.exists() and all(json.loads(marker.read_text()).get(k) == v for k, v in want.items()):
        print(f"MoE demo model ready at {model_dir} (fingerprint {fingerprint(model_dir)})")
        return
    if marker.exists():
        print(f"rebuilding the MoE demo model at {model_dir}: built by an older recipe, another arch or dense model")
        marker.unlink()
    dense = AutoModelForCausalLM.from_pretrained(dense_dir, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(dense_dir)
    model = upcycle(dense, arch)
    rows = [json.loads(line) for line in (data_dir / "train.jsonl").read_text().splitlines()]
    probe = rows[:200]
    acc_dense, acc_upcycled = greedy_accuracy(dense, tok, probe), greedy_accuracy(model, tok, probe)
    print(f"greedy accuracy on 200 training prompts: dense {acc_dense:.3f}, upcycled {acc_upcycled:.3f}")
    kl = None
    if arch == "qwen3_moe":  # the attention changed: distil the dense model back in
        kl = heal(model, dense, tok, rows, steps=heal_steps)
    acc = greedy_accuracy(model, tok, probe)
    save_model(model, tok, model_dir)
    info = {
        **want, "arch": arch, "num_experts": NUM_EXPERTS, "top_k": TOP_K, "noise": NOISE,
        "heal_steps": heal_steps if arch == "qwen3_moe" else 0, "heal_kl": kl,
        "greedy_train_accuracy": acc, "dense_greedy_train_accuracy": acc_dense, "fingerprint": fingerprint(model_dir),
    }  # fmt: skip
    marker.write_text(json.dumps(info) + "\n")
    print(
        f"MoE demo model ({arch}, {NUM_EXPERTS} experts, top-{TOP_K}) written to {model_dir} (greedy accuracy "
        f"{acc:.2f}, dense {acc_dense:.2f}, fingerprint {info['fingerprint']})"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arch", choices=ARCHS, default="qwen3_moe")
    ap.add_argument("--out", type=Path, default=None, help="default: outputs/moe_model_<arch>")
    ap.add_argument("--dense", type=Path, default=Path("outputs/demo_model"))
    ap.add_argument("--data", type=Path, default=Path("outputs/demo_data"))
    args = ap.parse_args()
    build_moe(args.out or Path(f"outputs/moe_model_{args.arch}"), args.dense, args.data, args.arch)


if __name__ == "__main__":
    main()
