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
