"""Build the demo reward model: a tiny Qwen2 sequence classifier that scores answers to the demo's sums.

    python -m torchrl_post.demo.reward_model [--out outputs/demo_reward_model] [--demo outputs/demo_model]
        [--data outputs/demo_data]
    make reward-model; make train ARGS="--config-name rm" trains the demo policy against it

The reward model is a `Qwen2ForSequenceClassification` (one label) that reads a prompt and a response as
`torchrl_post.reward.model_inputs.reward_model_ids` writes them (its chat template, ChatML like the demo policy's,
with the response as the assistant's turn) and scores the last token. It never sees the reference answer: it
computes the sum itself. It is trained by Bradley-Terry (`torchrl_post.reward.preference`) on the train split's
prompts: the correct answer as the policy writes it ("7") is chosen over wrong ones - near misses n±1..3, random
numbers, the warm start's "=7", empty, repeated digits, stray characters - and over the wrong answers the demo
policy itself samples at temperature 1 (labelled by the exact-match rule, `torchrl_post.reward.builtin.arithmetic`),
so that it ranks what the policy emits, mostly near misses.

Like the demo judge (`torchrl_post.demo.judge`), it is trained from scratch, not from the demo policy, with its own
tokenizer (`reward_tokenizer`): the demo's characters plus the numbers 10-99 as single tokens, so that every answer
to a demo sum is one token and telling "13" from "12" is telling two tokens apart, not digit strings of varying
length. (The policy's own layers and character tokenizer, trained by Bradley-Terry, rank held-out pairs well
(0.95) but near misses badly (n against n±1: 0.85), and RL against that model does not learn.) Bradley-Terry is the
main objective; beside it, auxiliary cross-entropies (`AUX_COEF`, heads discarded after the build) ask, after
`AUX_LAYER` of the `LAYERS` layers, the prompt's last position for the answer's token and the scored (last)
position for both the answer's token and the response's first token, so that the last layer only has to compare
two tokens it holds. Measured over build seeds 0-2 (validation split; n against n+1 and |n-1|): with them, 500 steps
reach 1.0, 0.99, 1.0 held-out near-miss accuracy and 1.0 on the policy's own (correct, wrong) sample pairs; without
the scored position's two targets 1000 steps reach 0.98-0.995, and 600 steps of a model twice as wide 0.90-1.0.
RL against it (configs/rm.yaml, trainer.seed 0, 1, 2) raises exact-match validation from 0.27 to 0.68, 0.75, 0.79
in 100 steps.

Like the demo policy it is the same bit for bit on every machine (float64 steps with gradients on a grid, sampling
in float64: `build.deterministic`; the `fingerprint` is printed) and cached: a marker written last records the
recipe, the demo model and data it was built from, and the held-out accuracies. About a minute on two cores (the
policy's samples ~6 s, 500 steps ~45 s, one thread: `judge.one_thread`).
"""

from __future__ import annotations

import argparse
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
    Qwen2Config,
    Qwen2ForSequenceClassification,
)

from torchrl_post.demo.build import GRID, _encode, build_demo, deterministic, fingerprint
from torchrl_post.demo.judge import NUMBERS, one_thread
from torchrl_post.demo.qwen import _staging, write_marker
from torchrl_post.demo.tokenizer import build_char_tokenizer
from torchrl_post.reward.builtin import arithmetic
from torchrl_post.reward.model_inputs import reward_model_ids
from torchrl_post.reward.preference import bradley_terry_loss, pairwise_accuracy

RECIPE = 2
"""The reward model build's version: a cached model built by another recipe is rebuilt (2: its own tokenizer, from
scratch)."""
MARKER = "reward_model_build.json"
MAX_LENGTH = 64
"""reward_model_ids' max_length here (configs/rm.yaml's): the demo's rows are under 40 tokens."""
RESPONSE_TOKENS = 8
"""The policy's samples are as long as the demo's rollouts (configs/config.yaml data.max_response_length)."""
SAMPLES = 8
"""Temperature-1 samples of the demo policy per train prompt (the demo's rollout.n); twice as many per validation
prompt for the held-out measure."""
NEAR_WEIGHT = 3
"""How many times the near misses n-1 and n+1 appear among a prompt's rejected responses: most of the policy's wrong
numbers are off by one, and they are the hardest to tell from the sum."""
HIDDEN, LAYERS, HEADS, MLP = 32, 3, 2, 128
"""The classifier's sizes: hidden 32, 3 layers of 2 heads (head_dim 16), MLP 128. Measured against hidden 64 with 4
heads: half the time per step, and as accurate in as many steps."""
AUX_LAYER = 2
"""The auxiliary losses read the hidden states after this many layers (the last layer compares)."""
AUX_COEF = 1.0
"""The auxiliary losses' weight (the pairwise loss's is 1)."""
STEPS = 500
PROMPTS = 32
"""Prompts per step, each with its chosen response and `REJECTED` rejected ones drawn from its list."""
REJECTED = 7
LR = 6e-3
"""The peak learning rate (AdamW), after a warm-up of STEPS / 20, decayed linearly to a tenth."""
SEED = 0
Pair = tuple[str, str, str]
"""(prompt, chosen response, rejected response)."""


