"""Rollout engines below the rollout layer: the stepped protocol (base.py), vLLM in-process (vllm.py), transformers
(hf.py), tensor-parallel lockstep (lockstep.py), building one (build.py), their output as a batch (batch.py)."""
