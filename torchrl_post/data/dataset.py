"""Prompt datasets: JSON, JSONL, CSV and parquet rows -> tokenized prompts with answers and data sources.

A row has a prompt column (`data.prompt_key`: a string, or a list of chat messages) or a `messages`
column, an answer column (`data.answer_key`, dots reach into nested dicts as in verl's
reward_model.ground_truth), and optionally a data_source column. Prompts go through the tokenizer's chat
template. Overlong prompts are dropped with a logged count, or rejected (data.filter_overlong_prompts).
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchrl_post.config.errors import DataError
from torchrl_post.config.schema import DataConfig

log = logging.getLogger(__name__)
FORMATS = (".json", ".jsonl", ".csv", ".parquet")


def _read_jsonl(path: Path, bad: list[str] | None) -> list[dict[str, Any]]:
    """Rows of a JSONL file; a bad line raises DataError, or is recorded in `bad` when that is a list."""
    rows = []
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")  # tolerate a byte-order mark
                if not line.strip():
                    continue
                row = json.loads(line)
                if not isinstance(row, dict):
                    raise DataError(f"{path}:{lineno}: each line must be a JSON object, got {type(row).__name__}")
            except UnicodeDecodeError as e:
                err = DataError(f"{path}:{lineno}: not valid UTF-8 ({e.reason} at byte {e.start})")
            except json.JSONDecodeError as e:
                err = DataError(f"{path}:{lineno}: malformed JSON ({e.msg} at column {e.colno})")
            except DataError as e:
                err = e
            else:
                rows.append(row)
                continue
            if bad is None:
                raise err
            bad.append(str(err))
    return rows


def _to_python(value: Any) -> Any:
    """parquet/pandas give numpy arrays and scalars; turn them into lists, dicts and Python scalars."""
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        value = value.tolist()
    if isinstance(value, list):
        return [_to_python(v) for v in value]
    if isinstance(value, dict):
        return {k: _to_python(v) for k, v in value.items()}
    return value


def read_rows(path: str | Path, bad: list[str] | None = None) -> list[dict[str, Any]]:
    """All rows of one data file, by extension; with a `bad` list, malformed JSONL lines go there."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"data file not found: {p} (check data.train_files / data.val_files)")
    suffix = p.suffix.lower()
    if suffix not in FORMATS:
        raise DataError(f"{p}: unsupported data format {suffix!r}; use one of {', '.join(FORMATS)}")
    if suffix == ".jsonl":
        return _read_jsonl(p, bad)
    if suffix == ".json":
        try:
            data = json.loads(p.read_text(encoding="utf-8-sig"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise DataError(f"{p}: not a valid UTF-8 JSON file ({e})") from e
        if isinstance(data, dict) and isinstance(data.get("data"), list):
            data = data["data"]
        if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
            raise DataError(f"{p}: a .json data file must hold a list of objects (or {{'data': [...]}})")
        return data
    import pandas as pd

    try:
        frame = pd.read_csv(p, dtype=str, keep_default_na=False) if suffix == ".csv" else pd.read_parquet(p)
    except Exception as e:  # pandas/pyarrow raise many types for unreadable files
        raise DataError(f"{p}: cannot read as {suffix[1:]} ({' '.join(str(e).split())})") from e
    return [{k: _to_python(v) for k, v in row.items()} for row in frame.to_dict(orient="records")]


def _dig(row: dict[str, Any], dotted: str) -> Any:
    value: Any = row
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


@dataclass
class PromptDataset:
    """Tokenized prompts plus what the reward needs, index-aligned."""

    prompt_ids: list[list[int]]
    answers: list[Any]
    data_sources: list[str]
    extra_infos: list[dict[str, Any]]
    questions: list[str] = field(default_factory=list)
    """The last user message of each row: the question an agent environment is reset with (`task["question"]`)."""
    images: list[list[Any]] = field(default_factory=list)
    """Vision-language models: each row's images (PIL, RGB); empty for a text-only model."""
    mm_inputs: list[dict[str, Any]] = field(default_factory=list)
    """Each row's processor outputs (pixel_values, image_grid_thw) with data.return_multi_modal_inputs."""
    num_filtered: int = 0
    num_bad: int = 0
    files: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.prompt_ids)


def _is_message(m: Any, items: bool) -> bool:
    """A {role, content} message; `items`: content may also be a list of {type: text|image} items."""
    if not isinstance(m, dict) or not isinstance(m.get("role"), str):
        return False
    content = m.get("content")
    if isinstance(content, str):
        return True
    return items and isinstance(content, list) and all(isinstance(i, dict) and "type" in i for i in content)


def _messages(row: dict[str, Any], cfg: DataConfig, where: str, items: bool = False) -> list[dict[str, Any]]:
    prompt = _dig(row, cfg.prompt_key)
    if prompt is None:
        prompt = row.get("messages")
    if prompt is None:
        raise DataError(
            f"{where}: no '{cfg.prompt_key}' or 'messages' column; set data.prompt_key to the prompt column"
        )
    if isinstance(prompt, str):
        if not prompt.strip():
            raise DataError(f"{where}: empty prompt in column '{cfg.prompt_key}'")
        return [{"role": "user", "content": prompt}]
    if isinstance(prompt, list) and prompt and all(_is_message(m, items) for m in prompt):
        return [{"role": m["role"], "content": m["content"]} for m in prompt]
    raise DataError(
        f"{where}: column '{cfg.prompt_key}' must be a string or a list of {{role, content}} messages, "
        f"got {type(prompt).__name__}"
    )


def load_prompts(
    files: list[str], cfg: DataConfig, tokenizer: Any, split: str, processor: Any = None, max_images: int = 1
) -> PromptDataset:
    """Read, template, tokenize and length-filter the rows of `files`. With a vision-language model's
    `processor`, rows' images (`data.image_key`, at most `max_images` each) are read, and the prompt lengths
    count their image tokens."""
    out = PromptDataset([], [], [], [], [], files=list(files))
    too_long: list[str] = []
    bad: list[str] | None = [] if cfg.skip_bad_rows else None
    for path in files:
        for i, row in enumerate(read_rows(path, bad)):
            where = f"{path} row {i + 1}"
            try:
                if processor is not None:
                    _add_image_row(out, row, i, where, cfg, processor, too_long, Path(path).parent, max_images)
                else:
                    _add_row(out, row, i, where, cfg, tokenizer, too_long)
            except DataError as e:
                if bad is None:
                    raise
                bad.append(str(e))
    out.num_filtered = len(too_long)
    out.num_bad = len(bad or [])
    if bad:
        log.warning("%s: skipped %d bad rows (data.skip_bad_rows=true); first: %s", split, len(bad), bad[0])
    if too_long:
        log.warning(
            "%s: filtered %d prompts over data.max_prompt_length=%d (first: %s)",
            split,
            len(too_long),
            cfg.max_prompt_length,
            too_long[0],
        )
    if not out.prompt_ids:
        raise DataError(
            f"{split} data {files} is empty after filtering ({len(too_long)} prompts over "
            f"data.max_prompt_length={cfg.max_prompt_length}, {out.num_bad} bad rows skipped)"
        )
    return out


def _add_row(
    out: PromptDataset, row: dict[str, Any], i: int, where: str, cfg: DataConfig, tokenizer: Any, too_long: list[str]
) -> None:
    """Template, tokenize and check one row; append it to `out` (or its location to `too_long`)."""
    msgs = _messages(row, cfg, where)
    if cfg.apply_chat_template and getattr(tokenizer, "chat_template", None):
        enc = tokenizer.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True)
        ids = list(enc["input_ids"] if isinstance(enc, dict) or hasattr(enc, "keys") else enc)
    else:
        ids = tokenizer("\n".join(m["content"] for m in msgs), add_special_tokens=True)["input_ids"]
    if _fits(ids, cfg, where, too_long, ""):
        _append(out, row, i, where, cfg, ids, msgs)


