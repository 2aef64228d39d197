"""Prompt datasets: JSON, JSONL, CSV and parquet rows, or rows passed in Python (a list of dicts, a
`datasets.Dataset`) -> tokenized prompts with answers and data sources.

A row has a prompt column (`data.prompt_key`: a string, or a list of chat messages) or a `messages`
column, an answer column (`data.answer_key`, dots reach into nested dicts as in verl's
reward_model.ground_truth), and optionally a data_source column. Prompts go through the tokenizer's chat
template (data.chat_template may replace it: data/chat_templates.py). Overlong prompts are dropped with a logged
count (data.filter_overlong_prompts), or cut as data.truncation says (`truncate_prompt`), or rejected.
"""

from __future__ import annotations

import csv
import json
import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchrl_post.config.errors import ConfigError, DataError
from torchrl_post.config.schema import DataConfig
from torchrl_post.multimodal.vision import image_inputs
from torchrl_post.types import PromptBatch

log = logging.getLogger(__name__)
FORMATS = (".json", ".jsonl", ".csv", ".parquet")


VERL_ANSWER_KEY = "reward_model.ground_truth"
"""Where verl's example preprocessors put the ground truth (beside `prompt` chat messages, `data_source` and
`extra_info`, which load as they are): read when the default answer column is absent."""

ROLES = ("system", "user", "assistant", "tool")
"""Chat message roles a prompt may hold."""


def _read_jsonl(path: Path, bad: list[str] | None, lines: list[int] | None = None) -> list[dict[str, Any]]:
    """Rows of a JSONL file; a bad line raises DataError, or is recorded in `bad` when that is a list.
    `lines`, when given, gets each row's line number."""
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
                if lines is not None:
                    lines.append(lineno)
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


def _read_csv(path: Path, bad: list[str] | None, lines: list[int] | None = None) -> list[dict[str, Any]]:
    """Rows of a CSV file, every value a string. A row with fewer fields than the header (pandas would fill
    the missing ones with "", training on an empty answer) or more is an error naming its line (the header is
    line 1), or recorded in `bad`. `lines`, when given, gets each row's first line number."""
    csv.field_size_limit(2**31 - 1)  # long prompts: the default limit is 128 KiB per field
    rows: list[dict[str, Any]] = []
    try:
        with path.open(encoding="utf-8-sig", newline="") as f:
            reader = csv.reader(f)
            header = next(reader, None)
            if header is None:
                raise DataError(f"{path}: empty CSV file (no header line)")
            header = [name or f"Unnamed: {j}" for j, name in enumerate(header)]  # pandas' names for blank ones
            dupes = sorted({name for name in header if header.count(name) > 1})
            if dupes:
                raise DataError(f"{path}:1: the header names column(s) {dupes} twice")
            start = reader.line_num + 1
            for record in reader:
                lineno, start = start, reader.line_num + 1
                if not record:  # a blank line
                    continue
                if len(record) != len(header):
                    if len(record) < len(header):
                        missing = header[len(record) :]
                        what = f"no value for {', '.join(repr(m) for m in missing)}"
                    else:
                        what = "an unquoted comma? quote fields that hold commas"
                    err = DataError(
                        f"{path}:{lineno}: {len(record)} field(s) where the header has {len(header)} ({what})"
                    )
                    if bad is None:
                        raise err
                    bad.append(str(err))
                    continue
                rows.append(dict(zip(header, record, strict=True)))
                if lines is not None:
                    lines.append(lineno)
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not valid UTF-8 ({e.reason} at byte {e.start})") from e
    except csv.Error as e:
        raise DataError(f"{path}: cannot read as csv ({e})") from e
    return rows


def read_rows(path: str | Path, bad: list[str] | None = None) -> list[dict[str, Any]]:
    """All rows of one data file, by extension; with a `bad` list, malformed JSONL lines and CSV rows go there."""
    return _read_rows(path, bad)[0]


