"""Attention read through a paged KV cache's block tables: PyTorch, a Triton kernel, and references.

The layout is `helpers.decode.paged`'s: one layer's pool of keys (or values) is (num_blocks, block_size, H_kv,
head_dim), a sequence's block table lists its blocks in order, and token position p lives in block
`table[p // block_size]` at offset `p % block_size`. Nothing here allocates or frees blocks.

* `paged_decode_torch`, `paged_prefill_torch`: gather each sequence's blocks into a contiguous view,
  then masked (GQA-grouped) attention in fp32 (fp64 when q or the pool is fp64); decode is one new query per
  sequence, prefill T causal ones. q and the pools may have different dtypes; both are converted to that one.
* `paged_decode_triton`: the same decode as one Triton kernel. Each program looks each token's block up
  in the table as it loads a tile of keys, and long sequences are split over several programs whose
  partial softmaxes a second kernel merges (the split-KV of FlashDecoding). It reads q and the pools in
  their own dtypes (fp32, bf16 or fp16, which may differ) and computes in fp32. It runs in Triton's
  interpreter without CUDA and is compiled on a GPU; `compile_decode_kernel` compiles it for sm_90
  ahead of time without one; `decode_splits` and `decode_warps` choose its launch.
* `dense_decode`: the contiguous reference. `flex_paged_decode`: PyTorch's FlexAttention paged helper
  reading the same pools and tables (a cross-check).

Without CUDA the kernel runs in Triton's interpreter (numpy, slow, for correctness only): importing this
module switches it on (`helpers.measure.triton_mode.use_interpreter_without_gpu`) before it imports
triton. `TRITON_MISSING` is a sentence saying why the kernel cannot run in this process, or None.
"""
from __future__ import annotations

import functools
import math
import os
import warnings

import torch

from helpers.measure import triton_mode
from helpers.measure.params import positive

# COURSE_TRITON_AOT=1: compile-only checks on a machine without a GPU (compile_decode_kernel)
AHEAD_OF_TIME = os.environ.get("COURSE_TRITON_AOT") == "1"
INTERPRETED = not torch.cuda.is_available() and not AHEAD_OF_TIME
# why the Triton kernel cannot run in this process, if it cannot; set before anything here imports triton
TRITON_MISSING: str | None = triton_mode.use_interpreter_without_gpu(__name__, INTERPRETED)

if TRITON_MISSING is None:
    import triton  # after the interpreter switch
    import triton.language as tl
else:  # pragma: no cover - without a runnable triton only the PyTorch path exists
    triton = tl = None


# the dtypes the Triton decode kernel reads q and the pools in (it computes in float32)
KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def gather_blocks(pool: torch.Tensor, tables: torch.Tensor) -> torch.Tensor:
    """(B, H_kv, max_blocks * block_size, hd): each sequence's blocks, in table order, from a layer's pool."""
    B, nb = tables.shape
    # read: the blocks each row of `tables` names, wherever they sit in the pool (one indexing, no loop)
    g = pool[tables.long()]  # (B, max_blocks, block_size, H_kv, hd)
    # laid end to end, block i's slots are positions i * block_size ..: the sequence as a contiguous cache holds it
    return g.reshape(B, nb * pool.size(1), pool.size(2), pool.size(3)).transpose(1, 2)


def attention_dtype(q: torch.dtype, pool: torch.dtype) -> torch.dtype:
    """The dtype the PyTorch paged paths compute in: float32, or float64 when q or the pool is float64."""
    return torch.promote_types(torch.promote_types(q, pool), torch.float32)


