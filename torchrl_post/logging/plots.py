"""Plots of a run from its metrics.jsonl: training reward and validation score against the step.

python -m torchrl_post.logging.plots outputs/demo
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def read_metrics(run_dir: Path) -> list[dict[str, float]]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def plot_run(run_dir: Path) -> Path | None:
    """Write plots/reward.png (train reward, response length, validation curves); None when nothing to plot."""
    rows = read_metrics(run_dir)
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_r, ax_v) = plt.subplots(1, 2, figsize=(11, 4))
    train = [
        (r["training/global_step"], r["critic/score/mean"]) for r in rows if r.get("critic/score/mean") is not None
    ]
    if train:
        xs, ys = zip(*train, strict=True)
        ax_r.plot(xs, ys, lw=0.8, alpha=0.5, label="critic/score/mean")
        k = max(1, len(ys) // 20)
        smooth = [sum(ys[max(0, i - k + 1) : i + 1]) / len(ys[max(0, i - k + 1) : i + 1]) for i in range(len(ys))]
        ax_r.plot(xs, smooth, lw=2, label=f"moving mean ({k})")
    ax_r.set(title="training reward", xlabel="step", ylabel="mean score")
    ax_r.legend(loc="lower right")
    val_keys = sorted({k for r in rows for k in r if k.startswith("val/test_score/")})
    for key in val_keys:
        pts = [(r["training/global_step"], r[key]) for r in rows if r.get(key) is not None]
        if pts:
            xs, ys = zip(*pts, strict=True)
            ax_v.plot(xs, ys, marker="o", label=key)
    ax_v.set(title="validation (greedy)", xlabel="step", ylabel="accuracy")
    if val_keys:
        ax_v.legend(loc="lower right")
    fig.tight_layout()
    out = run_dir / "plots" / "reward.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


if __name__ == "__main__":
    print(plot_run(Path(sys.argv[1] if len(sys.argv) > 1 else "outputs/demo")))
