"""Hand-built prompts and a collated two-prompt batch, shared by the types and rollout tests."""

from __future__ import annotations

from torchrl_post.engines.batch import collate
from torchrl_post.types import Batch, Generation, PromptBatch

PAD = 99  # not 0, so a pad filled with 0 where pad_id belongs (or the reverse) shows


def _prompts(prompt_ids: list[list[int]], uids: list[int]) -> PromptBatch:
    k = len(prompt_ids)
    return PromptBatch(prompt_ids, [f"a{i}" for i in range(k)], ["src"] * k, [{} for _ in range(k)], uids)


def _two_prompt_batch() -> Batch:
    """2 prompts ([5, 6, 7] and [8], uids 3 and 4) x n=2; responses of lengths 2, 4, 0, 1."""
    prompts = _prompts([[5, 6, 7], [8]], [3, 4])
    gen = Generation(
        response_ids=[[11, 12], [13, 14, 15, 16], [], [17]],
        logprobs=[[-0.5, -0.25], [-1.0, -2.0, -3.0, -4.0], [], [-0.125]],
        finish_reasons=["stop", "length", "stop", "stop"],
    )
    return collate(prompts, gen, n=2, pad_id=PAD)
