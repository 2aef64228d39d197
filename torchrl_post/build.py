"""Build this rank's program from the set-up (`run.Run`) and the plan: each part gets its own config section and
the plan's values, never the whole config or the set-up object.

    actor ranks           Trainer(actor, rollouts, weights, critic?, reference?)        trainer.py
    rollout-only ranks    RolloutServer(engine source, producer, broadcast sync, transfer) rollout/remote.py
    critic/frozen roles   RoleServer(link, transfer?, critic | Frozen(reference / RM / teacher)) workers/remote.py

What each rank holds follows from the plan: a role is local where the rank is one of its ranks, a proxy where
the role sits on ranks of its own, absent where the plan has none.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any, cast

import torch
import torch.distributed as dist

from torchrl_post.agent.loop import AgentLoop, LoopLimits
from torchrl_post.components import AgentParts
from torchrl_post.config.schema import AgentConfig, JudgeConfig, ModelConfig, ReferenceConfig, RolloutConfig
from torchrl_post.data.sampler import ShardedBatchSampler
from torchrl_post.data.sft import SftDataset
from torchrl_post.distributed.mailbox import Mailbox
from torchrl_post.distributed.role_link import RoleLink
from torchrl_post.distributed.transfer import RolloutTransfer
from torchrl_post.engines.base import EngineSpec, RolloutEngine
from torchrl_post.engines.build import Followed, build_engine
from torchrl_post.engines.lockstep import agreed
from torchrl_post.logging.timing import Timer
from torchrl_post.program import RankProgram
from torchrl_post.reward.judge_client import RemoteJudge
from torchrl_post.reward.judge_local import LocalJudge, judge_engine_args
from torchrl_post.reward.samples import SampleScoring
from torchrl_post.reward.server import RewardServer
from torchrl_post.rollout.groups import Groups
from torchrl_post.rollout.local import LocalRollouts
from torchrl_post.rollout.remote import RemoteRollouts, RolloutServer
from torchrl_post.rollout.scores import GroupScores, ScoreServer
from torchrl_post.rollout.source import EngineSource, SourceSettings
from torchrl_post.rollout.supervised import SupervisedSource
from torchrl_post.run import Run
from torchrl_post.sync.lora import is_adapter
from torchrl_post.sync.weights import BroadcastSync, Keep, ReloadSync
from torchrl_post.trainer import NoEngine, RankInfo, StepRoles, Trainer
from torchrl_post.workers.actor import Actor, AdapterOffReference
from torchrl_post.workers.critic import Critic
from torchrl_post.workers.reference import Reference
from torchrl_post.workers.remote import (
    CriticRole,
    Frozen,
    ReferenceRole,
    RemoteCritic,
    RemoteReference,
    RemoteRewardModel,
    RewardModelRole,
    RoleServer,
)
from torchrl_post.workers.reward_model import RewardModel

log = logging.getLogger(__name__)


def build_program(run: Run) -> RankProgram:
    """The actor's ranks train; ranks with only an engine serve rollouts; the rest serve a critic/reference."""
    if run.topo.has("actor"):
        return build_trainer(run)
    transfer = rollout_transfer(run) if run.plan.disaggregated else None
    if run.topo.has("rollout"):
        assert transfer is not None
        return build_rollout_server(run, transfer)
    part = transfer.take_part if transfer is not None else None
    if run.topo.has("critic"):
        return RoleServer(role_link(run, "critic"), part, critic=build_critic(run))
    if run.plan.scores_as_groups_finish and run.topo.has("reward_model"):
        rm = build_reward_model(run)
        first = run.env.rank == run.plan.placement.ranks["reward_model"][0]
        served = ScoreServer(score_mailbox(run), run.plan.engines, rm.score_ids, first, rm.group)
        return RoleServer(role_link(run, "reward_model"), part, scores=served)
    role, frozen = frozen_role(run)
    return RoleServer(role_link(run, role), part, frozen=frozen)


