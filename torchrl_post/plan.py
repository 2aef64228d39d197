"""The run plan: every run-wide decision, made once from the config and the launched world size.

    plan = plan_run(cfg, world_size)      # pure: no process group, no file read, no model
    print(plan.describe(device, backend)) # what trainer.dry_run=true prints

The plan answers what the rest of the program would otherwise decide again in several places: which roles
exist and on which ranks (with their FSDP meshes), the group size, samples per mini-batch per rank of each
trained role, whether the step needs old logprobs, where the reference comes from (its own model, here or on
its own ranks, or the actor with its LoRA adapter off), whether a critic exists, how LoRA weights reach the
engine, which weight sync runs and its bucket size (bytes, the only unit below the config), the rollout
correction (importance weights and rejection), the top-k / top-p support the trainer's logprobs are renormalised
on, and the total number of steps once the data's size is known.

Every error is one `ConfigError` line naming the key and the fix. The config is never changed: a role the
algorithm needs but the user did not place is placed in the plan (with a note), one placed but unused is left
out of it (with a note).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from torchrl_post.algos.estimators import NEEDS_VALUES
from torchrl_post.algos.rollout_correction import RolloutCorrection, rs_band
from torchrl_post.algos.sampling_support import Truncation, sampler_truncation
from torchrl_post.config.aliases import DEFAULTS_FROM
from torchrl_post.config.errors import ConfigError
from torchrl_post.config.precision import resolve_dtype
from torchrl_post.config.schema import SELF_JUDGE, Config, FSDPConfig, PlacementConfig
from torchrl_post.config.validate import mini_batch_prompts, validate_batch, validate_placement
from torchrl_post.distributed.liveness import Deadlines, deadlines
from torchrl_post.distributed.placement import SERVED, Placement, mesh_shape, plan_placement
from torchrl_post.engines.base import ENGINE_SHARE_OF_FREE, EngineSpec
from torchrl_post.rollout.filters import masked_reasons
from torchrl_post.rollout.taken import Fill

Where = Literal["none", "colocated", "own_ranks"]
ReferenceSource = Literal["none", "colocated", "own_ranks", "adapter_off"]
LoraSync = Literal["none", "merged", "adapter"]
SyncKind = Literal["reload", "broadcast"]
MB = 1 << 20


@dataclass(frozen=True)
class RolePlan:
    """A trained or forward-only role (actor, critic, reference) on its ranks."""

    ranks: tuple[int, ...]
    colocated: bool
    """Shares the actor's ranks (always true for the actor)."""
    fsdp: FSDPConfig
    """The FSDP settings it is wrapped with (the reference takes the actor's)."""
    mesh_dims: tuple[str, ...]
    mesh_shape: tuple[int, ...]
    mini_batch_samples: int
    """Samples per optimizer step (trained roles) drawn by each of its ranks (with sequence parallelism, the
    ranks of an sp group train the union of theirs)."""
    sequence_parallel: int = 1
    """Ulysses sp group size (model.ulysses_sequence_parallel_size): the (dp, sp) layout over its FSDP ranks."""
    micro_batch_samples: int = 0
    """Trained roles: samples per forward and backward of an update (its ppo_micro_batch_size_per_gpu, at most a
    mini-batch of the rows it splits: the sp group's, each rank holding 1/sp of their tokens); 0 for the reference,
    which only forwards. Fixed-size micro-batches (actor.use_dynamic_bsz packs by a token budget instead)."""
    expert_parallel: int = 1
    """MoE routed experts over an ep group of this many ranks (fsdp.expert_parallel_size): the sparse mesh
    (efsdp, ep) = (ranks / ep, ep) beside the dense one (`distributed/placement.py: expert_mesh`)."""

    @property
    def where(self) -> Where:
        return "colocated" if self.colocated else "own_ranks"


