"""Built-in reward functions, all with the verl signature.

    fn(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None) -> float

>>> arithmetic("arithmetic", "12", "12")
1.0
>>> gsm8k("openai/gsm8k", "so she has 3 + 4 = 7 apples.\\n#### 7", "7")
1.0
>>> math_boxed("math", "The answer is $\\\\boxed{\\\\frac{1}{2}}$", "0.5")
1.0

TRL's built-in rewards (trl.rewards, the names its `--reward_funcs` takes) are here with verl's signature too:
`accuracy_reward`, `reasoning_accuracy_reward` and `think_format_reward`, the ground truth standing for TRL's
`solution` column. math-verify's own timeouts are off (its SIGALRM would cancel reward.timeout_s, which bounds
every call instead).
"""

from __future__ import annotations

import re
from typing import Any

_INT = re.compile(r"-?\d+")
_GSM8K = re.compile(r"####\s*(-?[\d,]*\.?\d+)")


def arithmetic(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None) -> float:
    """1.0 when the response is exactly the integer answer (surrounding whitespace allowed), else 0.0."""
    text = solution_str.strip()
    return 1.0 if _INT.fullmatch(text) is not None and int(text) == int(ground_truth) else 0.0


def _as_number(text: str) -> float | None:
    try:
        return float(text.replace(",", "").strip())
    except ValueError:
        return None


def gsm8k(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None) -> float:
    """1.0 when the last `#### <number>` in the response equals the ground truth number."""
    found = _GSM8K.findall(solution_str)
    if not found:
        return 0.0
    truth = _GSM8K.findall(str(ground_truth))
    want = _as_number(truth[-1] if truth else str(ground_truth))
    got = _as_number(found[-1])
    return 1.0 if want is not None and got is not None and abs(got - want) < 1e-6 else 0.0


def last_boxed(text: str) -> str | None:
    """The content of the last \\boxed{...} in text, braces balanced; None when there is none."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1 : j]
    return None


def math_boxed(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None) -> float:
    """1.0 when the last \\boxed{} answer is mathematically equal to the ground truth (math-verify)."""
    from math_verify import parse, verify

    answer = last_boxed(solution_str)
    if answer is None:
        return 0.0
    truth = str(ground_truth)
    gold = parse(truth if "\\boxed" in truth or "$" in truth else f"${truth}$", parsing_timeout=None)
    pred = parse(f"$\\boxed{{{answer}}}$", parsing_timeout=None)
    return 1.0 if gold and pred and verify(gold, pred, timeout_seconds=None) else 0.0


def accuracy_reward(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None) -> float:
    """TRL's accuracy_reward: 1.0 when the response's answer is mathematically equal to the ground truth
    (math-verify): the first \\boxed{} or anchored LaTeX answer, as TRL reads it, else (here, where TRL scores 0)
    the last plain number or expression (`12`, `=12`). 0.0 for a ground truth math-verify cannot parse (TRL skips
    the sample, which sums to 0)."""
    from latex2sympy2_extended import NormalizationConfig
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    gold = parse(str(ground_truth), parsing_timeout=None)
    if not gold:
        return 0.0
    latex = LatexExtractionConfig(
        normalization_config=NormalizationConfig(units=True), boxed_match_priority=0, try_extract_without_anchor=False
    )
    answer = parse(solution_str, extraction_config=[latex], extraction_mode="first_match", parsing_timeout=None)
    if not answer:
        answer = parse(solution_str, extraction_config=[ExprExtractionConfig()], parsing_timeout=None)
    return 1.0 if answer and verify(gold, answer, timeout_seconds=None) else 0.0


def reasoning_accuracy_reward(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None) -> float:
    """TRL's reasoning_accuracy_reward: `accuracy_reward` of what follows the last `</think>`; 0.0 without one."""
    if "</think>" not in solution_str:
        return 0.0
    return accuracy_reward(data_source, solution_str.split("</think>")[-1], ground_truth, extra_info)


_THINK = re.compile(r"^<think>(?!.*<think>)(.*?)</think>.*$", re.DOTALL | re.MULTILINE)


def think_format_reward(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None) -> float:
    """TRL's think_format_reward: 1.0 when the response opens with one `<think>...</think>` block, else 0.0."""
    return 1.0 if _THINK.match(solution_str) else 0.0


# data_source -> built-in reward, for datasets that do not name reward.function.
BUILTIN_BY_SOURCE = {
    "arithmetic": arithmetic,
    "gsm8k": gsm8k,
    "openai/gsm8k": gsm8k,
    "math": math_boxed,
    "lighteval/MATH": math_boxed,
    "DigitalLearningGmbH/MATH-lighteval": math_boxed,
    "HuggingFaceH4/MATH-500": math_boxed,
}
