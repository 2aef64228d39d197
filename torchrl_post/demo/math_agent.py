"""The math-agent demo (rLLM's train_math_agent, tiny): sums of two 3-digit numbers, too large for the tiny
model to add in its head, and a calculator it may call with a Hermes-style tool call.

    python -m torchrl_post.demo.math_agent [--out outputs/math_agent_model] [--data outputs/math_agent_data]

A trajectory, as the agent loop grows it token in, token out (agent/chat.py):

    <|im_start|>user\\nWhat is 483+901?<|im_end|>\\n<|im_start|>assistant\\n                     prompt
    <tool_call>{"name": "calculator", "arguments": {"expression": "483+901"}}</tool_call><|im_end|>   turn 1
    \\n<|im_start|>tool\\n1384<|im_end|>\\n<|im_start|>assistant\\n                             observation
    1384<|im_end|>                                                                             turn 2

or, without the tool, a direct answer (`1377<|im_end|>`), which is a guess and nearly always wrong.

The warm start is a supervised pass on a mix of both kinds (loss on the responses only). Half of the
trajectories call the tool with no loss on their first token: they teach the format (copy the operands
into the call, copy the tool's result into the answer) but not the decision to call. The others teach the
decision: the tool at a rate that differs by phrasing (`TOOL_FRAC`), else a guess (the true sum off by a
little). So the warm-started model calls the tool greedily on some phrasings only and, sampled, on a share
of every phrasing's prompts, and gets the answer right when it does: RL has signal from the first step and
room to improve. The learning rate falls linearly to 0; training stops at the first evaluation (the agent
loop's exact multi-turn format, HF generation, the real calculator) with greedy accuracy in a window,
greedy tool calls right, and a sampling policy calling the tool often enough and right enough (see
`build_math_agent`). Deterministic (seeded, one thread) and cached like the demo build.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer, PreTrainedTokenizerBase, Qwen2ForCausalLM

from torchrl_post.agent.chat import observation_delta, prompt_ids
from torchrl_post.agent.math_agent import MathEnv
from torchrl_post.demo.build import build_tiny_model, save_model, sft
from torchrl_post.demo.task import TEMPLATES, write_splits
from torchrl_post.tools import ToolBox

DATA_SOURCE = "math_agent"
TOOL_CALL_START, TOOL_CALL_END = "<tool_call>", "</tool_call>"
TOOL_TOKENS = [TOOL_CALL_START, TOOL_CALL_END]
TOOL_FRAC = (0.65, 0.4, 0.3, 0.2, 0.15)
"""Share of the warm start's trajectories that decide to call the tool, per phrasing of `TEMPLATES`."""
FORMAT_FRAC = 0.5
"""Share of the warm start's trajectories that are tool calls teaching the format, not the decision."""
MARKER = "math_agent_build.json"

_CALL = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)  # as vLLM's hermes parser
_TEMPLATE_RES = [re.compile(re.escape(t).replace(r"\{a\}", r"(\d+)").replace(r"\{b\}", r"(\d+)")) for t in TEMPLATES]


# ---- data -------------------------------------------------------------------------------------------------
def make_math_rows(seed: int = 0, n_train: int = 2000, n_val: int = 128) -> tuple[list[dict], list[dict]]:
    """Distinct (a, b, phrasing) questions with a, b in 100..999, split into train and validation."""
    rng = random.Random(seed)
    seen: set[tuple[int, int, int]] = set()
    while len(seen) < n_train + n_val:
        seen.add((rng.randint(100, 999), rng.randint(100, 999), rng.randrange(len(TEMPLATES))))
    keys = sorted(seen)
    rng.shuffle(keys)
    rows = []
    for a, b, t in keys:
        q = TEMPLATES[t].format(a=a, b=b)
        rows.append({"prompt": q, "answer": str(a + b), "data_source": DATA_SOURCE, "question": q})
    return rows[n_val:], rows[:n_val]


def write_math_task(out_dir: Path, seed: int = 0) -> tuple[Path, Path]:
    """Write train.jsonl (2000 rows) and val.jsonl (128 rows) under out_dir; returns their paths."""
    return write_splits(out_dir, *make_math_rows(seed))


