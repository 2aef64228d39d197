"""The GPU tier: `make gpu-check` (docs/gpu.md), skipped without a CUDA device."""
