"""Fixtures shared by unit tests in several folders."""

from __future__ import annotations

import pytest

from torchrl_post.demo.tokenizer import build_char_tokenizer
from torchrl_post.engines.vllm import tool_call_parser


@pytest.fixture(scope="module")
def parse():  # type: ignore[no-untyped-def]
    return tool_call_parser("hermes", build_char_tokenizer())
