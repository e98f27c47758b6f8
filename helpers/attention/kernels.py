"""Attention, from the naive N x N version to FlashAttention-2 (Dao, 2023) in plain PyTorch tiles.

* `naive_attention`: softmax(q kᵀ / sqrt(d)) v with every score materialised (the course GPT's).
* `softmax_merge`, `online_softmax`: the running-max / running-sum softmax (Milakov & Gimelshein,
  2018) that lets FlashAttention see the scores one block at a time.
* `FlashAttentionPyTorch`: FlashAttention-2 as a `torch.autograd.Function` over (..., N, d) tensors;
  it keeps only q, k, v, O and the log-sum-exp L for backward. `tiled_forward(tile_fn, ...)`: the
  same forward's loop over query tiles with the tile's work left to a function (exercise 06.tile).
  The Triton version of the same algorithm is `helpers.attention.flash_triton.FlashAttentionTriton`.
* `attention(q, k, v, impl, is_causal)`: one call over every implementation the machine has
  (`availability` says which and why not the others), with grouped-query attention;
  `register_course_kernels` makes the course's kernels selectable in the course GPT.
* `attention_flops`, `make_qkv`: the FLOP convention of the FlashAttention papers and the inputs.
* `saved_bytes`, `naive_traffic_bytes`, `tiled_traffic_bytes`, `traffic_crossover`: the models of the
  bytes kept for backward and of the HBM traffic of the forward.

`flash_triton` is None where triton is not installed (then `TRITON_MISSING` says so); importing it
switches Triton's interpreter on where there is no GPU.
"""
from __future__ import annotations

import functools
import math
import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from helpers.gpt import model
from helpers.gpt.model import naive_attention
from helpers.measure import bench, params

try:  # optional: triton is a Linux-only dependency
    from helpers.attention import flash_triton
    TRITON_MISSING: str | None = flash_triton.BROKEN
except ImportError as err:
    flash_triton, TRITON_MISSING = None, f"triton is not installed ({err})"

# ------------------------------------------------------------------------------ online softmax


