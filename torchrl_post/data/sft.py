"""Supervised fine-tuning data (sft.enable): rows -> a prompt's tokens and a response's tokens with the mask of the
tokens the loss trains on.

Two row shapes, as verl's and TRL's SFT take them:

    prompt/response   {"prompt": "...", "response": "..."}            (data.prompt_key, sft.response_key)
    conversation      {"messages": [{role, content}, ...]}            (sft.messages_key)

Either becomes a conversation rendered turn by turn with the chat template: the prompt is everything up to the
first assistant turn's generation prompt; the response is the rest, and the mask is 1 on the assistant turns'
tokens (their content and end-of-turn token as the template renders them; not the template's text after that
token, which the model never generates) and 0 on every other turn's, so a multi-turn
conversation trains only on what the model says. Each assistant turn is tokenised from its generation prompt on,
as the engine would produce it, the other pieces as they render. Without a chat template (or with
data.apply_chat_template=false) a prompt/response row is the prompt's text and the response's tokens with the end
of sequence token; a conversation needs a template.

The prompt obeys the data section's rules for prompts (data.max_prompt_length, filter_overlong_prompts,
truncation); a response over data.max_response_length is cut and counted, or refused (sft.truncation). Errors name
the file and row, as the prompt loader's do (data/dataset.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from torchrl_post.config.errors import DataError
from torchrl_post.config.schema import DataConfig, SftConfig
from torchrl_post.data.dataset import (
    PromptDataset,
    _fit,
    _Overlong,
    _read_rows,
    _text,
    _where,
    as_rows,
    messages_of,
)

log = logging.getLogger(__name__)


@dataclass
class SftDataset(PromptDataset):
    """Prompts as the prompt loader keeps them, plus each row's response tokens and loss mask (index-aligned)."""

    response_ids: list[list[int]] = field(default_factory=list)
    response_masks: list[list[int]] = field(default_factory=list)
    """1 where a response token is trained on (an assistant turn's), 0 elsewhere (another turn's)."""
    num_truncated: int = 0
    """Responses cut at data.max_response_length (sft.truncation=right)."""


def _conversation(row: dict[str, Any], data: DataConfig, sft: SftConfig, where: str) -> list[dict[str, str]]:
    """The row as chat messages ending in at least one assistant turn."""
    response = row.get(sft.response_key)
    if response is not None:
        if not isinstance(response, str) or not response.strip():
            raise DataError(f"{where}: column '{sft.response_key}' (sft.response_key) must be a non-empty string")
        prompt = [{"role": m["role"], "content": _text(m["content"])} for m in messages_of(row, data, where)]
        return [*prompt, {"role": "assistant", "content": response}]
    msgs = row.get(sft.messages_key)
    if msgs is None:
        raise DataError(
            f"{where}: no '{sft.response_key}' column (sft.response_key) and no '{sft.messages_key}' column "
            "(sft.messages_key); an SFT row is a prompt with a response, or a conversation"
        )
    turns = messages_of({"messages": msgs}, DataConfig(prompt_key="messages"), where)
    if not any(m["role"] == "assistant" for m in turns):
        raise DataError(
            f"{where}: column '{sft.messages_key}' has no assistant turn; SFT trains on the assistant turns, so "
            "each conversation needs at least one"
        )
    return [{"role": m["role"], "content": _text(m["content"])} for m in turns]


def _render(tokenizer: Any, messages: list[dict[str, str]], generation_prompt: bool) -> str:
    return str(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt))


def _ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []


def conversation_tokens(tokenizer: Any, messages: list[dict[str, str]], where: str) -> tuple[list[int], list[int]]:
    """(tokens, mask) of a conversation rendered with the chat template piece by piece: 1 on assistant turns."""
    ids: list[int] = []
    mask: list[int] = []
    done = ""  # the text rendered so far
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        opened = _render(tokenizer, messages[:i], True)  # up to this turn's generation prompt
        closed = _render(tokenizer, messages[: i + 1], False)
        if not opened.startswith(done) or not closed.startswith(opened):
            raise DataError(
                f"{where}: the chat template does not render this conversation turn by turn as a prefix of the "
                "next (it rewrites earlier turns); SFT needs a template that does (data.chat_template)"
            )
        before = _ids(tokenizer, opened[len(done) :])
        turn = _ids(tokenizer, closed[len(opened) :])
        # the turn's content and end-of-turn token train; the template's glue after it (Qwen's newline) does not
        end = tokenizer.eos_token_id
        trained = len(turn) - turn[::-1].index(end) if end in turn else len(turn)
        ids += before + turn
        mask += [0] * len(before) + [1] * trained + [0] * (len(turn) - trained)
        done = closed
    rest = _ids(tokenizer, _render(tokenizer, messages, False)[len(done) :])  # turns after the last assistant's
    return ids + rest, mask + [0] * len(rest)