def reward_tokenizer() -> PreTrainedTokenizerBase:
    """The demo's character tokenizer, its ChatML chat template included (the policy's conversations render to the
    same text), plus `NUMBERS` as single (non-special) tokens: "13", "=13" and "1313" hold the token "13"."""
    tok = build_char_tokenizer(128)
    tok.add_tokens(NUMBERS)
    return tok


def fresh_reward_model(tok: PreTrainedTokenizerBase, seed: int = SEED) -> Qwen2ForSequenceClassification:
    """A randomly initialised one-label Qwen2 sequence classifier over `tok` of the sizes `HIDDEN`, `LAYERS`,
    `HEADS`, `MLP`."""
    cfg = Qwen2Config(
        vocab_size=64 * -(-len(tok) // 64),
        hidden_size=HIDDEN,
        intermediate_size=MLP,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        dtype="float32",
    )
    cfg.num_labels = 1
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return Qwen2ForSequenceClassification(cfg)


def wrong_answers(answer: str, rng: random.Random) -> list[str]:
    """Responses the exact-match rule rejects for `answer`: near misses, random numbers, the "=<n>" format, empty,
    repeated digits, a stray character before or after, a little more text."""
    n = int(answer)
    near = [str(n + d) for d in (-3, -2, -1, 1, 2, 3) if n + d >= 0]
    out = [
        *near, str(rng.choice([m for m in range(100) if m != n])), str(rng.randrange(19)), "=" + answer,
        "=" + rng.choice(near), "", answer * 2, answer * 3, answer[0] + answer, answer + answer[-1],
        rng.choice("=+-.,?:x") + answer, answer + rng.choice("=+-.,?!x"), answer + " " + rng.choice("abx?"),
        answer + rng.choice("=+-.,?!x") + rng.choice("0123456789"), f"{answer}={answer}",
    ]  # fmt: skip
    return [r for r in dict.fromkeys(out) if not arithmetic("arithmetic", r, answer)]


@torch.no_grad()
def sample_responses(
    policy: PreTrainedModel, tok: PreTrainedTokenizerBase, prompts: list[str], n: int, seed: int
) -> list[list[str]]:
    """`n` responses per prompt sampled from `policy` (with its tokenizer `tok`) at temperature 1 (no top-k or
    top-p), at most RESPONSE_TOKENS tokens each, decoded as the trainer decodes them (skip_special_tokens). Each
    prompt runs once and its `n` samples continue from its cached keys and values (`generate` would run it `n`
    times); in float64, so the same on every machine."""
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
    as it drew them, and the near misses NEAR_WEIGHT times in all."""
    answer = row["answer"]
    policy_wrong = [s for s in drawn if not arithmetic("arithmetic", s, answer)]
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


def near_miss_pairs(rows: list[dict]) -> list[Pair]:
    """Each row's answer n against its near misses n+1 and |n-1| (n=0: 1 twice)."""
    return [(r["prompt"], r["answer"], str(abs(int(r["answer"]) + d))) for r in rows for d in (1, -1)]


def sample_pair_accuracy(
    model: PreTrainedModel, tok: PreTrainedTokenizerBase, rows: list[dict], samples: list[list[str]]
) -> tuple[float, int]:
    """The share of (correct, wrong) sample pairs of the same prompt that the model orders right (what GRPO's group
    advantages need of a reward), and how many pairs there are."""
    texts: list[tuple[str, str]] = []
    spans: list[tuple[int, int, int]] = []
    for row, drawn in zip(rows, samples, strict=True):
        good = [s for s in drawn if arithmetic("arithmetic", s, row["answer"])]
        bad = [s for s in drawn if not arithmetic("arithmetic", s, row["answer"])]
        spans.append((len(texts), len(good), len(bad)))
        texts += [(row["prompt"], s) for s in good + bad]
    s = score(model, tok, texts)
    right = sum(int((s[i : i + g, None] > s[None, i + g : i + g + b]).sum()) for i, g, b in spans)
    total = sum(g * b for _, g, b in spans)
    return right / total, total


def _pair_scores(
    model: Qwen2ForSequenceClassification,
    tok: PreTrainedTokenizerBase,
    prompts: list[list[int]],
    responses: list[list[int]],
) -> tuple[torch.Tensor, tuple[torch.Tensor, ...], tuple[torch.Tensor, ...], torch.Tensor, torch.Tensor]:
    """Scores of each prompt followed by each of its responses (len(responses) / len(prompts) per prompt, in order),
    the prompts run once: the responses run on the prompts' cached keys and values, at the positions that follow
    each prompt, which computes what the whole rows would (the prompt is ~30 of a row's ~35 tokens). Returns the
    [R] scores, the prompts' hidden states after each layer and the prompts' attention mask."""
    per = len(responses) // len(prompts)
    prompt_ids, prompt_mask = padded(tok, prompts)  # right-padded: each prompt's positions are 0..len-1
    response_ids, response_mask = padded(tok, responses)
    first = model.model(  # type: ignore[operator]
        input_ids=prompt_ids, attention_mask=prompt_mask, use_cache=True, output_hidden_states=True
    )
    cache = first.past_key_values
    cache.batch_repeat_interleave(per)
    positions = prompt_mask.sum(1).repeat_interleave(per)[:, None] + torch.arange(response_ids.shape[1])
    rest = model.model(  # type: ignore[operator]
        input_ids=response_ids,
        attention_mask=torch.cat([prompt_mask.repeat_interleave(per, 0), response_mask], 1),
        position_ids=positions,
        past_key_values=cache,
        output_hidden_states=True,
    )
    last = response_mask.sum(1) - 1
    scores = model.score(rest.last_hidden_state[torch.arange(len(responses)), last])[:, 0]
    return scores, first.hidden_states, rest.hidden_states, prompt_mask, last


def train(
    model: Qwen2ForSequenceClassification,
    tok: PreTrainedTokenizerBase,
    groups: list[tuple[str, str, list[str]]],
    seed: int = SEED,
    steps: int = STEPS,
) -> float:
    """AdamW steps of Bradley-Terry on `groups` ((prompt, chosen, rejected responses)): per step `PROMPTS` prompts,
    each with its chosen response and `REJECTED` of its rejected ones, plus AUX_COEF times three auxiliary
    cross-entropies on the hidden states after `AUX_LAYER` layers, each through a head of its own (discarded): the
    prompt's last position predicts the answer's token (the sum), and every row's last position - the one the
    classifier scores - predicts both the answer's token and the response's first token. Float64 with gradients on
    `GRID` (`build.deterministic`); the learning rate warms up over the first twentieth, then falls linearly to a
    tenth. Returns the last step's pairwise loss."""
    rows = []
    for prompt, chosen, rejected in groups:
        p = _encode(tok, prompt)  # the prompt with the generation prompt: the rows' common prefix
        rest = [encode(tok, prompt, r)[len(p) :] for r in [chosen, *rejected]]
        rows.append((p, rest[0], rest[1:]))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed + 1)
        aux, aux_sum, aux_resp = (
            torch.nn.Sequential(torch.nn.RMSNorm(HIDDEN, eps=1e-6), torch.nn.Linear(HIDDEN, model.config.vocab_size))
            for _ in range(3)
        )
    trained = torch.nn.ModuleDict({"model": model, "aux": aux, "aux_sum": aux_sum, "aux_resp": aux_resp})
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(trained.parameters(), lr=LR)
    warmup = max(steps // 20, 1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min((s + 1) / warmup, 1.0 - 0.9 * s / steps))
    loss = torch.tensor(float("nan"))
    with deterministic(trained):
        for step in range(steps):
            picked = [rows[i] for i in torch.randint(len(rows), (PROMPTS,), generator=gen).tolist()]
            responses = []
            for _, chosen, rejected in picked:
                responses += [chosen] + [
                    rejected[j] for j in torch.randint(len(rejected), (REJECTED,), generator=gen).tolist()
                ]
            scores, prompt_states, states, prompt_mask, last = _pair_scores(
                model, tok, [p for p, _, _ in picked], responses
            )
            scores = scores.view(PROMPTS, 1 + REJECTED)
            loss = bradley_terry_loss(scores[:, :1].expand(-1, REJECTED).reshape(-1), scores[:, 1:].reshape(-1))
            # the prompt's last position predicts the chosen answer's (first) token
            hidden = prompt_states[AUX_LAYER][torch.arange(PROMPTS), prompt_mask.sum(1) - 1]
            answers = torch.tensor([c[0] for _, c, _ in picked])
            lm = torch.nn.functional.cross_entropy(aux(hidden), answers)
            # every row's last position holds both the sum and the response's first token for the last layer
            final = states[AUX_LAYER][torch.arange(len(responses)), last]
            lm = lm + torch.nn.functional.cross_entropy(aux_sum(final), answers.repeat_interleave(1 + REJECTED))
            lm = lm + torch.nn.functional.cross_entropy(aux_resp(final), torch.tensor([r[0] for r in responses]))
            opt.zero_grad()
            (loss + AUX_COEF * lm).backward()
            for param in trained.parameters():
                if param.grad is not None:  # see build.deterministic: the same bits on every machine
                    param.grad.div_(GRID).round_().mul_(GRID)
            opt.step()
            sched.step()
            if step % 50 == 49:
                acc = pairwise_accuracy(scores[:, :1].expand(-1, REJECTED), scores[:, 1:]).item()
                print(
                    f"reward model step {step + 1}: pairwise loss {loss.item():.4f} (batch accuracy {acc:.3f}), "
                    f"auxiliary loss {lm.item():.4f}",
                    flush=True,
                )
    return loss.item()


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:12]


