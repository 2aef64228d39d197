"""The config schema: dataclasses registered in Hydra's ConfigStore (the only schema; YAML sets values).

Key names follow verl and ROLL where those have one. The defaults are the built-in demo (a tiny Qwen2
model learning single-digit sums with GRPO), so `torchrun ... -m torchrl_post.train` with no overrides
runs it. Fields typed `Any` accept a string or a list and are checked in `validate.py`. A field typed
`Annotated[str, T]` takes one of the values of the `Literal` type T (`enums.py`): OmegaConf sees a `str` (it has no
`Literal`), and `validate.check_enums` checks the value against T.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any

from torchrl_post.config.enums import (
    AdvEstimator,
    Defaults,
    Device,
    DistillLoss,
    Dtype,
    DtypeOrAuto,
    Engine,
    EngineLoadFormat,
    ExpertsImplementation,
    InflightUpdate,
    JudgeOnError,
    JudgeParser,
    KLControl,
    KLKind,
    Logger,
    LoraSyncMode,
    LossAggMode,
    LrSchedulerType,
    ModelLoadFormat,
    PolicyLoss,
    ResumeMode,
    RewardCombine,
    RolloutIS,
    RolloutMode,
    RSLevel,
    SftTruncation,
    StepwiseMode,
    Truncation,
)


@dataclass
class ModelConfig:
    path: str = "outputs/demo_model"
    """Local HF model directory (config.json, safetensors, tokenizer). No hub downloads at run time."""
    trust_remote_code: bool = False
    """Allow the model directory's own Python code. Off unless you trust the directory."""
    enable_gradient_checkpointing: bool = False
    """Recompute each decoder layer's activations in the backward pass (activation checkpointing)."""
    load_format: Annotated[str, ModelLoadFormat] = "sharded"
    """How the trained and frozen roles get their weights: `sharded` builds the model with its parameters on the
    meta device, shards it, and each rank reads only its own rows from the safetensors files (host memory per
    rank ~1/ranks of the model); `full` loads the whole model on every rank, then shards it. Tensor names are read
    as transformers renames them (Qwen2-VL's), and an MoE's per-expert tensors as the fused experts it stacks them
    into (Qwen3-MoE's, Qwen2-MoE's: each rank reads its own experts); LoRA models, and checkpoints whose tensors
    it converts in other ways, load in full."""
    use_remove_padding: bool = True
    """Sequence packing (verl's key; on by default): each micro-batch's samples are packed into rows as long as its
    longest sample, attention kept within each sample by its position ids (or sequence boundaries for an attention
    that takes no mask), with a prompt's samples sharing one copy of it (model.use_shared_prefix); the same loss as
    the padded forward, less compute (1.4x faster per step on the demo, 1.7x to 3x on the measured models). Actor,
    reference and critic forwards; vision-language batches stay padded. false: the padded forward."""
    use_shared_prefix: bool = True
    """With use_remove_padding: the samples of one prompt (GRPO's n) share one copy of it in the packed row, each
    response attending to the prompt and itself (a tree mask), so the prompt's tokens are computed once. Exact
    (the same logprobs and loss). Under sdpa the attention runs block by block (each response over the prompt and
    itself, never more than its own row), so all the samples of a prompt share it; eager and Ulysses attend over
    a dense mask and share only where that costs no more attention than separate rows (prompts long next to
    responses). With flash-attn the samples pack apart."""
    dtype: Annotated[str, Dtype] = "float32"
    """The dtype the trained and frozen models are loaded and kept in (ROLL's model_args.dtype): float32 (master
    weights; mixed precision via actor.fsdp.param_dtype), bfloat16 or float16."""
    ulysses_sequence_parallel_size: int = 1
    """Sequence parallelism (DeepSpeed-Ulysses; verl's key, ROLL's model_args.ulysses_size): each row's tokens are
    split over this many ranks of the actor, critic and reference, so one rank holds 1/sp of a long sample's
    activations. Attention swaps sequence shards for head shards (two all-to-alls per layer), so every rank attends
    over the whole sequence for its heads. It divides every trained or forward role's ranks and the attention
    heads (key/value heads are repeated where fewer); the sp ranks of a group train the union of their rows.
    Text models with sdpa or eager attention; 1: off."""
    lora_rank: int = 0
    """LoRA adapter rank (PEFT); 0 trains the full model. With an adapter only its parameters train and sit in
    the optimizer, the reference policy is the base model (the adapter disabled), and the engine gets merged
    weights (W + lora_alpha / lora_rank * B @ A) at every sync."""
    lora_alpha: int = 16
    """LoRA scaling numerator (PEFT's lora_alpha)."""
    target_modules: Any = "all-linear"
    """Modules to adapt: `all-linear` or a list of module names (q_proj, k_proj, v_proj, o_proj, ...)."""
    lora_dropout: float = 0.0
    """Dropout on the adapter's input (PEFT's lora_dropout); 0 keeps the trainer's logprobs equal to the engine's."""
    experts_implementation: Annotated[str, ExpertsImplementation] = "auto"
    """How a mixture-of-experts model runs its experts (transformers' experts_implementation), in the actor,
    reference, critic and HF rollout: `auto` is transformers' choice (grouped_mm where it can dispatch, else eager);
    `eager` loops over the experts; `grouped_mm` runs each projection as one grouped matmul
    (torch.nn.functional.grouped_mm); `batched_mm` copies each routed token's expert weights (memory grows with
    tokens x top-k x an expert's size: for generation-sized batches, not an update). The same numbers either way;
    on CPU grouped_mm runs at eager's speed (0.98x to 1.05x), batched_mm 10 to 20x slower at 2048 tokens
    (benchmarks/moe_experts.py). Dense models ignore it (with a warning)."""


