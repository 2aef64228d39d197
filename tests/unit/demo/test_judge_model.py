"""The demo judge (torchrl_post/demo/judge.py), through the co-hosted judge a run uses: its verdicts agree with the
demo's exact-match rule on held-out prompts, and its build recorded that agreement on the demo policy's samples."""

from __future__ import annotations

import json
from pathlib import Path

from torchrl_post.build import local_judge
from torchrl_post.demo.judge import MARKER, TEMPLATE, judge_config
from torchrl_post.demo.task import make_rows
from torchrl_post.reward.builtin import arithmetic


def held_out_triples() -> list[tuple[str, str, str]]:
    """Every validation prompt with responses a policy writes: right, off by one either way, right but written
    "=<answer>" (the warm start's habit), doubled, and empty."""
    _, val = make_rows(0)
    triples = []
    for row in val:
        answer = row["answer"]
        n = int(answer)
        for response in (answer, str(n + 1), str(abs(n - 1)), f"={answer}", answer * 2, ""):
            triples.append((row["prompt"], response, answer))
    return triples


def test_the_demo_judge_agrees_with_the_exact_match_rule(demo_judge_model: Path) -> None:
    triples = held_out_triples()
    rule = [arithmetic("arithmetic", r, g) for _, r, g in triples]
    assert 0.1 < sum(rule) / len(rule) < 0.2  # a judge that always says no agrees on at most 0.9 of them
    judge = local_judge(judge_config(demo_judge_model, engine="hf"))
    with judge:
        out = judge.score(*map(list, zip(*triples, strict=True)))
    assert out.errors == 0 and out.parse_failures <= len(triples) // 100
    agree = [not f and s == want for s, f, want in zip(out.scores.tolist(), out.failed.tolist(), rule, strict=True)]
    assert sum(agree) / len(agree) >= 0.95, [t for t, a in zip(triples, agree, strict=True) if not a][:20]
    assert set(out.replies) <= {"yes", "no"} | {r for r, f in zip(out.replies, out.failed.tolist(), strict=True) if f}

    marker = json.loads((demo_judge_model / MARKER).read_text())
    assert marker["val_policy_agreement"] >= 0.95 and marker["template"] == TEMPLATE
