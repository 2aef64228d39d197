"""Build the demo reward model: a tiny Qwen2 sequence classifier that scores answers to the demo's sums.

    python -m torchrl_post.demo.reward_model [--out outputs/demo_reward_model] [--demo outputs/demo_model]
        [--data outputs/demo_data]
    make reward-model; make train ARGS="--config-name rm" trains the demo policy against it

The reward model is a `Qwen2ForSequenceClassification` (one label, the demo tokenizer) that reads a prompt and a
response as `torchrl_post.reward.model_inputs.reward_model_ids` writes them (the chat template with the response as
the assistant's turn) and scores the last token. It is trained by Bradley-Terry (`torchrl_post.reward.preference`)
on the train split's prompts: the correct answer as the policy writes it ("7") is chosen over wrong ones - near
misses, random numbers, the warm start's "=7", empty, repeated digits, stray characters - and over the wrong
answers the demo policy itself samples at temperature 1 (labelled by the exact-match rule,
`torchrl_post.reward.builtin.arithmetic`), so that it ranks what the policy emits, mostly near misses.

Deliberate choices, each measured against the plain recipe (the policy's two layers, Bradley-Terry alone), which
stalls near 0.75 on the policy's own (correct, wrong) pairs:
- Three layers: the policy's two, which already find the sum, and a third whose output projections start at zero
  (the model starts as the policy's features), where the last token can compare the response with the sum.
- An auxiliary next-token loss on the chosen answers, through a copy of the policy's final norm and LM head applied
  after the second layer (discarded after the build): it teaches the sums at the answer position in tens of steps,
  where the pairwise loss alone takes hundreds.
- Each step runs a prompt once and its chosen and rejected responses on the prompt's cached keys and values
  (`_pair_scores`): the prompt is 31 of a row's ~35 tokens.

Like the demo policy it is the same bit for bit on every machine (float64 steps with gradients on a grid, sampling
in float64: `build.deterministic`; the `fingerprint` is printed) and cached: a marker written last records the
recipe, the demo model and data it was built from, and the held-out accuracies.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import random
import time
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Qwen2ForSequenceClassification,
)

from torchrl_post.demo.build import GRID, _encode, build_demo, deterministic, fingerprint
from torchrl_post.demo.qwen import _staging, write_marker
from torchrl_post.reward.builtin import arithmetic
from torchrl_post.reward.model_inputs import reward_model_ids
from torchrl_post.reward.preference import bradley_terry_loss, pairwise_accuracy

RECIPE = 1
"""The reward model build's version: a cached model built by another recipe is rebuilt."""
MARKER = "reward_model_build.json"
MAX_LENGTH = 64
"""reward_model_ids' max_length here: the demo's rows are under 45 tokens."""
RESPONSE_TOKENS = 8
"""The policy's samples are as long as the demo's rollouts (configs/config.yaml data.max_response_length)."""
SAMPLES = 8
"""Temperature-1 samples of the demo policy per train prompt (the demo's rollout.n); twice as many per validation
prompt for the held-out measure."""
MAX_CHARS = 5
"""Training responses are at most this long (the policy's samples are, all but ~1 in 300): a batch's responses are
padded to its longest."""
NEAR_WEIGHT = 3
"""How many times the near misses n-1 and n+1 appear among a prompt's rejected responses: most of the policy's wrong
numbers are off by one, and they are the hardest to tell from the sum."""
STEPS = 200
PROMPTS = 32
"""Prompts per step, each with its chosen response and `REJECTED` rejected ones drawn from its list."""
REJECTED = 7
LR = 3e-3
LM_COEF = 1.0
"""The auxiliary next-token loss's weight."""
Pair = tuple[str, str, str]
"""(prompt, chosen response, rejected response)."""


def wrong_answers(answer: str, rng: random.Random) -> list[str]:
    """Responses the exact-match rule rejects for `answer`, at most MAX_CHARS long: near misses, random numbers, the
    "=<n>" format, empty, repeated digits, a stray character before or after, a little more text."""
    n = int(answer)
    near = [str(n + d) for d in (-3, -2, -1, 1, 2, 3) if n + d >= 0]
    out = [
        *near, str(rng.choice([m for m in range(100) if m != n])), str(rng.randrange(19)), "=" + answer,
        "=" + rng.choice(near), "", answer * 2, answer * 3, answer[0] + answer, answer + answer[-1],
        rng.choice("=+-.,?:x") + answer, answer + rng.choice("=+-.,?!x"), answer + " " + rng.choice("abx?"),
        answer + rng.choice("=+-.,?!x") + rng.choice("0123456789"), f"{answer}={answer}",
    ]  # fmt: skip
    return [r for r in dict.fromkeys(out) if len(r) <= MAX_CHARS and not arithmetic("arithmetic", r, answer)]