@dataclass
class DataConfig:
    train_files: Any = "outputs/demo_data/train.jsonl"
    """Training data: a path or a list of paths (.json, .jsonl, .csv, .parquet)."""
    val_files: Any = "outputs/demo_data/val.jsonl"
    """Validation data, as train_files; null means no validation set."""
    prompt_key: str = "prompt"
    """Column holding the prompt: a string or a list of chat messages. A `messages` column is used if absent."""
    answer_key: str = "answer"
    """Column holding the ground truth given to the reward function (dots reach into dicts); with the default,
    rows without `answer` take verl's reward_model.ground_truth."""
    data_source_key: str = "data_source"
    """Column naming the task of each row; it picks the built-in reward and names val/test_score/<data_source>."""
    default_data_source: str = "arithmetic"
    """data_source for rows without that column."""
    apply_chat_template: bool = True
    """Wrap prompts with the tokenizer's chat template (a string prompt becomes one user message)."""
    chat_template: str | None = None
    """The chat template prompts and agent turns are rendered with: null keeps the tokenizer's own; a name
    (chatml, qwen2_5, llama3, base, empty: ROLL's data_args.template) or a path to a .jinja file (TRL's
    chat_template_path) replaces it, also in the exported tokenizer. A vision-language model takes a path only."""
    train_batch_size: int = 16
    """Prompts per training step (each is sampled rollout.n times)."""
    val_batch_size: int = 0
    """Prompts per validation generate call; 0 means the whole validation set at once."""
    max_prompt_length: int = 64
    """Prompt token budget; longer prompts are filtered, cut or rejected (filter_overlong_prompts, truncation)."""
    max_response_length: int = 8
    """Maximum generated tokens per sample."""
    filter_overlong_prompts: bool = True
    """Drop prompts over max_prompt_length (the count is logged); false hands them to data.truncation."""
    truncation: Annotated[str, Truncation] = "error"
    """A prompt over max_prompt_length that data.filter_overlong_prompts=false keeps (verl's data.truncation): error,
    left (keep its last max_prompt_length tokens), right (its first) or middle (the first half and the last half,
    the end taking the odd one; right cuts the generation prompt too, as verl's does). Cut after the chat template;
    a cut through image tokens is an error."""
    shuffle: bool = True
    """Shuffle the training set every epoch (seeded by trainer.seed and the epoch)."""
    skip_bad_rows: bool = False
    """Skip (and count) malformed rows instead of stopping at the first with an error naming file and line."""
    image_key: str = "images"
    """Vision-language models: the column listing each row's images (file paths relative to the data file,
    bytes, or {"bytes", "path"} dicts); the prompt holds one `<image>` marker (or image item) per image."""
    return_multi_modal_inputs: bool = True
    """Vision-language models: run the image processor once when the data loads and keep its pixel values
    (faster steps); false processes each step's images when its batch is built (less memory)."""


@dataclass
class ValKwargs:
    n: int = 1
    """Samples per validation prompt; above 1 also logs val/test_score/<data_source>/mean@n and pass@n."""
    do_sample: bool = False
    """false: greedy (temperature 0); true: sample at temperature, top_p and top_k."""
    temperature: float = 0.0
    """Validation temperature when do_sample (0 is greedy)."""
    top_p: float = 1.0
    """Validation nucleus mass when do_sample."""
    top_k: int = -1
    """Validation top-k when do_sample; -1 disables it."""


@dataclass
class RolloutConfig:
    engine: Annotated[str, Engine] = "vllm"
    """Generation engine: vllm (in-process vllm.LLM per rank) or hf (transformers generate)."""
    n: int = 8
    """Samples per prompt (the GRPO group size)."""
    temperature: float = 1.0
    """Sampling temperature for training rollouts."""
    top_p: float = 1.0
    """Nucleus sampling mass."""
    top_k: int = -1
    """Top-k sampling; -1 disables it."""
    val_kwargs: ValKwargs = field(default_factory=lambda: ValKwargs())
    """Validation sampling (verl's rollout.val_kwargs): greedy by default."""
    gpu_memory_utilization: float | None = None
    """Fraction of the GPU's memory vLLM may take (vLLM's meaning; GPU only). null sizes it by placement: an engine
    on GPUs of its own takes 0.9; a colocated engine takes 0.9 of what is free when it starts, less the optimizer
    state the trainer has yet to allocate (`engines/base.py: engine_memory_fraction`)."""
    cpu_kvcache_space_gb: int = 1
    """Most KV cache vLLM takes on CPU, in whole GiB: it allocates what rollout.max_num_seqs sequences of the
    longest prompt plus response can fill, up to this (VLLM_CPU_KVCACHE_SPACE, when set, wins)."""
    max_num_seqs: int = 256
    """Most sequences vLLM schedules at once; its KV cache holds what this many of the longest prompt plus response
    fill, at most what its memory allows (CPU and CUDA alike: `engines/base.py: kv_cache_cap`)."""
    dtype: Annotated[str, DtypeOrAuto] = "auto"
    """Engine weight dtype: auto (float32 on CPU, which keeps parity with the trainer exact; bfloat16 on CUDA, the
    dtype vLLM's FlashAttention/FlashInfer backends take), float32, bfloat16 or float16."""
    tensor_parallel_size: int = 1
    """vLLM tensor parallel size: consecutive rollout ranks that hold one engine (must divide the rollout ranks)."""
    mode: Annotated[str, RolloutMode] = "sync"
    """sync or async, verl's and rLLM's key: every rollout here is continuous batching already (a step's requests
    sent to the engine as one batch, or the agent loop when an agent is configured), so both values run the same and
    nothing but the validator reads it; it stays so that verl's configs load (the alias table maps
    actor_rollout_ref.rollout.mode here). Off-policy look-ahead is trainer.max_off_policy_steps."""
    free_cache_engine: bool = True
    """On GPU, a colocated vLLM sleeps during the update to free its memory: level 2 (weights and KV cache
    discarded; the next sync writes every weight) when the whole model is synced, level 1 (weights kept in host
    memory) with rollout.lora_sync=adapter, whose syncs send the adapter only. No sleep mode on CPU, and no need
    on rollout ranks of their own."""
    enforce_eager: bool | None = None
    """Skip vLLM's CUDA-graph capture. null: true on CPU (nothing to capture), false on CUDA (decoding is bound by
    kernel launches without graphs; the in-place weight reload keeps tensor storage, so the graphs survive it)."""
    sync_bucket_mb: int = 64
    """Weight sync bucket size in MiB: parameters are gathered and pushed this many bytes at a time."""

    limit_images: int = 1
    """Vision-language models: the most images one prompt may carry (vLLM's limit_mm_per_prompt)."""
    load_format: Annotated[str, EngineLoadFormat] = "dummy"
    """The engine's initial weights (vLLM's load_format; ROLL's and verl's advice): `dummy` starts it with random
    weights and the first weight sync (at every fresh start, as after a resume) gives it the actor's; `auto` reads
    them from model.path as well. With rollout.lora_sync=adapter the base weights are read from disk."""
    return_routed_experts: bool = True
    """Mixture-of-experts models on the vLLM engine: record each token's experts per MoE layer (vLLM's
    enable_return_routed_experts): actor.router_replay needs them, and rollout/router_mismatch compares them with
    the trainer's own routing. They travel with the batch as int16 [samples, layers, top-k, tokens]; an agent
    trajectory's are its last turn's (each recorded turn prefills its whole context)."""
    partial_rollout: bool = False
    """Streaming generation with partial rollouts (verl's async_training.partial_rollout): the engine keeps
    rollout.prompts_in_flight prompts generating, a step takes the first data.train_batch_size groups that
    complete, and the unfinished requests carry on into later steps across weight updates (rollout.inflight_update
    says what happens to their KV cache). Every token keeps the policy version that sampled it and its logprob (the
    behaviour policy the rollout correction weighs against); trainer.max_staleness bounds how old a group may be.
    With trainer.max_off_policy_steps=k the rollout ranks fill k batches ahead while the actor trains. Colocated,
    the unfinished requests survive each update: re-prefilled under the new weights when the engine generates
    again. The points where weights change are counted in engine steps, so runs and resumes are exact."""
    prompts_in_flight: int | None = None
    """rollout.partial_rollout: prompts (groups of rollout.n) generating or completed and not yet trained, over
    all engines; null: max(trainer.max_off_policy_steps + 1, 2) x data.train_batch_size. More than a batch lets a step
    take the groups that finish first while the long ones keep generating."""
    inflight_update: Annotated[str, InflightUpdate] = "keep"
    """rollout.partial_rollout on rollout ranks of their own: what a weight update does to the requests in flight.
    keep: they continue with their KV cache (keys and values of earlier tokens from the old weights; nothing is
    repeated); recompute: they are re-added with their tokens so far as prompt, so the new weights prefill them
    (one prefill per request and update; every later token is exactly the new policy's). Colocated engines always
    recompute (their KV cache is freed for the update)."""
    update_on_arrival: bool = False
    """rollout.partial_rollout on rollout ranks of their own: after filling the batches ahead, keep generating (and
    start new prompts while rollout.prompts_in_flight allows) until the actor's new weights have arrived, and take
    them at the next engine-step boundary (verl's fully-async rollouter). No rollout rank waits while it has work;
    groups get staler (trainer.max_staleness bounds them). The update point then depends on timing: a run is not
    reproducible step for step and a resume goes on from the checkpoint without loss but not bit for bit. false:
    the rollout ranks block for the weights after the fill (counted update points, exact resumes)."""
    lora_sync: Annotated[str, LoraSyncMode] = "merged"
    """With model.lora_rank > 0: `merged` pushes W + alpha/r * B @ A through the engine's weight reload (full
    engine speed); `adapter` sends only the adapter's tensors and loads them as the engine's own LoRA adapter (a
    fresh adapter id per update; vLLM's LoRA kernels run about 2x slower on CPU)."""


