"""Sequence packing: whole documents in fixed-length rows, a block-diagonal causal mask, positions per document.

Padding (the baseline) gives every document its own row and fills the rest with a pad token that no
loss is taken on. Packing puts several whole documents into one row of `row_len` tokens (first-fit
decreasing, so no document is ever split) and builds, per row:

* `doc` (R, T) int64: which document each slot holds (0, 1, ... within the batch), -1 for padding;
* `pos` (R, T) int64: the position ids, restarting at 0 at each document's first token;
* `block_causal_mask(doc)` (R, T, T) bool: query i may attend to key j when both hold the same
  document and j <= i (padding slots form one block of their own, so no row of the mask is empty);
* `y` (R, T) int64: the next token of the *same* document, -1 (ignored) at each document's last token
  and on padding, so no target crosses a document boundary.

With that mask and those positions, every document's loss is exactly the loss it has alone
(`forward_packed` runs the course GPT so); without the mask, tokens attend to the documents before
them in the row (cross-contamination). Packing documents this way is what e.g. Krell et al., 2021,
*Efficient Sequence Packing without Cross-contamination*, describe for BERT.

The same rule without storing T^2 booleans per row: `document_block_mask` (FlexAttention's BlockMask,
(T/block)^2 int32 block tables per row) with `flex_document_attention`, and `cu_seqlens` (FlashAttention's
variable-length layout, one int32 per document) with `varlen_attention`, the reference that attends
within each document separately.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F

PAD = 0  # the token id written into padding slots (never a target: targets there are -1)


def checked_lengths(lengths: Sequence[int], row_len: int) -> list[int]:
    """The lengths as ints; ValueError unless row_len >= 2 and every length is in [2, row_len]."""
    if isinstance(row_len, bool) or not isinstance(row_len, int) or row_len < 2:
        raise ValueError(f"row_len={row_len!r} must be an int >= 2")
    out = [int(n) for n in lengths]
    bad = [n for n in out if not 2 <= n <= row_len]
    if bad:
        raise ValueError(f"document lengths must be in [2, row_len={row_len}] (a document needs a token and its "
                         f"target, and is never split); got {bad[:5]}")
    return out


def padding_fraction(lengths: Sequence[int], row_len: int, rows: int | None = None) -> float:
    """Share of the slots in `rows` rows of `row_len` tokens that hold no document token (exact).

    rows=None: one row per document (padding). Raises ValueError when the tokens do not fit.
    """
    n = checked_lengths(lengths, row_len)
    rows = len(n) if rows is None else rows
    if rows * row_len < sum(n) or rows < 1:
        raise ValueError(f"{sum(n)} tokens do not fit in {rows} rows of {row_len}")
    return 1.0 - sum(n) / (rows * row_len)


def first_fit_decreasing(lengths: Sequence[int], row_len: int) -> list[list[int]]:
    """Assign documents to rows: longest first, each into the first row with room (never split).

    Returns a list of rows, each a list of document indices in placement order. Ties keep input
    order, so the result is deterministic.
    """
    n = checked_lengths(lengths, row_len)
    rows: list[list[int]] = []  # the document indices of each row, in placement order
    free: list[int] = []  # the slots each row has left
    for i in sorted(range(len(n)), key=lambda i: (-n[i], i)):  # longest first: short ones fill the gaps last
        for r, room in enumerate(free):
            if n[i] <= room:  # the first row it fits in takes it whole
                rows[r].append(i)
                free[r] -= n[i]
                break
        else:  # no row has room: open a new one
            rows.append([i])
            free.append(row_len - n[i])
    return rows


@dataclass
class Batch:
    """A batch of rows: x, y, pos, doc are (R, T) int64 (see the module docstring); tokens = real tokens."""

    x: torch.Tensor
    y: torch.Tensor
    pos: torch.Tensor
    doc: torch.Tensor
    tokens: int

    @property
    def padding(self) -> float:
        """Share of slots that are padding."""
        return 1.0 - self.tokens / self.x.numel()

    def to(self, device, non_blocking: bool = False) -> "Batch":
        """The same batch on `device`."""
        move = lambda t: t.to(device, non_blocking=non_blocking)  # noqa: E731
        return Batch(move(self.x), move(self.y), move(self.pos), move(self.doc), self.tokens)

    def pin_memory(self) -> "Batch":
        """The same batch in page-locked host memory (DataLoader calls this with pin_memory=True)."""
        return Batch(self.x.pin_memory(), self.y.pin_memory(), self.pos.pin_memory(), self.doc.pin_memory(),
                     self.tokens)


def fill_rows(docs: Sequence[torch.Tensor], rows: list[list[int]], row_len: int) -> Batch:
    """The Batch of `docs` laid out in `rows` (lists of document indices, placed left to right) of `row_len` slots."""
    R = len(rows)
    x = torch.full((R, row_len), PAD, dtype=torch.long)  # inputs: PAD where no document is
    y = torch.full((R, row_len), -1, dtype=torch.long)  # targets: -1 (ignored) unless written below
    pos = torch.zeros((R, row_len), dtype=torch.long)  # position ids
    doc = torch.full((R, row_len), -1, dtype=torch.long)  # which document holds each slot; -1: padding
    for r, members in enumerate(rows):
        at = 0  # the next free slot of row r
        for i in members:
            d = docs[i].long()
            n = len(d)
            x[r, at:at + n] = d
            y[r, at:at + n - 1] = d[1:]  # the document's last token has no target in this document
            pos[r, at:at + n] = torch.arange(n)  # positions restart at 0: the model sees the document as if alone
            doc[r, at:at + n] = i  # what the block-diagonal mask is built from
            at += n
    return Batch(x, y, pos, doc, sum(len(docs[i]) for row in rows for i in row))


def pad_batch(docs: Sequence[torch.Tensor], row_len: int | None = None) -> Batch:
    """One document per row, padded to `row_len` (None: the longest document of the batch)."""
    row_len = max(len(d) for d in docs) if row_len is None else row_len
    checked_lengths([len(d) for d in docs], row_len)
    return fill_rows(docs, [[i] for i in range(len(docs))], row_len)


def pack_batch(docs: Sequence[torch.Tensor], row_len: int) -> Batch:
    """Whole documents packed into rows of `row_len` by first-fit decreasing (see the module docstring)."""
    return fill_rows(docs, first_fit_decreasing([len(d) for d in docs], row_len), row_len)


def block_causal_mask(doc: torch.Tensor) -> torch.Tensor:
    """(R, T) document ids -> (R, T, T) bool mask: True where query i may attend to key j.

    mask[r, i, j] = doc[r, i] == doc[r, j] and j <= i. Padding (-1) is one block of its own, so every
    query keeps at least itself and no softmax row is empty.
    """
    T = doc.size(-1)
    causal = torch.ones(T, T, dtype=torch.bool, device=doc.device).tril()  # (T, T)
    return (doc[..., :, None] == doc[..., None, :]) & causal  # (R, T, T)


def positions_from_doc(doc: torch.Tensor) -> torch.Tensor:
    """(R, T) document ids -> (R, T) int64 position ids restarting at 0 where a new document starts (0 on padding).

    A document starts at slot 0 and wherever the id differs from the slot before (packing never puts
    one document in two runs of a row).
    """
    T = doc.size(-1)
    idx = torch.arange(T, device=doc.device).expand_as(doc)  # (R, T)
    start = torch.ones_like(doc, dtype=torch.bool)
    start[..., 1:] = doc[..., 1:] != doc[..., :-1]
    first = torch.where(start, idx, torch.zeros_like(idx)).cummax(dim=-1).values  # (R, T) start of each run
    return torch.where(doc >= 0, idx - first, torch.zeros_like(idx))


def forward_packed(model, x: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor | None,
                   targets: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The course GPT on rows with given position ids and an attention mask; (logits, mean loss or None).

    x, pos, targets (R, T) int64; mask (R, T, T) bool (True = attend) or None for plain causal
    attention over the whole row (what packing without a mask does). Runs the model's own modules
    (embeddings, blocks, final norm, head) with its attention kernel swapped for a masked SDPA for
    the duration of the call, then restored. Raises ValueError for a position past the model's seq_len.
    """
    if int(pos.max()) >= model.config.seq_len:
        raise ValueError(f"position {int(pos.max())} is past seq_len={model.config.seq_len}")
    previous = model.attn_impl
    if mask is not None:
        bias = mask[:, None]  # (R, 1, T, T), broadcast over heads; True = attend, False = a score of -inf

        def masked(q, k, v, is_causal):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)  # (R, H, T, hd)

        model.attn_impl = masked
    try:
        h = model.drop(model.wte(x) + model.wpe(pos))  # (R, T, d_model): the position table read at pos, not 0..T-1
        for block in model.blocks:
            h = block(h)  # (R, T, d_model); every attention in it goes through `masked`
        logits = model.lm_head(model.ln_f(h))  # (R, T, vocab)
    finally:
        model.attn_impl = previous  # the model is left as it was, even after an error
    loss = None
    if targets is not None:
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-1)
    return logits, loss