@torch.no_grad()
def sample_responses(
    policy: PreTrainedModel, tok: PreTrainedTokenizerBase, prompts: list[str], n: int, seed: int
) -> list[list[str]]:
    """`n` responses per prompt sampled from `policy` at temperature 1 (no top-k or top-p), at most RESPONSE_TOKENS
    tokens each, decoded as the trainer decodes them (skip_special_tokens). Each prompt runs once and its `n`
    samples continue from its cached keys and values (`generate` would run it `n` times); in float64, so the
    same on every machine."""
    encoded = [_encode(tok, p) for p in prompts]
    width = max(map(len, encoded))
    ids = torch.tensor([[tok.pad_token_id] * (width - len(p)) + p for p in encoded])  # left-padded
    mask = (ids != tok.pad_token_id).long()
    gen = torch.Generator().manual_seed(seed)
    tokens = []
    with deterministic(policy):
        out = policy(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp(min=0))
        cache, logits = out.past_key_values, out.logits[:, -1].repeat_interleave(n, 0)
        cache.batch_repeat_interleave(n)
        mask = mask.repeat_interleave(n, 0)
        done = torch.zeros(len(mask), dtype=torch.bool)
        for _ in range(RESPONSE_TOKENS):
            token = torch.multinomial(logits.softmax(-1), 1, generator=gen)[:, 0].masked_fill(done, tok.pad_token_id)
            tokens.append(token)
            done |= token == tok.eos_token_id
            if done.all():
                break
            positions = mask.sum(1, keepdim=True)
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
            logits = policy(
                input_ids=token[:, None], attention_mask=mask, position_ids=positions, past_key_values=cache
            ).logits[:, -1]
    texts = tok.batch_decode(torch.stack(tokens, 1), skip_special_tokens=True)
    return [texts[i * n : (i + 1) * n] for i in range(len(prompts))]


def rejected_responses(row: dict, drawn: list[str], rng: random.Random) -> list[str]:
    """A row's rejected responses, repeats weighting the draws: `wrong_answers`, the policy's wrong samples as often
    as it drew them (at most MAX_CHARS long), and the near misses NEAR_WEIGHT times in all."""
    answer = row["answer"]
    policy_wrong = [s for s in drawn if len(s) <= MAX_CHARS and not arithmetic("arithmetic", s, answer)]
    near = [str(int(answer) + d) for d in (-1, 1) if int(answer) + d >= 0]
    return wrong_answers(answer, rng) + policy_wrong + near * (NEAR_WEIGHT - 1)


def encode(tok: PreTrainedTokenizerBase, prompt: str, response: str) -> list[int]:
    """The reward model's ids of a prompt and a response (the trainer's `reward_model_ids`)."""
    return reward_model_ids(tok, [{"role": "user", "content": prompt}], response, MAX_LENGTH).ids


