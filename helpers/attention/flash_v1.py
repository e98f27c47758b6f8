"""FlashAttention-1's loop order (Dao et al., 2022, algorithm 1) beside FlashAttention-2's (Dao, 2023).

* `flash1_forward`: the forward with key/value tiles in the outer loop and query tiles in the inner one.
  The output O and the softmax statistics m and l of every query row live in memory and are read and
  written back once per (key tile, query tile); FlashAttention-2 (`kernels.FlashAttentionPyTorch`) swaps the
  loops, so that a query tile's O, m and l stay on chip and are written once.
* `flash1_traffic_bytes`: that order's HBM bytes, by the model of `kernels.tiled_traffic_bytes`.
* `program_counts`: how many GPU programs each order launches: FlashAttention-1 one per (batch, head),
  FlashAttention-2 one per (query tile, batch, head), the grid of `flash_triton`'s forward.
"""
from __future__ import annotations

import math

import torch

from helpers.attention.kernels import _causal_tile_mask
from helpers.measure import params


def flash1_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False,
                   block_q: int = 64, block_k: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(q kᵀ / sqrt(d)) v in FlashAttention-1's loop order; returns O (..., N_q, d) and L = m + log l (..., N_q).

    q (..., N_q, d), k and v (..., N_k, d); the arithmetic is fp32, O is returned in q's dtype. Causal masks
    key j for query i when j > i. Raises ValueError for a non-positive tile size.
    """
    params.positive("block_q", block_q)
    params.positive("block_k", block_k)
    n_q, n_k, scale = q.shape[-2], k.shape[-2], q.shape[-1] ** -0.5
    # "in HBM": O, m and l of every query row, read and written back once per key tile
    o = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    m = torch.full(q.shape[:-1], float("-inf"), device=q.device)  # running max of each row
    l = torch.zeros_like(m)  # running sum of exp(s - m) of each row
    with torch.autocast(q.device.type, enabled=False):
        for j0 in range(0, n_k, block_k):  # outer loop: one key/value tile, loaded once, stays "on chip"
            j1 = min(j0 + block_k, n_k)
            kj, vj = k[..., j0:j1, :].float(), v[..., j0:j1, :].float()
            first = (j0 // block_q) * block_q if is_causal else 0  # causal: earlier query tiles never see key j0
            for i0 in range(first, n_q, block_q):  # inner loop: every query tile, once per key tile
                i1 = min(i0 + block_q, n_q)
                qi = q[..., i0:i1, :].float()  # Q_i read again for every key tile
                oi, mi, li = o[..., i0:i1, :], m[..., i0:i1], l[..., i0:i1]  # O_i, m_i, l_i read back from memory
                s = qi @ kj.mT * scale  # (..., Bq, Bk)
                mask = _causal_tile_mask(i0, i1, j0, j1, q.device) if is_causal else None
                if mask is not None:
                    s = s.masked_fill(mask, float("-inf"))
                m_new = torch.maximum(mi, s.amax(dim=-1))  # finite: every row sees key 0, in the first key tile
                p = torch.exp(s - m_new[..., None])  # (..., Bq, Bk)
                alpha = torch.exp(mi - m_new)  # rescales the old sum and output to the new max
                l_new = li * alpha + p.sum(dim=-1)
                # O_i is kept normalised: undo the old 1/l, add this tile's P V, divide by the new l; written back
                o[..., i0:i1, :] = (oi * (li * alpha)[..., None] + p @ vj) / l_new[..., None]
                m[..., i0:i1], l[..., i0:i1] = m_new, l_new  # the statistics written back too
    return o.to(q.dtype), m + torch.log(l)


def flash1_traffic_bytes(n: int, d: int, block_q: int, block_k: int, batch_heads: int = 1, itemsize: int = 2,
                         is_causal: bool = False) -> int:
    """HBM bytes of the FlashAttention-1 forward in `flash1_forward`'s order, per the paper's algorithm 1.

    O (at the input's element size, as the algorithm counts it) and m, l (fp32) are initialised in memory once,
    K and V read once; then, for each key tile, every query tile it reaches (all of them, or from the key
    tile's own query tile on when causal) reads Q_i, O_i, m_i, l_i and writes O_i, m_i, l_i back. Per head:
    s(3Nd + 3Nd·⌈N/B_c⌉) + 4(2N + 4N·⌈N/B_c⌉) bytes when not causal. Raises ValueError for a non-positive size.
    """
    for name, value in (("n", n), ("d", d), ("block_q", block_q), ("block_k", block_k), ("batch_heads", batch_heads),
                        ("itemsize", itemsize)):
        params.positive(name, value)
    kv_tiles = math.ceil(n / block_k)
    rows = (sum(n - (j * block_k // block_q) * block_q for j in range(kv_tiles)) if is_causal
            else kv_tiles * n)  # query rows visited, summed over the key tiles
    elems = n * d + 2 * n * d + rows * 3 * d  # O zeroed; K, V read once; per visit Q_i read, O_i read and written
    stats = 2 * n + rows * 4  # m, l initialised; per visit m_i, l_i read and written
    return batch_heads * (elems * itemsize + stats * 4)


def program_counts(batch: int, heads: int, n: int, block_q: int) -> dict[str, int]:
    """GPU programs (thread blocks) one forward launches: FlashAttention-1 parallelises over batch and heads,
    one program walking every tile of its head; FlashAttention-2 over query tiles too, the grid
    (⌈N/B_r⌉, batch·heads) of `flash_triton`'s forward. Raises ValueError for a non-positive size."""
    for name, value in (("batch", batch), ("heads", heads), ("n", n), ("block_q", block_q)):
        params.positive(name, value)
    return {"FlashAttention-1": batch * heads, "FlashAttention-2": math.ceil(n / block_q) * batch * heads}
