"""`fit`: what every rank runs around its rank program's steps (program.py; `build.build_program` picks it).

`fit` owns the cadence they share: resume, one `step` per global step, validation
(every engine generates its share, totals summed over every rank), metrics (the first actor rank writes)
and checkpoints (every rank writes its part; the barrier spans all of them).
"""

from __future__ import annotations

import json
import logging
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from torchrl_post.checkpoint.dcp import Checkpointer, rng_state, set_rng_state
from torchrl_post.config.errors import ConfigError
from torchrl_post.config.load import to_yaml
from torchrl_post.distributed import liveness
from torchrl_post.distributed.placement import Topology
from torchrl_post.faults import maybe_raise, maybe_signal
from torchrl_post.logging.metrics import MetricsLogger
from torchrl_post.logging.plots import plot_run
from torchrl_post.logging.timing import Timer
from torchrl_post.program import RankProgram
from torchrl_post.run import Run, package_versions

log = logging.getLogger("torchrl_post")


@dataclass(frozen=True)
class FitResult:
    """Where `fit` ended, the same on every rank."""

    step: int
    """The last global step (with trainer.val_only: the step of the model validated)."""
    validation: dict[str, float] = field(default_factory=dict)
    """The last validation's scores (val/test_score/<data_source>, ...); empty when none ran."""


def fit(run: Run, program: RankProgram) -> FitResult:
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
    checkpointer = Checkpointer(
        run.run_dir,
        run.env.rank,
        t.max_ckpt_to_keep,
        run.env.world_size,
        run.topo.barrier_all,
        partial_rollout=cfg.rollout.partial_rollout,
    )
    if run.is_main:
        run.run_dir.mkdir(parents=True, exist_ok=True)
        (run.run_dir / "config.yaml").write_text(to_yaml(cfg))
        (run.run_dir / "versions.json").write_text(json.dumps(package_versions(), indent=1) + "\n")
        # the run plan with every default by device resolved (what trainer.dry_run=true prints)
        (run.run_dir / "plan.txt").write_text(run.plan.describe(run.env.device.type, run.env.backend) + "\n")
    step = resume(run, program, checkpointer)
    if step == 0:
        program.after_resume()  # the first sync: engines may have started with dummy weights
    if t.val_only:
        result = FitResult(step, validate_only(run, program, step))
        metrics.close()
        return result
    if run.is_main:
        checkpointer.set_aside(after=step)  # another timeline's checkpoints: out of this run's way, kept
    run.topo.barrier_all()
    if step:
        metrics.resume_from(step)
    else:
        metrics.start_fresh()
    stop = StopSignal() if t.save_on_sigterm else None
    saved = step
    validating = run.val_data is not None and t.test_freq > 0
    scores: dict[str, float] = {}
    if step == 0 and validating and t.val_before_train:
        scores = validate(run, program, 0)
        metrics.log({"training/global_step": 0, **scores})
    while step < total:
        step += 1
        maybe_raise("raise_in_step", step, run.env.rank)
        maybe_signal("sigterm_in_step", step, run.env.rank)
        liveness.enter("step", step)
        out = program.step(step)
        liveness.enter("end_of_step")  # validation, the stop agreement, the checkpoint's barriers
        last = step == total
        if validating and (step % t.test_freq == 0 or last):
            timer = Timer()
            with timer("testing"):
                scores = validate(run, program, step)
            out |= scores
            out |= timer.metrics()
        metrics.log(out)
        stopping = stop is not None and stop.agreed(run.topo)
        if (t.save_freq > 0 and (step % t.save_freq == 0 or last)) or (stopping and saved < step):
            liveness.enter("checkpoint")
            state = {"rng": rng_state(), **program.state_dict()}
            path = checkpointer.save(step, program.trained_roles(), state, write_extra=program.write_hf)
            saved = step
            if run.is_main:
                log.info("saved checkpoint %s", path)
        if stopping:
            metrics.close()
            raise Stopped(step, checkpointer.step_dir(saved) if saved else None)
    if run.is_main:
        plots = plot_run(run.run_dir) if run.cfg.trainer.plots else "off (trainer.plots=false)"
        log.info("run finished at step %d; plots: %s", step, plots)
    metrics.close()
    return FitResult(step, scores)


class Stopped(Exception):
    """The run stopped early on a signal, at a step boundary, with its checkpoint saved."""

    def __init__(self, step: int, checkpoint: Path | None) -> None:
        self.step = step
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

    def agreed(self, topo: Topology) -> bool:
        flag = topo.sum_all(torch.tensor([float(self.received)]))
        return bool(flag.item() > 0)


def resume(run: Run, program: RankProgram, checkpointer: Checkpointer) -> int:
    """Restore the checkpoint trainer.resume_mode picks; returns its step (0: a fresh start)."""
    t = run.cfg.trainer
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
    if run.is_main:
        log.info("resumed from %s (step %d)", path, step)
    return step


@torch.no_grad()
def validate(run: Run, program: RankProgram, step: int) -> dict[str, float]:
    """Score per data_source over the whole validation set: the engines split it, every rank adds its totals.
    With rollout.val_kwargs.n > 1 also mean@n (over every sample) and pass@n (each prompt's best sample).
    The first engine writes trainer.log_val_generations samples to val_generations/step_<step>.jsonl."""
    data = run.val_data
    assert data is not None
    liveness.enter("validation", step)
    n = run.cfg.rollout.val_kwargs.n
    sources = sorted(set(data.data_sources))
    totals = run.topo.sum_all(program.validation_totals(data, sources))
    write_val_generations(run, program.val_samples(), step)
    if run.plan.sft:  # token NLL sums and trained tokens (rollout/supervised.py)
        out = {"val/loss": (totals[0].sum() / totals[1].sum().clamp(min=1)).item()}
        if len(sources) > 1:
            out |= {f"val/loss/{s}": (totals[0, j] / totals[1, j].clamp(min=1)).item() for j, s in enumerate(sources)}
        return out
    out = {}
    for j, src in enumerate(sources):
        mean = (totals[0, j] / totals[1, j]).item()
        out[f"val/test_score/{src}"] = mean
        if n > 1:
            out[f"val/test_score/{src}/mean@{n}"] = mean
            out[f"val/test_score/{src}/pass@{n}"] = (totals[2, j] * n / totals[1, j]).item()
    return out


def validate_only(run: Run, program: RankProgram, step: int) -> dict[str, float]:
    """trainer.val_only: score the model (or the resumed checkpoint), print it, append it to val_only.jsonl;
    returns the scores."""
    if run.val_data is None:
        raise ConfigError("trainer.val_only=true needs data.val_files (in Python: val_data)")
    scores = validate(run, program, step)
    out = {"training/global_step": float(step), **scores}
    if run.is_main:
        with (run.run_dir / "val_only.jsonl").open("a") as f:
            f.write(json.dumps(out) + "\n")
        line = " | ".join(f"{k.removeprefix('val/test_score/')} {v:.3f}" for k, v in scores.items())
        print(f"validation at step {step}: {line}", flush=True)
    return scores


def write_val_generations(run: Run, samples: list[dict[str, Any]], step: int) -> None:
    """trainer.log_val_generations: this rank's kept validation samples as val_generations/step_<N>.jsonl."""
    if not samples:
        return
    out = run.run_dir / "val_generations"
    out.mkdir(parents=True, exist_ok=True)
    with (out / f"step_{step}.jsonl").open("w") as f:
        for sample in samples:
            f.write(json.dumps(sample, default=str) + "\n")