def _read_rows(path: str | Path, bad: list[str] | None = None) -> tuple[list[dict[str, Any]], list[int] | None]:
    """`read_rows` and, for line-based files (JSONL, CSV), each row's line number."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"data file not found: {p} (check data.train_files / data.val_files)")
    suffix = p.suffix.lower()
    if suffix not in FORMATS:
        raise DataError(f"{p}: unsupported data format {suffix!r}; use one of {', '.join(FORMATS)}")
    lines: list[int] = []
    if suffix == ".jsonl":
        return _read_jsonl(p, bad, lines), lines
    if suffix == ".csv":
        return _read_csv(p, bad, lines), lines
    if suffix == ".json":
        try:
            data = json.loads(p.read_text(encoding="utf-8-sig"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise DataError(f"{p}: not a valid UTF-8 JSON file ({e})") from e
        if isinstance(data, dict) and isinstance(data.get("data"), list):
            data = data["data"]
        if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
            raise DataError(f"{p}: a .json data file must hold a list of objects (or {{'data': [...]}})")
        return data, None
    import pandas as pd

    try:
        frame = pd.read_parquet(p)
    except Exception as e:  # pandas/pyarrow raise many types for unreadable files
        raise DataError(f"{p}: cannot read as {suffix[1:]} ({' '.join(str(e).split())})") from e
    return [{k: _to_python(v) for k, v in row.items()} for row in frame.to_dict(orient="records")], None


def _missing(value: Any) -> bool:
    """No value: absent, or a null (parquet nulls come as NaN)."""
    return value is None or (isinstance(value, float) and math.isnan(value))


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
    messages: list[list[dict[str, Any]]] = field(default_factory=list)
    """Each row's prompt as chat messages (text content): what a reward model re-tokenises with its own template."""
    images: list[list[Any]] = field(default_factory=list)
    """Vision-language models: each row's images (PIL, RGB); empty for a text-only model."""
    mm_inputs: list[dict[str, Any]] = field(default_factory=list)
    """Each row's processor outputs (pixel_values, image_grid_thw) with data.return_multi_modal_inputs."""
    num_filtered: int = 0
    num_bad: int = 0
    files: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.prompt_ids)

    def batch(self, idx: list[int], uids: list[int], processor: Any = None) -> PromptBatch:
        """Rows `idx` as a step's prompts, group ids `uids`; a vision model's images processed now by `processor`
        where the rows do not hold their processor outputs (data.return_multi_modal_inputs=false)."""
        images = [self.images[i] for i in idx] if self.images else []
        if self.mm_inputs:
            mm = [self.mm_inputs[i] for i in idx]
        else:
            mm = [image_inputs(processor, imgs) for imgs in images]
        return PromptBatch(
            [self.prompt_ids[i] for i in idx],
            [self.answers[i] for i in idx],
            [self.data_sources[i] for i in idx],
            [self.extra_infos[i] for i in idx],
            uids,
            [self.questions[i] for i in idx] if self.questions else [],
            images,
            mm,
            [self.messages[i] for i in idx] if self.messages else [],
        )


def _is_message(m: Any, items: bool) -> bool:
    """A {role, content} message; `items`: content may also be a list of {type: text|image} items."""
    if not isinstance(m, dict) or not isinstance(m.get("role"), str):
        return False
    content = m.get("content")
    if isinstance(content, str):
        return True
    return items and isinstance(content, list) and all(isinstance(i, dict) and "type" in i for i in content)


def messages_of(row: dict[str, Any], cfg: DataConfig, where: str, items: bool = False) -> list[dict[str, Any]]:
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
    column = cfg.prompt_key if _dig(row, cfg.prompt_key) is not None else "messages"
    if isinstance(prompt, list):
        for j, m in enumerate(prompt):
            role = m.get("role") if isinstance(m, dict) else None
            if isinstance(role, str) and role not in ROLES:
                raise DataError(
                    f"{where}: column '{column}' message {j + 1} has role {role!r}; use one of {', '.join(ROLES)}"
                )
    if isinstance(prompt, list) and prompt and all(_is_message(m, items) for m in prompt):
        if all(isinstance(m["content"], str) and not m["content"].strip() for m in prompt):
            raise DataError(f"{where}: every message in column '{column}' is empty")
        return [{"role": m["role"], "content": m["content"]} for m in prompt]
    raise DataError(
        f"{where}: column '{cfg.prompt_key}' must be a string or a list of {{role, content}} messages, "
        f"got {type(prompt).__name__}"
    )


