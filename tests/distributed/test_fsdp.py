"""FSDP2 actor on gloo: exact bucketed gather of uneven shards; updates independent of ranks and micro-batches;
the FSDP2 options (offload_policy, reshard_after_forward, reference offload, model.dtype) change no update."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from tests.conftest import ONE_THREAD, assert_ok, torchrun

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def odd_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Odd vocabulary and MLP sizes, so dim-0 shards differ in size between two ranks."""
    from torchrl_post.demo.build import build_tiny_model

    out = tmp_path_factory.mktemp("odd_model")
    build_tiny_model(
        out, hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=97, vocab_size=131
    )
    return out


def _run(nproc: int, model: Path, out: Path) -> list[dict]:
    # One thread a rank for one rank too (as torchrun gives two): beside the suite's background model builds, a
    # one-process launch's two threads waited on each other (this test 25 s alone, 144 s there)
    assert_ok(torchrun(nproc, ["tests/distributed/fsdp_worker.py", str(model), str(out)], env=ONE_THREAD))
    return json.loads(out.read_text())


def test_gather_and_update_equivalences(odd_model: Path, tmp_path: Path) -> None:
    two = _run(2, odd_model, tmp_path / "two.json")
    one = _run(1, odd_model, tmp_path / "one.json")
    for rank in one + two:
        assert rank["uneven_param"] or len(one) == 1
        for bucket in (1, 4096, 1 << 30):
            assert rank[f"gather_exact_{bucket}"], f"bucket {bucket}: gathered weights differ from the checkpoint"
        assert rank["update_moved"] > 1e-4
        # Adam turns float rounding in near-zero gradients into ~1e-5 weight differences; a wrong loss
        # scale shows in grad_norm, which is compared tightly.
        assert rank["accumulation_max_diff"] < 1e-4
        assert rank["checkpointing_max_diff"] < 1e-4
        g = rank["grad_norms"]
        assert all(x == pytest.approx(g[0], rel=1e-5) for x in g[1:]), g
        assert rank["dynamic_bsz_max_diff"] < 1e-4
        for mode, norms in rank["agg_mode_grad_norms"].items():  # whole, uneven micro-batches, token budget
            assert norms[1:] == pytest.approx([norms[0]] * 2, rel=1e-5), f"{mode}: {norms}"
        # model.use_remove_padding: packed micro-batches (fixed and token-budget, counts unequal across the
        # ranks) train exactly like padded ones; no padding is computed.
        for name in ("packed", "packed_dynamic", "padded_dynamic", "packed_apart"):
            # Adam on near-zero gradients, as above; a shared prompt's gradient is summed over its samples in one
            # row (another order of the same float sums): about 2e-4 after two steps of lr 1e-2
            assert rank[f"pack_max_diff_{name}"] < 5e-4, name
            assert rank[f"pack_grad_norm_{name}"] == pytest.approx(rank["pack_grad_norm_padded"], rel=1e-5), name
            assert rank[f"pack_logp_diff_{name}"] < 2e-6, name
            assert rank[f"pg_loss_{name}"] == pytest.approx(rank["pg_loss_padded"], rel=1e-5, abs=1e-7), name
            assert rank[f"entropy_{name}"] == pytest.approx(rank["entropy_padded"], rel=1e-5), name
        assert rank["pack_moved"] > 1e-3
        # packed rows run without their slack (one flat row, attention row by row): no cell computed without a
        # token (token-budget plans add stand-ins, all padding, on the rank with fewer micro-batches)
        for name in ("packed", "packed_apart"):
            assert rank[f"padding_frac_{name}"] == pytest.approx(0.0, abs=1e-9), name
        # model.use_shared_prefix: each pair's prompt computed once (not in token-budget micro-batches that
        # split the pair); never without packing or with it off
        assert rank["shared_prompt_frac_packed"] > 0.1
        for name in ("padded", "padded_dynamic", "packed_apart"):
            assert rank[f"shared_prompt_frac_{name}"] == 0.0, name
        assert rank["critic_pack_max_diff"] < 5e-5  # Adam on near-zero gradients (a shared prompt: 1e-5)
        check_rollout_correction(rank)
        # the sharded reward model's scores are transformers' single-row forwards, to float32 noise
        assert rank["rm_sharded"] and rank["rm_max_diff"] < 1e-5, rank["rm_max_diff"]
        values = torch.tensor(rank["critic_values_True"]) - torch.tensor(rank["critic_values_False"])
        assert values.abs().max() < 2e-6
    for ranks in (one, two):
        for rank in ranks:
            check_skipping(rank, world=len(ranks), zeros=sum(r["skip_expected"] for r in ranks))
    assert two[1]["padding_frac_padded"] > 0.1  # the second rank's short rows: padding the packed update skips
    assert two[1]["padding_frac_packed"] < two[1]["padding_frac_padded"]
    w1 = torch.load(tmp_path / "one.json.pt", weights_only=True)
    w2 = torch.load(tmp_path / "two.json.pt", weights_only=True)
    assert w1["grad_norm"].item() == pytest.approx(w2["grad_norm"].item(), rel=1e-5)
    assert max((w1[k] - w2[k]).abs().max().item() for k in w1) < 1e-4, "2-rank update differs from 1-rank update"
    for mode in one[0]["agg_mode_grad_norms"]:  # every mode: 2 ranks with the global counts = 1 rank
        assert two[0]["agg_mode_grad_norms"][mode][0] == pytest.approx(one[0]["agg_mode_grad_norms"][mode][0], rel=1e-5)