def grouped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """softmax(q kᵀ/sqrt(hd)) v in attention_dtype with GQA grouping: q (B, H, T, hd), k/v (B, H_kv, S, hd),
    keep (B, T, S)."""
    B, H, T, hd = q.shape
    H_kv = k.size(1)
    dt = attention_dtype(q.dtype, k.dtype)
    qg = q.to(dt).reshape(B, H_kv, H // H_kv, T, hd)  # query heads h = g*(H/H_kv) + i share kv head g
    scores = (qg / math.sqrt(hd)) @ k.to(dt).unsqueeze(2).transpose(-2, -1)  # (B, H_kv, G, T, S)
    scores = scores.masked_fill(~keep[:, None, None], float("-inf"))
    out = torch.softmax(scores, dim=-1) @ v.to(dt).unsqueeze(2)  # (B, H_kv, G, T, hd)
    return out.reshape(B, H, T, hd)


def paged_decode_torch(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, tables: torch.Tensor,
                       lengths: torch.Tensor) -> torch.Tensor:
    """Decode attention read through block tables, in PyTorch (a gather, then masked attention).

    q (B, H, hd): one query per sequence; k_pool, v_pool (num_blocks, block_size, H_kv, hd) one layer's
    pool; tables (B, max_blocks) int block numbers; lengths (B,) keys per sequence (>= 1, including
    the new token's). q and the pools may differ in dtype. Returns (B, H, hd) in attention_dtype (float32,
    float64 when q or the pool is). H must be a multiple of H_kv (GQA/MQA).
    """
    k, v = gather_blocks(k_pool, tables), gather_blocks(v_pool, tables)  # (B, H_kv, S, hd)
    # the gathered rows are as long as the longest table: a shorter sequence's tail (the unfilled part of its
    # last block, and the padding blocks) holds no keys of its own, so it is masked out
    keep = torch.arange(k.size(2), device=q.device)[None, None, :] < lengths.to(q.device)[:, None, None]
    return grouped_attention(q[:, :, None], k, v, keep)[:, :, 0]  # (B, H, hd)


def paged_prefill_torch(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, tables: torch.Tensor,
                        cached: torch.Tensor) -> torch.Tensor:
    """Causal attention of T new queries per sequence over its cached and new keys, through the table.

    q (B, H, T, hd); cached (B,) tokens each sequence held before these T (new token t sits at position
    cached + t and sees positions <= cached + t). Returns (B, H, T, hd) in attention_dtype (float32, float64
    when q or the pool is).
    """
    T = q.size(2)
    k, v = gather_blocks(k_pool, tables), gather_blocks(v_pool, tables)  # (B, H_kv, S, hd)
    last = cached.to(q.device)[:, None, None] + torch.arange(T, device=q.device)[None, :, None]  # (B, T, 1)
    keep = torch.arange(k.size(2), device=q.device)[None, None, :] <= last  # (B, T, S)
    return grouped_attention(q, k, v, keep)


def dense_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """The contiguous reference: q (B, H, hd), k/v (B, H_kv, S_max, hd) padded; lengths (B,). -> (B, H, hd) in
    attention_dtype (fp32, fp64 when q or k is)."""
    keep = torch.arange(k.size(2), device=q.device)[None, None, :] < lengths.to(q.device)[:, None, None]
    return grouped_attention(q[:, :, None], k, v, keep)[:, :, 0]


def flex_paged_decode(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, tables: torch.Tensor,
                      lengths: torch.Tensor) -> torch.Tensor | None:
    """The same decode through PyTorch's FlexAttention paged helper (a cross-check, not the lesson).

    Our block tables are copied into torch's experimental `PagedAttention` page table, and
    `flex_attention` reads our pools through its converted block mask. Same shapes as
    `paged_decode_torch`; returns (B, H, hd) float32, or None when this torch has no such helper.
    Eager (uncompiled) on a CPU: the first call takes seconds, later ones are quick.
    """
    try:  # optional: an experimental module of torch, absent from some releases
        from torch.nn.attention.experimental._paged_attention import PagedAttention
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError:
        return None
    B, H, hd = q.shape
    nb, bs, H_kv, _ = k_pool.shape
    dev = q.device
    pa = PagedAttention(nb, bs, B, device=dev)
    for b in range(B):
        n = -(-int(lengths[b]) // bs)  # blocks holding its keys
        row = tables[b, :n].to(device=dev, dtype=torch.int64)
        pa.page_table[b, :n] = row
        pa.physical_to_logical[b, row] = torch.arange(n, device=dev)
        pa.capacity[b] = n * bs
    logical = create_block_mask(lambda b, h, q_idx, kv_idx: kv_idx >= 0, B, None, 1, tables.size(1) * bs,
                                device=dev, BLOCK_SIZE=bs)
    mask = pa.convert_logical_block_mask(logical, kv_len=lengths.to(dev))
    kc = k_pool.permute(2, 0, 1, 3).reshape(1, H_kv, nb * bs, hd).expand(B, -1, -1, -1)  # pool as one long sequence
    vc = v_pool.permute(2, 0, 1, 3).reshape(1, H_kv, nb * bs, hd).expand(B, -1, -1, -1)
    with warnings.catch_warnings():  # "flex_attention called without torch.compile": fine for a check
        warnings.simplefilter("ignore")
        out = flex_attention(q[:, :, None].float(), kc.float(), vc.float(), block_mask=mask, enable_gqa=True)
    return out[:, :, 0]


if tl is not None:
    @triton.jit
    def _paged_decode_kernel(q_ptr, k_ptr, v_ptr, table_ptr, len_ptr, acc_ptr, ml_ptr,
                             s_qb, s_qh, s_kb, s_ks, s_kh, s_tb, s_ab, s_ah, s_as, scale, split_tokens,
                             GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr,
                             HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr):
        """One program per (sequence, query head, split): an online softmax over that split's tokens.

        Tokens come TILE at a time; each token's block is looked up in the table (so a tile may span
        several blocks, and the block size need not be a power of two). Writes the split's unnormalised
        output and its (max, sum) for `_combine_kernel`.
        """
        b = tl.program_id(0)
        h = tl.program_id(1)
        sp = tl.program_id(2)
        kvh = h // GROUP  # the kv head this query head shares
        offs_d = tl.arange(0, D_PAD)
        offs_t = tl.arange(0, TILE)
        d_ok = offs_d < HEAD_DIM
        q = tl.load(q_ptr + b * s_qb + h * s_qh + offs_d, mask=d_ok, other=0.0).to(tl.float32) * scale
        n_keys = tl.load(len_ptr + b)
        lo = sp * split_tokens
        hi = tl.minimum(lo + split_tokens, n_keys)
        m_i = -float("inf")
        l_i = 0.0
        acc = tl.zeros([D_PAD], dtype=tl.float32)
        for start in range(lo, hi, TILE):
            pos = start + offs_t  # (TILE,) token positions
            ok = pos < hi
            blk = tl.load(table_ptr + b * s_tb + pos // BLOCK_SIZE, mask=ok, other=0).to(tl.int64)  # the lookup
            rows = blk * s_kb + (pos % BLOCK_SIZE) * s_ks + kvh * s_kh  # (TILE,) where each token's key lives
            kv_ok = ok[:, None] & d_ok[None, :]
            k = tl.load(k_ptr + rows[:, None] + offs_d[None, :], mask=kv_ok, other=0.0).to(tl.float32)
            s = tl.where(ok, tl.sum(k * q[None, :], axis=1), -float("inf"))  # (TILE,) scores
            m_new = tl.maximum(m_i, tl.max(s, axis=0))
            alpha = tl.exp(m_i - m_new)
            p = tl.exp(s - m_new)
            v = tl.load(v_ptr + rows[:, None] + offs_d[None, :], mask=kv_ok, other=0.0).to(tl.float32)
            acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
            l_i = l_i * alpha + tl.sum(p, axis=0)
            m_i = m_new
        tl.store(acc_ptr + b * s_ab + h * s_ah + sp * s_as + offs_d, acc, mask=d_ok)
        piece = (b * tl.num_programs(1) + h) * tl.num_programs(2) + sp  # row of the contiguous (B, H, S, 2) ml
        tl.store(ml_ptr + 2 * piece, m_i)  # an empty split leaves m = -inf, l = 0
        tl.store(ml_ptr + 2 * piece + 1, l_i)


    @triton.jit
    def _combine_kernel(acc_ptr, ml_ptr, out_ptr, n_splits, s_ob, s_oh,
                        S_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr):
        """One program per (sequence, query head): merge its pieces' partial softmaxes into the output.

        out = sum_s exp(m_s - M) acc_s / sum_s exp(m_s - M) l_s, with M = max_s m_s (an empty piece
        has m = -inf and weighs 0). acc (B, H, S, hd) and ml (B, H, S, 2) are contiguous.
        """
        b = tl.program_id(0)
        h = tl.program_id(1)
        row = b * tl.num_programs(1) + h
        offs_s = tl.arange(0, S_PAD)
        offs_d = tl.arange(0, D_PAD)
        s_ok = offs_s < n_splits
        m = tl.load(ml_ptr + 2 * (row * n_splits + offs_s), mask=s_ok, other=-float("inf"))
        l = tl.load(ml_ptr + 2 * (row * n_splits + offs_s) + 1, mask=s_ok, other=0.0)
        acc = tl.load(acc_ptr + (row * n_splits + offs_s[:, None]) * HEAD_DIM + offs_d[None, :],
                      mask=s_ok[:, None] & (offs_d[None, :] < HEAD_DIM), other=0.0)
        w = tl.exp(m - tl.max(m, axis=0))  # (S_PAD,)
        out = tl.sum(w[:, None] * acc, axis=0) / tl.sum(w * l, axis=0)
        tl.store(out_ptr + b * s_ob + h * s_oh + offs_d, out, mask=offs_d < HEAD_DIM)


@functools.lru_cache(maxsize=None)
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def decode_splits(batch_heads: int, max_len: int, tile: int, device: str | torch.device) -> int:
    """How many pieces to split each sequence into so that a GPU has enough programs to run at once.

    On CUDA: enough (batch * heads * splits) to give each streaming multiprocessor about four, with
    at least `tile` tokens a piece; elsewhere 1 (the interpreter runs programs one after another).
    """
    device = torch.device(device)
    if device.type != "cuda":
        return 1
    sms = _sm_count(device)
    return max(1, min(-(-max_len // tile), -(-4 * sms // batch_heads)))


def paged_decode_triton(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, tables: torch.Tensor,
                        lengths: torch.Tensor, *, splits: int | None = None, tile: int = 64,
                        max_len: int | None = None) -> torch.Tensor:
    """`paged_decode_torch` as one Triton kernel: no gather, each program reads its tokens in place.

    Same shapes and result (B, H, hd) float32; q and the pools are read in their own dtypes (float32,
    bfloat16 or float16, q's may differ from the pools') and converted to float32 as they load. Each
    sequence is cut into `splits` pieces (None: `decode_splits`), each piece handled by its own program,
    `tile` tokens (a power of two) at a time; a second small kernel merges the pieces' partial softmaxes
    (FlashDecoding's split-KV).
    `max_len`: the longest length if the caller knows it on the host (saves a device sync). Runs in
    Triton's interpreter without CUDA (slow, correctness only). Raises RuntimeError when triton is
    unavailable, ValueError on bad shapes, dtypes or arguments.
    """
    if TRITON_MISSING:
        raise RuntimeError(f"the Triton paged decode cannot run here: {TRITON_MISSING}")
    bad = [t.dtype for t in (q, k_pool, v_pool) if t.dtype not in KERNEL_DTYPES]
    if bad:
        raise ValueError(f"the Triton paged decode reads float32, bfloat16 or float16 tensors, not {bad[0]}; "
                         f"paged_decode_torch (a PagedKVCache's impl='torch') takes it")
    B, H, hd = q.shape
    nb, bs, H_kv, hd_k = k_pool.shape
    if hd_k != hd or H % H_kv or v_pool.shape != k_pool.shape or tables.size(0) != B or lengths.numel() != B:
        raise ValueError(f"shapes do not fit: q {tuple(q.shape)}, pools {tuple(k_pool.shape)}, "
                         f"tables {tuple(tables.shape)}, lengths {tuple(lengths.shape)}")
    if tile < 1 or tile & (tile - 1):
        raise ValueError(f"tile={tile} must be a power of two")
    max_len = int(lengths.max()) if max_len is None else max_len
    splits = decode_splits(B * H, max_len, tile, q.device) if splits is None else splits
    positive("splits", splits)
    split_tokens = -(-max_len // splits)
    split_tokens = -(-split_tokens // tile) * tile  # whole tiles per piece
    splits = -(-max_len // split_tokens)
    k_pool, v_pool, q = k_pool.contiguous(), v_pool.contiguous(), q.contiguous()
    tables = tables.to(torch.int32).contiguous()
    lengths = lengths.to(device=q.device, dtype=torch.int32).contiguous()
    acc = torch.empty(B, H, splits, hd, dtype=torch.float32, device=q.device)
    ml = torch.empty(B, H, splits, 2, dtype=torch.float32, device=q.device)
    _paged_decode_kernel[(B, H, splits)](
        q, k_pool, v_pool, tables, lengths, acc, ml,
        q.stride(0), q.stride(1), k_pool.stride(0), k_pool.stride(1), k_pool.stride(2), tables.stride(0),
        acc.stride(0), acc.stride(1), acc.stride(2), 1.0 / math.sqrt(hd), split_tokens,
        GROUP=H // H_kv, BLOCK_SIZE=bs, TILE=tile, HEAD_DIM=hd, D_PAD=triton.next_power_of_2(hd),
        num_warps=decode_warps(tile, hd))
    out = torch.empty(B, H, hd, dtype=torch.float32, device=q.device)
    _combine_kernel[(B, H)](acc, ml, out, splits, out.stride(0), out.stride(1),
                            S_PAD=triton.next_power_of_2(splits), HEAD_DIM=hd, D_PAD=triton.next_power_of_2(hd))
    return out


def check_triton_decode(head_dim: int = 64, *, tile: int = 64, dtype: torch.dtype = torch.bfloat16,
                        device: str | torch.device = "cuda", seed: int = 0) -> float:
    """`paged_decode_triton` against `paged_decode_torch` on random pools of head dim `head_dim` in `dtype`
    (2 sequences of 37 and 90 tokens, 4 query heads on 2 KV heads, blocks of 16 in a shuffled table):
    the largest absolute difference of the (2, 4, head_dim) float32 outputs. At `tile` = 64 and a head
    dim of 64 the kernel runs its 8-warp configuration (`decode_warps`). Raises what `paged_decode_triton`
    raises."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([37, 90])
    blocks = -(-int(lengths.max()) // 16)
    order = torch.randperm(2 * blocks, generator=g)
    tables = order.view(2, blocks).to(device)
    q, kp, vp = (torch.randn(shape, generator=g).to(device=device, dtype=dtype)
                 for shape in ((2, 4, head_dim), (2 * blocks, 16, 2, head_dim), (2 * blocks, 16, 2, head_dim)))
    got = paged_decode_triton(q, kp, vp, tables, lengths.to(device), tile=tile)
    want = paged_decode_torch(q, kp, vp, tables, lengths.to(device))
    return float((got - want.float()).abs().max())


def decode_warps(tile: int, head_dim: int) -> int:
    """Warps per program: 8 once a (tile, head_dim) fp32 tile has 4096 elements or more, else 4. With 4
    warps, a 64 x 128 tile spills registers to local memory on sm_90 (compile_decode_kernel's report)."""
    return 8 if tile * triton.next_power_of_2(head_dim) >= 4096 else 4


def compile_decode_kernel(dtype: str = "bf16", *, block_size: int = 16, head_dim: int = 64, group: int = 1,
                          tile: int = 64, arch: int = 90, num_warps: int | None = None, combine: bool = False):
    """Compile the Triton decode kernel for sm_<arch> ahead of time, with no GPU needed (Triton's real
    compiler, down to ptxas): catches what the interpreter accepts and the compiler rejects.

    dtype: "bf16", "fp16" or "fp32" pools and query. Must run in a process where Triton's
    interpreter is off: set COURSE_TRITON_AOT=1 before importing helpers (see helpers.attention.triton_aot).
    num_warps: None for what paged_decode_triton launches with (decode_warps). combine: compile the
    kernel that merges the pieces instead. Returns Triton's
    compiled kernel (helpers.attention.triton_aot.resources reads its registers and spills); raises RuntimeError
    when the interpreter is on.
    """
    if TRITON_MISSING or INTERPRETED:
        raise RuntimeError(TRITON_MISSING or "Triton's interpreter is on in this process: set COURSE_TRITON_AOT=1 "
                           "before importing")
    # optional: Triton's ahead-of-time compiler API, loaded only for this compile-only check
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if combine:  # the merge of the pieces: fp32 throughout, whatever the pools' dtype
        fn = _combine_kernel
        meta = dict(S_PAD=16, HEAD_DIM=head_dim, D_PAD=triton.next_power_of_2(head_dim))
        types = {n: "constexpr" if n in meta else "*fp32" if n.endswith("_ptr") else "i32" for n in fn.arg_names}
        return triton.compile(ASTSource(fn, types, meta, {}), target=GPUTarget("cuda", arch, 32),
                              options={"num_warps": 4})
    p = {"bf16": "*bf16", "fp16": "*fp16", "fp32": "*fp32"}[dtype]
    fn = _paged_decode_kernel
    args = dict(q_ptr=p, k_ptr=p, v_ptr=p, table_ptr="*i32", len_ptr="*i32", acc_ptr="*fp32", ml_ptr="*fp32",
                scale="fp32")
    meta = dict(GROUP=group, BLOCK_SIZE=block_size, TILE=tile, HEAD_DIM=head_dim,
                D_PAD=triton.next_power_of_2(head_dim))
    types = {n: "constexpr" if n in meta else args.get(n, "i32") for n in fn.arg_names}  # strides: i32
    return triton.compile(ASTSource(fn, types, meta, {}), target=GPUTarget("cuda", arch, 32),
                          options={"num_warps": num_warps or decode_warps(tile, head_dim)})
