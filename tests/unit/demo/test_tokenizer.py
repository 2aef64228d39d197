"""The demo tokenizer survives save_pretrained + AutoTokenizer (as vLLM loads it) with identical ids."""

import pytest
import transformers

from torchrl_post.demo.tokenizer import CHAT_TEMPLATE, IM_END, PAD, build_char_tokenizer

MESSAGES = [
    {"role": "system", "content": "Answer  with one number.\tNo words."},
    {"role": "user", "content": "What is 3 + 4?\nThink, then answer:  "},
]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    tok = build_char_tokenizer()
    d = tmp_path_factory.mktemp("demo_model")
    transformers.Qwen2Config(
        vocab_size=128,
        hidden_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=64,
    ).save_pretrained(d)
    tok.save_pretrained(d)
    return tok, transformers.AutoTokenizer.from_pretrained(d), d


def _chat_ids(tok) -> list[int]:
    return list(tok.apply_chat_template(MESSAGES, tokenize=True, add_generation_prompt=True)["input_ids"])


def test_reloaded_tokenizer_gives_the_same_ids(saved):
    tok, loaded, d = saved
    assert (d / "config.json").exists()
    ids = _chat_ids(tok)
    assert _chat_ids(loaded) == ids
    text = tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert "\t" in text and "\n" in text and "  " in text
    assert loaded(text, add_special_tokens=False)["input_ids"] == ids
    assert loaded.decode(ids) == text
    assert tok.decode(ids) == text
    assert all(0 <= i < 128 for i in ids)


def test_every_character_is_one_token(saved):
    tok, loaded, _ = saved
    text = "".join(chr(c) for c in range(32, 127)) + "\t\n"
    ids = loaded(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text)
    assert ids == tok(text, add_special_tokens=False)["input_ids"]
    assert len(set(ids)) == len(text)
    assert loaded.decode(ids) == text
    assert max(ids) < 128


def test_special_tokens_survive_the_round_trip(saved):
    tok, loaded, _ = saved
    assert loaded.eos_token == tok.eos_token == IM_END
    assert loaded.pad_token == tok.pad_token == PAD
    assert loaded.eos_token_id == tok.eos_token_id
    assert loaded.pad_token_id == tok.pad_token_id
    assert loaded.chat_template == CHAT_TEMPLATE
    # chat markers are single tokens
    assert len(loaded("<|im_start|>", add_special_tokens=False)["input_ids"]) == 1
    assert loaded("<|im_end|>", add_special_tokens=False)["input_ids"] == [loaded.eos_token_id]


def test_vocab_size_check():
    with pytest.raises(ValueError):
        build_char_tokenizer(vocab_size=50)