@dataclass
class FSDPConfig:
    fsdp_size: int = -1
    """Ranks each parameter is sharded over; -1 (or the group size) is plain FSDP, smaller is HSDP: a
    (group / fsdp_size) x fsdp_size mesh, sharded within rows, replicated across them."""
    param_dtype: Annotated[str, DtypeOrAuto] = "auto"
    """Mixed-precision dtype for parameters in forward/backward: auto (float32 on CPU; bfloat16 on CUDA, over
    master weights kept in model.dtype), float32, bfloat16 or float16."""
    reduce_dtype: Annotated[str, Dtype] = "float32"
    """Dtype for gradient reduce-scatter."""
    reshard_after_forward: bool = True
    """Free gathered parameters after forward (ZeRO-3); false keeps them until backward (ZeRO-2)."""
    offload_policy: bool = False
    """CPU offload of the sharded parameters, gradients and optimizer state (FSDP2's CPUOffloadPolicy; the
    optimizer steps on CPU): less accelerator memory for more host traffic. ROLL's offload_policy."""
    param_offload: bool = False
    """Hybrid engine (verl's param_offload): move the sharded parameters and gradients to host memory after the
    weight sync, while the colocated engine generates, and back before the next forward. No-op on CPU."""
    optimizer_offload: bool = False
    """Hybrid engine (verl's optimizer_offload): keep the optimizer state in host memory outside the optimizer
    step. No-op on CPU."""
    expert_parallel_size: int = 1
    """Mixture-of-experts models: ranks each MoE layer's routed experts are spread over (the `ep` dimension of a
    sparse mesh (efsdp, ep) beside the dense one; each rank holds E / ep experts, FSDP-sharded over efsdp = ranks
    / ep, and tokens go to their experts' ranks by all-to-all). Divides the role's ranks (with HSDP, fsdp_size: the
    mesh is then (dp_replicate, efsdp, ep)) and the expert count; composes with LoRA and Ulysses; 1: the experts are
    sharded with the rest of each layer by FSDP2. ROLL's expert_model_parallel_size; docs/moe.md."""