@dataclass(frozen=True)
class RunPlan:
    placement: Placement
    roles: dict[str, RolePlan]
    """actor, and critic / reference where they exist as models of their own."""
    group_size: int
    """Samples per prompt (rollout.n): the GRPO/RLOO group."""
    prompts_per_step: int
    mini_batch_prompts: int
    ppo_epochs: int
    tensor_parallel_size: int
    rollout_engine: str
    """rollout.engine: vllm or hf."""
    engines: int
    """Rollout engines (one per tensor_parallel_size rollout ranks)."""
    needs_old_log_probs: bool
    """An extra forward for the old policy's logprobs: several updates per batch, a KL in the reward, or a
    rollout correction that rejects (its mask sets the loss denominators before the update)."""
    reference: ReferenceSource
    critic: Where
    reward_model: Where
    """The frozen reward model (reward_model.enable): with the actor, on ranks of its own, or none."""
    teacher: Where
    """The frozen distillation teacher (distillation.enable): with the actor, on ranks of its own, or none."""
    teacher_top_k: int
    """What the teacher answers: 0, its logprob of each sampled token (`Batch.teacher_log_probs`, the estimator
    loss modes); k, its k most likely tokens at each position (`Batch.teacher_topk`, loss_mode=forward_kl_topk)."""

    @property
    def teacher_field(self) -> str:
        """The batch field the teacher's answer fills (`teacher_top_k`)."""
        return "teacher_topk" if self.teacher_top_k else "teacher_log_probs"

    reward_weights: dict[str, float]
    """Reward source -> weight of each training score (reward.weights, or the one source there is:
    reward/mixing.py); reward.combine says how they combine."""
    reward_combine: str
    lora_sync: LoraSync
    sync: SyncKind
    """reload: every colocated actor rank pushes into its engine; broadcast: to rollout ranks."""
    sync_bucket_bytes: int
    rollout_correction: RolloutCorrection
    """Importance weights and rejection against the rollout logprobs (algorithm.rollout_correction.*)."""
    masked_reasons: tuple[str, ...]
    """Termination reasons whose samples compact filtering masks (none unless it is on)."""
    max_off_policy_steps: int
    fill: Fill
    """How the rollout producer fills (rollout/groups.py): whole batches or partial rollouts, how far ahead."""
    total_epochs: int
    total_training_steps: int | None
    engine: EngineSpec
    """The engines' part of the plan (the training loop pushes the actor's weights before generating)."""
    sft: bool = False
    """Supervised fine-tuning (sft.enable): no engine, no weight sync; each step's batch is the data's responses
    (rollout/supervised.py), the actor's loss their token negative log-likelihood, validation `val/loss`."""
    self_judge: bool = False
    """reward.judge.model=policy: the judge is the policy, its engine loaded at every weight sync."""
    judge_engine_kind: str = "vllm"
    """reward.judge.engine, or rollout.engine."""
    judge_engine: EngineSpec | None = None
    """A co-hosted judge's engine (reward.judge.enable with no url; reward/judge_local.py): one more in-process
    engine on every rollout rank, its weights from reward.judge.model, never asleep; max_model_len 0: the judge's
    positions. None: no judge, or a judge served by URL."""
    model_dtype: str = "float32"
    """model.dtype: the trained models' weights (the master copy under mixed precision)."""
    device: str = "cpu"
    """cpu or cuda: what the defaults by device below were resolved for."""
    max_logprob_diff: float = 1e-4
    """The engine/trainer mismatch warning's threshold (trainer.max_logprob_diff, or by precision); 0: off."""
    router_replay: bool = False
    """Mixture-of-experts models: the actor's and reference's routers use the engine's recorded experts
    (actor.router_replay; the engine records them: `engine.record_routes`)."""
    sampling_support: Truncation | None = None
    """The training sampler's top-k / top-p that the actor's and the reference's logprobs are renormalised on, as
    the engine's processed logprobs are (actor.renormalize_logprobs_on_support); None: the full vocabulary."""
    skip_zero_advantage: bool = False
    """The update skips samples whose trained tokens all have advantage 0 (actor.skip_zero_advantage, where no
    other loss term reads them)."""
    deadlines: Deadlines = field(default_factory=lambda: deadlines(300.0))
    """How long a rank may be silent (trainer.wait_timeout_s) and the collectives' timeout (distributed/liveness.py)."""
    notes: tuple[str, ...] = field(default=())
    defaults_from: str = "torchrl_post"
    """trainer.defaults_from: whose defaults the keys not set took (the plan's first line)."""
    """What the plan placed or left out that the config did not say (printed once as `note:` lines)."""

    @property
    def actor_ranks(self) -> list[int]:
        return self.placement.ranks["actor"]

    @property
    def rollout_ranks(self) -> list[int]:
        return self.placement.ranks["rollout"]

    @property
    def mixes_rewards(self) -> bool:
        """Training scores are the rule's and other sources' mix, made on the actor's ranks after the reward model
        scored them (trainer.py); else the rule's score as the producer shaped it (rollout/groups.py)."""
        return set(self.reward_weights) != {"rule"}

    @property
    def scores_as_groups_finish(self) -> bool:
        """A reward model on ranks of its own scores each group on the rollout ranks' side as it completes
        (rollout/scores.py), overlapping generation, rather than the step's batch once the actor has it."""
        return self.reward_model == "own_ranks" and self.disaggregated

    @property
    def disaggregated(self) -> bool:
        """The rollout engines sit on ranks of their own."""
        return self.sync == "broadcast"

    @property
    def sequence_parallel(self) -> int:
        """Ulysses sp group size of the actor, critic and reference (model.ulysses_sequence_parallel_size)."""
        return self.roles["actor"].sequence_parallel

    @property
    def fsdp_sizes(self) -> dict[str, int]:
        return {role: r.fsdp.fsdp_size for role, r in self.roles.items()}

    @property
    def expert_parallel_sizes(self) -> dict[str, int]:
        return {role: r.expert_parallel for role, r in self.roles.items() if r.expert_parallel > 1}

    def total_steps(self, train_prompts: int) -> int:
        """Steps of the run once the training set's size is known: epochs x batches per epoch, capped by
        trainer.total_training_steps."""
        bsz = self.prompts_per_step
        per_epoch = train_prompts // bsz
        if per_epoch == 0:
            raise ConfigError(f"data.train_batch_size={bsz} is larger than the {train_prompts} training prompts")
        steps = per_epoch * self.total_epochs
        return min(steps, self.total_training_steps or steps)

    def batch_numbers(self) -> dict[str, int]:
        """The per-rank batch arithmetic the dry run shows."""
        actor, n = self.roles["actor"], self.group_size
        sp = {"samples_per_mini_batch_per_sp_group": actor.mini_batch_samples * actor.sequence_parallel}
        return {
            "prompts_per_step": self.prompts_per_step,
            "samples_per_step": self.prompts_per_step * n,
            "prompts_per_rollout_engine": self.prompts_per_step // self.engines,
            "samples_per_actor_rank": self.prompts_per_step * n // len(actor.ranks),
            "mini_batches_per_epoch": self.prompts_per_step // self.mini_batch_prompts,
            "samples_per_mini_batch_per_rank": actor.mini_batch_samples,
        } | (sp if actor.sequence_parallel > 1 else {})

    def _judge(self) -> str:
        """Where the LLM judge runs (the dry run's line)."""
        j = self.judge_engine
        if j is None:
            return "by URL" if "judge" in self.reward_weights else "none"
        length = f"max_model_len {j.max_model_len}" if j.max_model_len else "its max_position_embeddings long"
        share = "" if j.gpu_memory_utilization is None else f", gpu_memory_utilization {j.gpu_memory_utilization:g}"
        own = f"a {self.judge_engine_kind} engine of its own, {length}{share}"
        if self.self_judge:
            return f"the policy itself (self-judging), current weights: {own}, loaded at every weight sync"
        return f"co-hosted on every rollout rank: {own}"

    def describe(self, device: str, backend: str) -> str:
        """The dry-run plan: roles -> ranks, meshes, engines, the sync, where each role comes from, batch
        arithmetic."""
        lines = [
            f"defaults: {DEFAULTS_FROM[self.defaults_from]}",
            self.placement.describe(),
            f"  device {device}, backend {backend}",
        ]
        for role, r in self.roles.items():
            how = "HSDP" if len(r.mesh_dims) == 2 else "FSDP"
            sp = r.sequence_parallel
            seq = (
                f"; Ulysses (dp, sp) = ({len(r.ranks) // sp}, {sp}): each row's tokens over {sp} ranks"
                if sp > 1
                else ""
            )
            micro = f"; micro-batches of {r.micro_batch_samples} samples" if r.micro_batch_samples else ""
            ep = r.expert_parallel
            shards = r.mesh_shape[-1]  # HSDP: a replica's shard group, which holds every expert once
            layout = (
                f"(dp_replicate, efsdp, ep) = ({r.mesh_shape[0]}, {shards // ep}, {ep})"
                if len(r.mesh_shape) == 2
                else f"(efsdp, ep) = ({shards // ep}, {ep})"
            )
            experts = (
                f"; experts {layout}: each rank holds 1/{ep} of every MoE layer's experts, tokens sent to them "
                "by all-to-all"
                if ep > 1
                else ""
            )
            lines.append(f"  {role} mesh {r.mesh_dims} = {r.mesh_shape} ({how}){seq}{experts}{micro}")
        if self.sft:  # no engine: the placement's rollout and weight-sync lines say nothing
            shown = "\n".join(lines).splitlines()
            lines = [line for line in shown if not line.startswith(("  rollout ", "  weight sync"))]
            lines.append(
                "  supervised fine-tuning (sft.enable): no engine, no weight sync; each step trains on the data's "
                f"responses ({self.prompts_per_step} rows, token negative log-likelihood); validation: val/loss"
            )
            lines.append("  old logprobs: no; reference: none; critic: none; reward model: none")
            lines.append(f"  {self.deadlines.describe()}")
            return "\n".join(lines)
        tp, roll = self.tensor_parallel_size, self.rollout_ranks
        engines = [roll[i : i + tp] for i in range(0, len(roll), tp)]
        lines.append(f"  rollout engines ({self.rollout_engine}, tensor_parallel_size={tp}): {engines}")
        lines.append(
            f"  off-policy look-ahead: trainer.max_off_policy_steps={self.max_off_policy_steps}"
            + (" (on-policy)" if not self.max_off_policy_steps else "")
        )
        lines.append(f"  {self.fill.describe()}")
        if self.disaggregated:
            lines.append(
                f"  batch transfer: whole prompt groups ({self.group_size} samples) from {self.engines} engine(s) "
                f"to {len(self.actor_ranks)} actor ranks, equal counts, balanced by tokens"
            )
        e, actor = self.engine, self.roles["actor"].fsdp
        memory = "sized from free memory" if e.gpu_memory_utilization is None else f"{e.gpu_memory_utilization:g}"
        lines.append(
            f"  precision ({self.device}): engine {e.dtype}, trainer compute {actor.param_dtype} over "
            f"{self.model_dtype} weights; cuda graphs {'off' if e.enforce_eager else 'on'}; engine sleep level "
            f"{e.sleep_level}; gpu_memory_utilization {memory}; mismatch warning above {self.max_logprob_diff:g}"
        )
        lines += [
            f"  group size: {self.group_size}; old logprobs: {'yes' if self.needs_old_log_probs else 'no'}",
            f"  reference: {self.reference}; critic: {self.critic}; reward model: {self.reward_model}"
            + (" (scores each group as it finishes)" if self.scores_as_groups_finish else "")
            + "; "
            f"lora sync: {self.lora_sync}"
            + (f"; distillation teacher: {self.teacher}" if self.teacher != "none" else "")
            + (f" (its top-{self.teacher_top_k} tokens per position)" if self.teacher_top_k else ""),
            "  training reward: "
            + " + ".join(f"{w:g} x {name}" for name, w in self.reward_weights.items())
            + ("" if set(self.reward_weights) == {"rule"} else f" ({self.reward_combine}); validation: rule"),
            f"  judge: {self._judge()}",
            f"  weight sync: {self.sync}, buckets of {self.sync_bucket_bytes / MB:g} MiB",
            f"  rollout correction: {self.rollout_correction.describe()}",
            "  MoE routing: "
            + ("the engine's experts replayed in the trainer (R3)" if self.router_replay else "the trainer's own")
            + (
                f"; the engine records them ({'vLLM' if self.engine.routes_from_engine else 'a router hook'})"
                if self.engine.record_routes
                else ""
            ),
            "  trainer logprobs: "
            + (
                f"renormalised on the sampler's kept set ({self.sampling_support.describe()}), as the engine's"
                if self.sampling_support is not None
                else "over the full vocabulary"
            ),
        ]
        lines.append(f"  {self.deadlines.describe()}")
        lines += [f"  {k}: {v}" for k, v in self.batch_numbers().items()]
        return "\n".join(lines)


