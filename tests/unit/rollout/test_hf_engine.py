"""Tests of torchrl_post/rollout/hf_engine.py: the engine loads the sync's stream and names what it did not get."""

from __future__ import annotations

import pytest
import torch

from tests.unit.sync_helpers import stream, tied_llama, untied_qwen
from torchrl_post.rollout.hf_engine import HFEngine

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