def padded(tok: PreTrainedTokenizerBase, seqs: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids and their attention mask (the classifier scores the last non-pad token)."""
    width = max(map(len, seqs))
    ids = torch.tensor([s + [tok.pad_token_id] * (width - len(s)) for s in seqs])
    return ids, (ids != tok.pad_token_id).long()


@torch.no_grad()
def score(model: PreTrainedModel, tok: PreTrainedTokenizerBase, texts: list[tuple[str, str]]) -> torch.Tensor:
    """[N] float32 scores of (prompt, response) pairs, each row whole through the classifier (as the trainer runs it)."""
    out = []
    for i in range(0, len(texts), 512):
        ids, mask = padded(tok, [encode(tok, p, r) for p, r in texts[i : i + 512]])
        out.append(model(input_ids=ids, attention_mask=mask).logits[:, 0].float())
    return torch.cat(out)


def pair_accuracy(model: PreTrainedModel, tok: PreTrainedTokenizerBase, pairs: list[Pair]) -> float:
    """The share of (prompt, chosen, rejected) pairs whose chosen response the model scores higher."""
    chosen = score(model, tok, [(p, c) for p, c, _ in pairs])
    rejected = score(model, tok, [(p, r) for p, _, r in pairs])
    return float(pairwise_accuracy(chosen, rejected))


def sample_pair_accuracy(
    model: PreTrainedModel, tok: PreTrainedTokenizerBase, rows: list[dict], samples: list[list[str]]
) -> tuple[float, int]:
    """The share of (correct, wrong) sample pairs of the same prompt that the model orders right (what GRPO's group
    advantages need of a reward), and how many pairs there are."""
    texts, spans = [], []
    for row, drawn in zip(rows, samples, strict=True):
        good = [s for s in drawn if arithmetic("arithmetic", s, row["answer"])]
        bad = [s for s in drawn if not arithmetic("arithmetic", s, row["answer"])]
        spans.append((len(texts), len(good), len(bad)))
        texts += [(row["prompt"], s) for s in good + bad]
    s = score(model, tok, texts)
    right = sum(int((s[i : i + g, None] > s[None, i + g : i + g + b]).sum()) for i, g, b in spans)
    total = sum(g * b for _, g, b in spans)
    return right / total, total


def reward_model_from(policy: PreTrainedModel, tok: PreTrainedTokenizerBase, seed: int) -> PreTrainedModel:
    """A one-label Qwen2 sequence classifier of the policy's sizes and one more layer: the policy's layers and
    embeddings, a fresh last layer whose attention and MLP output projections are zero (the model starts computing
    the policy's features), a fresh score head."""
    cfg = policy.config.to_dict()
    for key in ("architectures", "id2label", "label2id", "num_labels", "pad_token_id", "layer_types"):
        cfg.pop(key, None)
    import os
    cfg["num_hidden_layers"] += int(os.environ.get("RM_EXTRA", "1"))
    config = type(policy.config)(**cfg, num_labels=1, pad_token_id=tok.pad_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForSequenceClassification(config)
    missing = model.model.load_state_dict(policy.model.state_dict(), strict=False).missing_keys  # type: ignore
    with torch.no_grad():
      for last in model.model.layers[policy.config.num_hidden_layers:]:  # type: ignore
        if os.environ.get("RM_ZERO", "1") == "1":
            last.self_attn.o_proj.weight.zero_()
            last.mlp.down_proj.weight.zero_()
    return model


def _pair_scores(
    model: PreTrainedModel, tok: PreTrainedTokenizerBase, prompts: list[list[int]], responses: list[list[int]]
) -> tuple[torch.Tensor, tuple[torch.Tensor, ...], tuple[torch.Tensor, ...], torch.Tensor]:
    """Scores of each prompt followed by each of its responses (len(responses) / len(prompts) per prompt, in order),
    the prompts run once: the responses run on the prompts' cached keys and values, at the positions that follow
    each prompt, which computes what the whole rows would. Returns the [R] scores, the prompts' and the responses'
    hidden states after each layer, and the prompts' attention mask."""
    per = len(responses) // len(prompts)
    prompt_ids, prompt_mask = padded(tok, prompts)  # right-padded: each prompt's positions are 0..len-1
    response_ids, response_mask = padded(tok, responses)
    first = model.model(  # type: ignore
        input_ids=prompt_ids, attention_mask=prompt_mask, use_cache=True, output_hidden_states=True
    )
    cache = first.past_key_values
    cache.batch_repeat_interleave(per)
    positions = prompt_mask.sum(1).repeat_interleave(per)[:, None] + torch.arange(response_ids.shape[1])
    rest = model.model(  # type: ignore
        input_ids=response_ids,
        attention_mask=torch.cat([prompt_mask.repeat_interleave(per, 0), response_mask], 1),
        position_ids=positions,
        past_key_values=cache,
        use_cache=True,
        output_hidden_states=True,
    )
    last = response_mask.sum(1) - 1
    scores = model.score(rest.last_hidden_state[torch.arange(len(responses)), last])[:, 0]  # type: ignore
    return scores, first.hidden_states, rest.hidden_states, prompt_mask


def train(
    model: PreTrainedModel,
    policy: PreTrainedModel,
    tok: PreTrainedTokenizerBase,
    groups: list[tuple[str, str, list[str]]],
    seed: int,
    steps: int = STEPS,
) -> float:
    """AdamW steps of Bradley-Terry on `groups` ((prompt, chosen, rejected responses)) plus LM_COEF times the
    next-token loss of the chosen answers after the policy's layers (through copies of the policy's final norm and
    LM head), float64 with gradients on `GRID`, the learning rate falling linearly to 0. Returns the last step's
    pairwise loss."""
    layer = policy.config.num_hidden_layers  # hidden_states[layer]: after the policy's layers
    aux = torch.nn.ModuleDict({"norm": copy.deepcopy(policy.model.norm), "head": copy.deepcopy(policy.lm_head), "match": torch.nn.Linear(policy.config.hidden_size, 1)})  # type: ignore
    trained = torch.nn.ModuleDict({"model": model, "aux": aux})
    rows = []
    for prompt, chosen, rejected in groups:
        p = _encode(tok, prompt)
        rest = [encode(tok, prompt, r)[len(p) :] for r in [chosen, *rejected]]
        rows.append((p, rest[0], rest[1:]))
    gen = torch.Generator().manual_seed(seed)
    import os
    newn = ("score",) + tuple(f"model.layers.{i}." for i in range(layer, 6))
    new = [p for n, p in model.named_parameters() if n.startswith(newn)]
    old = [p for n, p in trained.named_parameters() if not n.startswith(tuple("model." + x for x in newn))]
    assert len(new) + len(old) == len(list(trained.parameters()))
    opt = torch.optim.AdamW([{"params": old, "lr": LR}, {"params": new, "lr": LR * float(os.environ.get("RM_NEWLR", "1"))}])
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1 - s / steps)
    loss = torch.tensor(float("nan"))
    with deterministic(trained):
        for step in range(steps):
            picked = [rows[i] for i in torch.randint(len(rows), (PROMPTS,), generator=gen).tolist()]
            responses = []
            for _, chosen_ids, rejected_ids in picked:
                responses += [chosen_ids] + [
                    rejected_ids[j] for j in torch.randint(len(rejected_ids), (REJECTED,), generator=gen).tolist()
                ]
            scores, prompt_states, response_states, prompt_mask = _pair_scores(
                model, tok, [p for p, _, _ in picked], responses
            )
            scores_pk = scores.view(PROMPTS, 1 + REJECTED)
            loss = bradley_terry_loss(scores_pk[:, :1].expand(-1, REJECTED).reshape(-1), scores_pk[:, 1:].reshape(-1))
            # next-token loss of each chosen answer: its first token from the prompt's last position, the rest
            # (up to <|im_end|>) from the answer's own positions
            chosen_idx = torch.arange(PROMPTS) * (1 + REJECTED)
            ends = prompt_mask.sum(1) - 1
            lengths = [len(c) - 1 for _, c, _ in picked]  # the answer and <|im_end|>, not the "\n" after it
            hidden = torch.cat(
                [prompt_states[layer][torch.arange(PROMPTS), ends][:, None], response_states[layer][chosen_idx]], 1
            )
            targets = torch.full(hidden.shape[:2], -100)
            for i, (_, c, _) in enumerate(picked):
                targets[i, : lengths[i]] = torch.tensor(c[: lengths[i]])
            logits = aux["head"](aux["norm"](hidden))
            lm = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100
            )
            match_coef = float(os.environ.get("RM_MATCH", "0"))
            if match_coef:
                owner = [c for _, c, _ in picked for _ in range(1 + REJECTED)]
                lab = torch.full(response_states[layer].shape[:2], -1.0)
                for i, (r, c) in enumerate(zip(responses, owner)):
                    for j in range(len(r) - 1):
                        lab[i, j] = float(r[: j + 1] == c[: j + 1])
                mlog = aux["match"](aux["norm"](response_states[layer]))[..., 0]
                valid = lab >= 0
                mloss = torch.nn.functional.binary_cross_entropy_with_logits(mlog[valid], lab[valid].to(mlog.dtype))
                lm = lm + match_coef * mloss / LM_COEF
            opt.zero_grad()
            (loss + LM_COEF * lm).backward()
            for p in trained.parameters():
                if p.grad is not None:  # see build.deterministic: the same bits on every machine
                    p.grad.div_(GRID).round_().mul_(GRID)
            opt.step()
            sched.step()
            if step % 25 == 24:
                acc = pairwise_accuracy(scores_pk[:, :1].expand(-1, REJECTED), scores_pk[:, 1:]).item()
                print(
                    f"reward model step {step + 1}: pairwise loss {loss.item():.4f} (batch accuracy {acc:.2f}), next-token loss {lm.item():.4f}",
                    flush=True,
                )
    return loss.item()


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:12]


