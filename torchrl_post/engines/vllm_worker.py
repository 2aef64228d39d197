"""vLLM's GPU worker with its KV cache capped at what the engine's sequences can fill (`engines/base.py:
kv_cache_cap`). vLLM sizes a GPU KV cache from gpu_memory_utilization alone (its CPU backend takes the cap as
kv_cache_memory_bytes, which on a GPU would skip the profile and so the share's bound); this worker takes the
profile's answer and lowers it to the cap, which `VLLMEngine` passes as additional_config[KV_NEED]. vLLM imports it
by name (`worker_cls`) on CUDA only; the rest stays free for the trainer and a wake-up re-allocates only the cap."""

from __future__ import annotations

from vllm.v1.worker.gpu_worker import Worker

from torchrl_post.engines.base import kv_cache_cap

KV_NEED = "torchrl_post_kv_cache_need"
"""additional_config's key for one rank's `kv_cache_need`, in bytes."""


class KVCappedWorker(Worker):
    def determine_available_memory(self) -> int:
        """The KV bytes vLLM's profile leaves of the share, at most the rank's need."""
        config = self.vllm_config.additional_config
        assert isinstance(config, dict), config  # VLLMEngine passes a dict
        return kv_cache_cap(int(config[KV_NEED]), super().determine_available_memory())