def parse_question(question: str) -> tuple[int, int, int]:
    """(phrasing index, a, b) of a question written from `TEMPLATES`."""
    for i, pattern in enumerate(_TEMPLATE_RES):
        m = pattern.fullmatch(question)
        if m:
            return i, int(m.group(1)), int(m.group(2))
    raise ValueError(f"not a math-agent question: {question!r}")


def tool_call_text(expression: str) -> str:
    call = {"name": "calculator", "arguments": {"expression": expression}}
    return f"{TOOL_CALL_START}{json.dumps(call)}{TOOL_CALL_END}"


def trajectory(
    tok: PreTrainedTokenizerBase, question: str, answer: str, guess: str | None
) -> tuple[list[int], list[int]]:
    """(ids, loss mask) of a trajectory in the agent loop's format: a tool call, its result and the answer
    (`guess` None), or the direct answer `guess`. The mask covers the responses only."""
    _, a, b = parse_question(question)
    prompt = prompt_ids(tok, [{"role": "user", "content": question}])

    def response(text: str) -> list[int]:
        return list(tok(text, add_special_tokens=False)["input_ids"]) + [tok.eos_token_id]

    if guess is not None:
        r = response(guess)
        return prompt + r, [0] * len(prompt) + [1] * len(r)
    call = response(tool_call_text(f"{a}+{b}"))
    obs = observation_delta(tok, {"role": "tool", "content": answer}, True)
    final = response(answer)
    ids = prompt + call + obs + final
    return ids, [0] * len(prompt) + [1] * len(call) + [0] * len(obs) + [1] * len(final)


def warm_start_rows(
    tok: PreTrainedTokenizerBase,
    rows: list[dict],
    seed: int,
    tool_frac: tuple[float, ...] = TOOL_FRAC,
    format_frac: float = FORMAT_FRAC,
) -> tuple[list[list[int]], list[list[int]], int]:
    """The warm start's trajectories, one per row. A `format_frac` share are tool calls that teach the
    format only: no loss on their first token, the decision to call. The others teach the decision: with
    the tool at the phrasing's rate (`tool_frac`), else a guess (the sum off by 1..60 either way).
    Returns (ids, masks, number of tool trajectories)."""
    rng = random.Random(seed + 1)
    seqs, masks, n_tool = [], [], 0
    for r in rows:
        t, _, _ = parse_question(r["question"])
        format_only = rng.random() < format_frac
        guess = None
        if not format_only and rng.random() >= tool_frac[t]:
            guess = str(int(r["answer"]) + rng.choice([-1, 1]) * rng.randint(1, 60))
        ids, mask = trajectory(tok, r["question"], r["answer"], guess)
        if format_only:
            mask[mask.index(1)] = 0
        seqs.append(ids)
        masks.append(mask)
        n_tool += guess is None
    return seqs, masks, n_tool


# ---- multi-turn evaluation in the agent loop's format ------------------------------------------------------
def parse_tool_calls(raw: str) -> tuple[bool, list[tuple[str, str]]]:
    """(tried, [(name, arguments JSON)]) as vLLM's hermes parser reads a response decoded with its special
    tokens; tried with no calls is a malformed call."""
    if TOOL_CALL_START not in raw:
        return False, []
    try:
        found = [json.loads(m[0] or m[1]) for m in _CALL.findall(raw)]
        return True, [(str(c["name"]), json.dumps(c["arguments"], ensure_ascii=False)) for c in found]
    except Exception:
        return True, []


@torch.no_grad()
def generate(
    model: Qwen2ForCausalLM,
    tok: PreTrainedTokenizerBase,
    contexts: list[list[int]],
    max_new_tokens: int,
    sample: bool,
) -> list[list[int]]:
    """One response per context (left-padded batch), each up to and including its end token."""
    width = max(map(len, contexts))
    ids = torch.tensor([[tok.pad_token_id] * (width - len(c)) + c for c in contexts])
    attn = torch.tensor([[0] * (width - len(c)) + [1] * len(c) for c in contexts])
    kwargs: dict[str, Any] = {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0} if sample else {}
    out = model.generate(  # type: ignore[misc]
        input_ids=ids,
        attention_mask=attn,
        max_new_tokens=max_new_tokens,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        **({"do_sample": False} | kwargs),
    )
    responses = []
    for row in out[:, width:].tolist():
        end = row.index(tok.eos_token_id) + 1 if tok.eos_token_id in row else len(row)
        responses.append(row[:end])
    return responses