def check_skipping(rank: dict, world: int, zeros: int) -> None:
    """actor.skip_zero_advantage (fsdp_worker.skipping): the update without the rows of advantage 0 equals the full
    one to float noise (their loss terms are exactly 0; the denominators still count them), with and without
    packing, and reports the skipped share of all ranks' rows (4 each)."""
    for name in ("padded", "packed", "packed_dynamic"):
        assert rank[f"skip_{name}_max_diff"] < 1e-4, name  # Adam on near-zero gradients, as above
        full, skipped = rank[f"skip_{name}_grad_norms"]
        assert skipped == pytest.approx(full, rel=1e-5), name
        assert rank[f"skip_{name}_True_pg_loss"] == pytest.approx(
            rank[f"skip_{name}_False_pg_loss"], rel=1e-5, abs=1e-7
        )
        assert rank[f"skip_{name}_True_frac"] == pytest.approx(zeros / (4 * world)), name
        assert rank[f"skip_{name}_False_frac"] == -1.0, "no metric when nothing is skipped by design"


def check_rollout_correction(rank: dict) -> None:
    """algorithm.rollout_correction in the update equals the update without it on a batch changed by hand
    (fsdp_worker.corrections): rejected tokens or rows out of the loss mask, importance weights in the advantages."""
    tokens, rows = rank["corr_tokens"], rank["corr_rows"]
    for level in ("token", "sequence", "geometric", "veto"):
        gone_tokens, gone_rows = rank[f"corr_rs_{level}_rejected"]
        assert 0 < gone_tokens < tokens, f"{level}: the case rejects nothing or everything ({gone_tokens} of {tokens})"
        assert rank[f"corr_rs_{level}_max_diff"] < 1e-4, level  # Adam on near-zero gradients, as above
        norms = rank[f"corr_rs_{level}_grad_norms"]
        assert norms[0] == pytest.approx(norms[1], rel=1e-5), (level, norms)
        want = gone_rows / rows if level == "veto" else gone_tokens / tokens
        assert rank[f"corr_rs_{level}_metric"] == pytest.approx(want, rel=1e-6), level
    for level in ("token", "sequence"):
        assert 0 < rank[f"corr_is_{level}_capped"] < tokens, level
        assert rank[f"corr_is_{level}_max_diff"] < 1e-4, level
        norms = rank[f"corr_is_{level}_grad_norms"]
        assert norms[0] == pytest.approx(norms[1], rel=1e-5), (level, norms)
        metric, weight_sum = rank[f"corr_is_{level}_weight_mean"]
        assert metric == pytest.approx(weight_sum / tokens, rel=1e-6), level


def test_fsdp_options_give_the_same_update(odd_model: Path, tmp_path: Path) -> None:
    """actor/critic.fsdp.offload_policy (FSDP2 CPUOffloadPolicy), reshard_after_forward=false, the reference's
    param_offload and resharding, and model.dtype, on 2 gloo ranks."""
    out = tmp_path / "options.json"
    assert_ok(torchrun(2, ["tests/distributed/fsdp_worker.py", str(odd_model), str(out), "options"]))
    for rank in json.loads(out.read_text()):
        # The policy is on every parameter of the role that asks for it, and only there.
        for role in ("actor", "critic", "reference"):
            assert rank[f"{role}_policy_True"] == [True] and rank[f"{role}_policy_False"] == [False], role
        assert rank["actor_optimizer_state_on_cpu_True"]
        # Two clipped optimizer steps with and without offload: the same weights (float32, ~1e-6) and norms.
        assert rank["actor_moved"] > 1e-3
        assert rank["actor_offload_max_diff"] < 1e-6
        assert rank["critic_offload_max_diff"] < 1e-6
        for key in ("actor_grad_norms", "critic_grad_norms"):
            assert rank[key][0] > 0.05 and rank[key][1] == pytest.approx(rank[key][0], rel=1e-6), key
        # ZeRO-2 gives the ZeRO-3 update; a no-grad forward leaves no role's parameters gathered.
        assert rank["actor_zero2_max_diff"] < 1e-6
        assert rank["actor_sharded_after_log_probs_True"] and rank["actor_sharded_after_log_probs_False"]
        assert rank["critic_sharded_after_values_True"] and rank["critic_sharded_after_values_False"]
        assert rank["reference_sharded_after_forward_False"] and rank["reference_sharded_after_forward_True"]
        assert rank["reference_offload_logprob_diff"] < 1e-6
        assert rank["reference_vs_actor_logprob_diff"] < 1e-6
        # model.dtype=bfloat16: every role in it, the update moves the weights, offload changes nothing; a LoRA
        # adapter on it trains in float32 (PEFT's autocast).
        for key in ("bf16_actor_dtypes_False", "bf16_actor_dtypes_True", "bf16_reference_dtypes", "bf16_critic_dtypes"):
            assert rank[key] == ["torch.bfloat16"], key
        assert rank["bf16_actor_grad_norm_False"] > 0 and rank["bf16_actor_moved"] > 1e-3
        assert rank["bf16_actor_offload_max_diff"] < 1e-6
        assert rank["bf16_lora_dtypes"] == [["torch.bfloat16"], ["torch.float32"]]
        assert math.isfinite(rank["bf16_lora_grad_norm"]) and rank["bf16_lora_grad_norm"] > 0
