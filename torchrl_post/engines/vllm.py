"""The vLLM engine, in-process (one `vllm.LLM` per rollout rank). The only module that imports vllm.

The engine joins the torchrun world through vLLM's `external_launcher` executor (no extra processes,
no Ray). Weights are replaced in place with the worker's `reload_weights` RPC: calling the model's
`load_weights` a second time fails on the CPU build because weights are repacked after the first load.
Every reload is accounted for (`ReloadAccount`): a layer of the engine's model that got none of its
parameters, or a parameter vLLM reports unloaded, is an error naming it, not a stale weight.
"""

from __future__ import annotations

import copy
import functools
import gc
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig

from torchrl_post.config.schema import ModelConfig, RolloutConfig
from torchrl_post.engines.base import (
    EngineSpec,
    GiB,
    SamplingParams,
    StepOutput,
    engine_memory_fraction,
    kv_cache_cap,
    kv_cache_need,
)
from torchrl_post.multimodal.vision import NEVER_GENERATED_BIAS, VisionSpec, collapse_image_tokens
from torchrl_post.sync.lora import is_adapter, lora_scale, merged_weights, write_peft_adapter

log = logging.getLogger(__name__)


class VLLMEngine:
    def __init__(
        self,
        model: ModelConfig,
        rollout: RolloutConfig,
        spec: EngineSpec,
        device: torch.device,
        seed: int,
        reserve_bytes: int = 0,
    ) -> None:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # in-process engine core
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # its per-call INFO lines drown the step log
        import vllm

        self._vllm = vllm
        self._param_layers: dict[str, list[str]] | None = None  # layer class -> its modules that own parameters
        self.sleep_level = spec.sleep_level if device.type == "cuda" else 0
        if device.type != "cuda" and rollout.free_cache_engine:
            log.info("rollout.free_cache_engine: vLLM has no sleep mode on %s; the engine stays resident", device.type)
        self.asleep = False
        self._lengths: dict[str, int] = {}
        """Tokens each request in flight has generated so far (its steps report the new ones)."""
        self._last: tuple[Any, list[int], Any, Any] | None = None
        """The last processed input: (its sampling key, prompt ids, images, processed request), which the next
        samples of the same prompt copy."""
        self.weights_version = 0
        """Loads so far: every request's prefix-cache salt. vLLM's prefix reset fails while requests run (an update
        under rollout.inflight_update=keep), and the blocks the old weights computed would stay reusable; salted by
        the weights they were computed with, they never match a request of newer weights."""
        m = model
        self.adapter_mode = spec.lora_sync == "adapter"
        self.lora_scale = lora_scale(m.lora_rank, m.lora_alpha) if spec.lora_sync == "merged" else 0.0
        self.lora_rank, self.lora_alpha = m.lora_rank, m.lora_alpha
        self.lora_request: Any = None  # adapter mode: the current policy's adapter (None: the base model)
        self.lora_dir: Path | None = None
        max_len = spec.max_model_len
        hf_config = AutoConfig.from_pretrained(m.path, trust_remote_code=m.trust_remote_code)
        self.vision = VisionSpec.of(hf_config)
        # mixture-of-experts layers on CPU: vLLM prepacks their weights at the first load only (`load_weights`)
        experts = bool(getattr(hf_config.get_text_config(), "num_experts", 0))
        self.cpu_experts = device.type == "cpu" and experts
        # a text model's experts per token (a vision model's prompt reaches vLLM with its image tokens collapsed)
        record = experts and spec.record_routes and self.vision is None
        self.routes: RouteRecorder | None = RouteRecorder() if record and not spec.routes_from_engine else None
        self.engine_routes = record and spec.routes_from_engine
        eager = spec.enforce_eager or self.routes is not None
        if eager != spec.enforce_eager:  # compiled, vLLM's MoE op never calls the routers' hook
            log.info("rollout.enforce_eager=false: eager all the same, the experts are recorded by a router hook here")
        extra: dict[str, Any] = {}
        if device.type == "cpu":
            # A partially prefilled request with a seed makes vLLM 0.32 rewind its torch.Generator, which CPU
            # generators cannot do ("CPU Generator does not use offset"). A token budget that holds every
            # running sequence whole means no prefill is ever split.
            extra = {"enable_chunked_prefill": False, "max_num_batched_tokens": rollout.max_num_seqs * max_len}
            _eager_rank_count()
        width = torch.finfo(getattr(torch, spec.dtype)).bits // 8
        need = kv_cache_need(
            hf_config, width, rollout.max_num_seqs, max_len, tensor_parallel_size=rollout.tensor_parallel_size
        )
        extra |= kv_cache_args(device.type, need, rollout.cpu_kvcache_space_gb)
        extra |= spec.scheduler_options()
        if self.engine_routes:
            extra["enable_return_routed_experts"] = True
        if self.adapter_mode:
            extra |= {"enable_lora": True, "max_lora_rank": m.lora_rank, "max_loras": 1}
            shm = Path("/dev/shm")  # adapters are written per update: memory-backed where there is one
            self.lora_dir = Path(tempfile.mkdtemp(prefix="torchrl_post_lora_", dir=shm if shm.is_dir() else None))
        if spec.prefix_caching:
            # Prefix caching across an agent's turns (each turn's prompt is the last one grown). On CPU the
            # default block (128 tokens) never fills on short multi-turn prompts; 32 is the smallest the CPU
            # attention backend accepts.
            extra["enable_prefix_caching"] = True
            if device.type == "cpu":
                extra["block_size"] = 32
        if self.vision is not None:
            _vision_ready()
            extra["limit_mm_per_prompt"] = {"image": rollout.limit_images, "video": 0}
        if device.type == "cpu" and rollout.tensor_parallel_size > 1:
            _remove_stale_cpu_shm()
        llm_class = vllm.LLM  # the engine's modules load here
        # vLLM's start calls gc.collect() five times; each walked every object the imports made (0.25 s apiece
        # on CPU, 1.2 s of a 12 s start). Frozen, those objects are skipped: the collections find what is new.
        gc.freeze()
        self.llm = llm_class(
            model=m.path,
            trust_remote_code=m.trust_remote_code,
            distributed_executor_backend="external_launcher",
            tensor_parallel_size=rollout.tensor_parallel_size,
            dtype=spec.dtype,  # type: ignore[arg-type]  # validated against DTYPES
            seed=seed,
            max_model_len=max_len,
            max_num_seqs=rollout.max_num_seqs,
            gpu_memory_utilization=_memory_share(spec, device, reserve_bytes),
            enforce_eager=eager,
            enable_sleep_mode=self.sleep_level > 0,
            logprobs_mode="processed_logprobs",
            load_format=self._load_format(spec.load_format),
            **extra,
        )
        if self.routes is not None:
            layers = self.llm.collective_rpc(self.routes.install)[0]
            log.info("recording the experts of %d MoE layers per token (rollout.return_routed_experts)", layers)

    def _load_format(self, load_format: str) -> str:
        """rollout.load_format, except that an engine serving adapters needs its base weights from disk (the
        syncs send only adapters), and that `dummy` keeps the model's buffers (`dummy_keeping_buffers`)."""
        if load_format == "dummy" and self.adapter_mode:
            log.info("rollout.load_format=dummy: with rollout.lora_sync=adapter the engine reads its base weights")
            return "auto"
        if load_format == "dummy":
            return dummy_keeping_buffers()
        return load_format

    def _sampling(self, params: SamplingParams, uid: int, n: int) -> Any:
        """vLLM's sampling parameters for the prompt `uid` (its own seed), the sampled tokens' logprobs, ids only."""
        return self._vllm.SamplingParams(
            n=n,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k if params.top_k > 0 else -1,
            max_tokens=params.max_tokens,
            seed=params.prompt_seed(uid),
            logprobs=0,
            detokenize=False,
            output_kind=self._vllm.sampling_params.RequestOutputKind["DELTA" if params.progress else "FINAL_ONLY"],
            logit_bias=dict.fromkeys(self.vision.never_generated, NEVER_GENERATED_BIAS) if self.vision else None,
            # Each request gets parameters of its own, so vLLM's copy of them at add_request may be shallow: its deep
            # copy cost 10 ms per 64 single-sample requests on CPU, 7% of the demo's generation.
            skip_clone=True,
        )

    def _prompt(self, prompt_ids: list[int], images: list[Any] | None) -> dict[str, Any]:
        """vLLM's prompt: a vision-language prompt's image tokens collapsed to one placeholder per image (vLLM
        expands it to the patches) with its images."""
        if not images or self.vision is None:
            return {"prompt_token_ids": prompt_ids}
        ids = collapse_image_tokens(prompt_ids, self.vision.image_token_id)
        return {"prompt_token_ids": ids, "multi_modal_data": {"image": images}}

    # ---- step-driven generation (the agent loop adds a turn as soon as the previous one finished) ----
    def add_request(
        self,
        request_id: str,
        prompt_ids: list[int],
        params: SamplingParams,
        uid: int,
        images: list[Any] | None = None,
    ) -> None:
        """Queue one sample of `prompt_ids` (n is ignored) seeded by `uid`, with the prompt's `images`; `step`
        advances every request. Where experts are recorded, the request reads no cached prefix: its prefill
        computes (and records) every position, a re-added request's with the weights of now."""
        from vllm.inputs.engine import tokens_input

        self.wake_up()
        engine = self.llm.llm_engine
        # A group's samples come one after another with one prompt: its input is processed (validated, rendered,
        # an image run through the vision processor) once and each sample copies it, as vLLM fans out an n-sample
        # request; 64 single-sample requests processed one by one cost 7% of a demo batch's generation on CPU.
        key = (uid, replace(params, sample=0), self.weights_version, self.lora_request)
        last = self._last
        if last is not None and last[0] == key and last[2] is images and last[1] == prompt_ids:
            request = copy.copy(last[3])
            request.sampling_params = copy.copy(request.sampling_params)
            request.sampling_params.seed = params.prompt_seed(uid)
        else:
            sampling = self._sampling(params, uid, 1)
            if self.routes is not None or self.engine_routes:
                sampling.skip_reading_prefix_cache = True
            prompt: Any = self._prompt(prompt_ids, images)
            if "multi_modal_data" in prompt:  # through vLLM's renderer (its multi-modal processor), as LLM.generate's
                prompt["cache_salt"] = self._salt()
                prompt = self.llm._preprocess_cmpl_one(prompt)
            else:
                prompt = tokens_input(prompt_ids, cache_salt=self._salt())
            request = engine.input_processor.process_inputs(
                request_id, prompt, sampling, engine.get_supported_tasks(), lora_request=self.lora_request
            )
            self._last = (key, prompt_ids, images, copy.copy(request))
        # What `LLMEngine.add_request` does with a processed single-sample request (passing one to it is deprecated).
        request.request_id, request.external_req_id = request_id, None
        engine.input_processor.assign_request_id(request)
        engine.output_processor.add_request(request, None, None, 0)
        engine.engine_core.add_request(request)

    def step(self) -> list[StepOutput]:
        """One engine step: each request that progressed, with the tokens it gained (a request that reports only at
        its end: all of them) and their logprobs; a finished one with its finish reason and, where recorded, its
        experts."""
        out = []
        for o in self.llm.llm_engine.step():
            c: Any = o.outputs[0]  # type: ignore[index]
            lps: Any = c.logprobs or []
            ids = list(c.token_ids)
            step = StepOutput(o.request_id, ids, [lp[t].logprob for lp, t in zip(lps, ids, strict=False)])
            self._lengths[o.request_id] = self._lengths.get(o.request_id, 0) + len(ids)
            if o.finished:
                step.finish_reason = "length" if c.finish_reason == "length" else "stop"
                length = self._lengths.pop(o.request_id)
                computed = len(o.prompt_token_ids or []) + length - 1  # positions whose experts the sample needs
                if self.routes is not None:
                    step.routes = self.routes.take(o.request_id, computed)
                elif self.engine_routes:
                    step.routes = engine_routes(c.routed_experts, o.request_id, computed)
            out.append(step)
        return out

    def abort(self, request_ids: list[str]) -> None:
        self.llm.llm_engine.abort_request(request_ids)
        for rid in request_ids:
            self._lengths.pop(rid, None)
        if self.routes is not None:  # a re-add under the same id records afresh
            self.routes.forget(request_ids)

    def _salt(self) -> str:
        return f"weights-{self.weights_version}"

    def reset_prefix_cache(self) -> bool:
        """Forget the cached KV blocks: those of requests that ran across an update (rollout.inflight_update=keep)
        were computed by earlier weights. Asleep, there is nothing to forget until the next load resets it. False
        while requests run (vLLM frees no block in use): then the salt keeps the old blocks from being read."""
        return self.asleep or bool(self.llm.reset_prefix_cache())

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """(name, full tensor) pairs in HF names, or a LoRA model's PEFT names (merged here; in adapter mode
        the adapter's tensors only, loaded as the engine's LoRA adapter)."""
        if self.adapter_mode:
            self._load_adapter(weights)
            return
        if self.lora_scale:
            weights = merged_weights(weights, self.lora_scale)
        if self.asleep:
            self.llm.wake_up(tags=["weights"])
        with ReloadAccount() as account:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights)})
        if self.cpu_experts:
            self.llm.apply_model(repack_cpu_experts)
        self.weights_version += 1
        self.llm.reset_prefix_cache()
        if self.vision is not None:  # cached image embeddings came from the old vision tower
            self.llm.llm_engine.reset_encoder_cache()
        if self.asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self.asleep = False
        if account.layers or account.params:
            if self._param_layers is None:  # the model's structure never changes: asked once
                self._param_layers = self.llm.apply_model(layers_with_parameters)[0]
            error = reload_misses(account.layers, account.params, self._param_layers)
            if error is not None:
                raise RuntimeError(error)

    def _load_adapter(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """A fresh adapter id per update (a reused id would serve KV blocks cached under the old adapter);
        tensors cloned (vLLM scales lora_B in place); the previous adapter removed."""
        from vllm.lora.request import LoRARequest

        assert self.lora_dir is not None
        tensors = {name: t.detach().to("cpu", copy=True) for name, t in weights if is_adapter(name)}
        old = self.lora_request
        version = (old.lora_int_id if old is not None else 0) + 1
        path = self.lora_dir / f"v{version}"
        write_peft_adapter(tensors, self.lora_rank, self.lora_alpha, path)
        self.wake_up()
        self.lora_request = LoRARequest(f"policy-v{version}", version, str(path))
        self.weights_version += 1
        self.llm.llm_engine.add_lora(self.lora_request)
        if old is not None:
            self.llm.llm_engine.remove_lora(old.lora_int_id)
            shutil.rmtree(old.lora_path, ignore_errors=True)
        self.llm.reset_prefix_cache()

    def sleep(self) -> None:
        """Level 2 discards the weights (the next sync rewrites all of them: no copy to host and back), level 1
        keeps them in host memory (an adapter sync sends the adapter only); both free the KV cache."""
        if self.sleep_level and not self.asleep:
            self.llm.sleep(level=self.sleep_level)
            self.asleep = True

    def wake_up(self) -> None:
        if self.asleep:
            if self.sleep_level == 2:
                raise RuntimeError("the vLLM engine slept at level 2 (weights discarded): a weight sync must wake it")
            self.llm.wake_up()
            self.asleep = False

    def shutdown(self, process_ends: bool = False) -> None:
        # Must run before the default process group is destroyed (vLLM tears down its groups here). After an
        # error inside the engine, vLLM may have torn them down already; that must not mask the error.
        if self.lora_dir is not None:
            shutil.rmtree(self.lora_dir, ignore_errors=True)
        _release_shared_memory()
        if process_ends:
            return
        try:
            del self.llm
            gc.collect()
        except Exception as e:  # teardown only
            log.warning("vLLM shutdown: %s", e)


def _release_shared_memory() -> None:
    """Free what vLLM's groups hold in /dev/shm, which outlives the process unless unlinked: the CPU tensor-parallel
    communicator's segment (`<group name>_<rank>`, 4 MiB per rank: vLLM 0.32 never unlinks it, so every TP engine
    on CPU left one per rank behind) and the broadcast queue's ring buffer (unlinked by its creator when
    dropped). Mappings stay valid until the engine is gone."""
    from vllm.distributed import parallel_state
    from vllm.distributed.device_communicators.cpu_communicator import _CPUSHMDistributed

    for ref in list(parallel_state._groups.values()):
        group = ref()
        if group is None:
            continue
        shm = getattr(group.device_communicator, "dist_module", None)
        if isinstance(shm, _CPUSHMDistributed):
            Path(f"/dev/shm/{shm.group_name}_{shm.communicator.rank}").unlink(missing_ok=True)
        group.mq_broadcaster = None


def engine_routes(routed: Any, request_id: str, computed: int) -> torch.Tensor:
    """vLLM's own record of a finished request's experts ([positions, layers, k]) as the `RouteRecorder` gives
    them: the first `computed` positions, int64."""
    if routed is None or len(routed) < computed:
        got = "none" if routed is None else f"{len(routed)} positions"
        raise RuntimeError(
            f"rollout.return_routed_experts: vLLM returned {got} for request {request_id}, {computed} needed"
        )
    return torch.as_tensor(routed[:computed], dtype=torch.int64)


class RouteRecorder:
    """Each request's experts, per MoE layer, as the engine routes its tokens (what `routed_experts` would give
    on a GPU build: vLLM 0.32 returns them only from its V2 model runner, which needs Triton, absent on CPU).

    `install` runs inside the engine's worker (in this process): every MoE layer's router reports its top-k ids
    of a step (`set_capture_fn`, before any expert-parallel remapping: logical ids), and the model runner's step
    splits the step's rows by request, in the order its input batch lays them out. A request's rows are written
    at the positions they computed (the scheduler's count of computed tokens), so a prefix-cache hit leaves -1
    and a preempted request's recomputation overwrites its earlier rows."""

    def __init__(self) -> None:
        self.step: dict[int, torch.Tensor] = {}  # MoE layer id -> this step's [tokens, k] ids
        self.chunks: dict[str, list[tuple[int, torch.Tensor]]] = {}  # request id -> (first position, [n, L, k])

    def clear(self) -> None:
        self.chunks.clear()

    def forget(self, samples: list[str]) -> None:
        """Drop the rows of the requests vLLM knows as `samples` (aborted ones)."""
        gone = set(samples)
        for key in [k for k in self.chunks if k.rsplit("-", 1)[0] in gone]:
            del self.chunks[key]

    def capture(self, layer: int, ids: torch.Tensor) -> None:
        self.step[layer] = ids.detach().to("cpu", torch.int16)

    def install(self, worker: Any) -> int:
        """Inside the worker: hook every MoE layer's router and the model runner's step; the layers hooked."""
        from vllm.model_executor.layers.fused_moe.runner.moe_runner import MoERunner

        runner = worker.model_runner
        layers = 0
        for module in runner.get_model().modules():
            if isinstance(module, MoERunner):
                module.router.set_capture_fn(functools.partial(self.capture, module.layer_id))
                layers += 1
        step = runner.execute_model

        def execute_model(scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
            self.step.clear()
            out = step(scheduler_output, *args, **kwargs)
            if self.step:
                self.split(list(runner.input_batch.req_ids), scheduler_output)
            return out

        runner.execute_model = execute_model
        return layers

    def split(self, order: list[str], scheduled: Any) -> None:
        """This step's captured rows, [tokens, L, k], to the requests that computed them."""
        rows = torch.stack([self.step[i] for i in sorted(self.step)], 1)
        start = {r.req_id: r.num_computed_tokens for r in scheduled.scheduled_new_reqs}
        cached = scheduled.scheduled_cached_reqs
        start |= dict(zip(cached.req_ids, cached.num_computed_tokens, strict=True))
        offset = 0
        for rid in order:
            n = scheduled.num_scheduled_tokens.get(rid, 0)
            if n:
                self.chunks.setdefault(rid, []).append((start.get(rid, 0), rows[offset : offset + n]))
            offset += n

    def take(self, sample: str, length: int) -> torch.Tensor:
        """The routes of the request vLLM knows as `sample` plus its own suffix (`-<8 characters>`), [length, L,
        k], -1 where no row was computed; forgotten after."""
        key = next((k for k in self.chunks if k.rsplit("-", 1)[0] == sample), None)
        chunks = self.chunks.pop(key, []) if key is not None else []
        if not chunks:
            raise RuntimeError(f"rollout.return_routed_experts: no experts recorded for request {sample}")
        out = torch.full((length, *chunks[0][1].shape[1:]), -1, dtype=torch.int16)
        for first, rows in chunks:  # in step order: a recomputation overwrites
            rows = rows[: max(0, length - first)]
            out[first : first + len(rows)] = rows
        return out


def repack_cpu_experts(model: torch.nn.Module) -> int:
    """Run inside the engine after a weight reload: pack every mixture-of-experts layer's new weights for the CPU
    kernel; returns how many tensors it packed. vLLM 0.32 packs them at the first load only
    (unquantized_fused_moe_method.py: the kernel's process_weights_after_loading runs `if not
    is_weight_update`), so after a reload its CPU experts read unpacked weights: wrong outputs, no error
    (a tiny Qwen3-MoE's greedy tokens differ from the trainer's after the first sync; equal with this)."""
    from vllm._custom_ops import cpu_prepack_moe_weight
    from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts

    packed = 0
    for layer in model.modules():
        if not isinstance(layer, RoutedExperts):
            continue
        experts: Any = layer.quant_method.moe_kernel.fused_experts  # type: ignore[union-attr]
        isa = getattr(experts, "isa", None)  # the unquantized CPU kernel's (CPUUnquantizedExperts)
        if isa is None or getattr(experts, "_use_zentorch", False):  # another kernel, another layout
            continue
        for name in ("w13_weight", "w2_weight"):
            w = getattr(layer, name)
            w.data.copy_(cpu_prepack_moe_weight(w.contiguous(), isa))
            packed += 1
    return packed


def _eager_rank_count() -> None:
    """vLLM's sampler counts each sampled token's rank with a one-line function under torch.compile; on CPU its
    first call compiles it with inductor, 2.2 s of every engine start (measured). Its own eager function counts
    the same."""
    from vllm.v1.sample import sampler

    eager = getattr(sampler.batched_count_greater_than, "_torchdynamo_orig_callable", None)
    if eager is not None:
        sampler.batched_count_greater_than = eager


def kv_cache_args(device_type: str, need: int, cpu_space_gb: int) -> dict[str, Any]:
    """vLLM's arguments that cap a rank's KV cache at `need` (`kv_cache_cap`): what rollout.max_num_seqs sequences
    of the max model length fill, not all the memory vLLM is given. On CPU the KV cache is allocated and zeroed at
    the start (a tiny model needs MiB: the 1 GiB default took 2.4 s to zero): kv_cache_memory_bytes, at most
    rollout.cpu_kvcache_space_gb (VLLM_CPU_KVCACHE_SPACE, when set, still wins, as in vLLM). On CUDA the budget is
    what vLLM's profile leaves of its gpu_memory_utilization share, known only inside it: `KVCappedWorker`."""
    if device_type == "cuda":
        from torchrl_post.engines.vllm_worker import KV_NEED, KVCappedWorker

        worker = f"{KVCappedWorker.__module__}.{KVCappedWorker.__qualname__}"
        return {"worker_cls": worker, "additional_config": {KV_NEED: need}}
    if os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
        return {}
    return {"kv_cache_memory_bytes": kv_cache_cap(need, cpu_space_gb * GiB)}


def _memory_share(spec: EngineSpec, device: torch.device, reserve_bytes: int) -> float:
    """vLLM's gpu_memory_utilization: the plan's, or, colocated with it unset, sized from the memory the trainer
    leaves free now (`engine_memory_fraction`). The CPU backend ignores it (its KV cache is what the requests
    need, at most rollout.cpu_kvcache_space_gb)."""
    if device.type != "cuda":
        return 0.5
    if spec.gpu_memory_utilization is not None:
        return spec.gpu_memory_utilization
    torch.cuda.empty_cache()  # the trainer's cached, unused blocks are free to the engine (vLLM empties it too)
    free, total = torch.cuda.mem_get_info(device)
    share = engine_memory_fraction(free, total, reserve_bytes)
    log.info(
        "rollout.gpu_memory_utilization=%.3f: %.1f GiB free of %.1f GiB beside the trainer, %.1f GiB kept for its "
        "optimizer state", share, free / GiB, total / GiB, reserve_bytes / GiB,
    )  # fmt: skip
    return share


DUMMY_KEEPING_BUFFERS = "torchrl_post_dummy"
"""The load format a `rollout.load_format=dummy` engine starts with (`dummy_keeping_buffers`)."""


@functools.cache
def dummy_keeping_buffers() -> str:
    """vLLM's dummy start, except that persistent buffers keep the values the model computed when it was built;
    registered (once) as a load format of its own, whose name is returned.

    vLLM's dummy loader randomises every persistent buffer along with the parameters. The weight sync can only
    replace what the trainer has, its parameters, so a buffer that no HF model holds stays random for good. Qwen-VL
    engines have one: the vision tower's input normalisation (`FusedMMInputNorm`: image mean and std from the
    processor config as buffers, vLLM normalising pixels on the device), which HF does in its image processor.
    With it random the engine saw other images than the trainer (logprobs off by 0.2 after the first sync) and a
    VLM run stopped learning (val 0.25 -> 0.0). A reload leaves what it is not sent as it was (`reload_misses`),
    so such a buffer must be right from the start: what the constructor computed, as when weights are read."""
    from vllm.model_executor.model_loader import DummyModelLoader, register_model_loader

    class DummyKeepingBuffers(DummyModelLoader):
        def load_weights(self, model: torch.nn.Module, model_config: Any) -> None:
            kept = [
                (module, name, b.detach().clone())
                for module in model.modules()
                for name, b in module._buffers.items()
                if b is not None and name not in module._non_persistent_buffers_set
            ]
            super().load_weights(model, model_config)
            with torch.no_grad():
                for module, name, value in kept:
                    getattr(module, name).copy_(value)

    register_model_loader(DUMMY_KEEPING_BUFFERS)(DummyKeepingBuffers)
    return DUMMY_KEEPING_BUFFERS


def _vision_ready() -> None:
    """Qwen-VL models without torchvision (the CPU stack): the processor stand-ins (`multimodal.compat`) must be
    in place where vLLM inspects the model class, so that inspection runs in this process, not a fresh one."""
    from torchrl_post.multimodal import compat

    if compat.has_torchvision():
        return
    compat.install()
    from vllm.model_executor.models import registry

    registry._run_in_subprocess = lambda fn: fn()  # private in vLLM 0.32: pinned in requirements


RELOAD_LOGGERS = (
    "vllm.model_executor.model_loader.reload.layerwise",
    "vllm.model_executor.model_loader.reload.inplace",
)
"""Where vLLM 0.32's in-place reload reports what it did not load (its only report: no return value carries it)."""
_LAYER_MISSED = "%s: Failed to load weights"  # layerwise.finalize_layerwise_processing, arg: the layer's class
_PARAMS_MISSED = "Following weights were not loaded from checkpoint: %s"  # inplace.reload_weights, arg: names


class ReloadAccount(logging.Filter):
    """What one in-place reload did not load, taken from vLLM's reload loggers while it runs.

    vLLM 0.32 loads each layer of its model once all of its tensors arrived; a layer that got none of them is
    left as it was, with one warning, `<layer class>: Failed to load weights` (`layers`), and parameters that
    were never loaded are listed in another (`params`). Both records are taken here instead of printed (the
    engine raises on them, `reload_misses`); the loggers are opened to WARNING for the duration, so a quieter
    VLLM_LOGGING_LEVEL cannot hide a miss, and the records that only that let through are dropped.
    """

    def __init__(self) -> None:
        super().__init__()
        self.layers: list[str] = []
        self.params: list[str] = []
        self._saved: list[tuple[logging.Logger, int, int]] = []  # logger, its own level, its effective level

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        if record.msg == _LAYER_MISSED and args:
            self.layers.append(str(args[0]))
            return False
        if record.msg == _PARAMS_MISSED and args:
            names: Any = args[0]  # a set of parameter names
            self.params.extend(sorted(str(n) for n in names))
            return False
        return record.levelno >= next((eff for lg, _, eff in self._saved if lg.name == record.name), 0)

    def __enter__(self) -> ReloadAccount:
        for name in RELOAD_LOGGERS:
            logger = logging.getLogger(name)
            self._saved.append((logger, logger.level, logger.getEffectiveLevel()))
            logger.addFilter(self)
            if logger.getEffectiveLevel() > logging.WARNING:
                logger.setLevel(logging.WARNING)
        return self

    def __exit__(self, *exc: object) -> None:
        for logger, level, _ in self._saved:
            logger.removeFilter(self)
            logger.setLevel(level)
        self._saved.clear()


def layers_with_parameters(model: torch.nn.Module) -> dict[str, list[str]]:
    """Layer class name -> the names of its modules in `model` that own parameters (run inside the worker)."""
    out: dict[str, list[str]] = {}
    for name, module in model.named_modules():
        if next(module.parameters(recurse=False), None) is not None:
            out.setdefault(type(module).__name__, []).append(name)
    return out


def reload_misses(layers: list[str], params: list[str], param_layers: dict[str, list[str]]) -> str | None:
    """The error for what a reload did not load, or None when nothing that matters was missed.

    `layers`: classes of layers that got none of their tensors; `params`: parameter names vLLM reports unloaded;
    `param_layers`: `layers_with_parameters` of the engine's model. A layer without parameters is expected and
    quiet: its tensors are buffers computed from the config, which no sync sends (the rotary embeddings' cos/sin
    cache, a Qwen-VL vision tower's image normalisation), and vLLM keeps their values, right from the start (a
    dummy start keeps buffers: `dummy_keeping_buffers`). A layer with parameters kept its old values: the engine
    would sample with weights the trainer does not have.
    """
    missed = []
    for cls in dict.fromkeys(layers):
        owners = param_layers.get(cls, [])
        if len(owners) == 1:
            missed.append(f"{cls} ({owners[0]})")
        elif owners:
            more = ", ..." if len(owners) > 4 else ""
            missed.append(f"{cls} (some of its {len(owners)} layers: {', '.join(owners[:4])}{more})")
    if not missed and not params:
        return None
    parts = []
    if missed:
        parts.append("layers that got none of their parameters: " + "; ".join(missed))
    if params:
        parts.append("parameters not loaded: " + ", ".join(params[:8]) + (" ..." if len(params) > 8 else ""))
    return (
        "weight sync: the vLLM engine did not load every parameter of its model, "
        + "; ".join(parts)
        + ". The sync missed them, so the engine keeps their old values and samples with weights the trainer "
        "does not have. The sync sends the trainer's parameters under their HF names (tied embeddings also as "
        "lm_head.weight): check that this architecture's names match what vLLM's load_weights expects"
    )


ParsedCalls = tuple[bool, list[tuple[str, str]]]
"""(the response tried to call a tool, [(function name, arguments as JSON text)]): tried with no calls is a
malformed call."""


def tool_parser_names() -> list[str]:
    from vllm.tool_parsers import ToolParserManager

    return sorted(ToolParserManager.list_registered())


def tool_call_parser(name: str, tokenizer: Any) -> Callable[[str], ParsedCalls]:
    """vLLM's tool parser `name` (hermes for Qwen2.5's `<tool_call>{json}</tool_call>`) as a function of the
    response text decoded with its special tokens. A malformed call is reported, not logged with a traceback
    (the parser logs one per failure, and a policy in training writes many)."""
    from vllm.tool_parsers import ToolParserManager

    parser = ToolParserManager.get_tool_parser(name)(tokenizer)
    logging.getLogger(type(parser).__module__).setLevel(logging.CRITICAL)
    start = getattr(parser, "tool_call_start_token", None)

    def parse(text: str) -> ParsedCalls:
        info = parser.extract_tool_calls(text, None)  # type: ignore[arg-type]  # offline: no request
        calls = [(c.function.name, c.function.arguments) for c in info.tool_calls] if info.tools_called else []
        tried = bool(calls) or (isinstance(start, str) and start in text)
        return tried, calls

    return parse


def _remove_stale_cpu_shm() -> None:
    """vLLM's CPU tensor-parallel all-reduce keeps a /dev/shm segment per rank named after the group only
    (`-tp:0-[0-1]-cpushm_0` under torchrun, no run id in it). A killed run leaves them behind, and the next
    start fails with "create shm in SHMManager failed. errno: 17". Every rank of the engine removes them
    before the engine starts; none is created before all of them got there (vLLM all-reduces first)."""
    shm = Path("/dev/shm")
    for seg in shm.glob("-tp*cpushm*") if shm.is_dir() else []:
        log.info("removing a stale vLLM CPU shared-memory segment %s", seg.name)
        seg.unlink(missing_ok=True)