@dataclass
class ActorConfig:
    lr: float = 5e-4
    """AdamW learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    """AdamW betas."""
    lr_warmup_steps: int = 0
    """Training steps of linear warmup to lr (the first step trains at lr / lr_warmup_steps; every mini-batch of a
    step at the same lr); <= 0: lr_warmup_steps_ratio decides (verl's -1 too)."""
    lr_warmup_steps_ratio: float = 0.0
    """Warmup as a fraction of the run's training steps (int(ratio x steps)), when lr_warmup_steps <= 0."""
    lr_scheduler_type: Annotated[str, LrSchedulerType] = "constant"
    """After warmup: constant (lr) or cosine (down to min_lr_ratio x lr at the run's last step). verl's
    lr_scheduler_type (formerly warmup_style), ROLL's training_args.lr_scheduler_type."""
    min_lr_ratio: float = 0.0
    """cosine: the floor as a fraction of lr, in [0, 1] (the warmup starts there too)."""
    num_cycles: float = 0.5
    """cosine: waves over the decay; 0.5 is one half wave from lr down to the floor."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value (<= 0 disables clipping)."""
    clip_ratio: float = 0.2
    """PPO clip range epsilon; clip_ratio_low/high override each side."""
    clip_ratio_low: float | None = None
    """Lower clip epsilon (ratio >= 1 - low); defaults to clip_ratio."""
    clip_ratio_high: float | None = None
    """Upper clip epsilon (ratio <= 1 + high); defaults to clip_ratio."""
    loss_agg_mode: Annotated[str, LossAggMode] = "token-mean"
    """How token losses become one number: token-mean, seq-mean-token-sum, seq-mean-token-mean, seq-mean-token-sum-norm."""
    entropy_coeff: float = 0.0
    """Entropy bonus coefficient (subtracted from the loss)."""
    ppo_epochs: int = 1
    """Passes over each step's rollouts."""
    ppo_mini_batch_size: int = 0
    """Prompts per optimizer step (x rollout.n samples); 0 means the whole train batch (one update per step)."""
    ppo_micro_batch_size_per_gpu: int = 32
    """Samples per forward/backward on one rank (gradient accumulation splits the mini-batch into these)."""
    gradient_accumulation_steps: int = 0
    """The optimizer step counted per rank, as ROLL and TRL count it: every actor data-parallel group steps after
    this many micro-batches of ppo_micro_batch_size_per_gpu samples, so the plan sets ppo_mini_batch_size to
    micro x steps x data-parallel size / rollout.n prompts (which then depends on the world launched). 0: unused,
    ppo_mini_batch_size decides."""
    use_dynamic_bsz: bool = False
    """Form micro-batches by a token budget (ppo_max_token_len_per_gpu) instead of a row count."""
    ppo_max_token_len_per_gpu: int = 4096
    """With use_dynamic_bsz: most rows x (trimmed) columns in one micro-batch on one rank."""
    clip_ratio_c: float | None = 3.0
    """Dual-clip bound for negative advantages (loss <= -A * c); null turns dual clip off. Must be > 1."""
    policy_loss: Annotated[str, PolicyLoss] = "vanilla"
    """Policy loss mode: vanilla (token-level PPO ratio), gspo (sequence-level ratio, use small clip ratios), or
    the entropy-control modes of Cui et al. 2025: clip_cov (PPO clip; a few random high-covariance tokens get no
    gradient) and kl_cov (unclipped; a KL penalty on the top-covariance tokens). verl's policy_loss.loss_mode."""
    clip_cov_ratio: float = 0.0002
    """clip_cov: fraction of a micro-batch's trained tokens whose gradient is cut (at least one), in (0, 1]."""
    clip_cov_lb: float = 1.0
    """clip_cov: only tokens whose covariance (A - mean A)(logp - mean logp) exceeds this are candidates."""
    clip_cov_ub: float = 5.0
    """clip_cov: only tokens whose covariance is below this are candidates (> clip_cov_lb)."""
    kl_cov_ratio: float = 0.0002
    """kl_cov: fraction of a micro-batch's trained tokens, those of largest covariance, that get the KL penalty."""
    ppo_kl_coef: float = 1.0
    """kl_cov: coefficient of the penalty |logp - old_logp| on the selected tokens."""
    use_kl_loss: bool = False
    """Add a KL(actor || reference) term to the loss (GRPO style); builds the reference policy."""
    kl_loss_coef: float = 0.001
    """Coefficient of the KL loss term."""
    kl_loss_type: Annotated[str, KLKind] = "low_var_kl"
    """KL estimator for the loss: k1, k2, k3/low_var_kl, abs, mse."""
    router_replay: bool = False
    """Mixture-of-experts models: rollout routing replay (R3). The trainer's routers use the experts the engine
    chose for each token (rollout.return_routed_experts) in the old-logprob, reference and update forwards; the
    gate weights still come from the current router logits, so the router keeps learning. verl's and ROLL's
    router_replay.mode=R3."""
    router_aux_loss_coef: float = 0.0
    """Mixture-of-experts models: weight of the routers' load-balancing loss (Switch Transformer's, as
    transformers' router_aux_loss_coef) in the update's loss; logged as actor/moe_aux_loss whatever the weight."""
    renormalize_logprobs_on_support: bool | None = None
    """Renormalise actor and reference logprobs on the set rollout.top_k/top_p keep; null: on when they truncate."""
    skip_zero_advantage: bool = True
    """Skip the update's forward and backward of samples whose every trained token has advantage exactly 0 (a
    GRPO group with equal rewards): their policy-loss gradient is exactly 0 and the loss denominators still count
    them, so the update is unchanged. Only where no other loss term reads them (entropy_coeff=0, no KL loss, no
    router load-balancing loss); actor/skipped_samples_frac reports the share."""
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)
    """FSDP2 settings."""


@dataclass
class KLControlConfig:
    type: Annotated[str, KLControl] = "fixed"
    """fixed or adaptive (Ziegler et al.: the coefficient follows target_kl)."""
    kl_coef: float = 0.001
    """(Initial) coefficient of the KL penalty in the reward."""
    target_kl: float = 0.1
    """Adaptive controller: the KL per sequence it steers toward."""
    horizon: int = 10000
    """Adaptive controller: samples over which the coefficient adapts."""


@dataclass
class RejectionSampleConfig:
    enable: bool = False
    """Drop prompt groups whose rewards are all equal (no GRPO signal) and generate more to keep the batch full."""
    max_extra_rounds: int = 2
    """Extra generation rounds per step (each draws another share of prompts); when they are spent, the batch is
    filled with dropped groups at weight 0 (counted in filter/rejection/short_groups)."""


@dataclass
class CompactFilteringConfig:
    enable: bool = False
    """Give samples that ended for the reasons flagged below weight 0: they leave every loss and denominator."""
    mask_max_prompt_length_exceeded: bool = True
    """Termination `max_prompt_length` (an agent's context filled up)."""
    mask_max_response_length_exceeded: bool = True
    """Termination `length` (data.max_response_length reached: a truncated answer)."""
    mask_max_turns_exceeded: bool = True
    """Termination `max_turns`."""
    mask_timeout: bool = True
    """Termination `timeout`."""
    mask_error: bool = True
    """Termination `error`."""
    mask_env_done: bool = False
    """Termination `env_done` (the environment ended the episode normally)."""


