"""A real peer script run for 2 steps through the entrypoint (issue 37: "where a script is small enough, run it"):
TRL's `trl grpo` command from its CLI docs, its paths substituted, two flags of TRL's own added (the steps and the
run directory). Its keys are TRL's, so the run takes TRL's defaults: GRPO with 8 generations per prompt, no KL term,
transformers' generate, 512 completion tokens."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import assert_ok, read_jsonl, torchrun
from tests.unit.config.peer_scripts import PEER_SCRIPTS, make_demo, read_launch, substitute


def test_trls_grpo_command_trains_two_steps_with_trls_defaults(
    tiny_model: Path, tiny_moe_model: Path, tiny_vlms: dict[str, Path], task_data: tuple[Path, Path], tmp_path: Path
) -> None:
    demo = make_demo(tiny_model, tiny_vlms["qwen2_5_vl"], tiny_moe_model, *task_data, tmp_path / "demo", dry=False)
    launch = substitute(read_launch(PEER_SCRIPTS / "trl/clis_grpo.sh"), demo)
    run = tmp_path / "run"
    proc = torchrun(2, ["-m", "torchrl_post.train", *launch.args, "--max_steps", "2", "--output_dir", str(run)])
    assert_ok(proc)
    out = proc.stdout + proc.stderr
    assert "defaults: TRL's GRPOConfig (configs/trl.yaml)" in out, out[-3000:]
    assert "TRL's reward_funcs=accuracy_reward is reward.function=" in out, out[-3000:]
    rows = read_jsonl(run / "metrics.jsonl")
    assert [r["training/global_step"] for r in rows] == [1, 2]
    # TRL's per step: 16 prompts (the demo's batch: TRL counts per process) x num_generations 8, none over 512 tokens
    assert all(r["response_length/max"] <= 512 for r in rows)
    assert not any(k.startswith("val/") for r in rows for k in r)  # TRL's eval_strategy no
    assert "actor/kl_loss" not in rows[-1]  # beta 0: no KL term
