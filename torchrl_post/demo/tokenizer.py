"""A character-level tokenizer with a chat template, saved as a Qwen2 tokenizer.

It is Qwen2's byte-level BPE with no merges: every ASCII character is one token, and the chat markers
are special tokens. Being a real `Qwen2Tokenizer` matters: for a `qwen2` model directory, transformers'
AutoTokenizer (and so vLLM) always rebuilds the tokenizer as Qwen2Tokenizer, so any other tokenizer
class would tokenize differently after a save and load.
"""

from __future__ import annotations

from transformers import Qwen2Tokenizer

PAD, EOS, IM_START, IM_END = "<|pad|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [PAD, EOS, IM_START, IM_END]

# ChatML, as Qwen2 uses it; the assistant turn ends with <|im_end|>, which is also the EOS.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _byte_level(b: int) -> str:
    """GPT-2 byte-level alphabet: printable bytes stand for themselves, others shift past 255."""
    printable = set(range(ord("!"), ord("~") + 1)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    if b in printable:
        return chr(b)
    return chr(256 + sorted(set(range(256)) - printable).index(b))


def build_char_tokenizer(vocab_size: int = 128, extra_special: list[str] | None = None) -> Qwen2Tokenizer:
    """The tokenizer; ids fit below `vocab_size` (the model's embedding size).

    `extra_special`: more special tokens (e.g. `<tool_call>`, `</tool_call>`), each one token, with ids after
    the rest of the vocabulary so that every other token keeps its id.
    """
    chars = [_byte_level(b) for b in [9, 10, *range(32, 127)]]
    extra = list(extra_special or [])
    if len(set(extra)) != len(extra) or set(extra) & set(SPECIAL_TOKENS + chars):
        raise ValueError(f"extra_special tokens must be new and distinct: {extra}")
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + chars + extra)}
    if len(vocab) > vocab_size:
        raise ValueError(f"vocab_size={vocab_size} is too small for {len(vocab)} tokens")
    tok = Qwen2Tokenizer(
        vocab=vocab,
        merges=[],
        unk_token=None,  # type: ignore[arg-type]  # BPE without unk drops unknown bytes
        eos_token=IM_END,
        pad_token=PAD,
        additional_special_tokens=[EOS, IM_START, *extra],
    )
    tok.chat_template = CHAT_TEMPLATE
    tok.model_max_length = 512
    return tok