@dataclass
class StepwiseAdvantageConfig:
    enable: bool = False
    """Train agent trajectories step by step: each turn is its own sample (its whole context as the prompt,
    its response trained), instead of one sample per trajectory with observations masked."""
    mode: Annotated[str, StepwiseMode] = "broadcast"
    """broadcast: the trajectory's advantage (grpo/rloo over the group's trajectories) on every step's tokens;
    per_step: each step scored by its return (the discounted sum of this and later step rewards) and
    normalised against the same step of the group's other trajectories."""
    normalize_by_steps: bool = False
    """broadcast: divide each step's advantage by the trajectory's number of steps (rLLM's normalize_by_steps),
    so a long trajectory does not weigh more."""


@dataclass
class RolloutCorrectionConfig:
    rollout_is: Annotated[str | None, RolloutIS] = "auto"
    """Importance weights on the policy loss, the rollout engine's logprobs being the behaviour policy: token
    multiplies each token's loss by min(pi_old / pi_rollout, rollout_is_threshold) (truncated IS), sequence every
    token of a sample by min(prod_t pi_old / pi_rollout, rollout_is_threshold); null: none; auto: token when
    trainer.max_off_policy_steps > 0, else null."""
    rollout_is_threshold: float = 2.0
    """Cap of the importance weights."""
    rollout_rs: Annotated[str | None, RSLevel] = None
    """Rejection (IcePop-style masking): token drops each token whose ratio pi_old / pi_rollout leaves
    [rollout_rs_threshold_lower, rollout_rs_threshold], sequence each sample whose product of ratios does,
    geometric each sample whose geometric mean ratio does; dropped tokens leave the losses and their
    denominators (the old logprobs are then computed before the update); null: none."""
    rollout_rs_threshold: float | None = None
    """Upper end of the kept band; null: rollout_is_threshold. Geometric bands are tight (e.g. 1.001)."""
    rollout_rs_threshold_lower: float | None = None
    """Lower end of the kept band; null: 1 / rollout_rs_threshold."""
    rollout_token_veto_threshold: float | None = None
    """Drop every sample with a token whose ratio pi_old / pi_rollout is below this (e.g. 1e-4); null: no veto."""


@dataclass
class AlgorithmConfig:
    adv_estimator: Annotated[str, AdvEstimator] = "grpo"
    """Advantage estimator: grpo, gae (needs a critic), reinforce, reinforce_plus_plus, rloo."""
    norm_adv_by_std_in_grpo: bool = True
    """Divide GRPO advantages by the group's reward std (false gives Dr.GRPO-style mean-centering only)."""
    whiten_advantages: bool = False
    """Whiten the advantages over the trained tokens of the whole batch, every actor rank's rows (ROLL's
    whiten_advantages): (A - mean) / sqrt(var + 1e-8), var unbiased. gae and reinforce_plus_plus whiten theirs
    anyway, over this rank's rows unless this is true (verl's whole-batch whitening); false leaves the others'
    as estimated. Uniform GRPO groups then get nonzero advantages (actor.skip_zero_advantage skips fewer rows)."""
    advantage_clip: float | None = None
    """Clamp the advantages to [-advantage_clip, advantage_clip] after any whitening (ROLL's advantage_clip); null:
    no clamp."""
    gamma: float = 1.0
    """Discount factor (gae, reinforce, reinforce_plus_plus)."""
    lam: float = 1.0
    """GAE lambda."""
    use_kl_in_reward: bool = False
    """Subtract kl_ctrl.kl_coef * KL(actor || reference) from the token rewards; builds the reference policy."""
    kl_penalty: Annotated[str, KLKind] = "kl"
    """KL estimator for the reward penalty: kl/k1, k2, k3/low_var_kl, abs, mse."""
    kl_ctrl: KLControlConfig = field(default_factory=KLControlConfig)
    """Coefficient control for the KL in the reward."""
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)
    """Importance weights and rejection against the rollout engine's logprobs (verl's rollout_correction)."""
    rejection_sample: RejectionSampleConfig = field(default_factory=RejectionSampleConfig)
    """Rejection sampling of uniform groups, with bounded oversampling (rLLM's rejection_sample, DAPO's dynamic
    sampling)."""
    compact_filtering: CompactFilteringConfig = field(default_factory=CompactFilteringConfig)
    """Mask samples by termination reason (rLLM's compact_filtering)."""
    stepwise_advantage: StepwiseAdvantageConfig = field(default_factory=StepwiseAdvantageConfig)
    """Step-wise training of agent trajectories (rLLM's stepwise_advantage)."""


@dataclass
class CriticModelConfig:
    path: str | None = None
    """Value model initialisation (an HF causal LM directory; a scalar head is added); null: model.path."""


@dataclass
class CriticConfig:
    model: CriticModelConfig = field(default_factory=CriticModelConfig)
    """Where the value model starts from."""
    lr: float = 1e-3
    """Critic AdamW learning rate."""
    weight_decay: float = 0.0
    """Critic AdamW weight decay."""
    lr_warmup_steps: int = 0
    """Training steps of linear warmup for the critic; <= 0: lr_warmup_steps_ratio decides (as the actor's)."""
    lr_warmup_steps_ratio: float = 0.0
    """Critic warmup as a fraction of the run's training steps, when lr_warmup_steps <= 0."""
    lr_scheduler_type: Annotated[str, LrSchedulerType] = "constant"
    """The critic's schedule after warmup: constant or cosine (as actor.lr_scheduler_type)."""
    min_lr_ratio: float = 0.0
    """cosine: the critic's floor as a fraction of critic.lr, in [0, 1]."""
    num_cycles: float = 0.5
    """cosine: waves over the critic's decay (0.5: one half wave)."""
    grad_clip: float = 1.0
    """Clip the critic's gradient norm (<= 0 disables)."""
    cliprange_value: float | None = 0.5
    """Value clipping around the old values; null: none (ROLL's value_clip default)."""
    loss_agg_mode: Annotated[str, LossAggMode] = "token-mean"
    """How token value losses become one number (as actor.loss_agg_mode)."""
    ppo_micro_batch_size_per_gpu: int = 32
    """Samples per critic forward/backward on one rank."""
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)
    """FSDP2 settings of the critic."""