def sft_row(tokenizer: Any, data: DataConfig, sft: SftConfig, row: dict[str, Any], where: str) -> tuple[Any, ...]:
    """(prompt ids, response ids, response mask, response text) of one row, before any length rule."""
    msgs = _conversation(row, data, sft, where)
    first = next(i for i, m in enumerate(msgs) if m["role"] == "assistant")
    answer = msgs[first]["content"] if first == len(msgs) - 1 else msgs[-1]["content"]
    if data.apply_chat_template and getattr(tokenizer, "chat_template", None):
        ids, mask = conversation_tokens(tokenizer, msgs, where)
        start = mask.index(1)
        return ids[:start], ids[start:], mask[start:], answer
    if len(msgs) - first > 1 or row.get(sft.response_key) is None:
        raise DataError(
            f"{where}: a conversation needs a chat template to render its turns; the tokenizer has none (or "
            "data.apply_chat_template=false): set data.chat_template, or give prompt/response rows"
        )
    prompt = tokenizer("\n".join(m["content"] for m in msgs[:first]), add_special_tokens=True)["input_ids"]
    response = _ids(tokenizer, msgs[first]["content"]) + [tokenizer.eos_token_id]
    return list(prompt), response, [1] * len(response), answer


@dataclass
class _SftParse:
    data: DataConfig
    sft: SftConfig
    tokenizer: Any
    out: SftDataset
    too_long: _Overlong = field(default_factory=lambda: _Overlong([], []))
    cut: list[str] = field(default_factory=list)
    bad: list[str] | None = None

    def add(self, row: dict[str, Any], i: int, where: str) -> None:
        try:
            self._add(row, i, where)
        except DataError as e:
            if self.bad is None:
                raise
            self.bad.append(str(e))

    def _add(self, row: dict[str, Any], i: int, where: str) -> None:
        d, s = self.data, self.sft
        prompt, response, mask, answer = sft_row(self.tokenizer, d, s, row, where)
        fitted = _fit(prompt, d, where, self.too_long, "", frozenset())
        if fitted is None:
            return
        if len(response) > d.max_response_length:
            if s.truncation == "error":
                raise DataError(
                    f"{where}: response is {len(response)} tokens, over data.max_response_length="
                    f"{d.max_response_length}; raise it, or cut such responses with sft.truncation=right"
                )
            self.cut.append(where)
            response, mask = response[: d.max_response_length], mask[: d.max_response_length]
        if not any(mask):
            raise DataError(f"{where}: no assistant token is left to train on within data.max_response_length")
        source = row.get(d.data_source_key) or d.default_data_source
        o = self.out
        o.prompt_ids.append(fitted)
        o.response_ids.append(response)
        o.response_masks.append(mask)
        o.answers.append(answer)
        o.data_sources.append(str(source))
        o.extra_infos.append({"index": i})

    def finish(self, split: str, source: str) -> SftDataset:
        out, d = self.out, self.data
        out.num_filtered, out.num_bad, out.num_truncated = (
            len(self.too_long.dropped),
            len(self.bad or []),
            len(self.cut),
        )
        if self.bad:
            log.warning("%s: skipped %d bad rows (data.skip_bad_rows=true); first: %s", split, out.num_bad, self.bad[0])
        if self.too_long.dropped:
            log.warning(
                "%s: filtered %d prompts over data.max_prompt_length=%d (first: %s)",
                split, out.num_filtered, d.max_prompt_length, self.too_long.dropped[0],
            )  # fmt: skip
        if self.cut:
            log.warning(
                "%s: cut %d responses to data.max_response_length=%d (sft.truncation=right; first: %s)",
                split, len(self.cut), d.max_response_length, self.cut[0],
            )  # fmt: skip
        if not out.prompt_ids:
            raise DataError(
                f"{split} data {source} is empty after filtering ({out.num_filtered} prompts over "
                f"data.max_prompt_length={d.max_prompt_length}, {out.num_bad} bad rows skipped)"
            )
        return out


def load_sft(
    files: list[str], data: DataConfig, sft: SftConfig, tokenizer: Any, split: str, rows: Any = None
) -> SftDataset:
    """The SFT split from `files`, or from `rows` passed in Python (a list of dicts, a `datasets.Dataset`)."""
    parse = _SftParse(
        data, sft, tokenizer, SftDataset([], [], [], [], files=list(files)), bad=[] if data.skip_bad_rows else None
    )
    if rows is not None:
        name = f"{split}_data"
        for i, row in as_rows(rows, name, parse.bad):
            parse.add(row, i, f"{name}[{i}]")
        return parse.finish(split, name)
    for path in files:
        found, lines = _read_rows(path, parse.bad)
        for i, row in enumerate(found):
            parse.add(row, i, _where(path, i, lines[i] if lines is not None else None))
    return parse.finish(split, str(files))
