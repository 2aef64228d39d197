"""Entrypoint: config -> placement check -> process group -> Trainer(cfg).fit().

    torchrun --standalone --nproc-per-node 2 -m torchrl_post.train [key=value ...]
    python -m torchrl_post.train trainer.dry_run=true        # print the plan, load nothing

User errors (config, data, paths) end the run with one line on stderr and exit code 2.
"""

from __future__ import annotations

import logging
import os
import sys

from torchrl_post.config import UserError, load_config
from torchrl_post.config.validate import resolve_roles, validate_batch
from torchrl_post.distributed.env import init_distributed, read_env, shutdown_distributed
from torchrl_post.distributed.placement import plan_placement


def _fail(msg: str) -> None:
    if os.environ.get("RANK", "0") == "0":
        print(f"error: {msg}", file=sys.stderr, flush=True)
    sys.exit(2)


def _parse_args(argv: list[str]) -> tuple[str, list[str]]:
    name, overrides, it = "config", [], iter(argv)
    for arg in it:
        if arg == "--config-name":
            name = next(it, name)
        elif arg.startswith("--config-name="):
            name = arg.split("=", 1)[1]
        else:
            overrides.append(arg)
    return name, overrides


def main(argv: list[str] | None = None) -> None:
    name, overrides = _parse_args(sys.argv[1:] if argv is None else argv)
    try:
        cfg = load_config(overrides, name)
        env = read_env(cfg.trainer.device)
        role_notes = resolve_roles(cfg)
        placement = plan_placement(cfg.placement, env.world_size)
        plan = validate_batch(cfg, len(placement.ranks["actor"]), len(placement.ranks["rollout"]))
    except UserError as e:
        _fail(str(e))
        return
    if env.is_main:
        for note in role_notes:
            print(f"note: {note}", flush=True)
    if cfg.trainer.dry_run:
        if env.is_main:
            print(placement.describe())
            print(
                f"  device {env.device.type}, backend {env.backend}, actor mesh ('dp',) = ({len(placement.ranks['actor'])},)"
            )
            for k, v in plan.items():
                print(f"  {k}: {v}")
        return
    logging.basicConfig(
        level=logging.INFO if env.is_main else logging.WARNING,
        format=f"[rank{env.rank}] %(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    init_distributed(env)
    trainer = None
    try:
        from torchrl_post.trainer import Trainer

        trainer = Trainer(cfg, env, placement)
        trainer.fit()
    except UserError as e:
        _fail(str(e))
    finally:
        if trainer is not None:
            trainer.shutdown()
        shutdown_distributed()


if __name__ == "__main__":
    main()