def softmax_merge(m_a: torch.Tensor, l_a: torch.Tensor, m_b: torch.Tensor, l_b: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge two partial softmax statistics (max m, sum of exp(x - m) l) into those of the union.

    A part whose entries are all -inf (fully masked) has m = -inf and l = 0 and adds nothing.
    """
    m = torch.maximum(m_a, m_b)  # the union's max is the larger of the two parts' maxima
    shift = torch.where(m == float("-inf"), 0.0, m)  # avoids -inf - (-inf) = nan when both parts are empty
    # each part's sum was taken under its own max: exp(m_part - m) rescales it to the union's max
    return m, l_a * torch.exp(m_a - shift) + l_b * torch.exp(m_b - shift)


def online_softmax(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """softmax over the last dim, reading x one block of columns at a time; returns (softmax, m, l)."""
    m = torch.full(x.shape[:-1], float("-inf"), dtype=x.dtype, device=x.device)  # running max
    l = torch.zeros_like(m)  # running sum of exp(x - m)
    for j in range(0, x.shape[-1], block):
        xb = x[..., j:j + block]  # (..., block)
        mb = xb.amax(dim=-1)  # this block's max and sum; a fully masked block gives (-inf, 0)
        lb = torch.exp(xb - torch.where(mb == float("-inf"), 0.0, mb)[..., None]).sum(dim=-1)
        m, l = softmax_merge(m, l, mb, lb)  # the statistics of every block read so far
    # one more pass over x, now that the row's max and sum are final: each entry is read once and written once
    return torch.exp(x - m[..., None]) / l[..., None], m, l


# ------------------------------------------------------------------------------ FlashAttention-2 in PyTorch

def _causal_tile_mask(i0: int, i1: int, j0: int, j1: int, device) -> torch.Tensor | None:
    """True where key j is after query i inside the (i0:i1, j0:j1) tile; None when nothing is masked."""
    if j1 - 1 <= i0:
        return None
    return torch.arange(j0, j1, device=device)[None, :] > torch.arange(i0, i1, device=device)[:, None]


class FlashAttentionPyTorch(torch.autograd.Function):
    """softmax(q kᵀ / sqrt(d)) v in tiles: FlashAttention-2's algorithms 1 (forward) and 2 (backward).

    `FlashAttentionPyTorch.apply(q, k, v, is_causal=False, block_q=64, block_k=64)`; q is
    (..., N_q, d), k and v are (..., N_k, d). Arithmetic is fp32 whatever the input dtype. Saved for
    backward: q, k, v, O and L = logsumexp of the scaled scores (shape q.shape[:-1]), never N x N.
    """

    @staticmethod
    def forward(ctx, q, k, v, is_causal=False, block_q=64, block_k=64):
        params.positive("block_q", block_q)
        params.positive("block_k", block_k)
        n_q, n_k, scale = q.shape[-2], k.shape[-2], q.shape[-1] ** -0.5
        o = torch.empty_like(q)
        lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
        with torch.autocast(q.device.type, enabled=False):
            for i0 in range(0, n_q, block_q):
                i1 = min(i0 + block_q, n_q)
                qi = q[..., i0:i1, :].float()  # (..., Bq, d): stays "on chip" for the whole inner loop
                m = torch.full(qi.shape[:-1], float("-inf"), device=q.device)  # running max
                l = torch.zeros_like(m)  # running sum
                acc = torch.zeros_like(qi)  # unnormalised output
                for j0 in range(0, min(n_k, i1) if is_causal else n_k, block_k):  # causal: skip tiles above the diagonal
                    j1 = min(j0 + block_k, n_k)
                    s = qi @ k[..., j0:j1, :].float().mT * scale  # (..., Bq, Bk)
                    mask = _causal_tile_mask(i0, i1, j0, j1, q.device) if is_causal else None
                    if mask is not None:
                        s = s.masked_fill(mask, float("-inf"))
                    m_new = torch.maximum(m, s.amax(dim=-1))
                    p = torch.exp(s - m_new[..., None])  # (..., Bq, Bk)
                    alpha = torch.exp(m - m_new)  # rescales what was accumulated under the old max
                    l = l * alpha + p.sum(dim=-1)
                    acc = acc * alpha[..., None] + p @ v[..., j0:j1, :].float()
                    m = m_new
                o[..., i0:i1, :] = acc / l[..., None]  # written once per query tile: O and L, nothing N x N
                lse[..., i0:i1] = m + torch.log(l)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.is_causal, ctx.blocks = is_causal, (block_q, block_k)
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        (block_q, block_k), n_q, n_k, scale = ctx.blocks, q.shape[-2], k.shape[-2], q.shape[-1] ** -0.5
        with torch.autocast(q.device.type, enabled=False):
            delta = (do.float() * o.float()).sum(dim=-1)  # D = rowsum(dO * O), (..., N_q)
            dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
            dk = torch.zeros(k.shape, dtype=torch.float32, device=q.device)
            dv = torch.zeros(v.shape, dtype=torch.float32, device=q.device)
            for j0 in range(0, n_k, block_k):  # outer loop over key tiles (a kernel keeps dK_j, dV_j on chip)
                j1 = min(j0 + block_k, n_k)
                kj, vj = k[..., j0:j1, :].float(), v[..., j0:j1, :].float()
                first = (j0 // block_q) * block_q if ctx.is_causal else 0  # earlier queries never see key j0
                for i0 in range(first, n_q, block_q):
                    i1 = min(i0 + block_q, n_q)
                    qi, doi = q[..., i0:i1, :].float(), do[..., i0:i1, :].float()
                    p = torch.exp(qi @ kj.mT * scale - lse[..., i0:i1, None])  # P recomputed from L
                    mask = _causal_tile_mask(i0, i1, j0, j1, q.device) if ctx.is_causal else None
                    if mask is not None:
                        p = p.masked_fill(mask, 0.0)
                    dv[..., j0:j1, :] += p.mT @ doi  # dV = Pᵀ dO
                    ds = p * (doi @ vj.mT - delta[..., i0:i1, None])  # dS = P * (dP - D)
                    dq[..., i0:i1, :] += scale * ds @ kj  # dQ = scale dS K
                    dk[..., j0:j1, :] += scale * ds.mT @ qi  # dK = scale dSᵀ Q
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None


def flash_attention_pytorch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False) -> torch.Tensor:
    """FlashAttentionPyTorch.apply with the course's attention signature fn(q, k, v, is_causal)."""
    return FlashAttentionPyTorch.apply(q, k, v, is_causal)


def tiled_forward(tile_fn, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False,
                  block_q: int = 64, block_k: int = 64, keep: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashAttention-2's forward as the loop over query tiles, with the work of one tile left to `tile_fn`.

    `tile_fn(q_tile, k, v, row0, is_causal, block_k, keep) -> (o, lse)` gets the query rows
    row0 .. row0 + B_r - 1 as q_tile (..., B_r, d) and all of k, v (..., N_k, d); `keep` is None or a
    bool (..., N_k) that is True for the keys a row may attend to. It returns the tile's output
    (..., B_r, d) and its log-sum-exp (..., B_r). Returns O (..., N_q, d) and L (..., N_q).
    Raises ValueError for a non-positive tile size or a tile function that returns other shapes.
    """
    params.positive("block_q", block_q)
    params.positive("block_k", block_k)
    outs, lses = [], []
    for i0 in range(0, q.shape[-2], block_q):  # one GPU program per query tile; here, one after another
        qi = q[..., i0:i0 + block_q, :]
        o, lse = tile_fn(qi, k, v, i0, is_causal, block_k, keep)
        if tuple(o.shape) != tuple(qi.shape) or tuple(lse.shape) != tuple(qi.shape[:-1]):
            raise ValueError(f"the tile function returned o {tuple(o.shape)} and lse {tuple(lse.shape)} for a "
                             f"tile of {tuple(qi.shape)}; expected {tuple(qi.shape)} and {tuple(qi.shape[:-1])}")
        outs.append(o)
        lses.append(lse)
    return torch.cat(outs, dim=-2), torch.cat(lses, dim=-1)


# ------------------------------------------------------------------------------ one dispatcher

SDPA_BACKENDS = {"sdpa_math": SDPBackend.MATH, "sdpa_flash": SDPBackend.FLASH_ATTENTION,
                 "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION, "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION}
IMPLEMENTATIONS = ("naive", "sdpa", *SDPA_BACKENDS, "flash_attn", "flash_pytorch", "flash_triton")
NOTES = {
    "naive": "every score materialised (N x N)",
    "sdpa": "PyTorch picks the backend",
    "sdpa_math": "PyTorch's composite reference: also N x N",
    "sdpa_flash": "Dao's FlashAttention-2 kernel on CUDA; a tiled C++ kernel on a CPU",
    "sdpa_efficient": "xFormers' memory-efficient kernel (Rabe & Staats, 2021)",
    "sdpa_cudnn": "NVIDIA cuDNN's fused attention",
    "flash_attn": "Dao's flash-attn package, flash_attn_func",
    "flash_pytorch": "this course: FlashAttention-2 in PyTorch tiles",
    "flash_triton": "this course: FlashAttention-2 in Triton",
}


_SDPA_HAS_GQA = "enable_gqa" in (F.scaled_dot_product_attention.__doc__ or "")  # torch >= 2.5


def _kv_groups(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> int:
    """Query heads per key/value head (1 unless k and v have fewer heads than q, in dim -3)."""
    if k.shape != v.shape:
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must have the same shape")
    if q.dim() < 3 or k.shape[-3] == q.shape[-3]:
        return 1
    if q.shape[-3] % k.shape[-3]:
        raise ValueError(f"q has {q.shape[-3]} heads, k and v {k.shape[-3]}: that must divide it")
    return q.shape[-3] // k.shape[-3]


def _flash_attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool) -> torch.Tensor:
    from flash_attn import flash_attn_func  # optional, GPU only

    if is_causal and q.shape[-2] != k.shape[-2]:
        raise ValueError("flash_attn aligns the causal mask bottom-right when N_q != N_k; the course aligns it "
                         "top-left (as SDPA does), so that case is refused")
    to4 = lambda x: x.reshape(-1, *x.shape[-3:]) if x.dim() >= 3 else x[None, None]  # (B, H, N, d)
    out = flash_attn_func(to4(q).transpose(1, 2), to4(k).transpose(1, 2), to4(v).transpose(1, 2), causal=is_causal)
    return out.transpose(1, 2).reshape(q.shape)  # flash-attn is (B, N, H, d); back to (..., H, N, d)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, impl: str = "sdpa",
              is_causal: bool = False) -> torch.Tensor:
    """softmax(q kᵀ / sqrt(d)) v by the implementation `impl` (see IMPLEMENTATIONS) on (..., H, N, d).

    k and v may have fewer heads than q (grouped-query attention): "sdpa" and "flash_attn" handle
    that natively, every other implementation gets each kv head repeated for its query heads.
    """
    groups = _kv_groups(q, k, v)
    if impl == "sdpa" and groups > 1 and _SDPA_HAS_GQA:
        return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, enable_gqa=True)
    if impl == "flash_attn":
        return _flash_attn(q, k, v, is_causal)
    if impl not in IMPLEMENTATIONS:
        raise ValueError(f"impl={impl!r} is unknown; choose one of {', '.join(map(repr, IMPLEMENTATIONS))}")
    if groups > 1:
        k, v = k.repeat_interleave(groups, dim=-3), v.repeat_interleave(groups, dim=-3)
    if impl == "sdpa":  # (with groups > 1 only on torch < 2.5, which lacks enable_gqa)
        return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    if impl in SDPA_BACKENDS:
        with sdpa_kernel(SDPA_BACKENDS[impl]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    if impl == "naive":
        return naive_attention(q, k, v, is_causal)
    if impl == "flash_pytorch":
        return FlashAttentionPyTorch.apply(q, k, v, is_causal)
    if TRITON_MISSING:
        raise RuntimeError(TRITON_MISSING)
    return flash_triton.FlashAttentionTriton.apply(q, k, v, is_causal)


def _static_reason(impl: str, device: str, dtype: torch.dtype) -> str | None:
    if impl == "flash_attn":
        if device != "cuda":
            return "flash-attn runs on CUDA GPUs only"
        try:
            import flash_attn  # noqa: F401  (optional: a CUDA-only package)
        except Exception:  # absent or broken: either way it cannot run
            return "flash-attn is not installed (optional; see the README)"
    if impl == "flash_triton":
        if TRITON_MISSING:
            return TRITON_MISSING
        if device == "cpu" and dtype == torch.bfloat16:
            return "the Triton interpreter's bf16 tl.dot is broken; bf16 runs compiled, on a GPU"
    if device == "cpu" and impl in ("sdpa_efficient", "sdpa_cudnn"):
        return "a CUDA-only kernel; on a CPU PyTorch has only the math and its C++ flash kernel"
    return None


@functools.lru_cache(maxsize=None)
def _probe(impl: str, device: str, dtype: torch.dtype) -> str | None:
    """Why `impl` fails on a small causal problem here, or None when it runs."""
    reason = _static_reason(impl, device, dtype)
    if reason:
        return reason
    q, k, v = (torch.randn(1, 2, 32, 64, device=device, dtype=dtype) for _ in range(3))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            attention(q, k, v, impl, is_causal=True)
            return None
        except Exception as err:  # noqa: BLE001 -- every failure is a reason to report, not to crash
            return _reason_from(err, [str(w.message).strip() for w in caught])


def _reason_from(err: Exception, messages: list[str]) -> str:
    """One line out of SDPA's warnings ("X not used because:", then the detail) or the error itself."""
    told = []
    for i, message in enumerate(messages):
        if "not used because" in message or "requires" in message:
            line = " ".join(message.split())
            if line.endswith(":") and i + 1 < len(messages):  # the detail comes as the next warning
                line += " " + " ".join(messages[i + 1].split())
            told.append(line)
    return "; ".join(told[:2])[:300] or str(err).strip().splitlines()[0]


def availability(device: str | None = None, dtype: torch.dtype = torch.float16,
                 impls=IMPLEMENTATIONS) -> dict[str, str | None]:
    """{implementation: None if it runs here in `dtype`, else the reason why not}, for each of `impls`
    (every implementation unless told; each is tried once per device and dtype, and a Triton kernel
    tried is a kernel compiled)."""
    device = bench.resolve_device(device)
    return {impl: _probe(impl, device, dtype) for impl in impls}


def available(device: str | None = None, dtype: torch.dtype = torch.float16) -> list[str]:
    """The implementations that run here in `dtype`."""
    return [impl for impl, why in availability(device, dtype).items() if why is None]


def register_course_kernels() -> list[str]:
    """Make "flash_pytorch" (and "flash_triton" when Triton works) selectable as the GPT's attn_impl."""
    model.register_attention("flash_pytorch", flash_attention_pytorch)
    if TRITON_MISSING:
        return ["flash_pytorch"]
    model.register_attention("flash_triton", flash_triton.flash_attention_triton)
    return ["flash_pytorch", "flash_triton"]


# ------------------------------------------------------------------------------ FLOPs, inputs, memory

def attention_flops(batch: int, heads: int, n: int, d: int, is_causal: bool = False, backward: bool = False) -> float:
    """FLOPs counted the FlashAttention way: 4·B·H·N²·d forward (half when causal); backward 2.5× forward."""
    fwd = 4 * batch * heads * n * n * d * (0.5 if is_causal else 1.0)
    return fwd * 3.5 if backward else fwd


def make_qkv(batch: int, heads: int, n: int, d: int, dtype: torch.dtype, device: str, *,
             requires_grad: bool = False, kv_heads: int | None = None, seed: int = 0):
    """Random q (B, H, N, d) and k, v (B, kv_heads or H, N, d), reproducible from `seed`."""
    g = torch.Generator(device=device).manual_seed(seed)
    shapes = [(batch, heads, n, d)] + 2 * [(batch, kv_heads or heads, n, d)]
    return [torch.randn(s, generator=g, device=device, dtype=dtype).requires_grad_(requires_grad) for s in shapes]


def saved_bytes(kind: str, n: int, d: int, batch_heads: int = 1, itemsize: int = 2, is_causal: bool = False) -> int:
    """Bytes kept for backward, by our count. "naive": q, k, v and the N x N probabilities (plus the
    N x N bool causal mask, one for all heads); "tiled" (the course kernels): q, k, v, O and fp32 L."""
    params.choose("kind", kind, ("naive", "tiled"))
    qkv = 3 * batch_heads * n * d * itemsize
    if kind == "naive":
        return qkv + batch_heads * n * n * itemsize + (n * n if is_causal else 0)
    return qkv + batch_heads * (n * d * itemsize + 4 * n)


# ------------------------------------------------------------------------------ HBM traffic model

def naive_traffic_bytes(n: int, d: int, batch_heads: int = 1, itemsize: int = 2, is_causal: bool = False) -> int:
    """HBM bytes of the naive forward as `naive_attention` writes it: every line reads its inputs from
    memory and writes its output back (q * scale; S = q kᵀ; mask; softmax; P v): 4N² + 6Nd elements
    per head (+ 2N² and a one-byte mask per score when causal)."""
    nd, nn = n * d, n * n
    elems = 2 * nd + (2 * nd + nn) + (2 * nn if is_causal else 0) + 2 * nn + (nn + nd + nd)
    return batch_heads * (elems * itemsize + (nn if is_causal else 0))  # + the bool mask, one byte a score


def traffic_crossover(d: int) -> float:
    """The query tile B_r below which the tiled forward's quadratic traffic, 2d/B_r·N² elements (K and V
    re-read once per query tile), exceeds naive's 4N² (scores written, read by the softmax, probabilities
    written, read by P v); not causal. Equal at B_r = d/2."""
    return d / 2


def tiled_traffic_bytes(n: int, d: int, block_q: int, batch_heads: int = 1, itemsize: int = 2,
                        is_causal: bool = False) -> int:
    """HBM bytes of the FlashAttention-2 forward: Q read and O written once, K and V read once per
    query tile (only up to the diagonal when causal), L written in fp32."""
    tiles = math.ceil(n / block_q)
    kv_rows = sum(min(n, (t + 1) * block_q) for t in range(tiles)) if is_causal else tiles * n
    return batch_heads * ((2 * n * d + 2 * kv_rows * d) * itemsize + 4 * n)
