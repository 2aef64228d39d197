"""Tests of torchrl_post/engines/hf.py: the engine loads the sync's stream and names what it did not get;
its logprobs under top-p are those of the truncated distribution it sampled from."""

from __future__ import annotations

import pytest
import torch

from tests.unit.sync_helpers import stream, tied_llama, untied_qwen
from torchrl_post.algos.sampling_support import Truncation, support_log_probs
from torchrl_post.engines.base import SamplingParams, generate
from torchrl_post.engines.hf import HFEngine

# --- the HF engine's accounting ---------------------------------------------------------------------------------


def hf_engine(model: torch.nn.Module) -> HFEngine:
    engine = HFEngine.__new__(HFEngine)  # load_weights needs the model only
    engine.model, engine.lora_scale = model, 0.0
    return engine


def test_hf_engine_loads_a_tied_model_from_the_stream() -> None:
    trained, engine = tied_llama(seed=1), hf_engine(tied_llama(seed=2))
    engine.load_weights(stream(trained))
    assert torch.equal(engine.model.lm_head.weight, trained.model.embed_tokens.weight)


@pytest.mark.parametrize("make", [tied_llama, untied_qwen], ids=["tied", "untied"])
def test_hf_engine_names_a_parameter_the_sync_left_out(make: type) -> None:
    engine = hf_engine(make(seed=2))
    with pytest.raises(RuntimeError, match=r"did not get 1 parameter\(s\): model\.norm\.weight\. The sync missed"):
        engine.load_weights((n, t) for n, t in stream(make(seed=1)) if n != "model.norm.weight")
    with pytest.raises(RuntimeError, match="no parameter 'model.extra.weight'"):
        engine.load_weights([*stream(make(seed=1)), ("model.extra.weight", torch.zeros(1))])


def test_hf_engine_untied_lm_head_left_out_is_an_error() -> None:
    engine = hf_engine(untied_qwen(seed=2))
    with pytest.raises(RuntimeError, match=r"lm_head\.weight"):
        engine.load_weights((n, t) for n, t in stream(untied_qwen(seed=1)) if n != "lm_head.weight")


def _tiny_moe(seed: int) -> torch.nn.Module:
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    config = Qwen3MoeConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, moe_intermediate_size=8, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=8, num_experts=4, num_experts_per_tok=2,
    )  # fmt: skip
    torch.manual_seed(seed)
    return Qwen3MoeForCausalLM(config)


def test_hf_engine_loads_experts_sent_one_expert_at_a_time() -> None:
    """An expert-parallel trainer sends each fused experts parameter as its experts' checkpoint tensors
    (`experts.{e}.gate_proj.weight`, `up_proj`, `down_proj`): the engine puts each in its slice, and names a
    fused parameter none of whose pieces came."""
    trained, engine = _tiny_moe(1), hf_engine(_tiny_moe(2))
    experts = {n: p for n, p in trained.named_parameters() if ".experts." in n}
    assert sorted(experts) == [
        f"model.layers.{i}.mlp.experts.{k}" for i in (0, 1) for k in ("down_proj", "gate_up_proj")
    ]

    def per_expert(skip: str = "") -> list[tuple[str, torch.Tensor]]:
        out = [(n, t.detach()) for n, t in stream(trained) if n not in experts]
        for name, p in experts.items():
            head = name.rsplit(".", 1)[0]
            for e in range(4):
                if name.endswith("gate_up_proj"):
                    gate, up = p[e].detach().chunk(2)
                    out += [(f"{head}.{e}.gate_proj.weight", gate), (f"{head}.{e}.up_proj.weight", up)]
                elif name != skip:
                    out.append((f"{head}.{e}.down_proj.weight", p[e].detach()))
        return out

    engine.load_weights(per_expert())
    for name, p in engine.model.named_parameters():
        assert torch.equal(p, trained.get_parameter(name)), name
    with pytest.raises(RuntimeError, match=r"did not get 1 parameter\(s\): model\.layers\.1\.mlp\.experts\.down_proj"):
        hf_engine(_tiny_moe(2)).load_weights(per_expert(skip="model.layers.1.mlp.experts.down_proj"))


# --- the HF engine's logprobs under top-k / top-p ----------------------------------------------------------------


def test_hf_engine_reports_logprobs_on_the_top_p_set_as_vllm_does() -> None:
    """Sampling at top_p < 1, the engine's logprob of each token is log pi_S (`support_log_probs` of the model's
    tempered logits), vLLM's processed logprobs; each above the full-vocabulary logprob by the log of the kept mass."""
    model = untied_qwen(seed=1).eval()
    engine = hf_engine(model)
    engine.vision, engine.device, engine.pad_id, engine.eos_ids = None, torch.device("cpu"), 0, [1]
    engine._queue = []
    params = SamplingParams(n=2, temperature=0.8, top_p=0.5, top_k=-1, max_tokens=5, seed=3)
    prompt = [5, 9, 14, 3]
    gen = generate(engine, [prompt], [0], params)
    for ids, lps in zip(gen.response_ids, gen.logprobs, strict=True):
        seq = torch.tensor([prompt + ids])
        with torch.no_grad():
            z = model(seq).logits[0, len(prompt) - 1 : -1].float() / 0.8
        labels = torch.tensor(ids)
        want = support_log_probs(z, Truncation(top_p=0.5), labels).gather(-1, labels[:, None]).squeeze(-1)
        full = torch.log_softmax(z, -1).gather(-1, labels[:, None]).squeeze(-1)
        assert torch.allclose(torch.tensor(lps), want, atol=1e-5), (lps, want)
        assert (want > full).all()