def fill_policy(cfg: Config, engines: int, colocated: bool) -> Fill:
    r, t = cfg.rollout, cfg.trainer
    lag = 0 if colocated else t.max_off_policy_steps
    if not r.partial_rollout:
        batch = cfg.data.train_batch_size
        return Fill(False, lag, batch, -(-batch // engines), colocated, t.max_staleness, on_arrival=False)
    total = r.prompts_in_flight or max(t.max_off_policy_steps + 1, 2) * cfg.data.train_batch_size
    recompute = colocated or r.inflight_update == "recompute"
    on_arrival = r.update_on_arrival and not colocated
    return Fill(True, lag, total, -(-total // engines), recompute, t.max_staleness, on_arrival)


def skips_zero_advantage(cfg: Config) -> bool:
    """Samples with advantage 0 on every trained token change nothing in the update when only the policy loss
    reads them: no entropy bonus, KL loss, router load-balancing loss or distillation term (each has a gradient of its
    own)."""
    a = cfg.actor
    own_terms = a.entropy_coeff or a.use_kl_loss or a.router_aux_loss_coef or cfg.distillation.enable
    return a.skip_zero_advantage and not own_terms


def needs_critic(cfg: Config) -> bool:
    """The estimator needs values (an SFT run has no estimator: algorithm.* is not read)."""
    return cfg.algorithm.adv_estimator in NEEDS_VALUES and not cfg.sft.enable


def reward_weights(cfg: Config) -> dict[str, float]:
    """reward.weights, or each model source enabled at weight 1 (the reward model, the judge), else the rule."""
    given = {k: float(v) for k, v in vars(cfg.reward.weights).items() if v is not None}
    if given:
        return given
    models = [
        name for name, on in (("reward_model", cfg.reward_model.enable), ("judge", cfg.reward.judge.enable)) if on
    ]
    return dict.fromkeys(models or ["rule"], 1.0)


def needs_kl(cfg: Config) -> bool:
    return cfg.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward


def _role_placement(cfg: Config) -> tuple[PlacementConfig, list[str]]:
    """placement.* with the critic and reference put where the algorithm needs them (a copy; notes say why)."""
    placed, notes = cfg.placement, []
    lora = cfg.model.lora_rank > 0
    for role, needed, why in (
        ("critic", needs_critic(cfg), f"algorithm.adv_estimator={cfg.algorithm.adv_estimator}"),
        ("reference", needs_kl(cfg) and not lora, "actor.use_kl_loss / algorithm.use_kl_in_reward without LoRA"),
        ("reward_model", cfg.reward_model.enable, "reward_model.enable"),
        ("teacher", cfg.distillation.enable, "distillation.enable"),
    ):
        value = getattr(placed, role)
        if needed and value is None:
            placed = replace(placed, **{role: "actor"})
            notes.append(f"placement.{role}: colocated with the actor ({why} needs it)")
        elif not needed and value is not None:
            placed = replace(placed, **{role: None})
            what = "the actor with its LoRA adapter off is the reference" if role == "reference" and lora else ""
            notes.append(f"placement.{role}={value!r} ignored: " + (what or f"nothing uses a {role} ({why} is off)"))
    return placed, notes


def planned_world(configured: int | None, launched: int, under_torchrun: bool) -> int:
    """trainer.world_size (for a dry run without torchrun) or the launched world; they must agree."""
    if configured is None:
        return launched
    if configured < 1:
        raise ConfigError(f"trainer.world_size={configured} must be >= 1 (or null for torchrun's world)")
    if under_torchrun and configured != launched:
        raise ConfigError(
            f"trainer.world_size={configured} (verl: trainer.n_gpus_per_node x trainer.nnodes) but torchrun started "
            f"{launched} processes; the launcher sets the world (torchrun --nnodes / --nproc-per-node): drop the keys "
            "or match them"
        )
    return configured


def lora_sync(cfg: Config) -> LoraSync:
    """How LoRA weights reach the engine: none (no LoRA), merged into the base weights, or as an adapter."""
    if cfg.model.lora_rank == 0:
        return "none"
    return "adapter" if cfg.rollout.lora_sync == "adapter" else "merged"


def sleep_level(cfg: Config, device: str, colocated: bool) -> int:
    """0: the engine never sleeps (CPU, rollout ranks of its own, free_cache_engine off); 2: weights and KV cache
    discarded (the sync rewrites every weight); 1: weights kept (adapter syncs send the adapter only)."""
    if device != "cuda" or not colocated or not cfg.rollout.free_cache_engine:
        return 0
    return 1 if lora_sync(cfg) == "adapter" else 2


def mismatch_limit(cfg: Config, device: str, engine: str, compute: str) -> float:
    """trainer.max_logprob_diff, or by precision: float32 noise is ~1e-6 on CPU, TF32 attention puts it near
    1e-3 on CUDA, 16-bit weights or compute near 1e-2."""
    if cfg.trainer.max_logprob_diff is not None:
        return max(cfg.trainer.max_logprob_diff, 0.0)
    if engine != "float32" or compute != "float32" or cfg.model.dtype != "float32":
        return 0.1
    return 5e-3 if device == "cuda" else 1e-4


def engine_spec(cfg: Config, first_sync: bool = False, device: str = "cpu", colocated: bool = True) -> EngineSpec:
    """What an engine needs beyond model.* and rollout.*, with the defaults by device resolved. Its weights come
    from model.path, or, with `first_sync` (the caller pushes the actor's weights before any generation, as the
    training loop does), as rollout.load_format says (`dummy`: random until that sync). `colocated`: beside the
    trainer (memory sized from what it leaves free, sleep during the update)."""
    d, r = cfg.data, cfg.rollout
    util = r.gpu_memory_utilization
    if util is None and not colocated and device == "cuda":
        util = ENGINE_SHARE_OF_FREE  # of a card nothing else holds
    return EngineSpec(
        max_model_len=d.max_prompt_length + d.max_response_length,
        lora_sync=lora_sync(cfg),
        prefix_caching=cfg.agent.env is not None or r.n > 1,
        load_format=r.load_format if first_sync else "auto",
        dtype=resolve_dtype(cfg.rollout.dtype, device),
        enforce_eager=r.enforce_eager if r.enforce_eager is not None else device != "cuda",
        gpu_memory_utilization=util,
        sleep_level=sleep_level(cfg, device, colocated),
        record_routes=r.return_routed_experts,
        routes_from_engine=r.return_routed_experts and device == "cuda",
        updates_in_flight=r.partial_rollout,
    )


def judge_engine_spec(cfg: Config, device: str = "cpu") -> EngineSpec:
    """A co-hosted judge's engine: the judge's own weights from disk, the rollout's dtype, eager where the
    rollout's engine is, no sleep (it scores between updates), its reward.judge.gpu_memory_utilization on a GPU. A
    self-judge (reward.judge.model=policy) takes the policy engine's weights and LoRA handling: every sync loads it
    too."""
    j = cfg.reward.judge
    policy = engine_spec(cfg, first_sync=j.model == SELF_JUDGE, device=device)
    return replace(
        policy,
        max_model_len=j.max_model_len or 0,
        lora_sync=policy.lora_sync if j.model == SELF_JUDGE else "none",
        prefix_caching=False,
        load_format=policy.load_format if j.model == SELF_JUDGE else "auto",
        gpu_memory_utilization=j.gpu_memory_utilization if device == "cuda" else None,
        sleep_level=0,
        record_routes=False,
        routes_from_engine=False,
        updates_in_flight=False,
    )


def ignored_keys(cfg: Config) -> list[str]:
    """Keys set to something that this run does not use (a warning, not an error: the value is harmless)."""
    a, notes = cfg.agent, []
    if a.env is None and a.tools:
        notes.append(f"agent.tools={list(a.tools)} ignored: tools are called by agents, and agent.env is unset")
    if a.env is not None and cfg.reward.function is not None:
        notes.append(
            f"reward.function={cfg.reward.function!r} ignored: agent episodes are scored by their environment "
            "(agent.env)"
        )
    streamed = (
        ("rollout.prompts_in_flight", cfg.rollout.prompts_in_flight),
        ("trainer.max_staleness", cfg.trainer.max_staleness),
    )
    for key, value in streamed:
        if value is not None and not cfg.rollout.partial_rollout:
            notes.append(f"{key}={value} ignored: it shapes rollout.partial_rollout=true (whole batches here)")
    for role, r in (("actor", cfg.actor), ("critic", cfg.critic)):
        for key, default in (("min_lr_ratio", 0.0), ("num_cycles", 0.5)):
            if r.lr_scheduler_type == "constant" and getattr(r, key) != default:
                notes.append(f"{role}.{key}={getattr(r, key)} ignored: it shapes {role}.lr_scheduler_type=cosine")
    rc = cfg.algorithm.rollout_correction
    for key in ("rollout_rs_threshold", "rollout_rs_threshold_lower"):
        if rc.rollout_rs is None and getattr(rc, key) is not None:
            notes.append(
                f"algorithm.rollout_correction.{key}={getattr(rc, key)} ignored: it bounds the rejection, and "
                "algorithm.rollout_correction.rollout_rs is null"
            )
    return notes


def rollout_correction(cfg: Config) -> RolloutCorrection:
    """algorithm.rollout_correction.* resolved: rollout_is=auto is token with an off-policy look-ahead
    (trainer.max_off_policy_steps > 0) or with partial rollouts, and null otherwise; the rejection band's null ends as verl reads them."""
    rc = cfg.algorithm.rollout_correction
    level = rc.rollout_is
    if level == "auto":
        level = "token" if cfg.trainer.max_off_policy_steps > 0 or cfg.rollout.partial_rollout else None
    low, high = rs_band(rc.rollout_rs_threshold, rc.rollout_rs_threshold_lower, rc.rollout_is_threshold)
    return RolloutCorrection(level, rc.rollout_is_threshold, rc.rollout_rs, high, low, rc.rollout_token_veto_threshold)


def sampling_support(cfg: Config) -> tuple[Truncation | None, list[str]]:
    """actor.renormalize_logprobs_on_support resolved (null: on when the training rollouts truncate, i.e. sample at
    a temperature > 0 with rollout.top_k > 0 or rollout.top_p < 1; greedy sampling keeps no top-k / top-p), and
    notes on a setting that is ignored or that leaves the ratios biased."""
    r, key = cfg.rollout, "actor.renormalize_logprobs_on_support"
    truncation = sampler_truncation(r.temperature, r.top_k, r.top_p)
    setting = cfg.actor.renormalize_logprobs_on_support
    if setting and truncation is None:
        why = (
            "rollout.temperature=0 samples greedily" if r.temperature <= 0 else "rollout.top_k / top_p keep every token"
        )
        return None, [f"{key}=true ignored: {why}"]
    if setting is False and truncation is not None:
        return None, [
            f"{key}=false: the trainer's logprobs are over the full vocabulary while the engine's are over what "
            f"rollout.top_k={r.top_k} / top_p={r.top_p} keep; each importance ratio carries the kept mass"
        ]
    return truncation, []


def plan_run(cfg: Config, world_size: int, device: str = "cpu") -> RunPlan:
    """The plan for `cfg` on `world_size` ranks of `device` (cpu or cuda: the defaults by device; the config's
    world-independent checks already ran when it was loaded: `config.load.load_config`)."""
    placed, notes = _role_placement(cfg)
    notes += ignored_keys(cfg)
    support, support_notes = sampling_support(cfg)
    notes += support_notes
    placement = plan_placement(placed, world_size)
    validate_placement(cfg, placement.ranks, placement.colocated)
    if cfg.rollout.update_on_arrival and cfg.rollout.partial_rollout and placement.colocated["rollout"]:
        notes.append(
            "rollout.update_on_arrival=true ignored: a colocated engine sleeps while the actor updates (it has no "
            "time to fill); it applies to rollout ranks of their own"
        )
    tp = cfg.rollout.tensor_parallel_size
    engines = len(placement.ranks["rollout"]) // tp
    others: dict[str, int] = {r: len(placement.ranks[r]) for r in SERVED if r in placement.ranks}
    validate_batch(cfg, len(placement.ranks["actor"]), engines, others)
    sft = cfg.sft.enable
    n, bsz = (1 if sft else cfg.rollout.n), cfg.data.train_batch_size
    mini = mini_batch_prompts(cfg, len(placement.ranks["actor"]) // cfg.model.ulysses_sequence_parallel_size)
    fsdp = {
        role: replace(f, param_dtype=resolve_dtype(f.param_dtype, device))
        for role, f in (
            ("actor", cfg.actor.fsdp), ("critic", cfg.critic.fsdp), ("reference", cfg.actor.fsdp),
            ("reward_model", replace(cfg.actor.fsdp, expert_parallel_size=1)),
            ("teacher", replace(cfg.actor.fsdp, expert_parallel_size=1)),
        )
    }  # fmt: skip
    roles: dict[str, RolePlan] = {}
    for role in ("actor", *SERVED):
        if role not in placement.ranks:
            continue
        ranks, sp = placement.ranks[role], cfg.model.ulysses_sequence_parallel_size
        dims, shape = mesh_shape(len(ranks), fsdp[role].fsdp_size)
        samples = mini * n // len(ranks)
        micro = {"actor": cfg.actor.ppo_micro_batch_size_per_gpu, "critic": cfg.critic.ppo_micro_batch_size_per_gpu}
        ep = fsdp[role].expert_parallel_size
        if role == "reference" and not placement.colocated[role]:  # the actor's ep is for the actor's ranks
            fsdp[role] = replace(fsdp[role], expert_parallel_size=1)
            ep = 1
        if shape[-1] % ep:  # the ranks, or with HSDP a replica's shard group (which holds every expert once)
            key = "critic" if role == "critic" else "actor"
            what = (
                f"{key}.fsdp.fsdp_size={shape[-1]} (HSDP's shard group)"
                if len(shape) == 2
                else (f"the {role}'s {len(ranks)} ranks")
            )
            raise ConfigError(
                f"{key}.fsdp.expert_parallel_size={ep} does not divide {what}; set it to a divisor of {shape[-1]}"
            )
        roles[role] = RolePlan(
            tuple(ranks), placement.colocated[role], fsdp[role], dims, shape, samples, sp,
            min(micro[role], samples * sp) if role in micro else 0, ep,
        )  # fmt: skip
    lora = cfg.model.lora_rank > 0
    if "reference" in roles:
        reference: ReferenceSource = roles["reference"].where
    else:
        reference = "adapter_off" if lora and needs_kl(cfg) else "none"
    on_policy = cfg.actor.ppo_epochs == 1 and mini == bsz
    correction = rollout_correction(cfg)
    engine = engine_spec(cfg, first_sync=True, device=device, colocated=placement.colocated["rollout"])
    judge = cfg.reward.judge
    return RunPlan(
        placement=placement,
        roles=roles,
        group_size=n,
        prompts_per_step=bsz,
        mini_batch_prompts=mini,
        ppo_epochs=cfg.actor.ppo_epochs,
        tensor_parallel_size=tp,
        rollout_engine=cfg.rollout.engine,
        engines=engines,
        needs_old_log_probs=not sft and (not on_policy or cfg.algorithm.use_kl_in_reward or correction.rejects),
        reference=reference,
        critic=roles["critic"].where if "critic" in roles else "none",
        reward_model=roles["reward_model"].where if "reward_model" in roles else "none",
        teacher=roles["teacher"].where if "teacher" in roles else "none",
        teacher_top_k=cfg.distillation.topk
        if "teacher" in roles and cfg.distillation.loss_mode == "forward_kl_topk"
        else 0,
        reward_weights=reward_weights(cfg),
        reward_combine=cfg.reward.combine,
        lora_sync=lora_sync(cfg),
        sync="reload" if placement.colocated["rollout"] else "broadcast",
        sync_bucket_bytes=cfg.rollout.sync_bucket_mb * MB,
        rollout_correction=correction,
        masked_reasons=tuple(masked_reasons(cfg.algorithm.compact_filtering)),
        max_off_policy_steps=cfg.trainer.max_off_policy_steps,
        fill=fill_policy(cfg, engines, placement.colocated["rollout"]),
        total_epochs=cfg.trainer.total_epochs,
        total_training_steps=cfg.trainer.total_training_steps,
        engine=engine,
        sft=sft,
        judge_engine=judge_engine_spec(cfg, device) if judge.enable and judge.url is None else None,
        judge_engine_kind=judge.engine or cfg.rollout.engine,
        self_judge=judge.enable and judge.url is None and judge.model == SELF_JUDGE,
        model_dtype=cfg.model.dtype,
        device=device,
        max_logprob_diff=mismatch_limit(cfg, device, engine.dtype, fsdp["actor"].param_dtype),
        router_replay=cfg.actor.router_replay,
        sampling_support=support,
        skip_zero_advantage=not sft and skips_zero_advantage(cfg),
        deadlines=deadlines(cfg.trainer.wait_timeout_s),
        notes=tuple(notes),
        defaults_from=cfg.trainer.defaults_from,
    )
