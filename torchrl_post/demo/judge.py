"""Build the demo judge: a tiny grader that reads a judge prompt about a demo sum and replies `yes` or `no`.

    python -m torchrl_post.demo.judge [--out outputs/demo_judge_model] [--demo outputs/demo_model]
        [--data outputs/demo_data]
    make judge-model; configs/judge.yaml rewards the demo with it (reward.judge, co-hosted: LocalJudge)

The grader reads `TEMPLATE` and says whether the response is the reference answer by the demo's exact-match rule
(reward/builtin.py: `arithmetic`); its reply is read with the `label` parser and `LABELS`. It has no chat template
(the prompt is the template's text) and is trained from scratch, not from the demo model, because two choices make
the comparison learnable in a few hundred steps where the demo's own format takes thousands:
- its tokenizer is the demo's characters plus the numbers 10-99 as single tokens (`NUMBERS`), so that comparing two
  numbers is comparing two tokens, not digit strings of varying length;
- the prompt ends at the reference answer, so the position that predicts the verdict holds the reference itself and
  the grader compares it with the token a fixed distance back (the response's). With a question after it
  ("...Ref: 7\nCorrect?") the same training stalls below 0.9 agreement for some seeds.
Its training set is the train split's prompts, each with responses like the demo policy's - the built demo model
sampled at temperature 1 - and made-up correct, incorrect and malformed ones, labelled by the exact-match rule.

The build then scores the validation split's prompts with the demo model's own samples through the co-hosted judge
(reward/judge_local.py: LocalJudge, as a run does) and records the agreement with the rule in the marker (0.97-1.0
over five seeds). Like the demo model, the result is the same bit for bit on every machine (seeded; float64 steps on
a gradient grid, `build.deterministic`; its `fingerprint` is printed) and cached: the marker, written last, names
the recipe and the demo model it was built from. About a minute on two cores.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase, Qwen2Config, Qwen2ForCausalLM

from torchrl_post.build import local_judge
from torchrl_post.config.schema import JudgeConfig
from torchrl_post.demo.build import GRID, _encode, build_demo, deterministic, fingerprint, save_model, sft
from torchrl_post.demo.qwen import _staging, write_marker
from torchrl_post.demo.tokenizer import build_char_tokenizer
from torchrl_post.reward.builtin import arithmetic
from torchrl_post.reward.judge import JudgeTemplate

TEMPLATE = "Q: {question}\nA: {response}\nRef: {ground_truth}"
"""The grader's prompt (reward.judge.template); its verdict follows the reference answer directly."""
LABELS = {"yes": 1.0, "no": 0.0}
MAX_TOKENS = 4
"""`yes` and the end-of-sequence token."""
NUMBERS = [str(n) for n in range(10, 100)]
"""Tokens of their own in the grader's tokenizer (0-9 are characters already)."""
TRAIN_SAMPLES, VAL_SAMPLES = 2, 4
"""Demo-policy responses sampled per prompt: for training (train split) and for the agreement (validation split)."""
RESPONSE_TOKENS = 8
"""The longest sampled response: the demo config's data.max_response_length."""
STEPS = 400
"""Training steps: the grader's agreement on its probe jumps from about 0.65 to 0.97 between steps 200 and 350."""
LR = 3e-3
"""The peak learning rate (AdamW), after a warm-up of STEPS / 20, decayed linearly to a tenth."""
BATCH_SIZE = 64
SEED = 0
"""The grader's initialisation, its batches and the demo policy's samples."""
RECIPE = 2
"""The grader's version: a cached grader built by another recipe is rebuilt."""
MARKER = "judge_build.json"


def judge_tokenizer() -> PreTrainedTokenizerBase:
    """The demo's character tokenizer, without its chat template, plus `NUMBERS` as single (non-special) tokens."""
    tok = build_char_tokenizer(128)
    tok.add_tokens(NUMBERS)
    tok.chat_template = None
    return tok


