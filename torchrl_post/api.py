"""The Python API: a config, Python objects where the command line takes import paths and files, then one call
that trains (`train`) or only validates (`validate`).

    from torchrl_post.api import config, train
    cfg = config(sys.argv[1:], name="math_agent")            # configs/math_agent.yaml, then key=value overrides
    train(cfg, env_cls=MathEnv, agent_cls=ToolAgent, tools=[calculator], train_data=rows, val_data=val_rows)

    torchrun --standalone --nproc-per-node 2 examples/train_math_agent.py trainer.total_training_steps=20

Every rank runs the same script and builds the same objects: nothing is pickled between ranks. The objects
replace the keys that name them (`components.label_config`: reward.function, agent.env / agent.agent,
agent.tools, data.train_files / data.val_files), so the plan, the checks and the run's config.yaml see them.
The command line (`train.py`) is a client of the same calls: it composes the config from its arguments and
calls `run`, which resolves the import paths into the same objects once (`components.resolve_components`).

A user error (config, data, paths) is reported as the command line reports it: one line on stderr from the
first rank. `train` and `validate` raise it too; uncaught, it ends the script with exit code 2 and no
traceback. Once training has started, the process ends without interpreter finalization, as the command
line's does (`distributed.env.end_process`: a gloo thread can abort it after work that succeeded): exit code 0
at the script's end, 1 after another uncaught exception (a `sys.exit(n)` after `train` still ends with 0).
"""

from __future__ import annotations

import atexit
import copy
import logging
import re
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, is_dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from torchrl_post.agent.base import Agent, Env
from torchrl_post.components import Given, Tools, label_config, resolve_components
from torchrl_post.config import Config, ConfigError, UserError, load_config
from torchrl_post.config.errors import one_line, stderr_line
from torchrl_post.config.validate import validate as check_config
from torchrl_post.distributed.env import (
    DistEnv,
    end_process,
    launch_rank,
    open_store,
    read_env,
    shutdown_distributed,
    under_torchrun,
)
from torchrl_post.distributed.liveness import Watchdog
from torchrl_post.logging.metrics import check_loggers
from torchrl_post.plan import RunPlan, plan_run, planned_world
from torchrl_post.reward import RewardFn

REPORT_GRACE_S = 5.0


@dataclass(frozen=True)
class RunResult:
    """Where a run ended, the same on every rank."""

    run_dir: Path
    """trainer.default_local_dir: metrics.jsonl, checkpoints/, config.yaml, plan.txt."""
    step: int
    """The last global step trained (validate: the step of the model validated)."""
    validation: dict[str, float] = field(default_factory=dict)
    """The last validation's scores (val/test_score/<data_source>, ...); empty when none ran."""
    stopped: bool = False
    """Stopped early on SIGTERM (trainer.save_on_sigterm), its checkpoint saved."""
    dry_run: bool = False
    """trainer.dry_run: the plans were printed, nothing loaded."""


def config(
    overrides: Sequence[str] | None = None, name: str | None = None, path: str | None = None, **sections: Any
) -> Config:
    """The config: `<name>.yaml` (the shipped configs/, or `path` first, as --config-name / --config-path; None:
    configs/config.yaml, or the peer's base when the keys are one peer's: verl.yaml, roll.yaml, trl.yaml,
    openrlhf.yaml), then `sections` (a dict of keys, or a section's dataclass, which sets all of its keys), then the
    `key=value` `overrides` (the command line's: a script passes sys.argv[1:], which win over what the script sets).
    Validated; a user error is one ConfigError line naming the key.

        config(sys.argv[1:], name="lora", trainer={"total_training_steps": 20}, model=ModelConfig(path="m"))

    A Config built from the dataclasses themselves (`Config(model=ModelConfig(path=...))`) may be passed to
    `train` as it is: it is validated there."""
    _EXIT.hook()
    pre = [o for key, value in sections.items() for o in section_overrides(key, value)]
    return load_config([*pre, *(overrides or [])], name, path, notes=_ALIAS_NOTES)


