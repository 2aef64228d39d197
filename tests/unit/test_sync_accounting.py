"""Every parameter reaches the engine, or the run says which did not: tied word embeddings travel under both
names, an engine that did not get a parameter raises naming it, and a float32 run whose engine logprobs drift
from the trainer's warns. No process group, no vLLM engine (the distributed parity tests run the real ones)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from torchrl_post.config.schema import Config
from torchrl_post.rollout.hf_engine import HFEngine
from torchrl_post.rollout.vllm_engine import RELOAD_LOGGERS, ReloadAccount, reload_misses
from torchrl_post.sync.lora import is_adapter, lora_scale, merged_weights
from torchrl_post.sync.weights import tied_aliases, with_aliases
from torchrl_post.trainer import logprob_diff_warning

SIZES = {"vocab_size": 128, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2}
HEADS = {"num_attention_heads": 2, "num_key_value_heads": 1}


def tied_llama(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**SIZES, **HEADS, tie_word_embeddings=True)).eval()


def untied_qwen(seed: int = 0) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(Qwen2Config(**SIZES, **HEADS, tie_word_embeddings=False)).eval()


def stream(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """What the sync streams, without a process group: the parameters, tied embeddings under both names."""
    params = ((n, p.detach()) for n, p in model.named_parameters())
    return with_aliases(params, tied_aliases(model))


# --- tied embeddings in the sync's stream -----------------------------------------------------------------------


def test_tied_embeddings_are_streamed_under_both_names_once_gathered() -> None:
    model = tied_llama()
    assert "lm_head.weight" not in dict(model.named_parameters()), "named_parameters lists a tied weight once"
    assert tied_aliases(model) == (("lm_head.weight", "model.embed_tokens.weight"),)
    names = [n for n, _ in stream(model)]
    assert names.index("lm_head.weight") == names.index("model.embed_tokens.weight") + 1
    sent = dict(stream(model))
    assert sent["lm_head.weight"] is sent["model.embed_tokens.weight"], "the alias is the same tensor, not a copy"
    assert tied_aliases(untied_qwen()) == ()


def test_tied_aliases_under_peft_reach_the_merged_stream_under_hf_names() -> None:
    """LoRA merged mode: PEFT names in, the merged model's HF names out, the LM head among them."""
    peft = get_peft_model(tied_llama(), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    aliases = tied_aliases(peft)
    assert aliases == (("base_model.model.lm_head.weight", "base_model.model.model.embed_tokens.weight"),)
    assert tied_aliases(peft, keep=is_adapter) == (), "adapter mode sends only the adapter"
    merged = dict(merged_weights(stream(peft), lora_scale(4, 8)))
    assert torch.equal(merged["lm_head.weight"], merged["model.embed_tokens.weight"])


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


# --- the vLLM engine's accounting (vLLM's reload reports, as its loggers emit them) ------------------------------

PARAM_LAYERS = {
    "VocabParallelEmbedding": ["model.embed_tokens"],
    "ParallelLMHead": ["lm_head"],
    "RMSNorm": [f"model.layers.{i}.{n}" for i in range(2) for n in ("input_layernorm", "post_attention_layernorm")]
    + ["model.norm"],
}


def test_rotary_caches_are_quiet_and_a_layer_with_parameters_is_named() -> None:
    assert reload_misses(["RotaryEmbedding", "MRotaryEmbedding"], [], PARAM_LAYERS) is None
    error = reload_misses(["RotaryEmbedding", "ParallelLMHead"], [], PARAM_LAYERS)
    assert error is not None and "ParallelLMHead (lm_head)" in error and "Rotary" not in error
    assert "sync missed" in error
    error = reload_misses(["RMSNorm"], ["model.norm.weight"], PARAM_LAYERS)
    assert error is not None and "RMSNorm (some of its 5 layers" in error and "model.norm.weight" in error


@pytest.fixture
def vllm_at_error_level() -> Iterator[list[logging.LogRecord]]:
    """vLLM's logger as VLLM_LOGGING_LEVEL=ERROR leaves it (no propagation, its own level); what it prints."""
    root = logging.getLogger("vllm")
    saved = root.level, root.propagate
    printed: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = printed.append  # type: ignore[method-assign]
    root.setLevel(logging.ERROR)
    root.propagate = False
    root.addHandler(handler)
    yield printed
    root.removeHandler(handler)
    root.setLevel(saved[0])
    root.propagate = saved[1]


def test_reload_account_takes_vllm_reports_even_at_a_quieter_level(vllm_at_error_level: list) -> None:
    layerwise, inplace = (logging.getLogger(name) for name in RELOAD_LOGGERS)
    with ReloadAccount() as account:
        layerwise.warning("%s: Failed to load weights", "RotaryEmbedding")
        layerwise.warning("%s: Failed to load weights", "ParallelLMHead")
        inplace.warning("Following weights were not loaded from checkpoint: %s", {"model.norm.weight"})
        layerwise.warning("Allocating %.1f MB of device memory", 1.0)  # below the level set: stays unprinted
        layerwise.error("something else")  # at the level set: printed as before
    assert account.layers == ["RotaryEmbedding", "ParallelLMHead"]
    assert account.params == ["model.norm.weight"]
    assert [r.getMessage() for r in vllm_at_error_level] == ["something else"]
    assert not layerwise.filters and layerwise.level == logging.NOTSET, "the loggers are left as they were"
    layerwise.warning("%s: Failed to load weights", "ParallelLMHead")  # outside a reload: not taken
    assert account.layers == ["RotaryEmbedding", "ParallelLMHead"]


# --- the trainer's warning --------------------------------------------------------------------------------------


def test_logprob_diff_far_above_float32_noise_warns_naming_value_threshold_and_key() -> None:
    cfg = Config()
    assert cfg.trainer.max_logprob_diff == 1e-4  # float32 parity is about 1e-6; the stale head: 1.5e-4
    assert logprob_diff_warning({"rollout/logprob_diff": 5e-6}, cfg) is None
    text = logprob_diff_warning({"rollout/logprob_diff": 2.2e-4, "rollout/staleness": 0.0}, cfg)
    assert text is not None
    for part in ("0.00022", "0.0001", "trainer.max_logprob_diff", "missed a parameter", "tied embeddings"):
        assert part in text, part
    cfg.trainer.max_logprob_diff = 1e-3
    assert logprob_diff_warning({"rollout/logprob_diff": 2.2e-4}, cfg) is None


@pytest.mark.parametrize(
    ("key", "value", "metrics"),
    [
        ("trainer.max_logprob_diff", 0.0, {}),
        ("rollout.dtype", "bfloat16", {}),
        ("actor.fsdp.param_dtype", "bfloat16", {}),
        ("rollout.top_p", 0.9, {}),
        ("rollout.top_k", 20, {}),
        (None, None, {"rollout/staleness": 1.0}),
    ],
    ids=["off", "bf16-engine", "bf16-trainer", "top_p", "top_k", "look-ahead"],
)
def test_logprob_diff_check_stays_off_where_engine_and_trainer_differ_by_design(
    key: str | None, value: object, metrics: dict[str, float]
) -> None:
    cfg = Config()
    if key is not None:
        *path, last = key.split(".")
        node: object = cfg
        for part in path:
            node = getattr(node, part)
        setattr(node, last, value)
    assert logprob_diff_warning({"rollout/logprob_diff": 0.5, **metrics}, cfg) is None
