"""Tests of torchrl_post/engines/base.py: collate's padding, masks, positions and groups; SamplingParams' seeds."""

from __future__ import annotations

import pytest
import torch

from tests.unit.batch_helpers import _two_prompt_batch
from torchrl_post.engines.base import SamplingParams
from torchrl_post.engines.batch import collate
from torchrl_post.types import TERMINATIONS, Generation, PromptBatch

PAD = 0


def _batch():
    prompts = PromptBatch(
        prompt_ids=[[11, 12, 13], [21]],
        answers=["a0", "a1"],
        data_sources=["src0", "src1"],
        extra_infos=[{"i": 0}, {"i": 1}],
        uids=[5, 9],
    )
    gen = Generation(
        response_ids=[[31, 32], [41], [51, 52, 53], []],
        logprobs=[[-0.1, -0.2], [-0.4], [-0.5, -0.6, -0.7], []],
        finish_reasons=["stop", "stop", "length", "stop"],
    )
    return prompts, gen


def test_collate_tensors():
    prompts, gen = _batch()
    b = collate(prompts, gen, n=2, pad_id=PAD)
    # P = 3, R = 3
    expected_ids = torch.tensor(
        [
            [11, 12, 13, 31, 32, 0],
            [11, 12, 13, 41, 0, 0],
            [0, 0, 21, 51, 52, 53],
            [0, 0, 21, 0, 0, 0],
        ]
    )
    expected_attn = torch.tensor(
        [
            [1, 1, 1, 1, 1, 0],
            [1, 1, 1, 1, 0, 0],
            [0, 0, 1, 1, 1, 1],
            [0, 0, 1, 0, 0, 0],
        ]
    )
    # positions count attended tokens from 0; left padding sits at 0, right padding repeats the last position
    expected_pos = torch.tensor(
        [
            [0, 1, 2, 3, 4, 4],
            [0, 1, 2, 3, 3, 3],
            [0, 0, 0, 1, 2, 3],
            [0, 0, 0, 0, 0, 0],
        ]
    )
    expected_resp_mask = torch.tensor(
        [
            [1.0, 1.0, 0.0],
            [1.0, 0.0, 0.0],
            [1.0, 1.0, 1.0],
            [0.0, 0.0, 0.0],
        ]
    )
    expected_lp = torch.tensor(
        [
            [-0.1, -0.2, 0.0],
            [-0.4, 0.0, 0.0],
            [-0.5, -0.6, -0.7],
            [0.0, 0.0, 0.0],
        ]
    )
    assert torch.equal(b.input_ids, expected_ids)
    assert b.input_ids.dtype == torch.long
    assert torch.equal(b.attention_mask, expected_attn)
    assert torch.equal(b.position_ids, expected_pos)
    assert torch.equal(b.response_mask, expected_resp_mask)
    assert b.response_mask.dtype == torch.float32
    torch.testing.assert_close(b.rollout_log_probs, expected_lp)
    assert b.rollout_log_probs.dtype == torch.float32
    assert torch.equal(b.responses, expected_ids[:, 3:])
    assert b.response_width == 3
    assert len(b) == 4


def test_collate_groups_terminations_and_weights():
    prompts, gen = _batch()
    b = collate(prompts, gen, n=2, pad_id=PAD)
    assert b.group_ids.tolist() == [5, 5, 9, 9]
    assert b.group_ids.dtype == torch.long
    assert b.termination_names == ["stop", "stop", "length", "stop"]
    assert b.weights.tolist() == [1.0] * 4
    assert torch.equal(b.loss_mask, b.response_mask)  # single turn: every response token is trained on
    assert b.scores is None and b.advantages is None  # later stages fill these in


def test_collate_pad_id_and_all_empty_responses():
    prompts = PromptBatch([[7, 8], [9]], ["x", "y"], ["s", "s"], [{}, {}], [0, 1])
    gen = Generation([[], []], [[], []], ["stop", "stop"])
    b = collate(prompts, gen, n=1, pad_id=99)
    # response width is at least 1 so the tensors keep a response column
    assert torch.equal(b.input_ids, torch.tensor([[7, 8, 99], [99, 9, 99]]))
    assert torch.equal(b.attention_mask, torch.tensor([[1, 1, 0], [0, 1, 0]]))
    assert torch.equal(b.response_mask, torch.zeros(2, 1))
    assert b.group_ids.tolist() == [0, 1]