@dataclass
class ReferenceConfig:
    param_offload: bool = False
    """Keep the frozen reference weights in CPU memory between forwards (FSDP2 CPUOffloadPolicy; changes no
    placement on CPU); the reference reshards after every forward."""
    log_prob_micro_batch_size_per_gpu: int = 32
    """Samples per reference forward on one rank."""


@dataclass
class RewardModelSource:
    path: str | None = None
    """A Hugging Face sequence-classification checkpoint (AutoModelForSequenceClassification, num_labels=1: a
    Qwen2/Llama *ForSequenceClassification) with its own tokenizer and chat template."""
    trust_remote_code: bool = False
    """Run the checkpoint's own modelling code (transformers' trust_remote_code)."""


@dataclass
class RewardModelConfig:
    """A frozen reward model scoring every training sample: the prompt's messages and the response, re-tokenised
    by its own tokenizer (reward/model_inputs.py), scored at the last token; sharded with FSDP2 like the reference
    (placement.reward_model: with the actor, or ranks of its own). reward.weights mixes it with the rule."""

    enable: bool = False
    """Build the reward model and score training samples with it (verl's reward_model.enable)."""
    model: RewardModelSource = field(default_factory=RewardModelSource)
    micro_batch_size_per_gpu: int = 16
    """Samples per reward-model forward on one rank."""
    max_length: int = 2048
    """Reward-model tokens per sample: a longer conversation keeps its last max_length (reward_model/truncated)."""
    param_offload: bool = False
    """Keep the frozen reward-model weights in CPU memory between forwards (FSDP2 CPUOffloadPolicy)."""


@dataclass
class OverlongBufferConfig:
    """DAPO's overlong reward shaping (verl's reward_model.overlong_buffer): a training response longer than
    max_response_length - len tokens gets min(-(length - (max_response_length - len)) / len * penalty_factor, 0)
    added to its score (reward/overlong_reward: the mean penalty, reward/overlong: the share penalised)."""

    enable: bool = False
    """Add the overlong penalty to every training sample's score (validation scores stay the task's)."""
    len: int = 0
    """The buffer, in tokens: the penalty grows linearly over the last `len` tokens before the maximum."""
    penalty_factor: float = 1.0
    """The penalty of a response of the maximum length (DAPO's 1.0)."""
    max_response_length: int | None = None
    """The maximum length of the rule (verl's reward_kwargs.max_resp_len); null: data.max_response_length."""


@dataclass
class JudgeConfig:
    """An LLM judge scoring each training sample (reward.weights.judge mixes it with the rule and a reward model)."""

    enable: bool = False
    """Score training responses with an LLM judge."""
    url: str | None = None
    """An OpenAI-compatible server's base URL (http://host:8000/v1: chat completions), for judges too big to
    co-host; null: a judge co-hosted with the run."""
    model: str = ""
    """The judge model: the served model's name (the request's `model`), or a co-hosted judge's path; `policy`:
    the policy itself with its current weights (self-judging: an engine of model.path beside the policy's that
    every weight sync loads too, through host memory)."""
    engine: Annotated[str | None, Engine] = None
    """A co-hosted judge's engine, one more in-process engine on every rollout rank beside the policy's: vllm or
    hf; null: rollout.engine."""
    max_model_len: int | None = None
    """A co-hosted judge's prompt plus reply tokens; null: the judge's max_position_embeddings. A longer prompt
    fails its sample."""
    gpu_memory_utilization: float = 0.2
    """A co-hosted vLLM judge's share of a GPU, taken before the policy's engine sizes itself from what is left."""
    api_key_env: str | None = None
    """The NAME of the environment variable that holds the server's API key (sent as a bearer token); the key
    itself never goes in the config, logs or metrics. null: no key."""
    template: str | None = None
    """The judge prompt: text with {question}, {response} (required) and {ground_truth}, other braces kept as
    written; or a .txt/.jinja file's path; null: the shipped template (a 0-10 grade in \\boxed{})."""
    system: str | None = None
    """A system message sent before the prompt; null: none."""
    parser: Annotated[str, JudgeParser] = "boxed"
    """How the reply is read: `number` (its last number), `boxed` (the last \\boxed{}: a number or a label) or
    `label` (the last of `labels` it mentions, whole words, any case)."""
    labels: dict[str, float] | None = None
    """Label -> score for parser `label` (and labels in \\boxed{}), e.g. {correct: 1.0, incorrect: 0.0}."""
    scale: list[float] | None = field(default_factory=lambda: [0.0, 10.0])
    """[low, high]: a number read maps linearly to [0, 1] and is clamped (a label's score is used as is); null: the
    number as read. The default fits the shipped template."""
    timeout_s: float = 60.0
    """Seconds one request may wait on the judge's server; a request that times out is retried."""
    max_concurrency: int = 16
    """Requests in flight to the judge at most (a co-hosted judge: its engine's max_num_seqs)."""
    max_retries: int = 3
    """Retries of a request (exponential backoff) after a connection error, a timeout, HTTP 429 or 5xx; other
    HTTP errors fail the sample at once."""
    on_error: Annotated[str, JudgeOnError] = "zero"
    """A sample the judge failed on (no reply, or one without a score): `zero` scores it 0; `skip_group` gives its
    whole group weight 0. Counted either way."""
    temperature: float = 0.0
    """The judge's sampling temperature (0: greedy)."""
    max_tokens: int = 1024
    """The longest judge reply, in tokens; a reply cut off before its score is a failure."""


SELF_JUDGE = "policy"
"""reward.judge.model's name for the policy itself."""


@dataclass
class RewardServerConfig:
    """A reward server (OpenRLHF's --reward.remote_url): the rule's scores from an HTTP service (reward/server.py)."""

    url: list[str] | None = None
    """Its URLs (e.g. [http://rm-host:5000/get_reward]), groups round-robin over them; null: no server. Takes the
    rule's place: reward.function must be unset."""
    timeout_s: float = 180.0
    """Seconds one request may wait; a request that times out is retried."""
    max_retries: int = 5
    """Retries of a request (exponential backoff) after a connection error, a timeout, HTTP 429 or 5xx."""