def fresh_grader(tok: PreTrainedTokenizerBase, seed: int = SEED) -> Qwen2ForCausalLM:
    """A randomly initialised tiny Qwen2 over `tok`: hidden 32, 2 layers of one head, MLP 64 - a tenth of the demo
    model's compute per token. One head of 32: vLLM's CPU attention takes head sizes from 32 up (two of 16 fail
    every request there)."""
    cfg = Qwen2Config(
        vocab_size=64 * -(-len(tok) // 64),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=1,
        num_key_value_heads=1,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        dtype="float32",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return Qwen2ForCausalLM(cfg)


@torch.no_grad()
def sample_responses(demo_dir: Path, prompts: list[str], n: int, seed: int) -> list[list[str]]:
    """`n` responses per prompt from the demo model at temperature 1 (in float64, seeded: the same on every
    machine), as the policy writes them at the start of a run."""
    model = AutoModelForCausalLM.from_pretrained(demo_dir, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(demo_dir)
    ids = [_encode(tok, p) for p in prompts for _ in range(n)]
    width = max(map(len, ids))
    batch = torch.tensor([[tok.pad_token_id] * (width - len(p)) + p for p in ids])
    with deterministic(model), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        out = model.generate(  # type: ignore[misc]
            input_ids=batch,
            attention_mask=(batch != tok.pad_token_id).long(),
            max_new_tokens=RESPONSE_TOKENS,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
        )
    texts = tok.batch_decode(out[:, width:], skip_special_tokens=True)
    return [texts[i * n : (i + 1) * n] for i in range(len(prompts))]


def made_up_responses(answer: str, rng: random.Random) -> list[str]:
    """Responses for one prompt beside the policy's: the answer (three times: the policy is wrong more often than
    right), a wrong sum, a near miss, the warm start's "=<answer>" and one other malformed answer."""
    n = int(answer)
    wrong = str(rng.choice([x for x in range(19) if x != n]))
    near = str(rng.choice([x for x in (n - 1, n + 1, n - 10, n + 10, int(answer[::-1])) if x >= 0 and x != n]))
    malformed = [f"{answer}.", f"={wrong}", answer * 2, f"-{answer}", f"{answer}=", f"x{answer}", "", f"{answer}0"]
    return [answer, answer, answer, wrong, near, f"={answer}", rng.choice(malformed)]


def labelled(triples: list[tuple[str, str, str]]) -> list[bool]:
    """The exact-match rule's verdict on each (question, response, ground truth)."""
    return [arithmetic("arithmetic", r, g) == 1.0 for _, r, g in triples]


def prompt_ids(tok: PreTrainedTokenizerBase, question: str, response: str, truth: str) -> list[int]:
    """The grader's prompt as LocalJudge builds it for a tokenizer without a chat template."""
    messages = JudgeTemplate(TEMPLATE).render(question, response, truth)
    return list(tok(messages[0]["content"])["input_ids"])


def train_grader(
    model: Qwen2ForCausalLM, tok: PreTrainedTokenizerBase, triples: list[tuple[str, str, str]], seed: int = SEED
) -> float:
    """`STEPS` supervised steps on prompt -> `yes`/`no` (the rule's verdict; the learning rate warmed up over the
    first twentieth, then decayed linearly to a tenth), in float64 on the gradient grid (`build.deterministic`).
    Returns the share of a probe of 256 training prompts on which the first reply token is the rule's verdict."""
    seqs, masks = [], []
    for (q, r, g), yes in zip(triples, labelled(triples), strict=True):
        p = prompt_ids(tok, q, r, g)
        reply = tok("yes" if yes else "no", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        seqs.append(p + reply)
        masks.append([0] * len(p) + [1] * len(reply))
    probe = list(range(0, len(triples), len(triples) // 256))[:256]
    width = max(len(seqs[i]) for i in probe)
    probe_ids = torch.tensor([[tok.pad_token_id] * (width - len(seqs[i])) + seqs[i] for i in probe])
    verdict_at = torch.tensor([width - 1 - sum(masks[i]) for i in probe])  # the position that predicts the verdict
    verdict = torch.tensor([seqs[i][len(seqs[i]) - sum(masks[i])] for i in probe])  # its first token
    acc = 0.0

    @torch.no_grad()
    def evaluate() -> tuple[bool, str]:
        nonlocal acc
        logits = model(input_ids=probe_ids, attention_mask=(probe_ids != tok.pad_token_id).long()).logits
        acc = (logits[torch.arange(len(probe)), verdict_at].argmax(-1) == verdict).double().mean().item()
        return False, f"probe agreement {acc:.3f}"

    warmup = STEPS // 20
    with deterministic(model):
        sft(
            model, tok, seqs, masks, evaluate, torch.Generator().manual_seed(seed), max_steps=STEPS, lr=LR,
            batch_size=BATCH_SIZE, eval_every=50, trim=True, label="judge", grad_grid=GRID,
            lr_scale=lambda step: min((step + 1) / warmup, 1.0 - 0.9 * step / STEPS),
        )  # fmt: skip
        evaluate()
    return acc


def judge_config(judge_dir: Path, engine: str | None = None) -> JudgeConfig:
    """reward.judge as configs/judge.yaml sets it for the grader at `judge_dir` (co-hosted, on `engine`)."""
    return JudgeConfig(
        enable=True, model=str(judge_dir), engine=engine, template=TEMPLATE, parser="label", labels=dict(LABELS),
        scale=None, max_tokens=MAX_TOKENS,
    )  # fmt: skip


def agreement(judge_dir: Path, triples: list[tuple[str, str, str]]) -> tuple[float, int]:
    """The share of `triples` on which the judge at `judge_dir` (through LocalJudge, greedy) gives the exact-match
    rule's verdict, and how many of its replies held no verdict (counted as disagreeing)."""
    judge = local_judge(judge_config(judge_dir, engine="hf"))
    with judge:
        out = judge.score(*map(list, zip(*triples, strict=True)))
    verdicts = zip(out.scores.tolist(), out.failed.tolist(), labelled(triples), strict=True)
    agree = [not failed and (score == 1.0) == want for score, failed, want in verdicts]
    return sum(agree) / len(agree), out.parse_failures + out.errors


def build_judge(out_dir: Path, demo_dir: Path, data_dir: Path) -> dict:
    """Write the grader to `out_dir` (building the demo model and data first if missing), unless one of this recipe
    and from this demo model is already there; returns its marker (the build's record, agreement included)."""
    build_demo(demo_dir, data_dir)
    want = {"recipe": RECIPE, "demo_fingerprint": fingerprint(demo_dir), "template": TEMPLATE}
    try:
        info = json.loads((out_dir / MARKER).read_text())
    except (OSError, ValueError):
        info = {}
    if info and all(info.get(k) == v for k, v in want.items()):
        print(f"demo judge ready at {out_dir} (fingerprint {info['fingerprint']})")
        return info
    if info:
        print(f"rebuilding the demo judge at {out_dir}: built by an older recipe or from another demo model")
    (out_dir / MARKER).unlink(missing_ok=True)
    start = time.perf_counter()
    with one_thread():
        info = {**want, **_build(out_dir, demo_dir, data_dir)}
    info.update(build_s=round(time.perf_counter() - start, 1), fingerprint=fingerprint(out_dir))
    write_marker(out_dir, MARKER, info)
    print(
        f"demo judge written to {out_dir} after {info['steps']} steps: agrees with the exact-match rule on "
        f"{info['val_policy_agreement']:.3f} of {info['val_policy_samples']} held-out demo-policy responses "
        f"({info['val_policy_correct_share']:.2f} of them correct) and {info['val_made_up_agreement']:.3f} of "
        f"{info['val_made_up_samples']} made-up ones; {info['build_s']:.0f} s, fingerprint {info['fingerprint']}"
    )
    return info


def _build(out_dir: Path, demo_dir: Path, data_dir: Path) -> dict:
    """Sample, train, save and score the grader; returns the marker's results."""
    start = time.perf_counter()
    rows = {
        s: [json.loads(line) for line in (data_dir / f"{s}.jsonl").read_text().splitlines()] for s in ("train", "val")
    }
    policy = {
        s: sample_responses(demo_dir, [r["prompt"] for r in rows[s]], n, seed)
        for s, n, seed in (("train", TRAIN_SAMPLES, SEED), ("val", VAL_SAMPLES, SEED + 1))
    }
    print(f"sampled the demo policy's responses ({time.perf_counter() - start:.0f} s)", flush=True)
    rng = random.Random(SEED)
    train = [
        (r["prompt"], response, r["answer"])
        for r, sampled in zip(rows["train"], policy["train"], strict=True)
        for response in sampled + made_up_responses(r["answer"], rng)
    ]
    val_policy = [(r["prompt"], x, r["answer"]) for r, xs in zip(rows["val"], policy["val"], strict=True) for x in xs]
    val_made_up = [(r["prompt"], x, r["answer"]) for r in rows["val"] for x in made_up_responses(r["answer"], rng)]
    tok = judge_tokenizer()
    model = fresh_grader(tok)
    probe_acc = train_grader(model, tok, train)
    with _staging(out_dir) as stage:
        save_model(model, tok, stage)
    agree_policy, no_verdict = agreement(out_dir, val_policy)
    agree_made_up, _ = agreement(out_dir, val_made_up)
    return {
        "steps": STEPS, "probe_agreement": probe_acc, "train_samples": len(train),
        "val_policy_agreement": agree_policy, "val_policy_samples": len(val_policy),
        "val_policy_correct_share": sum(labelled(val_policy)) / len(val_policy), "val_policy_no_verdict": no_verdict,
        "val_made_up_agreement": agree_made_up, "val_made_up_samples": len(val_made_up),
    }  # fmt: skip


@contextmanager
def one_thread() -> Iterator[None]:
    """Matrices this small compute no faster on several threads, and on a machine busy with other work threads that
    wait on each other make each step several times slower (measured: 0.09 s on one thread, 0.34 s on two)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("outputs/demo_judge_model"))
    ap.add_argument("--demo", type=Path, default=Path("outputs/demo_model"))
    ap.add_argument("--data", type=Path, default=Path("outputs/demo_data"))
    args = ap.parse_args()
    build_judge(args.out, args.demo, args.data)


if __name__ == "__main__":
    main()