def per_document_loss(logits: torch.Tensor, targets: torch.Tensor, doc: torch.Tensor, n_docs: int) -> torch.Tensor:
    """Mean next-token loss of each document: (n_docs,) fp32, from logits (R, T, V), targets and doc (R, T).

    Slots with target -1 are left out; a document with no target gets NaN.
    """
    ce = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten().clamp(min=0), reduction="none")  # (R*T,)
    keep = (targets.flatten() >= 0) & (doc.flatten() >= 0)  # slots with a target, inside a document
    ids = doc.flatten()[keep]  # the document each kept slot belongs to
    total = torch.zeros(n_docs, dtype=torch.float32, device=logits.device).index_add_(0, ids, ce[keep])  # sum per doc
    count = torch.zeros(n_docs, dtype=torch.float32, device=logits.device).index_add_(
        0, ids, torch.ones_like(ce[keep]))
    return total / count


def unpacked_losses(model, docs: Sequence[torch.Tensor]) -> torch.Tensor:
    """Each document run alone through the ordinary `model.forward` (positions 0..n-1): (n_docs,) mean losses."""
    out = []
    for d in docs:
        d = d.long()[None]  # (1, n)
        out.append(model(d[:, :-1], d[:, 1:])[1].float())
    return torch.stack(out)


