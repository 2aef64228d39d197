"""The local experts of expert parallelism (torchrl_post/workers/expert_parallel.py), one process: the grouped GEMM
(bfloat16's path) against the per-expert loop computed in float32 on the same bfloat16 values."""

from __future__ import annotations

import pytest
import torch

from torchrl_post.workers.expert_parallel import gated_experts, grouped_experts

E, H, INTER = 4, 32, 16


def _inputs(rows: int, experts: list[int] | None = None) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(rows)
    gate_up = (torch.randn(E, 2 * INTER, H, generator=gen) * 0.2).bfloat16()
    down = (torch.randn(E, H, INTER, generator=gen) * 0.2).bfloat16()
    x = torch.randn(rows, H, generator=gen).bfloat16()
    chosen = (
        torch.tensor(experts, dtype=torch.long) if experts is not None else torch.randint(0, E, (rows,), generator=gen)
    )
    return gate_up, down, x, chosen


@pytest.mark.parametrize(("rows", "experts"), [(40, None), (6, [2, 2, 0, 2, 0, 2]), (0, [])])
def test_grouped_gemm_matches_the_loop_within_bfloat16(rows: int, experts: list[int] | None) -> None:
    """Outputs and every gradient (rows, both weights) of the grouped path in bfloat16 against the loop in float32,
    within 2% of each tensor's largest value (bfloat16 keeps 8 bits of mantissa: 0.4% a rounding, summed over 16-32
    terms); experts that got no row (and no row at all) get gradient zero, not none."""
    gate_up, down, x, chosen = _inputs(rows, experts)
    outs, grads = [], []
    for run, dtype in ((grouped_experts, torch.bfloat16), (gated_experts, torch.float32)):
        w = [t.detach().to(dtype).requires_grad_() for t in (gate_up, down)]
        xi = x.detach().to(dtype).requires_grad_()
        out = run(w[0], w[1], torch.nn.functional.silu)(xi, chosen)
        assert out.dtype == dtype and out.shape == (rows, H)
        g = torch.randn(out.shape, generator=torch.Generator().manual_seed(7)).to(dtype)
        (out * g).sum().backward()
        outs.append(out.float())
        grads.append([t.grad.float() for t in (xi, *w)])  # type: ignore[union-attr]
    for a, b in zip([outs[0], *grads[0]], [outs[1], *grads[1]], strict=True):
        if b.numel() == 0:  # no rows: the output and the rows' gradient are empty
            continue
        scale = max(b.abs().max().item(), 1e-3)
        assert (a - b).abs().max().item() <= 2e-2 * scale
    unused = sorted(set(range(E)) - set(chosen.tolist()))
    for grad in grads[0][1:]:
        assert all(grad[e].abs().max().item() == 0.0 for e in unused)