@dataclass
class RewardWeights:
    """null everywhere: the rule alone, or the reward model alone when one is enabled (verl's and OpenRLHF's
    meaning). Any set: exactly the sources set, a weight 0 scored and logged but not trained on."""

    rule: float | None = None
    """The rule's score (reward.function, or the data source's built-in)."""
    reward_model: float | None = None
    """The reward model's score (reward_model.enable)."""
    judge: float | None = None
    """The judge's score (reward.judge.enable)."""


@dataclass
class RewardConfig:
    function: str | None = None
    """Reward function as `package.module:function` (verl's signature, or TRL's (completions, **kwargs) -> list);
    null picks a built-in by data_source."""
    timeout_s: float = 30.0
    """A reward call running longer than this is stopped and scores 0 (counted in reward/errors); <= 0: no limit."""
    overlong_buffer: OverlongBufferConfig = field(default_factory=OverlongBufferConfig)
    """DAPO's overlong penalty on training scores."""
    clip: float | None = None
    """Clamp every training sample's score to [-clip, clip] before advantages, after the overlong penalty (ROLL's
    reward_clip); null: no clamp."""
    server: RewardServerConfig = field(default_factory=lambda: RewardServerConfig())
    """A reward server by URL, OpenRLHF's protocol: the rule's scores (training and validation) from it."""
    judge: JudgeConfig = field(default_factory=lambda: JudgeConfig())
    """An LLM judge: served by URL (OpenAI-compatible), or co-hosted (a local model on each rank)."""
    weights: RewardWeights = field(default_factory=lambda: RewardWeights())
    """Each reward source's weight in a training sample's score (TRL's reward_weights); validation is always scored
    by the rule."""
    combine: Annotated[str, RewardCombine] = "sum_then_normalize"
    """How the sources' scores combine: `sum_then_normalize` (the weighted sum, normalised by the estimator, as
    TRL's) or `normalize_then_sum` (GDPO: each source standardised within its prompt's group first, so a source with
    a large scale does not drown the others)."""


@dataclass
class AgentConfig:
    env: str | None = None
    """Environment class as `package.module:Class` (reset(task) -> observation, step(action) -> observation,
    reward, done, info); null: single-turn generation scored by reward.function."""
    agent: str | None = None
    """Agent class as `package.module:Class` (initial_messages, parse, observation_message); needed with env."""
    max_turns: int = 4
    """Turns per trajectory (termination `max_turns`)."""
    max_tokens_per_turn: int = 0
    """Response tokens per turn; 0: data.max_response_length (which bounds the whole trajectory's responses)."""
    timeout_s: float = 60.0
    """Wall clock per trajectory (termination `timeout`; the request is aborted, finished turns are kept)."""
    tools: list[str] = field(default_factory=list)
    """Tools the model may call: built-in names (calculator, python) or `package.module:function`. Their
    schemas go to the chat template (`tools=`); a response that calls them gets their results as its
    observation instead of an env step."""
    tool_parser: str = "hermes"
    """vLLM tool parser that reads calls from a response (hermes: Qwen2.5's `<tool_call>{json}</tool_call>`)."""
    env_workers: int = 32
    """Threads for environment and tool calls, which overlap decoding (they mostly wait: on a sandboxed
    process, a remote service); 0 runs them inline (the engine's batches are then reproducible run to run)."""


@dataclass
class PlacementConfig:
    actor: Any = None
    """Actor ranks: null (all ranks) or a list of ranks."""
    rollout: Any = "actor"
    """Rollout ranks: `actor` (colocated with the actor, the hybrid engine) or a list of ranks."""
    critic: Any = None
    """Critic ranks: `actor` or a list of ranks; null places it with the actor when the estimator needs values."""
    reference: Any = None
    """Reference ranks: `actor` or a list; null places it with the actor when a KL term needs it."""
    reward_model: Any = None
    """Reward-model ranks: `actor` or a list; null places it with the actor when reward_model.enable."""
    teacher: Any = None
    """Distillation teacher ranks: `actor` or a list; null places it with the actor when distillation.enable."""