def score_mailbox(run: Run) -> Mailbox:
    """Where a reward model on ranks of its own and the rollout ranks exchange groups and scores (rollout/scores.py)."""
    return Mailbox(run.topo.store, "rm_scores", run.plan.deadlines.collective_s)


def frozen_role(run: Run) -> tuple[str, Frozen]:
    """The frozen role this rank serves from ranks of its own (the placement gives each its own ranks)."""
    if run.topo.has("reference"):
        reference = build_reference(run)
        return "reference", Frozen("ref", reference.field, reference.log_probs)
    if run.topo.has("reward_model"):
        return "reward_model", Frozen("reward_model", "rm_scores", build_reward_model(run).scores, per_sample=True)
    assert run.topo.has("teacher"), "a rank that is no actor, rollout or critic serves a frozen role"
    teacher = build_teacher(run)
    return "teacher", Frozen("teacher", teacher.field, teacher.log_probs)


def build_trainer(run: Run) -> Trainer:
    cfg, plan, timer = run.cfg, run.plan, Timer()
    actor = Actor(
        cfg.model,
        cfg.actor,
        run.topo.mesh("actor"),
        run.env.device,
        temperature=1.0 if plan.sft else cfg.rollout.temperature,
        mini_batch_samples=plan.roles["actor"].mini_batch_samples,
        micro_batch_samples=plan.roles["actor"].micro_batch_samples,
        max_response_length=cfg.data.max_response_length,
        total_steps=run.total_steps,
        correction=plan.rollout_correction,
        fsdp=plan.roles["actor"].fsdp,
        sequence=run.topo.sequence("actor"),
        replay=plan.router_replay,
        truncation=plan.sampling_support,
        skip_zero_advantage=plan.skip_zero_advantage,
        seed=cfg.trainer.seed,
        supervised=plan.sft,
        distill=cfg.distillation if plan.teacher != "none" else None,
        experts=run.topo.experts("actor"),
    )
    info = RankInfo(
        run.env.rank, run.env.world_size, run.is_main, run.run_dir, run.pad_id, run.processor or run.tokenizer
    )
    if plan.sft:  # no engine: the data's responses, validated by the actor's loss (rollout/supervised.py)
        return Trainer(cfg, plan, StepRoles(actor, supervised_source(run, actor), NoEngine()), timer, info)
    critic: CriticRole | None = None
    # What the colocated engine must leave free: every trained role's optimizer state still to come (the memory
    # plan's `later`), not the actor's alone (PPO's critic would otherwise run out of memory at the first update).
    pending = actor.pending_state_bytes()
    if plan.critic == "colocated":
        critic = built = build_critic(run)
        pending += built.pending_state_bytes()
    elif plan.critic == "own_ranks":
        critic = RemoteCritic(role_link(run, "critic"))
    reference: ReferenceRole | None = None
    if plan.reference == "colocated":
        reference = build_reference(run)
    elif plan.reference == "own_ranks":
        reference = RemoteReference(role_link(run, "reference"))
    elif plan.reference == "adapter_off":
        reference = AdapterOffReference(actor)
    teacher: ReferenceRole | None = None
    if plan.teacher == "colocated":
        teacher = build_teacher(run)
    elif plan.teacher == "own_ranks":
        teacher = RemoteReference(role_link(run, "teacher"), plan.teacher_field)
    reward_model: RewardModelRole | None = None
    if plan.reward_model == "colocated":
        reward_model = build_reward_model(run)
    elif plan.reward_model == "own_ranks" and not plan.scores_as_groups_finish:  # else the batch comes scored
        reward_model = RemoteRewardModel(role_link(run, "reward_model"))
    keep: Keep | None = is_adapter if plan.lora_sync == "adapter" else None
    if plan.disaggregated:
        rejection = cfg.algorithm.rejection_sample.enable
        sampler = run.sampler(0, 1)
        rollouts = RemoteRollouts(
            rollout_transfer(run), sampler, timer, rejection, run.pad_id, plan.fill.carry, plan.group_size
        )
        dtype = getattr(torch, plan.engine.dtype)
        weights = BroadcastSync(
            run.topo.sync, run.env.device, plan.sync_bucket_bytes, dtype, actor.model, keep, run.topo.store
        )
        roles = StepRoles(actor, rollouts, weights, critic, reference, reward_model, teacher)
    else:
        dp, tp = len(plan.actor_ranks), plan.tensor_parallel_size
        share = plan.actor_ranks.index(run.env.rank)
        # The ranks of one engine draw its share together (rollout/local.py).
        sampler = run.sampler(share // tp, dp // tp)
        source = engine_source(run, sampler, timer, reserve_bytes=pending)
        local = LocalRollouts(source, producer(run, source), plan.fill.carry)
        # merged LoRA weights are merged in the trainer's dtype, then cast by the engine as it loads them
        wire = getattr(torch, plan.engine.dtype) if plan.lora_sync != "merged" else None
        sync = ReloadSync(source.engine, plan.sync_bucket_bytes, keep, wire, run.env.device)
        roles = StepRoles(actor, local, sync, critic, reference, reward_model, teacher)
    return Trainer(cfg, plan, roles, timer, info)


def supervised_source(run: Run, actor: Actor) -> SupervisedSource:
    """SFT's source: each actor rank draws its share of every step's rows and of the validation rows."""
    share, shares = run.plan.actor_ranks.index(run.env.rank), len(run.plan.actor_ranks)
    assert isinstance(run.train_data, SftDataset)  # run.py loads SFT rows with sft.enable
    return SupervisedSource(
        run.train_data, run.sampler(share, shares), run.pad_id, actor.log_probs, share, shares,
        run.cfg.data.val_batch_size,
    )  # fmt: skip


def build_rollout_server(run: Run, transfer: RolloutTransfer) -> RolloutServer:
    plan, timer = run.plan, Timer()
    tp, rollout = plan.tensor_parallel_size, plan.rollout_ranks
    sampler = run.sampler(rollout.index(run.env.rank) // tp, len(rollout) // tp)
    source = engine_source(run, sampler, timer)
    dtype = getattr(torch, plan.engine.dtype)
    sync = BroadcastSync(run.topo.sync, run.env.device, plan.sync_bucket_bytes, dtype, store=run.topo.store)
    group = source.engine_group
    return RolloutServer(
        source,
        producer(run, source),
        sync,
        transfer,
        rank=run.env.rank,
        lag=plan.fill.lag,
        on_arrival=plan.fill.on_arrival,
        agree=lambda flag: bool(agreed(flag, group)),
    )


def producer(run: Run, source: EngineSource) -> Groups:
    """This engine's groups (rollout/groups.py) by the plan's fill policy."""
    scores = None
    if run.plan.scores_as_groups_finish:
        scores = GroupScores(score_mailbox(run), source.engine_index, source.engine_leader, source.engine_group)
    return Groups(source, run.plan.fill, run.total_steps, scores)


def rollout_transfer(run: Run) -> RolloutTransfer:
    plan = run.plan
    return RolloutTransfer(run.topo.world, plan.prompts_per_step, plan.engines, plan.actor_ranks)


def build_judge(run: Run) -> RemoteJudge | LocalJudge | None:
    """The LLM judge reward.judge describes (None when off): a server's client by `url`, else the judge model on
    an in-process engine of its own (the plan's `judge_engine`), built before the policy's engine sizes itself from
    the memory left."""
    cfg, spec = run.cfg.reward.judge, run.plan.judge_engine
    if not cfg.enable:
        return None
    if spec is None:
        return RemoteJudge.from_config(cfg)
    return local_judge(cfg, spec, run.cfg.rollout, run.env.device, run.cfg.trainer.seed, run.cfg.model)


def local_judge(
    cfg: JudgeConfig,
    spec: EngineSpec | None = None,
    rollout: RolloutConfig | None = None,
    device: torch.device | None = None,
    seed: int = 0,
    policy: ModelConfig | None = None,
) -> LocalJudge:
    """The co-hosted judge `cfg` names on an engine of `spec` (reward/judge_local.py `judge_engine_args`); by
    default one as long as the judge's positions, of the rollout section's defaults, on the CPU."""
    spec = spec or EngineSpec(
        max_model_len=cfg.max_model_len or 0, lora_sync="none", prefix_caching=False, load_format="auto"
    )
    rollout, device = rollout or RolloutConfig(), device or torch.device("cpu")
    model, judge_rollout, spec, tokenizer = judge_engine_args(cfg, spec, rollout, policy)
    eos = [tokenizer.eos_token_id]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    engine = build_engine(model, judge_rollout, spec, device, seed, pad, eos)
    log.info(
        "judge %s: a %s engine on this rank (max_model_len %d)", model.path, judge_rollout.engine, spec.max_model_len
    )
    return LocalJudge.from_config(cfg, engine, tokenizer, spec.max_model_len, seed)


def source_settings(run: Run) -> SourceSettings:
    cfg, plan = run.cfg, run.plan
    return SourceSettings(
        rollout=cfg.rollout,
        group_size=plan.group_size,
        prompts_per_step=plan.prompts_per_step,
        max_response_length=cfg.data.max_response_length,
        seed=cfg.trainer.seed,
        rejection=cfg.algorithm.rejection_sample,
        masked=plan.masked_reasons,
        val_batch_size=cfg.data.val_batch_size,
        log_val_generations=cfg.trainer.log_val_generations,
        reward=cfg.reward,
        mixes_rewards=plan.mixes_rewards,
        reward_weights=plan.reward_weights,
        reward_combine=plan.reward_combine,
    )


def sample_scoring(run: Run, judge: RemoteJudge | LocalJudge | None) -> SampleScoring:
    """How an engine's samples are scored: the rule (or a reward server), the reward model's inputs, the judge."""
    cfg = run.cfg
    return SampleScoring(
        run.reward_fn_for,
        run.tokenizer,
        cfg.reward.timeout_s,
        RewardServer.from_config(cfg.reward.server),
        run.reward_tokenizer,
        cfg.reward_model.max_length,
        judge,
        cfg.reward.judge.on_error,
    )


def build_agent_loop(
    a: AgentConfig,
    parts: AgentParts,
    max_prompt_length: int,
    max_response_length: int,
    engine: Any,
    tokenizer: Any,
    group: dist.ProcessGroup | None = None,
    turn_batches: bool = False,
) -> AgentLoop:
    """The agent loop over `engine`: `parts`' environments, agent and tools, tool calls read with vLLM's
    `agent.tool_parser`; `group`: a tensor-parallel engine's ranks; `turn_batches`: one batch per turn (the hf
    engine's generate runs a batch to its end)."""
    from torchrl_post.engines.vllm import tool_call_parser

    max_len = max_prompt_length + max_response_length
    limits = LoopLimits(a.max_turns, max_response_length, max_len, a.timeout_s, a.max_tokens_per_turn)
    parse = tool_call_parser(a.tool_parser, tokenizer) if parts.tools is not None else None
    return AgentLoop(
        engine,
        tokenizer,
        parts.make_env,
        parts.make_agent(),
        limits,
        tools=parts.tools,
        parse_calls=parse,
        env_workers=a.env_workers,
        group=group,
        turn_batches=turn_batches,
    )


def engine_source(run: Run, sampler: ShardedBatchSampler, timer: Timer, reserve_bytes: int = 0) -> EngineSource:
    """This rank's engine (one per `rollout.tensor_parallel_size` rollout ranks; its first rank speaks for it)
    behind the rollout source, with the agent loop over it when agent.env is set. `reserve_bytes`: accelerator
    memory a colocated trainer has yet to allocate (its optimizer state), kept out of the engine's share."""
    cfg, plan = run.cfg, run.plan
    tp, index = plan.tensor_parallel_size, plan.rollout_ranks.index(run.env.rank)
    eos = [run.tokenizer.eos_token_id]
    seed = cfg.trainer.seed + index // tp
    judge = build_judge(run)
    engine: RolloutEngine = build_engine(
        cfg.model, cfg.rollout, plan.engine, run.env.device, seed, run.pad_id, eos, reserve_bytes
    )
    if plan.self_judge:  # the judge is the policy: its engine loads every sync too
        assert isinstance(judge, LocalJudge) and judge.engine is not None
        engine = cast(RolloutEngine, Followed(engine, judge.engine))
    episodes = None
    if run.components.agent is not None:
        d = cfg.data
        episodes = build_agent_loop(
            cfg.agent,
            run.components.agent,
            d.max_prompt_length,
            d.max_response_length,
            engine,
            run.tokenizer,
            run.topo.engine_group,
            turn_batches=cfg.rollout.engine == "hf",  # hf generate runs a batch to its end: one batch per turn
        )
    return EngineSource(
        source_settings(run),
        engine,
        run.tokenizer,
        run.train_data,
        sample_scoring(run, judge),
        sampler,
        timer,
        engine_index=index // tp,
        n_engines=len(plan.rollout_ranks) // tp,
        engine_leader=index % tp == 0,
        engine_group=run.topo.engine_group,
        processor=run.processor,
        vision=run.vision,
        episodes=episodes,
        stepwise=cfg.algorithm.stepwise_advantage.enable,
    )


def build_critic(run: Run) -> Critic:
    cfg, role = run.cfg, run.plan.roles["critic"]
    return Critic(
        cfg.model,
        cfg.critic,
        run.topo.mesh("critic"),
        run.env.device,
        mini_batch_samples=role.mini_batch_samples,
        micro_batch_samples=role.micro_batch_samples,
        epochs=run.plan.ppo_epochs,
        max_response_length=cfg.data.max_response_length,
        total_steps=run.total_steps,
        fsdp=role.fsdp,
        sequence=run.topo.sequence("critic"),
        experts=run.topo.experts("critic"),
    )


def build_reference(run: Run) -> Reference:
    cfg, role = run.cfg, run.plan.roles["reference"]
    return Reference(
        cfg.model,
        cfg.reference,
        role.fsdp,
        run.topo.mesh("reference"),
        run.env.device,
        temperature=cfg.rollout.temperature,
        sequence=run.topo.sequence("reference"),
        replay=run.plan.router_replay,
        truncation=run.plan.sampling_support,
        experts=run.topo.experts("reference"),
    )


def build_teacher(run: Run) -> Reference:
    """The distillation teacher: the reference's frozen role over distillation.teacher.path."""
    cfg, role, t = run.cfg, run.plan.roles["teacher"], run.cfg.distillation.teacher
    assert t.path is not None  # validate.py: distillation.teacher.path with distillation.enable
    model = replace(cfg.model, path=t.path, trust_remote_code=t.trust_remote_code, lora_rank=0)
    return Reference(
        model, ReferenceConfig(t.param_offload, t.log_prob_micro_batch_size_per_gpu), role.fsdp,
        run.topo.mesh("teacher"), run.env.device, temperature=cfg.rollout.temperature,
        sequence=run.topo.sequence("teacher"), truncation=run.plan.sampling_support, role="teacher",
        top_k=run.plan.teacher_top_k, field=run.plan.teacher_field,
    )  # fmt: skip


def build_reward_model(run: Run) -> RewardModel:
    cfg, role = run.cfg, run.plan.roles["reward_model"]
    return RewardModel(cfg.model, cfg.reward_model, role.fsdp, run.topo.mesh("reward_model"), run.env.device)


def role_link(run: Run, role: str) -> RoleLink:
    plan = run.plan
    return RoleLink(
        run.topo.links[role],
        len(plan.actor_ranks),
        len(plan.placement.ranks[role]),
        plan.prompts_per_step,
        run.pad_id,
    )