def train(
    cfg: Config | Mapping[str, Any],
    *,
    reward_fn: RewardFn | None = None,
    train_data: Any = None,
    val_data: Any = None,
    agent_cls: Callable[..., Agent] | None = None,
    agent_args: Mapping[str, Any] | None = None,
    env_cls: Callable[..., Env] | None = None,
    env_args: Mapping[str, Any] | None = None,
    tools: Tools | None = None,
) -> RunResult:
    """Train with `cfg` on every rank of this torchrun world (a plain `python` run is a world of one). `cfg` is a
    Config, or a dict or OmegaConf DictConfig of its keys (`as_config`). Each
    object given replaces the key that names it; None leaves the key in charge:

    - reward_fn: reward.function, a function of (data_source, solution_str, ground_truth, extra_info), or TRL's
      (completions, **kwargs) -> list (reward/trl_signature.py)
    - train_data, val_data: data.train_files, data.val_files; rows as a list of dicts or a datasets.Dataset,
      parsed and checked as file rows (a bad row: `train_data[3]: ...`)
    - env_cls, env_args: agent.env; `env_cls(**env_args)` for every trajectory
    - agent_cls, agent_args: agent.agent; `agent_cls(**agent_args)`
    - tools: agent.tools; functions (named by __name__), built-in names or import paths, or a dict by name

    trainer.dry_run=true prints the run plan and the memory plan and returns. A SIGTERM stops the run after a
    step with a checkpoint (`stopped`); run the same script to resume."""
    given = Given(reward_fn, train_data, val_data, agent_cls, agent_args, env_cls, env_args, tools)
    _EXIT.hook()
    return run(cfg, given)


def validate(
    cfg: Config | Mapping[str, Any],
    *,
    reward_fn: RewardFn | None = None,
    train_data: Any = None,
    val_data: Any = None,
    agent_cls: Callable[..., Agent] | None = None,
    agent_args: Mapping[str, Any] | None = None,
    env_cls: Callable[..., Env] | None = None,
    env_args: Mapping[str, Any] | None = None,
    tools: Tools | None = None,
) -> RunResult:
    """Only validate (trainer.val_only=true): score the model, or the checkpoint trainer.resume_mode picks, on the
    validation rows (`val_data`, else data.val_files); print the scores and append them to val_only.jsonl in the
    run directory. Takes `train`'s objects."""
    given = Given(reward_fn, train_data, val_data, agent_cls, agent_args, env_cls, env_args, tools)
    _EXIT.hook()
    return run(cfg, given, val_only=True)


def run(
    cfg: Config | Mapping[str, Any],
    given: Given | None = None,
    *,
    val_only: bool = False,
    notes: Sequence[str] = (),
    process_ends: bool = False,
) -> RunResult:
    """What `train` and `validate` do, without their hook on the script's uncaught errors: the command line
    calls it. `notes`: printed (first rank) with the plan's. A user error is reported (`report_error`), then
    raised. `process_ends`: the caller ends the process right after (`end_process`), so the engines free only
    what would outlive it."""
    try:
        cfg = as_config(cfg)
        notes = [*dict.fromkeys([*_ALIAS_NOTES, *notes])]
        return _run(cfg, given or Given(), val_only, notes, process_ends)
    except UserError as e:
        report_error(e)
        raise


def as_config(cfg: Any) -> Config:
    """`cfg` as the schema's Config: a Config as it is; a dict or an OmegaConf DictConfig (a script that composed its
    own, or read a run's config.yaml) as `config(**cfg)` reads it: its keys over configs/config.yaml, through the
    same overrides, aliases and checks as the command line's, so an unknown or aliased key says what it says there.
    Anything else is one line naming what was given."""
    if isinstance(cfg, Config):
        return cfg
    if isinstance(cfg, DictConfig):
        try:
            cfg = OmegaConf.to_container(cfg, resolve=True)
        except OmegaConfBaseException as e:
            raise ConfigError(
                f"the config given is an OmegaConf DictConfig that cannot be resolved ({one_line(e)})"
            ) from e
    if isinstance(cfg, Mapping):
        pre = [o for key, value in cfg.items() for o in section_overrides(str(key), value)]
        return load_config(pre, notes=_ALIAS_NOTES)
    shown = f"{type(cfg).__name__} {cfg!r}"
    raise ConfigError(
        f"the config given is a {shown[:80]}; pass a Config (torchrl_post.api.config(overrides, name=...) builds one "
        "from key=value overrides), or a dict or OmegaConf DictConfig of its keys"
    )