def load_prompts(
    files: list[str],
    cfg: DataConfig,
    tokenizer: Any,
    split: str,
    processor: Any = None,
    max_images: int = 1,
    model: str | None = None,
    vision_ids: tuple[int, ...] = (),
) -> PromptDataset:
    """Read, template, tokenize and length-filter the rows of `files`. With a vision-language model's
    `processor`, rows' images (`data.image_key`, at most `max_images` each) are read, and the prompt lengths
    count their image tokens (`vision_ids`: the model's vision placeholder tokens, which data.truncation must
    not cut); without one (a text-only model) a row with images is a ConfigError, never
    skipped (its images would be dropped silently). `model`: how that error names the model, e.g.
    "model.path='/models/x' (qwen2)"; by default the tokenizer's name_or_path."""
    out = PromptDataset([], [], [], [], [], files=list(files))
    parse = _Parse(cfg, tokenizer, processor, max_images, model, out, frozenset(vision_ids))
    for path in files:
        rows, lines = _read_rows(path, parse.bad)
        for i, row in enumerate(rows):
            parse.add(row, i, _where(path, i, lines[i] if lines is not None else None), Path(path).parent)
    return parse.finish(split, str(files))


def prompts_from_rows(
    data: Any,
    name: str,
    cfg: DataConfig,
    tokenizer: Any,
    split: str,
    processor: Any = None,
    max_images: int = 1,
    model: str | None = None,
    vision_ids: tuple[int, ...] = (),
) -> PromptDataset:
    """`load_prompts` for rows passed in Python (`as_rows`: a list of dicts, a `datasets.Dataset`), parsed and
    checked as file rows are; a row's errors name it by `name` and its index (`train_data[3]: ...`). Images may
    be PIL images, bytes or paths (relative ones from the working directory)."""
    parse = _Parse(
        cfg, tokenizer, processor, max_images, model, PromptDataset([], [], [], [], []), frozenset(vision_ids)
    )
    for i, row in as_rows(data, name, parse.bad):
        parse.add(row, i, f"{name}[{i}]", Path.cwd())
    return parse.finish(split, name)


def check_rows_shape(data: Any, name: str) -> None:
    """Rows passed in Python are rows at all (rows, not a path; something to iterate), checked without reading them:
    the dry run's check (`components.label_config`), and the first of `as_rows`'."""
    if isinstance(data, (str, bytes, Path)):
        raise DataError(
            f"{name} is a path ({str(data)[:80]!r}); pass rows (a list of dicts or a datasets.Dataset), or name "
            "data files in data.train_files / data.val_files"
        )
    if not isinstance(data, Iterable) and not (hasattr(data, "to_dict") and hasattr(data, "columns")):
        raise DataError(f"{name} must be a list of dicts or a datasets.Dataset, got {type(data).__name__}")


def as_rows(data: Any, name: str, bad: list[str] | None = None) -> list[tuple[int, dict[str, Any]]]:
    """(index, row) of rows passed in Python: a list (or any iterable) of dicts, a `datasets.Dataset` (its rows
    as iterating gives them: images decoded to PIL) or a pandas DataFrame; numpy values become Python values.
    A row that is not a dict raises DataError naming `name[index]`, or is recorded in `bad` when that is a list."""
    check_rows_shape(data, name)
    if hasattr(data, "to_dict") and hasattr(data, "columns"):  # a pandas DataFrame iterates its column names
        data = data.to_dict(orient="records")
    items = iter(data)
    out = []
    for i, row in enumerate(items):
        if not isinstance(row, Mapping):
            err = DataError(f"{name}[{i}]: a row must be a dict of columns, got {type(row).__name__}")
            if bad is None:
                raise err
            bad.append(str(err))
            continue
        out.append((i, {str(k): _to_python(v) for k, v in row.items()}))
    return out


@dataclass
class _Overlong:
    """Where the prompts over data.max_prompt_length were: dropped (data.filter_overlong_prompts), or cut
    (data.truncation)."""

    dropped: list[str]
    cut: list[str]


