"""Tests of torchrl_post/tools/builtin.py: the python tool (sandboxed) and the exact calculator."""

from __future__ import annotations

from tests.unit.tools.helpers import needs_bwrap
from torchrl_post.tools import resolve_tool
from torchrl_post.tools.builtin import calculator


@needs_bwrap
def test_python_tool() -> None:
    assert resolve_tool("python")(code="print(sum(range(10)))") == "45\n"


def test_calculator_is_exact_and_refuses_code() -> None:
    assert calculator("123456789 + 987654321") == "1111111110"
    assert calculator("(7 - 2) * 3 / 2") == "7.5"
    assert calculator("2 ** 1000000").startswith("error")
    assert calculator("__import__('os').system('id')").startswith("error")
    assert calculator("1 / 0").startswith("error")
