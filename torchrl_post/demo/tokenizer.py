"""A character-level tokenizer with a chat template, saved as an HF fast tokenizer.

Every printable ASCII character is one token; the chat markers are special tokens. The result is a
`PreTrainedTokenizerFast` (a `tokenizer.json`), so transformers and vLLM load it from disk with no hub.
"""

from __future__ import annotations

import string

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD, EOS, IM_START, IM_END = "<|pad|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [PAD, EOS, IM_START, IM_END]

# ChatML, as Qwen2 uses it; the assistant turn ends with <|im_end|>, which is also the EOS the
# generation config stops on.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def build_char_tokenizer(vocab_size: int = 128) -> PreTrainedTokenizerFast:
    """Build the tokenizer; `vocab_size` pads the vocabulary so the model's embedding matches."""
    chars = sorted(set(string.printable) - set("\x0b\x0c\r"))
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + chars)}
    if len(vocab) > vocab_size:
        raise ValueError(f"vocab_size={vocab_size} is too small for {len(vocab)} tokens")
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=PAD))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    core.add_special_tokens(SPECIAL_TOKENS)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD,
        eos_token=IM_END,
        bos_token=None,
        unk_token=PAD,
        additional_special_tokens=[EOS, IM_START],
    )
    tok.chat_template = CHAT_TEMPLATE
    tok.model_max_length = 512
    return tok