@dataclass
class _Parse:
    """One split's rows being templated, tokenized and checked into `out`; what was filtered or skipped."""

    cfg: DataConfig
    tokenizer: Any
    processor: Any
    max_images: int
    model: str | None
    out: PromptDataset
    vision_ids: frozenset[int] = frozenset()
    """The vision placeholder tokens a data.truncation cut must keep."""
    too_long: _Overlong = field(default_factory=lambda: _Overlong([], []))
    bad: list[str] | None = field(init=False, default=None)
    """Bad rows' errors with data.skip_bad_rows; None: a bad row raises."""

    def __post_init__(self) -> None:
        self.bad = [] if self.cfg.skip_bad_rows else None

    def add(self, row: dict[str, Any], i: int, where: str, base: Path) -> None:
        """One row (`i`: its index in its file or list; `where`: how errors name it; `base`: the folder relative
        image paths are read from)."""
        cfg, tokenizer = self.cfg, self.tokenizer
        if self.processor is None and _has_images(row.get(cfg.image_key)):
            name = getattr(tokenizer, "name_or_path", None)
            label = self.model or (f"model.path={name!r}" if name else "the model")
            raise ConfigError(
                f"{where} has images (data.image_key={cfg.image_key!r}) but {label} is a text-only model; "
                "use a vision-language model or drop the column / set data.image_key to a column that does "
                "not exist"
            )
        try:
            if self.processor is not None:
                _add_image_row(
                    self.out, row, i, where, cfg, self.processor, self.too_long, base, self.max_images, self.vision_ids
                )
            else:
                _add_row(self.out, row, i, where, cfg, tokenizer, self.too_long)
        except DataError as e:
            if self.bad is None:
                raise
            self.bad.append(str(e))

    def finish(self, split: str, source: str) -> PromptDataset:
        """The dataset, with the counts logged; DataError when no row is left (`source`: what the rows came from)."""
        out, bad, cfg = self.out, self.bad, self.cfg
        too_long, cut = self.too_long.dropped, self.too_long.cut
        out.num_filtered = len(too_long)
        out.num_bad = len(bad or [])
        if bad:
            log.warning("%s: skipped %d bad rows (data.skip_bad_rows=true); first: %s", split, len(bad), bad[0])
        if too_long:
            log.warning(
                "%s: filtered %d prompts over data.max_prompt_length=%d (first: %s)%s",
                split,
                len(too_long),
                cfg.max_prompt_length,
                too_long[0],
                ""
                if cfg.truncation == "error"
                else f"; data.truncation={cfg.truncation} cuts only what data.filter_overlong_prompts=false keeps",
            )
        if cut:
            log.info(
                "%s: data.truncation=%s cut %d prompts to data.max_prompt_length=%d (first: %s)",
                split,
                cfg.truncation,
                len(cut),
                cfg.max_prompt_length,
                cut[0],
            )
        if not out.prompt_ids:
            raise DataError(
                f"{split} data {source} is empty after filtering ({len(too_long)} prompts over "
                f"data.max_prompt_length={cfg.max_prompt_length}, {out.num_bad} bad rows skipped)"
            )
        return out


