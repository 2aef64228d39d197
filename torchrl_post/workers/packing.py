"""Sequence packing: a micro-batch's samples laid into rows without padding (attention kept per sample by
position ids, or by a tree mask where the samples of one prompt share one copy of it)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from torchrl_post.types import Batch
from torchrl_post.workers.row_attention import KEY, RowAttention, install, row_blocks
from torchrl_post.workers.ulysses import SequenceShard, own_attention


def prompt_keys(input_ids: torch.Tensor, attention_mask: torch.Tensor, response_width: int) -> list[tuple[int, ...]]:
    """Each row's real prompt tokens, as a key: rows with equal keys share their prompt."""
    width = attention_mask.shape[1] - response_width
    real = attention_mask[:, :width].bool()
    return [tuple(input_ids[i, :width][real[i]].tolist()) for i in range(real.shape[0])]


def group_rows(keys: list[Any]) -> list[list[int]]:
    """Row indices grouped by equal keys, groups in order of first appearance."""
    groups: dict[Any, list[int]] = {}
    for i, key in enumerate(keys):
        groups.setdefault(key, []).append(i)
    return list(groups.values())


@dataclass(frozen=True)
class Pack:
    """Samples' real tokens packed into k rows of equal length T (`pack`). `ids`, `pos` [k, T]; `segment`,
    `branch` [k, T]: which segment of its row each column belongs to and, within it, 0 for the (shared) prompt or
    1 + the response's index (None without shared prompts: the position ids then separate the samples); `keep`
    [K]: the columns whose outputs predict (or value) a response token in some row; `out_row`, `out_col`,
    `out_kept` [N]: for each of the N response tokens, its predicting position's row, column, and index in
    `keep`; `labels` [N]; `valid_bt` [b, R]: where those N outputs go back; `source` [k, T]: each column's cell in
    the rows' [b, P + R] grid, flattened (-1: slack), which places per-token records (`Batch.routed_experts`);
    `rows`: empty for k rows of T columns, or the row lengths of one flat row, the rows' real columns end to end
    (`trimmed`: no slack)."""

    ids: torch.Tensor
    pos: torch.Tensor
    keep: torch.Tensor
    out_row: torch.Tensor
    out_col: torch.Tensor
    out_kept: torch.Tensor
    labels: torch.Tensor
    valid_bt: torch.Tensor
    tokens: int
    """Real tokens placed, a shared prompt once (the rest of the k x T cells is each row's slack)."""
    source: torch.Tensor
    segment: torch.Tensor | None = None
    branch: torch.Tensor | None = None
    rows: tuple[int, ...] = ()

    @property
    def cells(self) -> int:
        """The token cells a forward computes (a flat pack's are all real tokens)."""
        return self.ids.numel()

    def trimmed(self) -> Pack:
        """The same rows as one flat [1, S] row, each row's real columns (its leading slack dropped) after the
        previous row's; the N outputs keep their order, so `kept`, `full` and `unpack` read them as before. Its
        forward attends block by block (`row_attention`, or the varlen boundaries), never across samples."""
        assert not self.rows, "already flat"
        real = self.source >= 0
        flat = torch.cumsum(real.reshape(-1), 0).view(real.shape) - 1  # each real cell's flat column
        lengths = tuple(int(n) for n in real.sum(1).tolist())
        out_col = flat[self.out_row, self.out_col]
        keep, out_kept = torch.unique(out_col, sorted=True, return_inverse=True)
        segment = None if self.segment is None else self.segment[real][None]
        branch = None if self.branch is None else self.branch[real][None]
        return replace(
            self, ids=self.ids[real][None], pos=self.pos[real][None], keep=keep,
            out_row=torch.zeros_like(self.out_row), out_col=out_col, out_kept=out_kept, source=self.source[real][None],
            segment=segment, branch=branch, rows=lengths,
        )  # fmt: skip

    def row_attention(self, device: torch.device) -> RowAttention:
        """A flat pack's plan for `row_attention`: each row's blocks (`row_blocks`), in column order."""
        blocks, start = [], 0
        for n in self.rows:
            cut = slice(start, start + n)
            seg, br = (
                (None, None)
                if self.segment is None or self.branch is None
                else (self.segment[0, cut], self.branch[0, cut])
            )
            blocks += row_blocks(start, self.pos[0, cut], seg, br, device)
            start += n
        return RowAttention(tuple(blocks))

    def attention(self, device: torch.device, additive: torch.dtype | None = None) -> torch.Tensor:
        """[k, 1, T, T] mask of a row with shared prompts: a column sees the earlier columns of its segment's
        prompt and of its own branch. Boolean (True: attend), or `additive` (0 / most negative) for eager."""
        assert self.segment is not None and self.branch is not None
        seg, br = self.segment.to(device), self.branch.to(device)
        t = seg.shape[1]
        causal = torch.ones(t, t, dtype=torch.bool, device=device).tril()
        same = (seg[:, :, None] == seg[:, None, :]) & ((br[:, None, :] == 0) | (br[:, :, None] == br[:, None, :]))
        allowed = (same & causal).unsqueeze(1)
        if additive is None:
            return allowed
        return torch.zeros(allowed.shape, dtype=additive, device=device).masked_fill(
            ~allowed, torch.finfo(additive).min
        )

    def inputs(self, device: torch.device, attn_implementation: str = "sdpa") -> dict[str, Any]:
        """The forward's keyword arguments. Without shared prompts no attention mask: sdpa and eager read the
        restarts of the position ids as sample boundaries (a block-diagonal causal mask per row); an attention
        that takes no mask (flash-attn, and any other implementation) gets the boundaries as varlen arguments
        (`varlen`): transformers infers them from position ids only for a single row, so with k > 1 rows the
        samples of a row would attend to each other. Not with a KV cache: `use_cache=False`. A flat pack
        (`trimmed`) under sdpa carries its `row_attention` plan and an empty mask in place of transformers' own."""
        out: dict[str, Any] = {"input_ids": self.ids.to(device), "position_ids": self.pos.to(device)}
        if self.rows and attn_implementation == "sdpa":
            install()
            out["attention_mask"] = torch.zeros(1, 1, 0, 0, dtype=torch.bool, device=device)
            out[KEY] = self.row_attention(device)
        elif self.segment is not None:
            additive = None if attn_implementation == "sdpa" else torch.get_default_dtype()
            out["attention_mask"] = self.attention(device, additive)
        elif attn_implementation not in MASKABLE:
            out |= self.varlen(device)
        return {**out, "use_cache": False}

    def varlen(self, device: torch.device) -> dict[str, Any]:
        """The packed rows' sequences for a mask-less varlen attention (flash-attn's `cu_seqlens`, as
        transformers passes them down: `cu_seq_lens_q/k`, `max_length_q/k`), over the k x T tokens flattened row
        by row: a sequence starts at every row's first column and wherever the position ids do not go on by one
        (a sample's first token, the end of a row's leading slack), and in a flat pack at each row's start."""
        starts = torch.ones(self.pos.shape, dtype=torch.bool)
        starts[:, 1:] = self.pos[:, 1:] != self.pos[:, :-1] + 1
        if self.rows:
            starts[0, torch.tensor(self.rows[:-1], dtype=torch.long).cumsum(0)] = True
        first = starts.reshape(-1).nonzero().squeeze(-1)
        cu = torch.cat([first, torch.tensor([self.pos.numel()])]).to(torch.int32)
        longest = int(cu.diff().max())
        cu = cu.to(device)
        return {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": longest, "max_length_k": longest}

    def kept(self, out: torch.Tensor) -> torch.Tensor:
        """[k, K, ...] outputs at `keep` (logits_to_keep) -> [N, ...], one per response token."""
        return out[self.out_row.to(out.device), self.out_kept.to(out.device)]

    def full(self, out: torch.Tensor) -> torch.Tensor:
        """[k, T, ...] outputs at every column -> [N, ...], one per response token."""
        return out[self.out_row.to(out.device), self.out_col.to(out.device)]

    def unpack(self, values: torch.Tensor) -> torch.Tensor:
        """[N, ...] per response token -> [b, R, ...], zero elsewhere (differentiable)."""
        zeros = torch.zeros((*self.valid_bt.shape, *values.shape[1:]), device=values.device, dtype=values.dtype)
        if not self.valid_bt.any():  # nothing to score: one kept position holds the graph together
            return zeros + 0.0 * values.sum()
        where = tuple(w.to(values.device) for w in self.valid_bt.nonzero(as_tuple=True))
        return zeros.index_put(where, values)


MASKABLE = ("sdpa", "eager")
"""Attention implementations that take a custom [b, 1, T, T] mask (shared prompts); the others (flash-attn) get
the sequence boundaries (`Pack.varlen`) and pack the samples of a prompt apart."""


def share_prompts(plen: list[int], resp: list[int], keys: list[Any], longest: int | None) -> list[list[int]]:
    """Samples into segments: one prompt and the responses that share it (`keys`: equal for equal prompts).

    Under a dense [L, L] mask (eager, Ulysses' batched rows) a segment grows while its attention,
    (prompt + responses)^2, stays within that of the rows it replaces, members x `longest`^2: the prompt's tokens
    are then computed once for all members at no extra attention cost (GRPO's n samples of a prompt with short
    answers share most of their tokens; long answers share little and stay apart). `longest` None: the attention
    runs block by block (`row_attention.row_blocks`: each response over the prompt and itself, never more than its
    own row would), so every sample of a prompt shares it. Segments keep the samples' order; a sample alone is a
    segment of one.
    """
    out: list[list[int]] = []
    for members in group_rows(keys):
        seg: list[int] = []
        size = 0
        for i in sorted(members, key=lambda i: (-resp[i], i)):
            grown = (size or plen[i]) + resp[i]
            if seg and longest is not None and grown * grown > (len(seg) + 1) * longest * longest:
                out.append(seg)
                seg, grown = [], plen[i] + resp[i]
            seg.append(i)
            size = grown
        out.append(seg)
    return out


def pack(batch: Batch, rows: slice | torch.Tensor, shared: bool = False, blockwise: bool = False) -> Pack:
    """The real tokens of `rows` (left-padded prompt, then the response right after it) in rows as long as the
    longest segment, each sample with its own position ids 0, 1, ... A segment is one sample, or with `shared`
    one prompt followed by the responses of the samples that share it (`share_prompts`), which see the prompt
    and themselves only (`Pack.attention`). Rows are right-aligned, the segment with the longest response last:
    most responses then end in the same last columns, and the LM head (one set of columns for every row,
    `logits_to_keep`) runs over few columns. A row's leading slack is a run of positions of its own, which no
    real token attends to; `Pack.trimmed` drops it (`packed_inputs` runs the rows flat wherever it can).
    `blockwise`: the forward attends block by block (a flat pack under sdpa), so a prompt is shared by all its
    samples whatever their lengths (`share_prompts`)."""
    mask = batch.attention_mask[rows].bool()
    ids_b, pos_b = batch.input_ids[rows], batch.position_ids[rows]
    width = batch.response_width
    lengths = mask.sum(1).tolist()
    resp = mask[:, -width:].sum(1).tolist()
    plen = [n - r for n, r in zip(lengths, resp, strict=True)]
    longest = max(max(lengths), 1)
    if shared:
        segments = share_prompts(plen, resp, prompt_keys(ids_b, mask, width), None if blockwise else longest)
    else:
        segments = [[i] for i in range(len(lengths))]
    seg_len = [plen[m[0]] + sum(resp[i] for i in m) for m in segments]
    cap = max(max(seg_len), 1)
    bins = pack_rows(seg_len, cap)
    masked = any(len(m) > 1 for m in segments)
    ids = torch.zeros(len(bins), cap, dtype=ids_b.dtype)
    pos = torch.zeros(len(bins), cap, dtype=pos_b.dtype)
    segment = torch.zeros(len(bins), cap, dtype=torch.long)
    branch = torch.zeros(len(bins), cap, dtype=torch.long)
    source = torch.full((len(bins), cap), -1, dtype=torch.long)
    grid = mask.shape[1]
    cells = torch.arange(mask.shape[0] * grid).view(mask.shape)
    where_row = torch.zeros(mask.shape[0], width, dtype=torch.long)
    where_tgt = torch.zeros(mask.shape[0], width, dtype=torch.long)  # the column of response token t
    where_col = torch.zeros(mask.shape[0], width, dtype=torch.long)  # the column predicting it
    for r, members in enumerate(bins):
        for m in members:
            segments[m].sort(key=lambda i: (resp[i], i))  # the longest response ends its segment
        members = sorted(members, key=lambda m: (resp[segments[m][-1]], m))  # and the longest segment the row
        col = cap - sum(seg_len[m] for m in members)
        if col:  # slack: a run of positions the first sample restarts from, its first token repeated
            first = segments[members[0]][0]
            first_id, first_pos = ids_b[first][mask[first]][0], pos_b[first][mask[first]][0]
            ids[r, :col] = first_id
            pos[r, :col] = first_pos + 1 + torch.arange(col)
        for s, m in enumerate(members, start=1):
            lead = segments[m][0]
            p = plen[lead]
            segment[r, col : col + seg_len[m]] = s
            ids[r, col : col + p], pos[r, col : col + p] = ids_b[lead][mask[lead]][:p], pos_b[lead][mask[lead]][:p]
            source[r, col : col + p] = cells[lead][mask[lead]][:p]
            last_prompt, col = col + p - 1, col + p
            for b, i in enumerate(segments[m], start=1):
                n, real = resp[i], mask[i, -width:]
                ids[r, col : col + n], pos[r, col : col + n] = ids_b[i, -width:][real], pos_b[i, -width:][real]
                source[r, col : col + n] = cells[i, -width:][real]
                branch[r, col : col + n] = b
                where_row[i] = r
                where_tgt[i] = col + torch.arange(width)
                where_col[i] = where_tgt[i] - 1
                where_col[i, 0] = last_prompt  # every member's first token is predicted by the prompt's end
                col += n
    valid_bt = torch.arange(width) < torch.tensor(resp).unsqueeze(1)
    out_row, out_col, target = where_row[valid_bt], where_col[valid_bt], where_tgt[valid_bt]
    if not len(out_col):  # nothing to score: one position keeps the graph (and FSDP's backward) together
        out_row, out_col = torch.zeros(1, dtype=torch.long), torch.full((1,), cap - 1, dtype=torch.long)
        target = out_col
    labels = ids[out_row, target]
    keep, out_kept = torch.unique(out_col, sorted=True, return_inverse=True)
    return Pack(
        ids, pos, keep, out_row, out_col, out_kept, labels, valid_bt, sum(seg_len), source,
        segment if masked else None, branch if masked else None,
    )  # fmt: skip


def packed_inputs(
    model: torch.nn.Module,
    batch: Batch,
    rows: slice | torch.Tensor,
    device: torch.device,
    shared: bool,
    shard: SequenceShard | None = None,
) -> tuple[Pack, dict[str, Any]]:
    """`pack` for `model` (prompts shared only where its attention takes a mask) and the forward's inputs: one
    flat row without slack (`Pack.trimmed`) where the attention can run it sample by sample (sdpa, by `row_attention`;
    flash-attn, by its varlen boundaries); the k batched rows under eager and under Ulysses (`shard`), whose
    sequence split and global mask take the rows as they are."""
    config = getattr(model, "config", None)
    impl = own_attention(model) if config is not None else "sdpa"  # under Ulysses: the one it runs inside
    flat = config is not None and impl != "eager" and (shard is None or shard.size == 1)
    p = pack(batch, rows, shared and impl in MASKABLE, blockwise=flat and impl == "sdpa")
    if flat:
        p = p.trimmed()
    return p, p.inputs(device, impl)


def can_pack(batch: Batch) -> bool:
    """Packing needs one row of position ids per sample: a vision model's M-RoPE positions and images do not
    pack here (verl and OpenRLHF do not pack VLM batches either)."""
    return not batch.has_images and batch.position_ids.dim() == 2


def pack_rows(lengths: list[int], budget: int) -> list[list[int]]:
    """First-fit decreasing: row indices into packs of at most `budget` tokens (a longer row alone)."""
    packs: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        for p, free in enumerate(room):
            if lengths[i] <= free:
                packs[p].append(i)
                room[p] -= lengths[i]
                break
        else:
            packs.append([i])
            room.append(budget - lengths[i])
    return [sorted(p) for p in packs]


def balance_rows(lengths: list[int], k: int) -> list[list[int]]:
    """Row indices into exactly `k` bins of about equal token sums (longest first into the lightest bin);
    bins stay empty when there are fewer rows than bins."""
    bins: list[list[int]] = [[] for _ in range(k)]
    load = [0] * k
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        b = min(range(k), key=lambda j: (load[j], j))
        bins[b].append(i)
        load[b] += lengths[i]
    return [sorted(b) for b in bins]