def build_reward_model(out_dir: Path, demo_dir: Path, data_dir: Path, seed: int = 0) -> dict[str, Any]:
    """Write the demo reward model to `out_dir` (building the demo policy and data first if missing) unless one of
    this recipe, seed, demo model and data is already there; returns the build's record (the marker's contents:
    what it was built from, the held-out accuracies, the seconds it took and the weights' fingerprint)."""
    build_demo(demo_dir, data_dir)
    want = {
        "recipe": RECIPE, "seed": seed, "demo_fingerprint": fingerprint(demo_dir),
        "data": [_digest(data_dir / "train.jsonl"), _digest(data_dir / "val.jsonl")],
    }  # fmt: skip
    try:
        info: dict[str, Any] = json.loads((out_dir / MARKER).read_text())
    except (OSError, ValueError):
        info = {}
    if info and all(info.get(k) == v for k, v in want.items()) and (out_dir / "model.safetensors").exists():
        print(f"demo reward model ready at {out_dir} (fingerprint {info['fingerprint']})")
        return info
    if info:
        print(f"rebuilding the demo reward model at {out_dir}: built by an older recipe, seed, demo model or data")
    (out_dir / MARKER).unlink(missing_ok=True)
    start = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(demo_dir)
    policy = AutoModelForCausalLM.from_pretrained(demo_dir, dtype=torch.float32).eval()
    train_rows, val_rows = (
        [json.loads(line) for line in (data_dir / f"{split}.jsonl").read_text().splitlines()]
        for split in ("train", "val")
    )
    train_samples = sample_responses(policy, tok, [r["prompt"] for r in train_rows], SAMPLES, seed)
    val_samples = sample_responses(policy, tok, [r["prompt"] for r in val_rows], 2 * SAMPLES, seed + 1)
    rng = random.Random(seed)
    groups = [
        (r["prompt"], r["answer"], rejected_responses(r, s, rng))
        for r, s in zip(train_rows, train_samples, strict=True)
    ]
    print(
        f"sampled the demo policy: {sum(len(g[2]) for g in groups)} rejected responses for {len(groups)} train prompts ({time.perf_counter() - start:.0f} s)",
        flush=True,
    )
    model = reward_model_from(policy, tok, seed)
    loss = train(model, policy, tok, groups, seed)
    model.eval()
    val_pairs = [(r["prompt"], r["answer"], w) for r in val_rows for w in wrong_answers(r["answer"], rng)]
    sample_acc, sample_pairs = sample_pair_accuracy(model, tok, val_rows, val_samples)
    info = {
        **want,
        "steps": STEPS,
        "last_pairwise_loss": round(loss, 4),
        "val_pair_accuracy": round(pair_accuracy(model, tok, val_pairs), 4),
        "val_pairs": len(val_pairs),
        "val_sample_pair_accuracy": round(sample_acc, 4),
        "val_sample_pairs": sample_pairs,
        "seconds": round(time.perf_counter() - start, 1),
    }
    with _staging(out_dir) as stage:
        model.save_pretrained(stage, safe_serialization=True)
        tok.save_pretrained(stage)
    info["fingerprint"] = fingerprint(out_dir)
    write_marker(out_dir, MARKER, info)
    print(
        f"demo reward model written to {out_dir} in {info['seconds']} s: held-out pair accuracy "
        f"{info['val_pair_accuracy']:.3f}, on the policy's own samples {sample_acc:.3f} ({sample_pairs} pairs), "
        f"fingerprint {info['fingerprint']}"
    )
    return info


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("outputs/demo_reward_model"))
    ap.add_argument("--demo", type=Path, default=Path("outputs/demo_model"))
    ap.add_argument("--data", type=Path, default=Path("outputs/demo_data"))
    ap.add_argument("--seed", type=int, default=0, help="the samples', the pairs' and the training's seed")
    args = ap.parse_args()
    build_reward_model(args.out, args.demo, args.data, args.seed)


if __name__ == "__main__":
    main()
