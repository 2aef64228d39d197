"""Entrypoint: config -> run plan -> process groups -> this rank's program -> fit.

    torchrun --standalone --nproc-per-node 2 -m torchrl_post.train [--config-path DIR] [--config-name NAME] [key=value ...]
    torchrun --standalone --nproc-per-node 2 $(which torchrl-post-train) ...   # the console script
    python -m torchrl_post.train trainer.dry_run=true        # print the plan, load nothing

User errors (config, data, paths) end the run with one line on stderr and exit code 2.
"""

from __future__ import annotations

import logging
import sys
import time

from torchrl_post.config import Config, UserError, load_config
from torchrl_post.distributed.env import (
    DistEnv,
    end_process,
    launch_rank,
    read_env,
    shutdown_distributed,
    under_torchrun,
)
from torchrl_post.plan import RunPlan, plan_run, planned_world

# Read before a cell's process group rewrites RANK to the rank within the cell.
_LAUNCH_RANK = launch_rank()
REPORT_GRACE_S = 5.0


def _report(msg: str) -> None:
    if _LAUNCH_RANK == 0:
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


def _dry_run(cfg: Config, plan: RunPlan, env: DistEnv) -> None:
    """Print the run plan and the memory plan (from model.path's config.json; nothing loads); a config that cannot
    fit the card raises a ConfigError naming the keys to change."""
    from torchrl_post.memory_plan import memory_plan_for_run  # transformers, for config.json: only a dry run needs it

    if env.is_main:
        print(plan.describe(env.device.type, env.backend), flush=True)
    memory = memory_plan_for_run(cfg, plan, env.device.type, env.local_rank)
    if env.is_main:
        print(memory.describe() if memory else f"memory plan: skipped (no config.json in {cfg.model.path})", flush=True)
    if memory is not None:
        memory.check()


def main(argv: list[str] | None = None) -> None:
    name, path, overrides = _parse_args(sys.argv[1:] if argv is None else argv)
    alias_notes: list[str] = []
    try:
        cfg = load_config(overrides, name, path, notes=alias_notes)
        env = read_env(cfg.trainer.device, need_device=not cfg.trainer.dry_run)
        world = planned_world(cfg.trainer.world_size, env.world_size, under_torchrun())
        plan = plan_run(cfg, world, env.device.type)
    except UserError as e:
        _fail(str(e))
        return
    if env.is_main:
        for note in (*alias_notes, *plan.notes):
            print(f"note: {note}", flush=True)
    if cfg.trainer.dry_run:
        try:
            _dry_run(cfg, plan, env)
        except UserError as e:
            _fail(str(e))
        return
    logging.basicConfig(
        level=logging.INFO if env.is_main else logging.WARNING,
        format=f"[rank{env.rank}] %(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    from torchrl_post.build import build_program
    from torchrl_post.distributed.placement import Topology
    from torchrl_post.loop import Stopped, fit
    from torchrl_post.run import Run, claim_run_dir

    program, code = None, 0
    try:
        topo = Topology(plan.placement, env, plan.fsdp_sizes, plan.tensor_parallel_size)
        claim_run_dir(cfg, env, topo)
        run = Run.prepare(cfg, plan, env, topo)
        program = build_program(run)
        fit(run, program)
    except UserError as e:
        _report(str(e))
        code = 2
        if _LAUNCH_RANK != 0:
            # Every rank usually meets the same error; the first rank reports it. A rank that exits first makes
            # torchrun stop the others, so wait for the first rank's line (it may still be writing the run's files).
            time.sleep(REPORT_GRACE_S)
    except Stopped as e:
        if _LAUNCH_RANK == 0:
            print(str(e), flush=True)
    finally:
        if program is not None:
            program.shutdown()
        shutdown_distributed()
    end_process(code)


if __name__ == "__main__":
    main()