@dataclass
class Episode:
    reward: float = 0.0
    tool_calls: int = 0
    tool_ok: int = 0  # tool calls whose expression was the question's sum, written a+b
    tokens: int = 0  # prompt, responses and observations
    response_tokens: int = 0


def play(
    model: Qwen2ForCausalLM,
    tok: PreTrainedTokenizerBase,
    rows: list[dict],
    sample: bool = False,
    max_turns: int = 2,
    max_new_tokens: int = 96,
    max_len: int = 256,
) -> list[Episode]:
    """Run the agent loop's protocol with the HF model: the first response without a tool call is scored
    (MathEnv); a tool call gets the calculator's result as the next observation; `max_turns` ends it. A
    turn's responses are cut to fit `max_len` tokens (the model's positions) in all."""
    tools = ToolBox.from_specs(["calculator"])
    contexts = [prompt_ids(tok, [{"role": "user", "content": r["question"]}]) for r in rows]
    episodes = [Episode() for _ in rows]
    live = list(range(len(rows)))
    for turn in range(max_turns):
        if not live:
            break
        budget = min(max_new_tokens, max_len - max(len(contexts[i]) for i in live))
        if budget < 1:
            break
        responses = generate(model, tok, [contexts[i] for i in live], budget, sample)
        still = []
        for i, resp in zip(live, responses, strict=True):
            e, row = episodes[i], rows[i]
            e.response_tokens += len(resp)
            contexts[i] = contexts[i] + resp
            tried, calls = parse_tool_calls(str(tok.decode(resp, skip_special_tokens=False)))
            if not tried:
                env = MathEnv()
                env.reset(row)
                e.reward = env.step(str(tok.decode(resp, skip_special_tokens=True)).strip())[1]
                continue
            e.tool_calls += len(calls) or 1
            _, a, b = parse_question(row["question"])
            e.tool_ok += sum(n == "calculator" and json.loads(x) == {"expression": f"{a}+{b}"} for n, x in calls)
            if turn + 1 < max_turns:
                msgs = [{"role": "tool", "content": tools.call(n, x)[0]} for n, x in calls] or [
                    {"role": "tool", "content": "error: malformed tool call (expected JSON)"}
                ]
                ended = bool(resp) and resp[-1] == tok.eos_token_id
                contexts[i] = contexts[i] + observation_delta(tok, msgs, ended)
                still.append(i)
        live = still
    for e, c in zip(episodes, contexts, strict=True):
        e.tokens = len(c)
    return episodes


def summarize(episodes: list[Episode]) -> dict[str, float]:
    """accuracy, tool_rate (episodes with a tool call), acc_given_tool, call_ok (tool-calling episodes whose
    call was exactly right), mean tokens per trajectory."""
    n = len(episodes)
    tooled = [e for e in episodes if e.tool_calls]
    return {
        "accuracy": sum(e.reward for e in episodes) / n,
        "tool_rate": len(tooled) / n,
        "acc_given_tool": sum(e.reward for e in tooled) / len(tooled) if tooled else 0.0,
        "call_ok": sum(e.tool_ok > 0 for e in tooled) / len(tooled) if tooled else 0.0,
        "acc_without_tool": sum(e.reward for e in episodes if not e.tool_calls) / max(1, n - len(tooled)),
        "tokens": sum(e.tokens for e in episodes) / n,
        "response_tokens": sum(e.response_tokens for e in episodes) / n,
    }


def _fmt(stats: dict[str, float]) -> str:
    return (
        f"acc {stats['accuracy']:.2f} tool rate {stats['tool_rate']:.2f} "
        f"acc|tool {stats['acc_given_tool']:.2f} tokens {stats['tokens']:.0f}"
    )


