"""The demo reward model: it loads as HF loads a reward model, ranks the correct answer to a held-out sum above wrong
ones, reports its accuracies, and is built the same way twice (sampling and training steps are reproducible)."""

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
    model = AutoModelForSequenceClassification.from_pretrained(demo_reward_model).eval()
    return model, AutoTokenizer.from_pretrained(demo_reward_model)


def _val_pairs(data: Path) -> list[tuple[str, str, str]]:
    """Per validation prompt: the answer against its near misses, "=<answer>", empty and a doubled answer."""
    rows = [json.loads(line) for line in (data / "val.jsonl").read_text().splitlines()]
    pairs: list[tuple[str, str, str]] = []
    for r in rows[:40]:
        n = int(r["answer"])
        pairs += [(r["prompt"], r["answer"], w) for w in (str(n - 1), str(n + 1), "=" + r["answer"], "", r["answer"] * 2)]
    assert all(arithmetic("arithmetic", c, c) and not arithmetic("arithmetic", w, c) for _, c, w in pairs)
    return pairs


def _scores(model, tok, rows: list[tuple[str, str]]) -> torch.Tensor:
    ids = [reward_model_ids(tok, [{"role": "user", "content": p}], r, 64).ids for p, r in rows]
    width = max(map(len, ids))
    batch = torch.tensor([i + [tok.pad_token_id] * (width - len(i)) for i in ids])  # right-padded, as a trainer may
    with torch.no_grad():
        return model(input_ids=batch, attention_mask=(batch != tok.pad_token_id).long()).logits[:, 0]


def test_it_loads_as_a_one_label_classifier_that_finds_the_last_token(loaded: tuple) -> None:
    model, tok = loaded
    assert model.config.num_labels == 1 and model.config.pad_token_id == tok.pad_token_id
    rows = [("What is 3+4?", "7"), ("Add 9 and 9.", "=18"), ("Sum 1 and 2.", "")]
    batched = _scores(model, tok, rows)
    alone = torch.cat([_scores(model, tok, [row]) for row in rows])
    torch.testing.assert_close(batched, alone, atol=1e-5, rtol=0)  # padding does not move the scored token


def test_it_ranks_the_correct_answer_first_on_held_out_prompts(loaded: tuple, demo: tuple[Path, Path]) -> None:
    model, tok = loaded
    pairs = _val_pairs(demo[1])
    chosen = _scores(model, tok, [(p, c) for p, c, _ in pairs])
    rejected = _scores(model, tok, [(p, w) for p, _, w in pairs])
    accuracy = (chosen > rejected).float().mean().item()
    assert accuracy >= 0.9, f"pairwise accuracy {accuracy:.3f} on {len(pairs)} held-out pairs"


def test_the_build_reports_its_accuracies_and_is_cached(demo_reward_model: Path, demo: tuple[Path, Path]) -> None:
    info = json.loads((demo_reward_model / rm.MARKER).read_text())
    assert info["val_pair_accuracy"] >= 0.9 and info["val_sample_pair_accuracy"] >= 0.9, info
    assert info["val_sample_pairs"] > 500  # enough of the policy's (correct, wrong) pairs to mean something
    assert rm.build_reward_model(demo_reward_model, *demo) == info  # the second call finds it


def test_sampling_and_training_steps_are_reproducible(demo: tuple[Path, Path]) -> None:
    """What makes two builds equal (a whole build takes a minute): the policy's samples and the training steps."""
    tok = AutoTokenizer.from_pretrained(demo[0])
    policy = AutoModelForCausalLM.from_pretrained(demo[0], dtype=torch.float32).eval()
    rows = [json.loads(line) for line in (demo[1] / "train.jsonl").read_text().splitlines()][:8]
    samples = rm.sample_responses(policy, tok, [r["prompt"] for r in rows], 4, seed=0)
    assert samples == rm.sample_responses(policy, tok, [r["prompt"] for r in rows], 4, seed=0)
    assert samples != rm.sample_responses(policy, tok, [r["prompt"] for r in rows], 4, seed=1)
    groups = [(r["prompt"], r["answer"], rm.rejected_responses(r, s, random.Random(0))) for r, s in zip(rows, samples)]
    weights = []
    for _ in range(2):
        model = rm.reward_model_from(policy, tok, seed=0)
        rm.train(model, policy, tok, groups, seed=0, steps=3)
        weights.append(model.state_dict())
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    assert not torch.equal(weights[0]["score.weight"], rm.reward_model_from(policy, tok, seed=0).score.weight)