_OUTLIVED: list[object] = []
"""The programs of runs whose process ends right after (`process_ends`): kept referenced until it does."""
_ALIAS_NOTES: list[str] = []
"""Notes of the verl / rLLM / ROLL / TRL keys `config` rewrote (a script's command-line overrides), printed by the
run with the plan's."""


def report_error(e: UserError) -> None:
    """One line on stderr from the first rank, once per error. Every rank usually meets the same error; the
    other ranks give that line time to be written before they go on: a rank that exits first makes torchrun
    stop the others (and the first rank may be a moment behind on a busy machine). An error only another rank
    meets (a role on ranks of its own, which starts sooner) is written by that rank after the wait, with its
    rank: the first rank, still starting, never sees it."""
    if getattr(e, "reported", False):
        return
    setattr(e, "reported", True)  # noqa: B010  # the same error passes through run() and the caller's handler
    rank = launch_rank()
    if rank == 0:
        stderr_line(f"error: {e}")
    else:
        time.sleep(REPORT_GRACE_S)
        stderr_line(f"error (rank {rank}): {e}")


def _run(cfg: Config, given: Given, val_only: bool, notes: list[str], process_ends: bool) -> RunResult:
    cfg = copy.deepcopy(cfg)  # the caller's stays as it was
    if val_only:
        cfg.trainer.val_only = True
    notes += label_config(cfg, given)
    check_config(cfg)
    env = read_env(cfg.trainer.device, need_device=not cfg.trainer.dry_run)
    world = planned_world(cfg.trainer.world_size, env.world_size, under_torchrun())
    plan = plan_run(cfg, world, env.device.type)
    if env.is_main:
        for note in [*notes, *plan.notes]:
            print(f"note: {note}", flush=True)
    run_dir = Path(cfg.trainer.default_local_dir)
    # import errors now, on every rank, before anything loads; in a dry run too (a reward file that does not import)
    parts = resolve_components(cfg, given)
    if cfg.trainer.dry_run:
        _dry_run(cfg, plan, env)
        return RunResult(run_dir, 0, dry_run=True)
    check_memory(cfg, plan, env)
    check_loggers(list(cfg.trainer.logger))  # a missing package or W&B key: one line before anything loads
    logging.basicConfig(
        level=logging.INFO if env.is_main else logging.WARNING,
        format=f"[rank{env.rank}] %(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    from torchrl_post.build import build_program
    from torchrl_post.distributed.placement import Topology
    from torchrl_post.loop import Stopped, fit
    from torchrl_post.run import Run, claim_run_dir

    _EXIT.start()
    program, watch = None, None
    try:
        topo = Topology(
            plan.placement,
            env,
            plan.fsdp_sizes,
            plan.tensor_parallel_size,
            timeout_s=plan.deadlines.collective_s,
            sp=plan.sequence_parallel,
            ep_sizes=plan.expert_parallel_sizes,
        )
        watch = _watch(plan, env)
        claim_run_dir(cfg, env, topo)
        prepared = Run.prepare(cfg, plan, env, topo, parts)
        program = build_program(prepared)
        result = fit(prepared, program)
        return RunResult(run_dir, result.step, result.validation)
    except UserError as e:
        report_error(e)  # now, before the engines shut down
        raise
    except Stopped as e:
        if launch_rank() == 0:
            print(str(e), flush=True)
        return RunResult(run_dir, e.step, stopped=True)
    except BaseException as e:
        if watch is not None and watch.explains(e):  # a wait that a silent rank broke: the watch ends the process
            raise
        process_ends = False  # a crash: the traceback and the interpreter's finalization follow, engines torn down
        raise
    finally:
        if watch is not None:
            watch.stop()
        if program is not None:
            program.shutdown(process_ends)
            if process_ends:  # dropped by the process's end: the engine's own teardown (a gc pass, vLLM's groups
                _OUTLIVED.append(program)  # after ours are gone) would only cost seconds and print a traceback
        shutdown_distributed()


def _watch(plan: RunPlan, env: DistEnv) -> Watchdog | None:
    """This rank's liveness watch (distributed/liveness.py), started; None in a world of one."""
    if env.world_size == 1:
        return None
    world = plan.placement.world_size
    roles = {r: "+".join(plan.placement.roles_of(r)) for r in range(world)}
    store = open_store(env, plan.deadlines.silence_s, client=True)
    watch = Watchdog(store, env.rank, world, roles, plan.deadlines)
    watch.start()
    return watch


def check_memory(cfg: Config, plan: RunPlan, env: DistEnv) -> None:
    """On CUDA a real run refuses, as its dry run does, a config its memory plan predicts will not fit the memory free
    on the card: one line naming the keys, before any model loads (else it would load for minutes and fail at the
    first wake). trainer.memory_check=false skips it (the plan is an estimate)."""
    if env.device.type != "cuda" or not cfg.trainer.memory_check:
        return
    from torchrl_post.memory_plan import memory_plan_for_run

    memory = memory_plan_for_run(cfg, plan, "cuda", env.local_rank, free=True)
    if memory is not None:
        memory.check()


def _dry_run(cfg: Config, plan: RunPlan, env: DistEnv) -> None:
    """Print the run plan and the memory plan (from model.path's config.json; nothing loads). The run's own
    preflight checks come first (`config/preflight.py`: the model's config.json against the config, the run and
    resume directories), so that a dry run refuses what the run would, with the same line; a config that cannot fit
    the card raises a ConfigError naming the keys to change."""
    from torchrl_post.config.preflight import check_critic, check_judge, check_reward_model, preflight
    from torchrl_post.memory_plan import memory_plan_for_run  # transformers, for config.json: only a dry run needs it

    preflight(cfg, dry_run=True)
    check_critic(cfg, used=plan.critic != "none", weights=False)
    check_reward_model(cfg, used=plan.reward_model != "none", weights=False)
    check_judge(cfg, weights=False)
    if env.is_main:
        print(plan.describe(env.device.type, env.backend), flush=True)
    memory = memory_plan_for_run(cfg, plan, env.device.type, env.local_rank)
    if env.is_main:
        skipped = f"memory plan: skipped (model.path={cfg.model.path!r} does not exist yet; the run itself needs it)"
        print(memory.describe() if memory else skipped, flush=True)
    if memory is not None:
        memory.check()


# ---- sections as overrides ------------------------------------------------------------------------------------
def section_overrides(key: str, value: Any) -> list[str]:
    """`key=value` overrides (Hydra's grammar) that set `value` at `key`: a dict or dataclass sets each of its keys,
    a list is one value; strings are quoted so that none of their characters is read as grammar."""
    if is_dataclass(value) and not isinstance(value, type):
        value = asdict(value)
    if isinstance(value, (DictConfig, ListConfig)):
        value = OmegaConf.to_container(value, resolve=True)
    if isinstance(value, Mapping):
        return [o for k, v in value.items() for o in section_overrides(f"{key}.{k}", v)]
    return [f"{key}={_override_value(value)}"]


def _override_value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_override_value(v) for v in value) + "]"
    if isinstance(value, Path):
        value = str(value)
    if isinstance(value, str):
        # Hydra unescapes only the backslashes before a quote or at the end of a quoted string.
        escaped = re.sub(r"(\\+)(?='|$)", lambda m: m.group(1) * 2, value).replace("'", "\\'")
        return f"'{escaped}'"
    raise ConfigError(f"config value {value!r} ({type(value).__name__}) is not a string, number, bool, list or None")


# ---- how a script's process ends ------------------------------------------------------------------------------
class _ProcessEnd:
    """A script that called `config`, `train` or `validate` ends as the command line does: an uncaught user error as one
    line and exit code 2; once training has started, without interpreter finalization (`end_process`)."""

    def __init__(self) -> None:
        self.hooked = False
        self.started = False

    def hook(self) -> None:
        if self.hooked:
            return
        self.hooked = True
        previous = sys.excepthook

        def excepthook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
            if isinstance(value, UserError):
                report_error(value)
                end_process(2)
            previous(kind, value, tb)
            if self.started:
                end_process(1)

        sys.excepthook = excepthook

    def start(self) -> None:
        """Training starts: from here a script ends through `end_process` (the command line calls it itself, and
        an uncaught exception there must keep its exit code 1: only a script's hook is armed)."""
        if self.hooked and not self.started:
            self.started = True
            atexit.register(end_process, 0)


_EXIT = _ProcessEnd()