@dataclass
class TrainerConfig:
    defaults_from: Annotated[str, Defaults] = "torchrl_post"
    """Whose defaults every key not set starts from: this project's (configs/config.yaml) or a peer's
    (configs/verl.yaml: verl's ppo_trainer.yaml; roll.yaml: ROLL's RLVR pipeline; trl.yaml: TRL's GRPOConfig;
    openrlhf.yaml: OpenRLHF's train_ppo_ray). Set by the config file (--config-name verl), or chosen when the command
    line uses one peer's keys; the plan's first line says which."""
    project_name: str = "torchrl_post"
    """wandb project."""
    experiment_name: str = "demo"
    """wandb run name."""
    total_epochs: int = 1000
    """Epochs over the training set; training stops at whichever of this and total_training_steps comes first."""
    total_training_steps: int | None = 300
    """Stop after this many steps (null: total_epochs decides)."""
    save_freq: int = 100
    """Save a checkpoint every N steps and at the end; <= 0 turns saving off."""
    test_freq: int = 25
    """Validate every N steps (and at step 0 and the end); <= 0 turns validation off."""
    plots: bool = True
    """Draw plots/*.png from metrics.jsonl at the end of the run (about a second of matplotlib); false for batch
    jobs nobody looks at (`python -m torchrl_post.plot <run dir>` draws them later)."""
    val_before_train: bool = True
    """Validate once before the first update (logged as step 0)."""
    val_only: bool = False
    """Validate the model (or the checkpoint trainer.resume_mode picks) once, log it, and exit without training."""
    log_val_generations: int = 0
    """Write this many validation samples (prompt, response, answer, score) to val_generations/step_<N>.jsonl
    in the run directory at every validation."""
    default_local_dir: str = "outputs/demo"
    """Run directory: metrics.jsonl, checkpoints/, plots/, the resolved config."""
    resume_mode: Annotated[str, ResumeMode] = "auto"
    """auto (latest checkpoint, if any), disable, or resume_path (trainer.resume_from_path)."""
    resume_from_path: str | None = None
    """Checkpoint directory (global_step_N) to resume from when resume_mode=resume_path."""
    max_ckpt_to_keep: int | None = None
    """Keep at most this many checkpoints (oldest removed first); null keeps all."""
    save_hf: bool = False
    """Also write each checkpoint's policy as an HF model (safetensors, config, tokenizer) under hf/."""
    max_nonfinite_skips: int = 3
    """Stop after this many consecutive updates skipped for a non-finite loss or gradient norm."""
    logger: Annotated[list[str], Logger] = field(default_factory=lambda: ["console"])
    """Loggers besides metrics.jsonl (always written): console, wandb (offline under the run directory with
    WANDB_MODE=offline), tensorboard (event files under tensorboard/)."""
    seed: int = 1
    """Seed for data order, sampling and initialisation."""
    device: Annotated[str, Device] = "auto"
    """auto (cuda when available, else cpu), cpu or cuda; also picks the backend (nccl or gloo)."""
    max_off_policy_steps: int = 0
    """0: on-policy. k > 0 (rollout on ranks of its own): the rollout generates the batch of step i + k while the
    actor updates step i, with the weights of update i - 1 (rollout/staleness <= k)."""
    max_staleness: int | None = None
    """Most policy versions a trained group may lag the trained policy (its oldest token's version): older groups
    are dropped before the step takes them (rollout/stale_dropped_groups) and the engine stops generating those
    that can no longer make it. null: no bound. SkyRL's fully_async.max_staleness_steps, TRL's max_staleness."""
    world_size: int | None = None
    """Ranks to plan for: null takes torchrun's WORLD_SIZE; set it to check a placement with a dry run from
    plain python (under torchrun it must equal the launched world)."""
    dry_run: bool = False
    """Print the placement plan, batch arithmetic and memory plan (docs/memory.md), then exit without loading a model."""
    gpu_memory_gb: float | None = None
    """Memory of one card in GiB for the dry run's memory plan; null: the visible card's (a cuda dry run on a machine
    without a GPU needs it)."""
    save_on_sigterm: bool = True
    """On SIGTERM (what Slurm and Kubernetes send before a kill) stop at the next step boundary, save a checkpoint
    if the last one is older than that step, and exit with one line; a resume continues from there."""
    memory_check: bool = True
    """On CUDA, refuse at start (before any model loads) a config whose memory plan does not fit the memory free on
    the card, as the dry run does; false: start anyway (the plan is an estimate: docs/memory.md)."""
    wait_timeout_s: float = 300.0
    """A rank silent this long (stopped, frozen, its network gone) ends the run on every live rank with one line
    naming it, its role and its stage (exit code 3); under torchrun --max-restarts the job restarts and resumes from
    the last checkpoint. Silence, not work: a long generation or update beats all along (docs/faults.md). TRL's
    weight_sync_timeout, verl's actor_rollout_ref.nccl_timeout."""
    max_logprob_diff: float | None = None
    """Warn loudly when rollout/logprob_diff (engine vs trainer on the same tokens) exceeds this: far above the
    precision's noise, it means the engine samples other weights than the trainer's (a sync that missed a
    parameter). null follows the engine's and trainer's precision: 1e-4 in float32 on CPU (noise about 1e-6),
    5e-3 in float32 on CUDA (vLLM's attention runs its dots in TF32), 0.1 with 16-bit weights or compute.
    <= 0 turns the check off."""


@dataclass
class TeacherConfig:
    path: str | None = None
    """The teacher's HF checkpoint (verl's distillation.teacher_models.<name>.model_path): any causal LM with the
    policy's tokenizer, of another size or architecture; frozen, sharded with FSDP2 like the reference."""
    trust_remote_code: bool = False
    """Load the teacher's modelling code from its checkpoint (transformers' trust_remote_code)."""
    param_offload: bool = False
    """Keep the teacher's shards in host memory between its forwards (GPU only)."""
    log_prob_micro_batch_size_per_gpu: int = 32
    """Samples per teacher forward on one rank."""


@dataclass
class DistillationConfig:
    enable: bool = False
    """On-policy distillation (verl's distillation.enabled): the teacher scores the student's sampled tokens and the
    student learns from the difference (docs/distillation.md); placement.teacher puts the teacher."""
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    loss_mode: Annotated[str, DistillLoss] = "k3"
    """k1, k2, k3, abs, mse: a reverse-KL(student || teacher) estimate per sampled token; forward_kl_topk: the
    forward KL over the teacher's top-k tokens at each position, backpropagated through the student."""
    topk: int = 32
    """forward_kl_topk: teacher tokens per position."""
    use_policy_gradient: bool = True
    """k-modes: the estimate as a per-token reward (its negative the advantage of a second PPO term: on-policy
    distillation as prime-rl's opd and slime's --use-opd); false backpropagates the estimate through the student's
    logprobs (verl's distillation_loss.use_policy_gradient)."""
    use_task_rewards: bool = True
    """Keep the task's reward and its policy loss, the distillation term added at distillation_loss_coef; false:
    the distillation term alone (weight 1)."""
    distillation_loss_coef: float = 1.0
    """Weight of the distillation term beside the task's policy loss (with use_task_rewards)."""
    loss_max_clamp: float | None = 10.0
    """Clamp each token's distillation loss to [-c, c]; null: none."""
    log_prob_min_clamp: float | None = -10.0
    """forward_kl_topk: clamp both models' top-k logprobs from below; null: none."""


@dataclass
class SftConfig:
    enable: bool = False
    """Supervised fine-tuning instead of RL (`--config-name sft`): the actor trains on the data's responses by
    token negative log-likelihood, through the same loader, FSDP2 actor, packing, Ulysses, LoRA, checkpoints and
    metrics; no engine is built, validation is `val/loss` on data.val_files (docs/sft.md)."""
    response_key: str = "response"
    """Prompt/response rows: the column holding the response (a string) to the prompt in data.prompt_key; the loss
    is on the response's tokens (with the chat template, the assistant turn it renders)."""
    messages_key: str = "messages"
    """Chat rows: the column holding a conversation ({role, content} messages); the loss is on the assistant turns
    only (verl's and TRL's convention), the prompt is everything before the first one. Used for rows without
    sft.response_key."""
    truncation: Annotated[str, SftTruncation] = "right"
    """A response (everything from the first assistant turn) over data.max_response_length tokens: right cuts it
    there and counts it (logged, `data/truncated_responses`); error refuses it, naming its file and row."""


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    reference: ReferenceConfig = field(default_factory=ReferenceConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    sft: SftConfig = field(default_factory=SftConfig)
    distillation: DistillationConfig = field(default_factory=DistillationConfig)
