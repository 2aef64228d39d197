"""Running the Qwen-VL processors without torchvision (the CPU stack; a GPU install with torchvision is untouched).

transformers 5 builds and runs the Qwen-VL models without torchvision, but their processors do not: the video
sub-processor and the torchvision image processor import it, and vLLM imports both modules. `install()` puts
stand-ins in their place: the PIL image processor (`Qwen2VLImageProcessorPil`, same outputs) under the
torchvision class's name, a video processor stub that carries the size fields vLLM reads at start (videos are
off: `limit_mm_per_prompt={"video": 0}`), and processors whose sub-processors are the image processor and the
tokenizer only. Idempotent; a no-op where torchvision imports.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from typing import Any

_installed = False


def has_torchvision() -> bool:
    return importlib.util.find_spec("torchvision") is not None


def install() -> None:
    global _installed
    if _installed or has_torchvision():
        return
    from transformers.models.qwen2_vl import image_processing_pil_qwen2_vl as pil
    from transformers.processing_utils import VideosKwargs

    image_module = types.ModuleType("transformers.models.qwen2_vl.image_processing_qwen2_vl")
    image_module.Qwen2VLImageProcessor = type("Qwen2VLImageProcessor", (pil.Qwen2VLImageProcessorPil,), {})  # type: ignore[attr-defined]
    image_module.smart_resize = pil.smart_resize  # type: ignore[attr-defined]
    sys.modules[image_module.__name__] = image_module

    class VideoProcessorStub:
        """What vLLM reads of a video processor when videos are off."""

        valid_kwargs = VideosKwargs
        size: dict[str, int] = {"shortest_edge": 128 * 32 * 32, "longest_edge": 768 * 32 * 32}
        patch_size, temporal_patch_size, merge_size = 16, 2, 2
        fps, min_frames, max_frames = 2, 4, 768

        def __init__(self, **_: Any) -> None:
            self.min_pixels = self.size["shortest_edge"]
            self.max_pixels = self.size["longest_edge"]

    for module, cls in (
        ("transformers.models.qwen2_vl.video_processing_qwen2_vl", "Qwen2VLVideoProcessor"),
        ("transformers.models.qwen3_vl.video_processing_qwen3_vl", "Qwen3VLVideoProcessor"),
    ):
        stub = types.ModuleType(module)
        setattr(stub, cls, type(cls, (VideoProcessorStub,), {}))
        stub.smart_resize = pil.smart_resize  # type: ignore[attr-defined]
        sys.modules[module] = stub

    from transformers.models.qwen2_5_vl import Qwen2_5_VLProcessor
    from transformers.models.qwen2_vl import Qwen2VLProcessor
    from transformers.models.qwen3_vl import Qwen3VLProcessor

    for proc in (Qwen2VLProcessor, Qwen2_5_VLProcessor, Qwen3VLProcessor):
        proc.get_attributes = classmethod(lambda cls: ["image_processor", "tokenizer"])  # type: ignore[method-assign,assignment]
        proc.video_processor = VideoProcessorStub()
    _installed = True