def test_collate_rejects_wrong_sample_count():
    prompts = PromptBatch([[7, 8], [9]], ["x", "y"], ["s", "s"], [{}, {}], [0, 1])
    gen = Generation([[1], [2], [3]], [[0.0], [0.0], [0.0]], ["stop"] * 3)
    with pytest.raises(AssertionError):
        collate(prompts, gen, n=2, pad_id=0)


def test_collate_layout_hand_computed():
    b = _two_prompt_batch()
    # P = 3 (longest prompt), R = 4 (longest response)
    assert len(b) == 4 and b.prompt_width == 3 and b.response_width == 4
    assert b.input_ids.shape == (4, 7) and b.loss_mask.shape == (4, 4) and b.rollout_log_probs.shape == (4, 4)
    assert b.input_ids.tolist() == [
        [5, 6, 7, 11, 12, 99, 99],
        [5, 6, 7, 13, 14, 15, 16],
        [99, 99, 8, 99, 99, 99, 99],
        [99, 99, 8, 17, 99, 99, 99],
    ]
    assert b.attention_mask.tolist() == [
        [1, 1, 1, 1, 1, 0, 0],
        [1, 1, 1, 1, 1, 1, 1],
        [0, 0, 1, 0, 0, 0, 0],
        [0, 0, 1, 1, 0, 0, 0],
    ]
    # positions count the real tokens from 0: left padding is 0, right padding repeats the last position
    assert b.position_ids.tolist() == [
        [0, 1, 2, 3, 4, 4, 4],
        [0, 1, 2, 3, 4, 5, 6],
        [0, 0, 0, 0, 0, 0, 0],
        [0, 0, 0, 1, 1, 1, 1],
    ]
    assert b.input_ids.dtype == b.attention_mask.dtype == b.position_ids.dtype == torch.long
    expected_resp = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0], [1, 0, 0, 0]], dtype=torch.float32)
    assert b.loss_mask.dtype == torch.float32
    assert torch.equal(b.loss_mask, expected_resp)
    assert torch.equal(b.response_mask, expected_resp)  # loss mask == the response attention
    assert torch.equal(b.responses, b.input_ids[:, 3:])
    assert torch.equal(
        b.rollout_log_probs,
        torch.tensor([[-0.5, -0.25, 0, 0], [-1.0, -2.0, -3.0, -4.0], [0, 0, 0, 0], [-0.125, 0, 0, 0]]),
    )
    assert b.group_ids.tolist() == [3, 3, 4, 4] and b.group_ids.dtype == torch.long
    assert b.termination.tolist() == [TERMINATIONS.index(x) for x in ("stop", "length", "stop", "stop")]
    assert b.termination_names == ["stop", "length", "stop", "stop"]
    assert torch.equal(b.weights, torch.ones(4))
    assert torch.equal(b.train_mask, expected_resp)
    assert b.scores is None and b.advantages is None and b.old_log_probs is None and b.reward_extra == {}


def test_sampling_params_prompt_seed_depends_on_uid_only():
    p = SamplingParams(n=2, temperature=1.0, top_p=1.0, top_k=-1, max_tokens=8, seed=3)
    q = SamplingParams(n=4, temperature=0.5, top_p=0.9, top_k=5, max_tokens=4, seed=3)
    assert p.prompt_seed(7) == q.prompt_seed(7) == (3 * 1_000_003 + 7) % (2**31 - 1)
    assert p.prompt_seed(7) != p.prompt_seed(8)
    assert 0 <= p.prompt_seed(10**12) < 2**31 - 1


def test_engine_memory_fraction_leaves_the_trainer_its_optimizer_state() -> None:
    from torchrl_post.config.errors import ConfigError
    from torchrl_post.engines.base import GiB, engine_memory_fraction

    # an 80 GiB card, 60 GiB free after the trainer's shards, 12 GiB of AdamW moments still to come:
    # 0.9 x (60 - 12) / 80 = 0.54 of the card
    assert engine_memory_fraction(60 * GiB, 80 * GiB, 12 * GiB) == pytest.approx(0.54)
    assert engine_memory_fraction(60 * GiB, 80 * GiB, 0) == pytest.approx(0.675)
    with pytest.raises(ConfigError, match="actor.fsdp.optimizer_offload=true"):
        engine_memory_fraction(10 * GiB, 80 * GiB, 8 * GiB)  # 2 GiB left: under 5% of the card
