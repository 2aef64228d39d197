"""The demo reward model: it loads as HF loads a reward model, with its own tokenizer (every number 0-99 one token,
ChatML like the policy's), ranks the correct answer to a held-out sum above its near misses and other wrong ones,
reports its accuracies, and is built the same way twice (sampling and training steps are reproducible)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

from torchrl_post.demo import reward_model as rm
from torchrl_post.reward.builtin import arithmetic
from torchrl_post.reward.model_inputs import reward_model_ids


@pytest.fixture(scope="module")
def loaded(demo_reward_model: Path) -> tuple:
    """The built reward model and its tokenizer, loaded as the trainer loads them."""
    model = AutoModelForSequenceClassification.from_pretrained(demo_reward_model).eval()
    return model, AutoTokenizer.from_pretrained(demo_reward_model)


def _rows(data: Path, split: str = "val") -> list[dict]:
    return [json.loads(line) for line in (data / f"{split}.jsonl").read_text().splitlines()]


def _scores(model, tok, rows: list[tuple[str, str]]) -> torch.Tensor:
    ids = [reward_model_ids(tok, [{"role": "user", "content": p}], r, 64).ids for p, r in rows]
    width = max(map(len, ids))
    batch = torch.tensor([i + [tok.pad_token_id] * (width - len(i)) for i in ids])  # right-padded, as a trainer may
    with torch.no_grad():
        return model(input_ids=batch, attention_mask=(batch != tok.pad_token_id).long()).logits[:, 0]


def _accuracy(model, tok, pairs: list[tuple[str, str, str]]) -> float:
    chosen = _scores(model, tok, [(p, c) for p, c, _ in pairs])
    rejected = _scores(model, tok, [(p, w) for p, _, w in pairs])
    return (chosen > rejected).float().mean().item()


def test_it_loads_as_a_one_label_classifier_that_finds_the_last_token(loaded: tuple) -> None:
    model, tok = loaded
    assert type(model).__name__ == "Qwen2ForSequenceClassification"
    assert model.config.num_labels == 1 and model.config.pad_token_id == tok.pad_token_id
    assert len(tok) <= model.config.vocab_size
    rows = [("What is 3+4?", "7"), ("Add 9 and 9.", "=18"), ("Sum 1 and 2.", "")]
    batched = _scores(model, tok, rows)
    alone = torch.cat([_scores(model, tok, [row]) for row in rows])
    torch.testing.assert_close(batched, alone, atol=1e-5, rtol=0)  # padding does not move the scored token


def test_its_tokenizer_has_every_number_as_one_token_and_the_policys_chatml(
    loaded: tuple, demo: tuple[Path, Path]
) -> None:
    _, tok = loaded
    for n in range(100):
        assert len(tok(str(n), add_special_tokens=False)["input_ids"]) == 1, n
    pieces = {
        r: tok.convert_ids_to_tokens(tok(r, add_special_tokens=False)["input_ids"]) for r in ("=13", "1313", "7.")
    }
    assert pieces == {"=13": ["=", "13"], "1313": ["13", "13"], "7.": ["7", "."]}
    policy_tok = AutoTokenizer.from_pretrained(demo[0])
    conversation = [{"role": "user", "content": "Sum 7 and 6."}, {"role": "assistant", "content": "13"}]
    text = tok.apply_chat_template(conversation, tokenize=False)
    assert text == policy_tok.apply_chat_template(conversation, tokenize=False)
    ids = reward_model_ids(tok, conversation[:1], "13", rm.MAX_LENGTH).ids
    assert tok.convert_ids_to_tokens(ids[-3:]) == ["13", "<|im_end|>", "Ċ"] and tok.decode(ids) == text


def test_it_ranks_the_answer_above_its_near_misses_on_held_out_prompts(loaded: tuple, demo: tuple[Path, Path]) -> None:
    """n against n+1 and |n-1|: the wrong answers the policy writes most, and the hardest to tell from the sum."""
    model, tok = loaded
    pairs = rm.near_miss_pairs(_rows(demo[1]))
    accuracy = _accuracy(model, tok, pairs)
    assert accuracy >= 0.95, f"near-miss accuracy {accuracy:.3f} on {len(pairs)} held-out pairs"


def test_it_ranks_the_answer_above_malformed_ones_on_held_out_prompts(loaded: tuple, demo: tuple[Path, Path]) -> None:
    model, tok = loaded
    pairs = []
    for r in _rows(demo[1])[:40]:
        a = r["answer"]
        pairs += [(r["prompt"], a, w) for w in ("=" + a, "", a * 2, a + ".", "x" + a, str(int(a) + 10))]
    assert all(arithmetic("arithmetic", c, c) and not arithmetic("arithmetic", w, c) for _, c, w in pairs)
    accuracy = _accuracy(model, tok, pairs)
    assert accuracy >= 0.95, f"pairwise accuracy {accuracy:.3f} on {len(pairs)} held-out pairs"


def test_the_build_reports_its_accuracies_and_is_cached(demo_reward_model: Path, demo: tuple[Path, Path]) -> None:
    info = json.loads((demo_reward_model / rm.MARKER).read_text())
    assert info["val_near_miss_accuracy"] >= 0.95 and info["val_sample_pair_accuracy"] >= 0.95, info
    assert info["val_sample_pairs"] > 500  # enough of the policy's (correct, wrong) pairs to mean something
    assert rm.build_reward_model(demo_reward_model, *demo) == info  # the second call finds it


def test_sampling_and_training_steps_are_reproducible(demo: tuple[Path, Path]) -> None:
    """What makes two builds equal (a whole build takes two minutes): the policy's samples and the training steps."""
    policy_tok = AutoTokenizer.from_pretrained(demo[0])
    policy = AutoModelForCausalLM.from_pretrained(demo[0], dtype=torch.float32).eval()
    rows = _rows(demo[1], "train")[:8]
    samples = rm.sample_responses(policy, policy_tok, [r["prompt"] for r in rows], 4, seed=0)
    assert samples == rm.sample_responses(policy, policy_tok, [r["prompt"] for r in rows], 4, seed=0)
    assert samples != rm.sample_responses(policy, policy_tok, [r["prompt"] for r in rows], 4, seed=1)
    groups = [
        (r["prompt"], r["answer"], rm.rejected_responses(r, s, random.Random(0)))
        for r, s in zip(rows, samples, strict=True)
    ]
    tok = rm.reward_tokenizer()
    weights = []
    for _ in range(2):
        model = rm.fresh_reward_model(tok, seed=0)
        rm.train(model, tok, groups, seed=0, steps=3)
        weights.append(model.state_dict())
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    assert not torch.equal(weights[0]["score.weight"], rm.fresh_reward_model(tok, seed=0).score.weight)


def test_the_prompt_cache_scores_what_whole_rows_score() -> None:
    """Training runs each prompt once and its responses on the prompt's cached keys and values (`_pair_scores`);
    the trainer runs whole rows."""
    tok = rm.reward_tokenizer()
    model = rm.fresh_reward_model(tok, seed=0).double()
    prompts, responses = ["Sum 7 and 6.", "What is 3+4?"], ["13", "", "=13", "1313", "7 a"]
    prefix = [rm._encode(tok, p) for p in prompts]
    rest = [rm.encode(tok, p, r)[len(x) :] for p, x in zip(prompts, prefix, strict=True) for r in responses]
    with torch.no_grad():
        cached, *_ = rm._pair_scores(model, tok, prefix, rest)
        whole = torch.cat(
            [model(input_ids=torch.tensor([rm.encode(tok, p, r)])).logits[:, 0] for p in prompts for r in responses]
        )
    torch.testing.assert_close(cached, whole, atol=1e-10, rtol=0)
