"""Notebook 12's variable-length attention section: packed attention checked three ways, and mask bytes counted.

* `varlen_check`: attention over packed rows with the dense mask and with FlexAttention's block mask,
  against each document attended to alone (`packing.varlen_attention` over `packing.cu_seqlens`).
* `mask_memory`: the bytes of the dense (R, T, T) mask, the BlockMask and cu_seqlens for the same
  documents packed into rows of several lengths, counted from the tensors built.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch.nn.functional as F

from helpers.dataload import packing


def varlen_check(docs: Sequence[torch.Tensor], row_len: int, *, heads: int = 4, head_dim: int = 16,
                 block_size: int = 64, seed: int = 0, cu_seqlens: Callable = packing.cu_seqlens,
                 varlen_attention: Callable = packing.varlen_attention) -> dict:
    """Attention over `docs` packed into rows of `row_len`, three ways, against each document run alone.

    Random q, k, v (R, heads, row_len, head_dim) fp32 on the packed slots; the reference is
    `packing.varlen_attention` (SDPA, causal, on each run of `packing.cu_seqlens` separately). Compared
    with it: the dense (R, 1, T, T) boolean mask through SDPA, and FlexAttention with
    `packing.document_block_mask(doc, block_size)`. Returns {"rows", "docs", "dense_err", "flex_err"
    (largest absolute differences), "dense_mask_bytes", "block_mask_bytes", "cu_seqlens_bytes",
    "blocks" (query blocks, key blocks per row)}. `cu_seqlens` and `varlen_attention` are the reference's two
    pieces (notebook 12 passes the ones its cells define; the default: `packing`'s own, the same code).
    """
    batch = packing.pack_batch(list(docs), row_len)
    R, T = batch.doc.shape
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(R, heads, T, head_dim, generator=g) for _ in range(3))
    cu = cu_seqlens(batch.doc)
    ref = varlen_attention(q, k, v, cu)
    dense_mask = packing.block_causal_mask(batch.doc)  # (R, T, T) bool
    dense = F.scaled_dot_product_attention(q, k, v, attn_mask=dense_mask[:, None])
    bm = packing.document_block_mask(batch.doc, block_size)
    flex = packing.flex_document_attention(q, k, v, bm)
    nb = -(-T // block_size)
    return {"rows": R, "docs": len(docs), "dense_err": float((dense - ref).abs().max()),
            "flex_err": float((flex - ref).abs().max()),
            "dense_mask_bytes": dense_mask.numel() * dense_mask.element_size(),
            "block_mask_bytes": packing.block_mask_bytes(bm), "cu_seqlens_bytes": cu.numel() * cu.element_size(),
            "blocks": [nb, nb]}


def mask_memory(lengths: Sequence[int], row_lens: Sequence[int], *, block_size: int = 128) -> list[dict]:
    """Bytes of each way to say "attend within your own document" for the same documents packed into rows of
    each length in `row_lens` (every document must fit a row): the dense (R, T, T) bool mask, FlexAttention's
    BlockMask (built row by row: a row's block tables do not depend on the other rows), and cu_seqlens.

    Counted from the tensors built (numel x element size), not from a formula. One dict per row length:
    {"row_len", "rows", "tokens", "dense", "block_mask", "cu_seqlens"}.
    """
    out = []
    for T in row_lens:
        docs = [torch.zeros(int(n), dtype=torch.long) for n in lengths]
        doc = packing.pack_batch(docs, T).doc  # (R, T)
        dense = packing.block_causal_mask(doc)
        bm = sum(packing.block_mask_bytes(packing.document_block_mask(doc[r:r + 1], block_size)) for r in range(len(doc)))
        cu = packing.cu_seqlens(doc)
        out.append({"row_len": T, "rows": len(doc), "tokens": int(sum(int(n) for n in lengths)),
                    "dense": dense.numel() * dense.element_size(), "block_mask": bm,
                    "cu_seqlens": cu.numel() * cu.element_size()})
        del dense
    return out