# ---- build ------------------------------------------------------------------------------------------------
def sampled_stats(
    model: Qwen2ForCausalLM, tok: PreTrainedTokenizerBase, rows: list[dict], seed: int
) -> dict[str, float]:
    """`summarize` of one temperature-1 episode per row, seeded (the global RNG is left as it was)."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return summarize(play(model, tok, rows, sample=True))


def build_math_agent(
    model_dir: Path,
    data_dir: Path,
    target_acc: float = 0.15,
    seed: int = 0,
    max_acc: float = 0.35,
    tool_acc: float = 0.9,
    min_tool_rate: float = 0.25,
    sampled_tool_acc: float = 0.8,
    tool_frac: tuple[float, ...] = TOOL_FRAC,
    format_frac: float = FORMAT_FRAC,
    max_steps: int = 700,
) -> None:
    """Write the task and the warm-started model, unless both are already there.

    The warm start (learning rate falling linearly to 0 over `max_steps`) is evaluated every 25 steps on
    128 training prompts and stops at the first evaluation where: greedy accuracy is in [target_acc,
    max_acc] and greedy tool-calling episodes answer right at least `tool_acc` of the time; and sampled at
    temperature 1 (two episodes a prompt) the model calls the tool in at least `min_tool_rate` of the
    episodes and answers right in `sampled_tool_acc` of those. The format is learnt, the decision to call
    is not. The thread count does not change the model (1 and 2 threads gave one SHA-256 of the weights)."""
    train_path, val_path = data_dir / "train.jsonl", data_dir / "val.jsonl"
    if not train_path.exists() or not val_path.exists():
        train_path, val_path = write_math_task(data_dir, seed)
    marker = model_dir / MARKER
    if marker.exists():
        print(f"math agent model ready at {model_dir}")
        return
    t0 = time.perf_counter()
    model, _ = build_tiny_model(model_dir, num_layers=2, seed=seed, extra_special=TOOL_TOKENS)
    tok = AutoTokenizer.from_pretrained(model_dir)  # exactly the tokenizer the trainer and vLLM will load
    rows = [json.loads(line) for line in train_path.read_text().splitlines()]
    val = [json.loads(line) for line in val_path.read_text().splitlines()]
    seqs, masks, n_tool = warm_start_rows(tok, rows, seed, tool_frac, format_frac)
    print(f"warm start on {len(seqs)} trajectories, {n_tool} with the tool", flush=True)
    probe = rows[:128]
    greedy_probe: dict[str, float] = {}
    sampled_probe: dict[str, float] = {}

    def evaluate() -> tuple[bool, str]:
        model.eval()
        greedy_probe.update(summarize(play(model, tok, probe)))
        acc = greedy_probe["accuracy"]
        text = "greedy " + _fmt(greedy_probe)
        done = target_acc <= acc <= max_acc and greedy_probe["acc_given_tool"] >= tool_acc
        if done:
            sampled_probe.update(sampled_stats(model, tok, probe + probe, seed))
            text += " | sampled " + _fmt(sampled_probe)
            done = sampled_probe["tool_rate"] >= min_tool_rate and sampled_probe["acc_given_tool"] >= sampled_tool_acc
        model.train()
        return done, text

    steps = sft(
        model,
        tok,
        seqs,
        masks,
        evaluate,
        torch.Generator().manual_seed(seed),
        max_steps,
        lr=1.5e-3,
        batch_size=32,
        eval_every=25,
        trim=True,
        lr_scale=lambda step: 1.0 - step / max_steps,
    )
    model.eval()
    greedy = summarize(play(model, tok, val))
    sampled = sampled_stats(model, tok, val + val, seed)
    save_model(model, tok, model_dir)
    seconds = time.perf_counter() - t0
    info = {
        "steps": steps,
        "seconds": round(seconds, 1),
        "seed": seed,
        "stop_rule": {
            "target_acc": target_acc,
            "max_acc": max_acc,
            "tool_acc": tool_acc,
            "min_tool_rate": min_tool_rate,
            "sampled_tool_acc": sampled_tool_acc,
        },
        "tool_frac": list(tool_frac),
        "format_frac": format_frac,
        "greedy_train_probe": greedy_probe,
        "greedy_val": greedy,
        "sampled_val": sampled,
    }
    marker.write_text(json.dumps(info) + "\n")
    if steps >= max_steps:
        print(f"warning: the warm start did not meet its stopping rule in {max_steps} steps")
    print(f"greedy val: {_fmt(greedy)}")
    print(f"sampled val (temperature 1, 2 a prompt): {_fmt(sampled)} (call right {sampled['call_ok']:.2f})")
    print(f"math agent model written to {model_dir} after {steps} warm-start steps ({seconds:.0f}s)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("outputs/math_agent_model"))
    ap.add_argument("--data", type=Path, default=Path("outputs/math_agent_data"))
    ap.add_argument("--target-acc", type=float, default=0.15)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    build_math_agent(args.out, args.data, args.target_acc, args.seed)


if __name__ == "__main__":
    main()