# ---------------------------------------------------------------- variable-length attention without a dense mask

def document_mask_mod(doc: torch.Tensor):
    """FlexAttention's `mask_mod` for packed rows: (b, h, q, kv) -> True where doc[b, q] == doc[b, kv] and kv <= q.

    The same rule as `block_causal_mask`, evaluated per index instead of stored as an (R, T, T) tensor.
    """
    def mask_mod(b, h, q, kv):
        return (doc[b, q] == doc[b, kv]) & (kv <= q)

    return mask_mod


def document_block_mask(doc: torch.Tensor, block_size: int = 128):
    """(R, T) document ids -> `torch.nn.attention.flex_attention.BlockMask` of the block-diagonal causal mask.

    A BlockMask stores, per (row, query block), how many key blocks are partly or fully allowed and which:
    int32 tensors of shape (R, 1, T/block) and (R, 1, T/block, T/block), so (T/block)^2 integers per row
    instead of T^2 booleans; empty blocks are skipped by the compiled kernel (Dong et al., 2024,
    *Flex Attention: A Programming Model for Generating Optimized Attention Kernels*). Built without
    torch.compile, which evaluates the mask once per element while building it. Raises ValueError for a
    block_size that is not a positive int.
    """
    from torch.nn.attention.flex_attention import create_block_mask  # loads torch's compiler stack (seconds): only here
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size={block_size!r} must be a positive int (FlexAttention's default is 128)")
    R, T = doc.shape
    return create_block_mask(document_mask_mod(doc), R, None, T, T, device=str(doc.device), BLOCK_SIZE=block_size)


def block_mask_bytes(block_mask) -> int:
    """Bytes of the tensors a BlockMask holds (block counts and block indices, for queries and keys)."""
    return sum(t.numel() * t.element_size() for t in block_mask.as_tuple() if isinstance(t, torch.Tensor))


def flex_document_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_mask) -> torch.Tensor:
    """softmax(q k^T / sqrt(hd) + mask) v through `flex_attention` with a `document_block_mask`; (R, H, T, hd).

    Called eagerly: without torch.compile PyTorch runs its unfused reference, which materialises the scores
    (it warns so once; the warning is silenced here because this call is the reference on purpose). Wrap
    `flex_attention` in torch.compile for the fused kernel that skips empty blocks.
    """
    from torch.nn.attention.flex_attention import flex_attention  # loads torch's compiler stack (seconds): only here
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        return flex_attention(q, k, v, block_mask=block_mask)


def cu_seqlens(doc: torch.Tensor) -> torch.Tensor:
    """(R, T) document ids -> int32 cumulative run lengths over the flattened rows, (n_runs + 1,), starting at 0.

    The variable-length layout of FlashAttention's `flash_attn_varlen_func` (Dao, 2023): the rows are
    concatenated into one sequence of R*T tokens and run i is tokens cu[i]:cu[i+1], each a document (or a
    row's padding); attention is causal inside each run. O(documents) integers instead of T^2 booleans.
    """
    flat = doc.flatten()  # (R*T,): the rows one after another
    change = torch.ones_like(flat, dtype=torch.bool)
    change[1:] = flat[1:] != flat[:-1]  # a run starts where the document id changes
    T = doc.size(-1)
    change[::T] = True  # a run never crosses a row boundary
    starts = torch.nonzero(change).flatten()  # (n_runs,) first slot of each run
    return torch.cat([starts, torch.tensor([flat.numel()], device=doc.device)]).to(torch.int32)  # + the end


def varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor) -> torch.Tensor:
    """Causal attention run separately on each run of `cu_seqlens` (the reference): (R, H, T, hd) in, same out.

    Each run (a document, or a row's padding) is sliced out of the flattened rows and attended to alone with
    PyTorch's SDPA, is_causal=True; no mask tensor exists at all.
    """
    R, H, T, hd = q.shape
    flat = lambda t: t.transpose(0, 1).reshape(H, R * T, hd)  # noqa: E731  (H, R*T, hd)
    fq, fk, fv = flat(q), flat(k), flat(v)
    out = torch.empty_like(fq)
    bounds = cu.tolist()
    for a, b in zip(bounds[:-1], bounds[1:]):  # one run at a time: its queries see only its own keys
        out[:, a:b] = F.scaled_dot_product_attention(fq[:, a:b], fk[:, a:b], fv[:, a:b], is_causal=True)
    return out.reshape(H, R, T, hd).transpose(0, 1)
