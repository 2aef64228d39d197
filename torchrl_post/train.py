"""Entrypoint: config -> placement check -> process groups -> this rank's program -> fit.

    torchrun --standalone --nproc-per-node 2 -m torchrl_post.train [--config-path DIR] [--config-name NAME] [key=value ...]
    torchrun --standalone --nproc-per-node 2 $(which torchrl-post-train) ...   # the console script
    python -m torchrl_post.train trainer.dry_run=true        # print the plan, load nothing

User errors (config, data, paths) end the run with one line on stderr and exit code 2.
"""

from __future__ import annotations

import logging
import os
import sys

from torchrl_post.config import UserError, load_config
from torchrl_post.config.errors import ConfigError
from torchrl_post.config.schema import Config
from torchrl_post.config.validate import resolve_roles, validate_batch, validate_placement
from torchrl_post.distributed.env import end_process, read_env, shutdown_distributed
from torchrl_post.distributed.placement import Placement, plan_placement

# torchrun's global rank, read before a cell's process group rewrites RANK to the rank within the cell.
_LAUNCH_RANK = os.environ.get("RANK", "0")


def _report(msg: str) -> None:
    if _LAUNCH_RANK == "0":
        print(f"error: {msg}", file=sys.stderr, flush=True)


def _fail(msg: str) -> None:
    _report(msg)
    sys.exit(2)


def _parse_args(argv: list[str]) -> tuple[str, str | None, list[str]]:
    """(--config-name, --config-path, the key=value overrides), as Hydra users type them (`-cn` / `-cp` too)."""
    name, path, overrides, it = "config", None, [], iter(argv)
    for arg in it:
        if arg in ("--config-name", "-cn"):
            name = next(it, name)
        elif arg.startswith("--config-name="):
            name = arg.split("=", 1)[1]
        elif arg in ("--config-path", "-cp"):
            path = next(it, path)
        elif arg.startswith("--config-path="):
            path = arg.split("=", 1)[1]
        else:
            overrides.append(arg)
    return name, path, overrides


def planned_world(configured: int | None, launched: int, under_torchrun: bool) -> int:
    if configured is None:
        return launched
    if configured < 1:
        raise ConfigError(f"trainer.world_size={configured} must be >= 1 (or null for torchrun's world)")
    if under_torchrun and configured != launched:
        raise ConfigError(
            f"trainer.world_size={configured} but torchrun started {launched} processes; drop the key or match it"
        )
    return configured


def describe_plan(cfg: Config, placement: Placement, plan: dict[str, int], device: str, backend: str) -> str:
    """The dry-run plan: roles -> ranks, meshes, engines, the sync group and the per-rank batch arithmetic."""
    lines = [placement.describe(), f"  device {device}, backend {backend}"]
    for role, fsdp in (("actor", cfg.actor.fsdp), ("critic", cfg.critic.fsdp), ("reference", cfg.actor.fsdp)):
        if role not in placement.ranks:
            continue
        n = len(placement.ranks[role])
        if 0 < fsdp.fsdp_size < n:
            lines.append(
                f"  {role} mesh ('dp_replicate', 'dp_shard') = ({n // fsdp.fsdp_size}, {fsdp.fsdp_size}) (HSDP)"
            )
        else:
            lines.append(f"  {role} mesh ('dp',) = ({n},) (FSDP)")
    tp = cfg.rollout.tensor_parallel_size
    roll = placement.ranks["rollout"]
    engines = [roll[i : i + tp] for i in range(0, len(roll), tp)]
    lines.append(f"  rollout engines ({cfg.rollout.engine}, tensor_parallel_size={tp}): {engines}")
    ahead = cfg.trainer.max_off_policy_steps
    lines.append(
        f"  rollout mode: {cfg.rollout.mode}, trainer.max_off_policy_steps={ahead}"
        + (" (on-policy)" if not ahead else "")
    )
    if not placement.colocated["rollout"]:
        lines.append(
            f"  batch transfer: whole prompt groups ({cfg.rollout.n} samples) from {len(engines)} engine(s) to "
            f"{len(placement.ranks['actor'])} actor ranks, equal counts, balanced by tokens"
        )
    lines += [f"  {k}: {v}" for k, v in plan.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    name, path, overrides = _parse_args(sys.argv[1:] if argv is None else argv)
    try:
        cfg = load_config(overrides, name, path)
        env = read_env(cfg.trainer.device)
        role_notes = resolve_roles(cfg)
        world = planned_world(cfg.trainer.world_size, env.world_size, "WORLD_SIZE" in os.environ)
        placement = plan_placement(cfg.placement, world)
        validate_placement(cfg, placement.ranks, placement.colocated)
        others: dict[str, int] = {r: len(placement.ranks[r]) for r in ("critic", "reference") if r in placement.ranks}
        engines = len(placement.ranks["rollout"]) // cfg.rollout.tensor_parallel_size
        plan = validate_batch(cfg, len(placement.ranks["actor"]), engines, others)
    except UserError as e:
        _fail(str(e))
        return
    if env.is_main:
        for note in role_notes:
            print(f"note: {note}", flush=True)
    if cfg.trainer.dry_run:
        if env.is_main:
            print(describe_plan(cfg, placement, plan, env.device.type, env.backend))
        return
    logging.basicConfig(
        level=logging.INFO if env.is_main else logging.WARNING,
        format=f"[rank{env.rank}] %(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    from torchrl_post.distributed.placement import Topology
    from torchrl_post.loop import Run, Stopped, claim_run_dir, fit
    from torchrl_post.trainer import build_program

    program, code = None, 0
    try:
        fsdp_sizes = {"actor": cfg.actor.fsdp.fsdp_size, "critic": cfg.critic.fsdp.fsdp_size}
        fsdp_sizes["reference"] = cfg.actor.fsdp.fsdp_size
        topo = Topology(placement, env, fsdp_sizes, cfg.rollout.tensor_parallel_size)
        claim_run_dir(cfg, env, topo)
        program = build_program(Run.prepare(cfg, env, topo))
        fit(program)
    except UserError as e:
        _report(str(e))
        code = 2
    except Stopped as e:
        if _LAUNCH_RANK == "0":
            print(str(e), flush=True)
    finally:
        if program is not None:
            program.shutdown()
        shutdown_distributed()
    end_process(code)


if __name__ == "__main__":
    main()
