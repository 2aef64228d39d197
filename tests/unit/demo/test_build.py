"""The demo's warm start builds the same model on every machine: float64 steps with gradients on a grid give the
same bits whatever the CPU's kernels (AVX2 or AVX-512) and thread count, where plain float32 steps do not."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# A tiny model, a few AdamW steps on random token rows, plain float32 and then float64 on the grid from the same
# start: each run prints the weights' hash before and after each.
SCRIPT = """
import hashlib, torch
from transformers import Qwen2Config, Qwen2ForCausalLM
from torchrl_post.demo.build import GRID, deterministic, sft

class Tok:
    pad_token_id = 0

def digest(model):
    h = hashlib.sha256()
    for v in model.state_dict().values():
        h.update(v.float().numpy().tobytes())
    return h.hexdigest()

for grid in (False, True):
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64))
    gen = torch.Generator().manual_seed(0)
    seqs = torch.randint(1, 64, (64, 24), generator=gen).tolist()
    masks = [[0] * 8 + [1] * 16 for _ in seqs]
    done = lambda: (False, "")
    print(digest(model))
    if grid:
        with deterministic(model):
            sft(model, Tok(), seqs, masks, done, gen, max_steps=60, lr=3e-3, batch_size=16, eval_every=10**9,
                grad_grid=GRID)
    else:
        sft(model, Tok(), seqs, masks, done, gen, max_steps=60, lr=3e-3, batch_size=16, eval_every=10**9)
    print(digest(model))
"""
MACHINES = {
    "avx512, 2 threads": {"OMP_NUM_THREADS": "2"},
    "avx2, 1 thread": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "OMP_NUM_THREADS": "1"},
}


def _hashes() -> dict[str, list[tuple[str, str]]]:
    """Each machine's hashes of the weights before and after the plain steps, then the grid's (the machines side by
    side, one process each)."""
    runs = {
        name: subprocess.Popen(
            [sys.executable, "-c", SCRIPT],
            env={**os.environ, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for name, env in MACHINES.items()
    }
    out = {}
    for name, proc in runs.items():
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, stderr[-3000:]
        lines = stdout.strip().splitlines()[-4:]
        out[name] = [(lines[0], lines[1]), (lines[2], lines[3])]
    return out


@pytest.mark.skipif("avx512f" not in open("/proc/cpuinfo").read(), reason="needs a CPU with AVX-512 to compare")
def test_the_warm_start_is_the_same_on_other_kernels() -> None:
    hashes = _hashes()
    plain, same = ({name: runs[i] for name, runs in hashes.items()} for i in (0, 1))
    assert len({a for _, a in plain.values()}) == 2, "float32 steps agreed across kernels: the check proves nothing"
    assert len({b for b, _ in plain.values()} | {b for b, _ in same.values()}) == 1, hashes  # the same start
    assert len(set(same.values())) == 1, same
    ((before, after),) = set(same.values())
    assert before != after, "the steps did not move the weights"