def _has_images(value: Any) -> bool:
    """A row's `data.image_key` value names at least one image (None, NaN, "" and [] name none)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return False
    if isinstance(value, (str, bytes)):
        return bool(value.strip())
    if isinstance(value, (list, tuple)):
        return any(_has_images(v) for v in value)
    if isinstance(value, dict):  # HF datasets' {"bytes", "path"}
        return any(_has_images(v) for v in value.values())
    return True


def _where(path: str, i: int, line: int | None) -> str:
    """`<file> row N` (and the line where that differs: blank or skipped lines in a JSONL file); a CSV row by
    its line, the header being line 1."""
    if line is None:
        return f"{path} row {i + 1}"
    if path.lower().endswith(".csv"):
        return f"{path} line {line}"
    return f"{path} row {i + 1}" if line == i + 1 else f"{path} row {i + 1} (line {line})"


def truncate_prompt(ids: list[int], max_length: int, side: str) -> list[int]:
    """A prompt's ids cut to `max_length` as verl's data.truncation: left keeps the last `max_length` ids, right
    the first, middle the first `max_length // 2` and the last `max_length - max_length // 2`. Shorter prompts
    come back as they are; side `error` (or any other) on an overlong one is a ValueError."""
    if len(ids) <= max_length:
        return ids
    if side == "left":
        return ids[len(ids) - max_length :]
    if side == "right":
        return ids[:max_length]
    if side == "middle":
        head = max_length // 2
        return ids[:head] + ids[len(ids) - (max_length - head) :]
    raise ValueError(f"cannot truncate a prompt of {len(ids)} tokens to {max_length} with side {side!r}")


def _add_row(
    out: PromptDataset, row: dict[str, Any], i: int, where: str, cfg: DataConfig, tokenizer: Any, too_long: _Overlong
) -> None:
    """Template, tokenize and check one row; append it to `out` (or its location to `too_long`)."""
    msgs = messages_of(row, cfg, where)
    if cfg.apply_chat_template and getattr(tokenizer, "chat_template", None):
        enc = tokenizer.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True)
        ids = list(enc["input_ids"] if isinstance(enc, dict) or hasattr(enc, "keys") else enc)
    else:
        ids = tokenizer("\n".join(m["content"] for m in msgs), add_special_tokens=True)["input_ids"]
    fitted = _fit(ids, cfg, where, too_long, "", frozenset())
    if fitted is not None:
        _append(out, row, i, where, cfg, fitted, msgs)


def _fit(
    ids: list[int], cfg: DataConfig, where: str, too_long: _Overlong, counted: str, vision_ids: frozenset[int]
) -> list[int] | None:
    """The prompt within data.max_prompt_length: as it is; None when data.filter_overlong_prompts drops it;
    cut by data.truncation; or an error (truncation `error`, or a cut through the vision tokens `vision_ids`)."""
    limit = cfg.max_prompt_length
    if len(ids) <= limit:
        return ids
    if cfg.filter_overlong_prompts:
        too_long.dropped.append(where)
        return None
    if cfg.truncation == "error":
        raise DataError(
            f"{where}: prompt is {len(ids)} tokens{counted}, over data.max_prompt_length={limit}; raise the "
            "limit, set data.filter_overlong_prompts=true, or cut it with data.truncation=left|right|middle"
        )
    cut = truncate_prompt(ids, limit, cfg.truncation)
    if vision_ids and sum(t in vision_ids for t in cut) != sum(t in vision_ids for t in ids):
        raise DataError(
            f"{where}: data.truncation={cfg.truncation} would cut image tokens from this prompt of {len(ids)} "
            f"tokens{counted} (data.max_prompt_length={limit}); raise data.max_prompt_length or drop such "
            "prompts with data.filter_overlong_prompts=true"
        )
    too_long.cut.append(where)
    return cut


def _append(
    out: PromptDataset, row: dict[str, Any], i: int, where: str, cfg: DataConfig, ids: list[int], msgs: list[Any]
) -> None:
    """Add a tokenized row with its answer, data source, extra info and question."""
    keys = [cfg.answer_key] + ([VERL_ANSWER_KEY] if cfg.answer_key == DataConfig.answer_key else [])
    for key in keys:
        answer = _dig(row, key)
        if not _missing(answer):
            break
    else:
        named = " or ".join(f"'{k}'" for k in keys)
        raise DataError(f"{where}: no {named} column for the reward; set data.answer_key")
    if isinstance(answer, str) and not answer.strip():
        raise DataError(
            f"{where}: empty '{key}' (the reward's ground truth); fill it in, or skip such rows with "
            "data.skip_bad_rows=true"
        )
    source = row.get(cfg.data_source_key)
    if source is None or source == "" or (isinstance(source, float) and math.isnan(source)):
        source = cfg.default_data_source
    if not isinstance(source, str):
        raise DataError(f"{where}: column '{cfg.data_source_key}' must be a string, got {type(source).__name__}")
    extra = row.get("extra_info")
    if extra == "" or (isinstance(extra, float) and math.isnan(extra)):
        extra = None
    if extra is not None and not isinstance(extra, dict):
        raise DataError(
            f"{where}: column 'extra_info' must be an object (a dict passed to the reward), got "
            f"{type(extra).__name__}; use JSONL or parquet for nested values"
        )
    out.prompt_ids.append(ids)
    out.answers.append(answer)
    out.data_sources.append(source)
    out.extra_infos.append(extra if isinstance(extra, dict) else {"index": i})
    text = [{"role": m["role"], "content": _text(m["content"])} for m in msgs]
    out.messages.append(text)
    out.questions.append(next((m["content"] for m in reversed(text) if m["role"] == "user"), text[-1]["content"]))


def _text(content: Any) -> str:
    """A message's text: its string, or its content items' text (images dropped)."""
    if isinstance(content, str):
        return content
    return "".join(str(item.get("text", "")) for item in content if isinstance(item, dict))


def _add_image_row(
    out: PromptDataset,
    row: dict[str, Any],
    i: int,
    where: str,
    cfg: DataConfig,
    processor: Any,
    too_long: _Overlong,
    base: Path,
    max_images: int,
    vision_ids: frozenset[int],
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
    msgs = with_image_items(messages_of(row, cfg, where, items=True), len(images), where)
    ids, mm = encode(processor, msgs, images)
    fitted = _fit(ids, cfg, where, too_long, " with its images' tokens", vision_ids)
    if fitted is None:
        return
    _append(out, row, i, where, cfg, fitted, msgs)
    out.images.append(images)
    if cfg.return_multi_modal_inputs:
        out.mm_inputs.append(mm if mm else image_inputs(processor, images))
