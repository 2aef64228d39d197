"""Checks on the files a run reads and writes, done before any model loads: one line naming the key and the fix.

Faults in a model directory otherwise surface only after the actor and the engine have loaded, as tracebacks
(config.json that is not JSON, a truncated safetensors shard) or not at all (no tokenizer files: transformers
builds a one-token tokenizer and every prompt encodes to nothing). The order `Run.prepare` calls them in:

    model_config = check_model_dir(cfg.model.path, "model.path", cfg.model.trust_remote_code)
    check_length_budget(cfg, model_config)
    check_sequence_parallel(cfg, model_config)
    check_experts(cfg, model_config)
    check_run_dir(cfg.trainer.default_local_dir)
    check_resume(cfg)                           # the resume path; the checkpoint against rollout.partial_rollout
    check_lora_targets(cfg, model_config)       # model.lora_rank > 0
    check_moe_lora(cfg, model_config)           # model.lora_rank > 0
    check_tool_parser(cfg)                      # agent.env set
    ... load the tokenizer (or processor) ...
    check_tokenizer(tokenizer, model_config, cfg.model.path)
    check_critic(cfg, tokenizer)
    check_reward_model(cfg)                     # reward_model.enable: a sequence classifier; returns its tokenizer
    check_judge(cfg)                            # a co-hosted judge: its model directory

(`preflight(cfg)` runs the first nine; the dry run, `preflight(cfg, dry_run=True)`, `check_critic` and
`check_reward_model`, the same but for the weights and the tool parser.) None of them loads a tensor; a safetensors file is checked by its
header alone: 8 bytes of header length, the JSON header, then the data its offsets describe, and LoRA's
target modules against the architecture built on the meta device from config.json.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import tempfile
from pathlib import Path
from typing import Any

from torchrl_post.checkpoint.dcp import check_resumable, resumed_checkpoint
from torchrl_post.config.errors import ConfigError, one_line
from torchrl_post.config.names import check_lora_targets, check_tool_parser
from torchrl_post.config.schema import SELF_JUDGE, Config
from torchrl_post.engines.base import VLLM_CPU_HEAD_SIZES, unsupported_head_size
from torchrl_post.workers.moe import expert_count

log = logging.getLogger(__name__)

MODEL_HINT = (
    "point it at a local HF model (the demo's is built by `make demo`, the math agent's by `make math-agent-model`, "
    "the VLM's by `make vlm-model`)"
)
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "tokenizer.model",
    "spiece.model",
    "sentencepiece.bpe.model",
)
"""Any one of these means a tokenizer was saved (tokenizer_config.json alone is caught by the test encode)."""
TEST_TEXT = "hello world 123"
MAX_HEADER = 100 * 1024 * 1024  # the safetensors format's own limit on the JSON header


def check_model_dir(path: str, key: str = "model.path", trust_remote_code: bool = False, weights: bool = True) -> Any:
    """A loadable HF model directory: config.json (JSON that AutoConfig reads) and complete safetensors
    weights (every file's length matches its header; an index names only files that exist; `weights`=False, the
    dry run's, plans for a model whose config.json alone is there). Returns the model's config (transformers'
    PretrainedConfig)."""
    if not isinstance(path, str) or not path.strip():
        raise ConfigError(f"{key} is empty; {MODEL_HINT}")
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"{key}={path!r} does not exist; {MODEL_HINT}")
    if not p.is_dir():
        raise ConfigError(f"{key}={path!r} is a file, not a model directory; {MODEL_HINT}")
    config_file = p / "config.json"
    if not config_file.is_file():
        raise ConfigError(f"{key}={path!r} is not a model directory (no config.json); {MODEL_HINT}")
    try:
        raw = json.loads(config_file.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise ConfigError(f"{key}={path!r}: {config_file} is not UTF-8 text ({e.reason} at byte {e.start})") from e
    except json.JSONDecodeError as e:
        raise ConfigError(
            f"{key}={path!r}: {config_file} is not valid JSON ({e.msg} at line {e.lineno} column {e.colno}); "
            "fix or re-download it"
        ) from e
    if not isinstance(raw, dict):
        raise ConfigError(f"{key}={path!r}: {config_file} must hold a JSON object, got {type(raw).__name__}")
    if weights:
        _check_weights(p, key, path)
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(str(p), trust_remote_code=trust_remote_code)
    except Exception as e:  # transformers raises ValueError, KeyError, OSError... for configs it cannot read
        raise ConfigError(f"{key}={path!r}: transformers cannot load its config.json ({one_line(e)})") from e


def _check_weights(p: Path, key: str, path: str) -> None:
    files = sorted(p.glob("*.safetensors"))
    if not files:
        raise ConfigError(f"{key}={path!r} has no *.safetensors weights; save the model with safe_serialization")
    for index in sorted(p.glob("*.safetensors.index.json")):
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map")
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError) as e:
            raise ConfigError(f"{key}={path!r}: {index.name} is not a valid index ({one_line(e)})") from e
        if not isinstance(weight_map, dict):
            raise ConfigError(f"{key}={path!r}: {index.name} has no weight_map object")
        missing = sorted({str(f) for f in weight_map.values()} - {f.name for f in files})
        if missing:
            raise ConfigError(
                f"{key}={path!r}: {index.name} names {len(missing)} weight file(s) that are not there "
                f"({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}); the download is incomplete"
            )
    for f in files:
        _check_safetensors(f, key, path)


def _check_safetensors(f: Path, key: str, path: str) -> None:
    """Header readable and the file exactly as long as the data its offsets describe (no tensor is read)."""
    where = f"{key}={path!r}: {f.name}"
    fix = "re-save or re-download it"
    try:
        size = f.stat().st_size
        with f.open("rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                raise ConfigError(f"{where} is truncated ({size} bytes, shorter than a safetensors header); {fix}")
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER or 8 + n > size:
                raise ConfigError(
                    f"{where} is truncated or not a safetensors file (header of {n} bytes, file of {size}); {fix}"
                )
            header = json.loads(fh.read(n).decode("utf-8"))
    except OSError as e:
        raise ConfigError(f"{where} cannot be read ({one_line(e)}); {fix}") from e
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{where} has a corrupt header ({one_line(e)}); {fix}") from e
    if not isinstance(header, dict):
        raise ConfigError(f"{where} has a corrupt header (not a JSON object); {fix}")
    end = 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(isinstance(o, int) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1]
        ):
            raise ConfigError(f"{where} has a corrupt header (tensor {name!r} has no valid data_offsets); {fix}")
        end = max(end, offsets[1])
    expected = 8 + n + end
    if size < expected:
        raise ConfigError(f"{where} is truncated: {size} bytes, its header describes {expected}; {fix}")
    if size > expected:
        raise ConfigError(f"{where} has {size - expected} bytes past the data its header describes; {fix}")


def _text_attr(model_config: Any, name: str) -> Any:
    """`name` of the language model: top level, else the text config of a vision-language model."""
    value = getattr(model_config, name, None)
    if value is None:
        text = getattr(model_config, "text_config", None)
        if text is None and hasattr(model_config, "get_text_config"):
            text = model_config.get_text_config()
        value = getattr(text, name, None) if text is not None else None
    return value


def _positions(model_config: Any) -> int | None:
    """Positions the model was built for (max_position_embeddings), stretched by linear/dynamic/yarn RoPE scaling."""
    n = _text_attr(model_config, "max_position_embeddings")
    if not isinstance(n, int) or n <= 0:
        return None
    rope = _text_attr(model_config, "rope_scaling") or _text_attr(model_config, "rope_parameters")
    if isinstance(rope, dict):
        kind, factor = rope.get("rope_type", rope.get("type")), rope.get("factor")
        if kind in ("linear", "dynamic", "yarn") and isinstance(factor, (int, float)) and factor > 1:
            base = rope.get("original_max_position_embeddings") if kind == "yarn" else None
            n = int((base if isinstance(base, int) else n) * factor)
    return n


def check_length_budget(cfg: Config, model_config: Any, key: str = "model.path") -> None:
    """data.max_prompt_length + data.max_response_length (the engine's max_model_len) within the model's positions."""
    limit = _positions(model_config)
    d = cfg.data
    total = d.max_prompt_length + d.max_response_length
    if limit is not None and total > limit:
        path = cfg.model.path if key == "model.path" else cfg.critic.model.path
        raise ConfigError(
            f"data.max_prompt_length={d.max_prompt_length} + data.max_response_length={d.max_response_length} = "
            f"{total} tokens, over the {limit} positions of {key}={path!r} (max_position_embeddings); "
            f"lower them to sum to at most {limit}"
        )


def check_sequence_parallel(cfg: Config, model_config: Any, key: str = "model.path") -> None:
    """model.ulysses_sequence_parallel_size against the model: a text model whose attention heads it divides."""
    sp = cfg.model.ulysses_sequence_parallel_size
    if sp == 1:
        return
    name = f"model.ulysses_sequence_parallel_size={sp}"
    path = cfg.model.path if key == "model.path" else cfg.critic.model.path
    if getattr(model_config, "vision_config", None) is not None:
        raise ConfigError(
            f"{name}: {key}={path!r} is a vision-language model, whose image features are not split by sequence "
            "here; set it to 1"
        )
    heads = _text_attr(model_config, "num_attention_heads")
    if isinstance(heads, int) and heads % sp:
        raise ConfigError(
            f"{name} does not divide the {heads} attention heads of {key}={path!r}; use a divisor of {heads}"
        )
    impl = getattr(model_config, "_attn_implementation", None) or "sdpa"
    if impl not in ("sdpa", "eager"):
        raise ConfigError(f"{name} runs sdpa or eager attention; {key}={path!r} asks for {impl}")


def check_experts(cfg: Config, model_config: Any) -> None:
    """actor.router_replay against the model: a text mixture-of-experts model (the engine records the experts of
    a text prompt's tokens; a vision model's placeholders are collapsed there, so rows would not line up); and
    expert parallelism against the model's experts (a MoE model whose expert count the ep size divides)."""
    experts = expert_count(model_config)
    for key, ep in (("actor", cfg.actor.fsdp.expert_parallel_size), ("critic", cfg.critic.fsdp.expert_parallel_size)):
        if ep > 1 and not experts:
            raise ConfigError(
                f"{key}.fsdp.expert_parallel_size={ep}: model.path={cfg.model.path!r} has no mixture-of-experts "
                "layers (no num_experts in its config.json); set it to 1"
            )
        if ep > 1 and experts % ep:
            raise ConfigError(
                f"{key}.fsdp.expert_parallel_size={ep} does not divide the {experts} experts of model.path="
                f"{cfg.model.path!r}; set it to a divisor of {experts}"
            )
    if not cfg.actor.router_replay:
        return
    text = model_config.get_text_config() if hasattr(model_config, "get_text_config") else model_config
    if not (getattr(text, "num_experts", 0) or 0):
        raise ConfigError(
            f"actor.router_replay=true: model.path={cfg.model.path!r} has no mixture-of-experts layers "
            "(no num_experts in its config.json); set it to false"
        )
    if getattr(model_config, "vision_config", None) is not None:
        raise ConfigError(
            f"actor.router_replay=true: model.path={cfg.model.path!r} is a vision-language model, whose image "
            "tokens the engine records collapsed; set it to false"
        )


def check_moe_lora(cfg: Config, model_config: Any) -> None:
    """A LoRA adapter on a mixture-of-experts model.path covers its fused experts (PEFT `target_parameters`,
    `workers/models.py: with_lora`): only the merged sync carries it to the engine (the adapter files hold 3-D
    expert adapters that vLLM loads only through its Triton MoE LoRA kernels, absent from the CPU build), and
    PEFT has no dropout on the experts' adapter."""
    experts = expert_count(model_config)
    if not experts:
        return
    moe = f"model.path={cfg.model.path!r} is a mixture-of-experts model ({experts} experts)"
    if cfg.rollout.lora_sync == "adapter":
        raise ConfigError(
            f"rollout.lora_sync=adapter: {moe}, whose fused-expert adapters the adapter sync cannot load into vLLM; "
            "use rollout.lora_sync=merged"
        )
    if cfg.model.lora_dropout > 0:
        raise ConfigError(
            f"model.lora_dropout={cfg.model.lora_dropout}: {moe}, and PEFT's LoRA on fused experts has no "
            "dropout; set model.lora_dropout=0"
        )


def check_tokenizer(tokenizer: Any, model_config: Any, path: str, key: str = "model.path") -> None:
    """Tokenizer files present, the vocabulary within the model's embedding, and a test text that encodes to
    several distinct tokens (a directory without tokenizer files gives a one-token tokenizer and empty prompts)."""
    p = Path(path)
    if p.is_dir() and not any((p / name).is_file() for name in TOKENIZER_FILES) and not any(p.glob("*.tiktoken")):
        raise ConfigError(
            f"{key}={path!r} has no tokenizer files ({', '.join(TOKENIZER_FILES[:3])}, ...); save the model's "
            "tokenizer into it (tokenizer.save_pretrained)"
        )
    vocab = _text_attr(model_config, "vocab_size")
    n = len(tokenizer)
    if isinstance(vocab, int) and n > vocab:
        raise ConfigError(
            f"{key}={path!r}: the tokenizer has {n} tokens but the model's vocab_size is {vocab}; ids past "
            f"{vocab - 1} have no embedding: use the model's own tokenizer"
        )
    try:
        ids = list(tokenizer(TEST_TEXT, add_special_tokens=False)["input_ids"])
    except Exception as e:  # a broken tokenizer may raise anything
        raise ConfigError(f"{key}={path!r}: the tokenizer fails to encode {TEST_TEXT!r} ({one_line(e)})") from e
    if len(set(ids)) <= 1:
        raise ConfigError(
            f"{key}={path!r}: the tokenizer encodes {TEST_TEXT!r} to {ids} (its vocabulary has {n} token(s)); "
            "its files are missing or broken: save the model's tokenizer into the directory"
        )
    if isinstance(vocab, int) and max(ids) >= vocab:
        raise ConfigError(
            f"{key}={path!r}: the tokenizer gives id {max(ids)} for {TEST_TEXT!r}, past the model's "
            f"vocab_size={vocab}: use the model's own tokenizer"
        )
    if getattr(tokenizer, "eos_token_id", None) is None:
        raise ConfigError(
            f"{key}={path!r}: the tokenizer has no eos_token, so generation cannot stop; "
            "set eos_token in tokenizer_config.json"
        )


def check_critic(cfg: Config, tokenizer: Any = None, used: bool = True, weights: bool = True) -> Any:
    """When a critic is `used` (the run plan has one), its critic.model.path (if set; else model.path) is a
    model directory within the length budget whose vocabulary covers the tokenizer (when given). Returns its
    config or None."""
    path = cfg.critic.model.path
    if not used or path is None:
        return None
    key = "critic.model.path"
    critic_config = check_model_dir(path, key, cfg.model.trust_remote_code, weights)
    check_length_budget(cfg, critic_config, key)
    check_sequence_parallel(cfg, critic_config, key)
    vocab = _text_attr(critic_config, "vocab_size")
    if tokenizer is not None and isinstance(vocab, int) and len(tokenizer) > vocab:
        raise ConfigError(
            f"{key}={path!r} has vocab_size={vocab}, fewer than the {len(tokenizer)} tokens of model.path's "
            "tokenizer: the critic must read the actor's token ids; use a critic of the same model family"
        )
    return critic_config


def check_teacher(cfg: Config, tokenizer: Any, used: bool = True, weights: bool = True) -> None:
    """When a distillation teacher is `used`: distillation.teacher.path is a causal LM's model directory whose
    tokenizer is the policy's (`tokenizer`): the teacher scores the student's token ids as they are."""
    if not used:
        return
    key, t = "distillation.teacher.path", cfg.distillation.teacher
    assert t.path is not None  # validate.py
    config = check_model_dir(t.path, key, t.trust_remote_code, weights)
    archs = list(getattr(config, "architectures", None) or [])
    if archs and not any(a.endswith("ForCausalLM") or a.endswith("ForConditionalGeneration") for a in archs):
        raise ConfigError(f"{key}={t.path!r} is a {archs[0]}; a teacher is a causal language model")
    from transformers import AutoTokenizer

    theirs = AutoTokenizer.from_pretrained(t.path, trust_remote_code=t.trust_remote_code)
    if theirs.get_vocab() != tokenizer.get_vocab():
        diff = len(set(theirs.get_vocab().items()) ^ set(tokenizer.get_vocab().items()))
        raise ConfigError(
            f"{key}={t.path!r} has another tokenizer than model.path ({diff} token ids differ): the teacher scores "
            "the student's token ids, so both must share one tokenizer; distil from a teacher of the same family"
        )
    n_teacher = getattr(config.get_text_config(), "vocab_size", None)
    if n_teacher is not None and n_teacher < len(tokenizer):
        raise ConfigError(f"{key}={t.path!r} has vocab_size={n_teacher}, fewer than the tokenizer's {len(tokenizer)}")
    d = cfg.distillation
    if d.loss_mode == "forward_kl_topk" and n_teacher is not None and d.topk > n_teacher:
        raise ConfigError(
            f"distillation.topk={d.topk} is more than the teacher's vocabulary ({n_teacher} tokens): "
            f"set distillation.topk to at most {n_teacher}"
        )


def check_reward_model(cfg: Config, used: bool = True, weights: bool = True) -> Any:
    """When a reward model is `used` (the plan has one): reward_model.model.path is a model directory of a
    sequence classifier with one label, with a tokenizer. Returns that tokenizer (None when not used)."""
    if not used:
        return None
    key, path = "reward_model.model.path", cfg.reward_model.model.path
    if path is None:
        raise ConfigError(
            f"reward_model.enable=true but {key} is not set; give a sequence-classification checkpoint "
            "(e.g. `make reward-model` builds outputs/demo_reward_model)"
        )
    trust = cfg.reward_model.model.trust_remote_code
    rm_config = check_model_dir(path, key, trust, weights)
    archs = list(getattr(rm_config, "architectures", None) or [])
    if archs and not any(a.endswith("ForSequenceClassification") for a in archs):
        raise ConfigError(
            f"{key}={path!r} is a {archs[0]}, not a sequence classifier: a reward model here is an "
            "AutoModelForSequenceClassification checkpoint with num_labels=1 (a *ForSequenceClassification head)"
        )
    if rm_config.num_labels != 1:
        raise ConfigError(
            f"{key}={path!r} has num_labels={rm_config.num_labels}; a reward model gives one score per sample "
            "(num_labels=1): give a reward model's checkpoint, not a classifier's"
        )
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust)
    check_tokenizer(tokenizer, rm_config, path, key)
    return tokenizer


def check_judge(cfg: Config, weights: bool = True, device_type: str = "cpu") -> None:
    """A co-hosted judge (reward.judge.enable, url null): reward.judge.model is a model directory with a tokenizer
    that its engine can run (vLLM on CPU: `VLLM_CPU_HEAD_SIZES`)."""
    judge = cfg.reward.judge
    if not judge.enable or judge.url is not None:
        return
    if judge.model == SELF_JUDGE:  # the policy itself: model.path, checked as the policy
        model_config = check_model_dir(cfg.model.path, "model.path", cfg.model.trust_remote_code, weights=False)
    else:
        model_config = check_model_dir(judge.model, "reward.judge.model", False, weights)
    engine = judge.engine or cfg.rollout.engine
    head = unsupported_head_size(model_config, engine, device_type)
    if head is not None:
        raise ConfigError(
            f"reward.judge.model={judge.model!r} has attention heads of {head}, which vLLM's CPU attention does not "
            f"run (it takes {', '.join(map(str, VLLM_CPU_HEAD_SIZES))}): set reward.judge.engine=hf"
        )


def check_run_dir(path: str, key: str = "trainer.default_local_dir") -> None:
    """The run directory is a directory we can create and write in (a file in its place, or a read-only parent,
    would otherwise fail at the first metrics line or checkpoint)."""
    if not isinstance(path, str) or not path.strip():
        raise ConfigError(f"{key} is empty; give the run directory (e.g. outputs/my_run)")
    p = Path(path)
    if p.is_symlink() and not p.exists():
        raise ConfigError(f"{key}={path!r} is a broken symbolic link; fix or remove it, or choose another directory")
    if p.exists() and not p.is_dir():
        raise ConfigError(f"{key}={path!r} is a file, not a directory; move it or choose another run directory")
    if p.is_dir():
        try:
            with tempfile.TemporaryFile(dir=p):
                pass
        except OSError as e:
            raise ConfigError(f"{key}={path!r} is not writable ({one_line(e)}); choose another run directory") from e
        return
    parent = p.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise ConfigError(f"{key}={path!r} cannot be created: {str(parent)!r} is a file; choose another run directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(
            f"{key}={path!r} cannot be created: {str(parent)!r} is not writable; choose another run directory"
        )


def check_resume_path(cfg: Config) -> None:
    """trainer.resume_mode=resume_path: trainer.resume_from_path is a complete checkpoint directory."""
    t = cfg.trainer
    if t.resume_mode != "resume_path":
        return
    key, path = "trainer.resume_from_path", t.resume_from_path
    if not path:
        raise ConfigError("trainer.resume_mode=resume_path needs trainer.resume_from_path=<checkpoints/global_step_N>")
    p = Path(path)
    if not p.exists():
        raise ConfigError(
            f"{key}={path!r} does not exist; give a checkpoint directory (<run>/checkpoints/global_step_N)"
        )
    if not p.is_dir():
        raise ConfigError(f"{key}={path!r} is a file; give a checkpoint directory (<run>/checkpoints/global_step_N)")
    if not (p / "trainer_state.json").is_file():
        found = {
            int(d.name.rsplit("_", 1)[1]): d
            for root in (p, p / "checkpoints")
            for d in root.glob("global_step_*")
            if d.name.rsplit("_", 1)[1].isdigit() and (d / "trainer_state.json").is_file()
        }
        hint = f"; the latest one under it is {str(found[max(found)])!r}" if found else ""
        raise ConfigError(
            f"{key}={path!r} is not a complete checkpoint (no trainer_state.json){hint}; "
            "give a <run>/checkpoints/global_step_N directory"
        )


def check_resume(cfg: Config) -> None:
    """trainer.resume_from_path, then the checkpoint the run would resume against this run's config (what
    `checkpoint.dcp.check_resumable` compares: rollout.partial_rollout), before anything loads or is written (the
    run directory's config.yaml included)."""
    check_resume_path(cfg)
    t = cfg.trainer
    path = resumed_checkpoint(Path(t.default_local_dir), t.resume_mode, t.resume_from_path)
    check_resumable(path, cfg.rollout.partial_rollout)


def preflight(cfg: Config, dry_run: bool = False) -> Any:
    """The checks that need neither tokenizer nor model weights, in order; returns model.path's config.

    The dry run (`dry_run`) makes the same checks, so that it refuses what the run would, except three that would
    stop it from planning before a download: it plans for a model.path that does not exist yet (returns None: the
    caller says so) or holds config.json alone (the weights are not checked), and it does not import vLLM for
    agent.tool_parser."""
    if dry_run and not Path(cfg.model.path).exists():
        model_config = None
    else:
        model_config = check_model_dir(cfg.model.path, "model.path", cfg.model.trust_remote_code, not dry_run)
    if model_config is not None:
        check_length_budget(cfg, model_config)
        check_sequence_parallel(cfg, model_config)
        check_experts(cfg, model_config)
    check_run_dir(cfg.trainer.default_local_dir)
    check_resume(cfg)
    if cfg.model.lora_rank > 0 and model_config is not None:
        check_lora_targets(cfg, model_config)
        check_moe_lora(cfg, model_config)
    if not dry_run:
        check_tool_parser(cfg)
    return model_config