def build_reward_model(out_dir: Path, demo_dir: Path, data_dir: Path, seed: int = SEED) -> dict[str, Any]:
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
    with one_thread():
        info = {**want, **_build(out_dir, demo_dir, data_dir, seed)}
    info.update(seconds=round(time.perf_counter() - start, 1), fingerprint=fingerprint(out_dir))
    write_marker(out_dir, MARKER, info)
    print(
        f"demo reward model written to {out_dir} in {info['seconds']} s: held-out near-miss accuracy "
        f"{info['val_near_miss_accuracy']:.3f}, pair accuracy {info['val_pair_accuracy']:.3f}, on the policy's own "
        f"samples {info['val_sample_pair_accuracy']:.3f} ({info['val_sample_pairs']} pairs), "
        f"fingerprint {info['fingerprint']}"
    )
    return info


def _build(out_dir: Path, demo_dir: Path, data_dir: Path, seed: int) -> dict[str, Any]:
    """Sample the policy, train, save and score the reward model; returns the marker's results."""
    start = time.perf_counter()
    policy_tok = AutoTokenizer.from_pretrained(demo_dir)
    policy = AutoModelForCausalLM.from_pretrained(demo_dir, dtype=torch.float32).eval()
    train_rows, val_rows = (
        [json.loads(line) for line in (data_dir / f"{split}.jsonl").read_text().splitlines()]
        for split in ("train", "val")
    )
    train_samples = sample_responses(policy, policy_tok, [r["prompt"] for r in train_rows], SAMPLES, seed)
    val_samples = sample_responses(policy, policy_tok, [r["prompt"] for r in val_rows], 2 * SAMPLES, seed + 1)
    rng = random.Random(seed)
    groups = [
        (r["prompt"], r["answer"], rejected_responses(r, s, rng))
        for r, s in zip(train_rows, train_samples, strict=True)
    ]
    print(
        f"sampled the demo policy: {sum(len(g[2]) for g in groups)} rejected responses for {len(groups)} train "
        f"prompts ({time.perf_counter() - start:.0f} s)",
        flush=True,
    )
    tok = reward_tokenizer()
    model = fresh_reward_model(tok, seed)
    loss = train(model, tok, groups, seed, STEPS)
    model.eval()
    with _staging(out_dir) as stage:
        model.save_pretrained(stage, safe_serialization=True)
        tok.save_pretrained(stage)
    # measured on the model and tokenizer as saved, loaded as the trainer loads them
    model = Qwen2ForSequenceClassification.from_pretrained(out_dir, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(out_dir)
    val_pairs = [(r["prompt"], r["answer"], w) for r in val_rows for w in wrong_answers(r["answer"], rng)]
    near = near_miss_pairs(val_rows)
    sample_acc, sample_pairs = sample_pair_accuracy(model, tok, val_rows, val_samples)
    train_sample_acc, _ = sample_pair_accuracy(model, tok, train_rows, train_samples)
    return {
        "steps": STEPS,
        "last_pairwise_loss": round(loss, 4),
        "val_near_miss_accuracy": round(pair_accuracy(model, tok, near), 4),
        "val_near_miss_pairs": len(near),
        "val_pair_accuracy": round(pair_accuracy(model, tok, val_pairs), 4),
        "val_pairs": len(val_pairs),
        "val_sample_pair_accuracy": round(sample_acc, 4),
        "val_sample_pairs": sample_pairs,
        "train_sample_pair_accuracy": round(train_sample_acc, 4),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("outputs/demo_reward_model"))
    ap.add_argument("--demo", type=Path, default=Path("outputs/demo_model"))
    ap.add_argument("--data", type=Path, default=Path("outputs/demo_data"))
    ap.add_argument("--seed", type=int, default=SEED, help="the samples', the pairs' and the training's seed")
    args = ap.parse_args()
    build_reward_model(args.out, args.demo, args.data, args.seed)


if __name__ == "__main__":
    main()
