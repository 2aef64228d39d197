"""Worker for test_loading.py: every role's model loaded shard by shard (model.load_format=sharded) against the
full load, on the ranks torchrun gives, for each model directory given (one launch, several models). Writes the
ranks' reports as a JSON list (rank 0): per rank, one report per model directory, in argument order."""

from __future__ import annotations

import json
import logging
import re
import resource
import sys

import torch
import torch.distributed as dist

from tests.distributed.checks import make_actor
from torchrl_post.config.schema import Config
from torchrl_post.distributed.env import end_process, init_world, read_env
from torchrl_post.distributed.placement import fsdp_mesh
from torchrl_post.sync.weights import iter_full_weights
from torchrl_post.types import Batch
from torchrl_post.workers import loading
from torchrl_post.workers.critic import Critic
from torchrl_post.workers.models import load_pretrained
from torchrl_post.workers.reference import Reference

CPU = torch.device("cpu")
_KEEP: list[object] = []


def _batch(vocab: int) -> Batch:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(5, vocab, (4, 10), generator=gen)
    attn = torch.ones_like(ids)
    attn[1, :2] = 0
    return Batch(
        input_ids=ids,
        attention_mask=attn,
        position_ids=(attn.cumsum(-1) - 1).clamp(min=0),
        loss_mask=torch.ones(4, 4),
        rollout_log_probs=torch.zeros(4, 4),
        group_ids=torch.arange(4),
        termination=torch.zeros(4, dtype=torch.long),
        weights=torch.ones(4),
    )


class _Notes(logging.Handler):
    """The loading module's log lines (a role that loads in full says so in one)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


class _Reads:
    """The experts whose tensors this rank reads (`SafetensorsFile.read_rows` wrapped): from per-expert names
    (`mlp.experts.3.up_proj.weight`) the expert in the name, from fused ones (`mlp.experts.gate_up_proj`, dim 0
    the expert) the rows read."""

    def __init__(self) -> None:
        self.experts: set[int] = set()
        self.read_rows = loading.SafetensorsFile.read_rows

    def __enter__(self) -> _Reads:
        def read_rows(f: loading.SafetensorsFile, name: str, start: int, stop: int, out: torch.Tensor) -> None:
            if (found := re.search(r"\.experts\.(\d+)\.", name)) is not None:
                self.experts.add(int(found.group(1)))
            elif ".experts." in name:
                self.experts.update(range(start, stop))
            self.read_rows(f, name, start, stop, out)

        loading.SafetensorsFile.read_rows = read_rows  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        loading.SafetensorsFile.read_rows = self.read_rows  # type: ignore[method-assign]


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return dict(iter_full_weights(model, 1 << 20))


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], skip: tuple[str, ...] = ()) -> bool:
    keys = [k for k in a if not k.startswith(skip)]
    return set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in keys)


def roles(cfg: Config, mesh: object) -> dict[str, object]:
    out: dict[str, object] = {}
    plain = load_pretrained(cfg.model)
    expected = {**plain.state_dict()}
    expected_buffers = {k: v for k, v in plain.named_buffers()}
    batch = _batch(plain.config.get_text_config().vocab_size)
    models: dict[str, dict[str, object]] = {}
    notes, loader_log = _Notes(), logging.getLogger("torchrl_post.workers.loading")
    loader_log.setLevel(logging.INFO)
    for fmt in ("full", "sharded"):
        cfg.model.load_format = fmt
        torch.manual_seed(0)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        loader_log.addHandler(notes)
        with _Reads() as reads:
            actor = make_actor(cfg, mesh)
            ref = Reference(cfg.model, cfg.reference, cfg.actor.fsdp, mesh, CPU, temperature=1.0)
            critic = Critic(
                cfg.model,
                cfg.critic,
                mesh,
                CPU,
                mini_batch_samples=4,
                micro_batch_samples=cfg.critic.ppo_micro_batch_size_per_gpu,
                epochs=1,
                max_response_length=4,
                total_steps=1,
            )
        loader_log.removeHandler(notes)
        _KEEP.extend([actor, ref, critic])
        models[fmt] = {
            "actor": _weights(actor.model),
            "reference": _weights(ref.model),
            "critic": _weights(critic.model),
            "buffers": {k: v.clone() for k, v in actor.model.named_buffers()},
            "logp": actor.log_probs(batch),
            "ref_logp": ref.log_probs(batch),
            "values": critic.values(batch),
            "maxrss_growth_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before,
        }
        out[f"dtensor_{fmt}"] = all(type(p).__name__ == "DTensor" for p in actor.model.parameters())
    s, f = models["sharded"], models["full"]
    out["loaded_in_full"] = notes.lines  # with load_format=sharded, every role must have read its rows
    out["experts_read"] = sorted(reads.experts)  # of the sharded loads (the full loads read through transformers)
    # The checkpoint's tensors; a tied model's state dict repeats the embedding as lm_head.weight.
    out["actor_equals_from_pretrained"] = all(torch.equal(s["actor"][k], expected[k]) for k in s["actor"])
    out["actor_names_covered"] = set(s["actor"]) <= set(expected)
    out["actor_equal"] = _same(s["actor"], f["actor"])
    out["reference_equal"] = _same(s["reference"], f["reference"])
    out["critic_backbone_equal"] = _same(s["critic"], f["critic"], skip=("score.",))
    out["critic_head_names"] = sorted(k for k in s["critic"] if k.startswith("score."))
    out["critic_head"] = s["critic"]["score.weight"].flatten()[:4].tolist()
    out["critic_head_std"] = s["critic"]["score.weight"].std().item()
    out["buffers_equal"] = set(s["buffers"]) == set(expected_buffers) and all(
        torch.equal(s["buffers"][k], expected_buffers[k]) for k in expected_buffers
    )
    out["logp_equal"] = torch.equal(s["logp"], f["logp"])
    out["ref_logp_equal"] = torch.equal(s["ref_logp"], f["ref_logp"])
    out["values_finite"] = bool(torch.isfinite(s["values"]).all())
    # The actor still trains from a sharded load (optimizer over the filled shards).
    cfg.model.load_format = "sharded"
    actor = make_actor(cfg, mesh)
    _KEEP.append(actor)
    batch.advantages = torch.randn(4, 4, generator=torch.Generator().manual_seed(1))
    actor.update(batch)
    out["moved_after_update"] = max((v - expected[k]).abs().max().item() for k, v in _weights(actor.model).items())
    return out


def main() -> None:
    out_path, *model_dirs = sys.argv[1:]
    env = read_env("cpu")
    init_world(env)
    mesh = fsdp_mesh("cpu", env.world_size, -1)
    report = []
    for model_dir in model_dirs:
        cfg = Config()
        cfg.model.path = model_dir
        cfg.actor.lr = 1e-2
        report.append(roles(cfg, mesh))
    gathered: list[object] = [None] * env.world_size
    dist.all_gather_object(gathered, report)
    if env.rank == 0:
        with open(out_path, "w") as f:
            json.dump(gathered, f)
    end_process()


if __name__ == "__main__":
    main()