def _fits(ids: list[int], cfg: DataConfig, where: str, too_long: list[str], counted: str) -> bool:
    """Within data.max_prompt_length; an overlong prompt is recorded (filtered) or an error."""
    if len(ids) <= cfg.max_prompt_length:
        return True
    if not cfg.filter_overlong_prompts:
        raise DataError(
            f"{where}: prompt is {len(ids)} tokens{counted}, over data.max_prompt_length={cfg.max_prompt_length}; "
            "raise the limit or set data.filter_overlong_prompts=true"
        )
    too_long.append(where)
    return False


def _append(
    out: PromptDataset, row: dict[str, Any], i: int, where: str, cfg: DataConfig, ids: list[int], msgs: list[Any]
) -> None:
    """Add a tokenized row with its answer, data source, extra info and question."""
    answer = _dig(row, cfg.answer_key)
    if answer is None or (isinstance(answer, float) and math.isnan(answer)):  # parquet nulls come as NaN
        raise DataError(f"{where}: no '{cfg.answer_key}' column for the reward; set data.answer_key")
    source = row.get(cfg.data_source_key) or cfg.default_data_source
    if not isinstance(source, str):
        raise DataError(f"{where}: column '{cfg.data_source_key}' must be a string, got {type(source).__name__}")
    extra = row.get("extra_info")
    out.prompt_ids.append(ids)
    out.answers.append(answer)
    out.data_sources.append(source)
    out.extra_infos.append(extra if isinstance(extra, dict) else {"index": i})
    question = next((m["content"] for m in reversed(msgs) if m["role"] == "user"), msgs[-1]["content"])
    if not isinstance(question, str):  # content items: their text
        question = "".join(str(item.get("text", "")) for item in question if isinstance(item, dict))
    out.questions.append(question)


def _add_image_row(
    out: PromptDataset,
    row: dict[str, Any],
    i: int,
    where: str,
    cfg: DataConfig,
    processor: Any,
    too_long: list[str],
    base: Path,
    max_images: int,
) -> None:
    """A vision-language row: its images read, the placeholders expanded to image tokens by the processor."""
    from torchrl_post.multimodal.vision import encode, image_inputs, load_image, with_image_items

    sources = row.get(cfg.image_key) or []
    if not isinstance(sources, list):
        sources = [sources]
    if len(sources) > max_images:
        raise DataError(
            f"{where}: {len(sources)} images, over rollout.limit_images={max_images}; raise rollout.limit_images"
        )
    images = [load_image(src, base, where) for src in sources]
    msgs = with_image_items(_messages(row, cfg, where, items=True), len(images), where)
    ids, mm = encode(processor, msgs, images)
    if not _fits(ids, cfg, where, too_long, " with its images' tokens"):
        return
    _append(out, row, i, where, cfg, ids, msgs)
    out.images.append(images)
    if cfg.return_multi_modal_inputs:
        out.mm_inputs.append(mm if mm else image_inputs(processor, images))
