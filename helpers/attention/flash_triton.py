"""FlashAttention-2 in Triton (Dao, 2023): a forward kernel, a backward in two kernels, one autograd Function.

Forward, one program per (query block, batch*head): keep a BLOCK_M x d tile of Q on chip, stream
K and V through in BLOCK_N-row tiles, and keep a running max m, running sum l and an unnormalised
output; write O = acc / l and the log-sum-exp L = m + log l (natural log) of the scaled scores.
Scores are kept in base 2 (scaled by log2 e) so the kernel calls exp2, the GPU's native exponential.

Backward recomputes P = exp(S - L) tile by tile instead of reading a stored N x N matrix:
  D  = rowsum(dO * O)                       (a small preprocessing kernel)
  dV = Pᵀ dO,  dP = dO Vᵀ,  dS = P * (dP - D),  dK = scale * dSᵀ Q   (one program per key block)
  dQ = scale * dS K                                                    (one program per query block)
Each program owns the rows it writes, so no atomics are needed.

Every kernel loops twice over its partner blocks: first over blocks that need no mask (inside the
sequence and, when causal, entirely below the diagonal), then over the few that do (the diagonal
and a ragged last block). Causal programs skip key blocks above the diagonal altogether.

Without CUDA the kernels run in Triton's interpreter: importing this module switches it on through
`helpers.measure.triton_mode` (TRITON_INTERPRET=1) before its own import of triton, since Triton's own
helper functions are built in one mode or the other at import time; `BROKEN` says why the kernels
cannot run in this process, or is None. The interpreter's bf16 `tl.dot` is wrong, so bf16 is refused
there; fp32 and fp16 run, slowly, for correctness only. COURSE_TRITON_AOT=1 leaves the interpreter off
without a GPU, for compiling the kernels ahead of time (`helpers.attention.triton_aot`).
"""
from __future__ import annotations

import inspect
import os

import torch

from helpers.measure import triton_mode

# COURSE_TRITON_AOT=1: compile-only checks on a machine without a GPU (tests/attention/test_attention_triton_aot.py)
AHEAD_OF_TIME = os.environ.get("COURSE_TRITON_AOT") == "1"
INTERPRETED = not torch.cuda.is_available() and not AHEAD_OF_TIME
# why the kernels cannot run in this process, if they cannot; set before anything imports triton
BROKEN: str | None = triton_mode.use_interpreter_without_gpu(__name__, INTERPRETED)
if not INTERPRETED and not AHEAD_OF_TIME and torch.cuda.get_device_capability() < (8, 0):  # e.g. a T4 (sm_75)
    _SM = "".join(map(str, torch.cuda.get_device_capability()))
    BROKEN = (f"the course's Triton kernels need an sm_80 or newer GPU (A100, H100, ...): for this sm_{_SM} GPU "
              "Triton compiles their matrix products without tensor cores, and the backward's tiles exceed its "
              f"shared memory (python -m helpers.attention.triton_aot --arch {_SM} shows the compiler's report)")

import triton  # noqa: E402  (after the interpreter switch)
import triton.language as tl  # noqa: E402

# constexpr: compiled kernels may read only constexpr globals (the interpreter would accept a float)
LOG2E = tl.constexpr(1.4426950408889634)  # log2(e): exp(x) = exp2(x * LOG2E)
LN2 = tl.constexpr(0.6931471805599453)  # ln(2): converts a base-2 log-sum-exp back to natural log
DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@triton.jit
def _load_rows(base, rows, n_rows, stride, offs_d, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
               CHECK_ROWS: tl.constexpr):
    """A (len(rows), D_PAD) tile of an (n_rows, HEAD_DIM) matrix with row stride `stride`, zero outside it."""
    ptrs = base + rows[:, None] * stride + offs_d[None, :]
    if CHECK_ROWS:
        tile = tl.load(ptrs, mask=(rows[:, None] < n_rows) & (offs_d[None, :] < HEAD_DIM), other=0.0)
    elif D_PAD != HEAD_DIM:
        tile = tl.load(ptrs, mask=offs_d[None, :] < HEAD_DIM, other=0.0)
    else:
        tile = tl.load(ptrs)
    return tile


@triton.jit
def _store_rows(base, tile, rows, n_rows, stride, offs_d, HEAD_DIM: tl.constexpr):
    """Write the rows of `tile` that exist (rows < n_rows, columns < HEAD_DIM), cast to base's dtype."""
    ptrs = base + rows[:, None] * stride + offs_d[None, :]
    tl.store(ptrs, tile.to(base.dtype.element_ty), mask=(rows[:, None] < n_rows) & (offs_d[None, :] < HEAD_DIM))


# ------------------------------------------------------------------------------------ forward

@triton.jit
def _fwd_inner(acc, m_i, l_i, q, k_base, v_base, s_kn, rows, offs_n, offs_d, lo, hi, N_K, qk_scale,
               HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_N: tl.constexpr,
               MASKED: tl.constexpr, IS_CAUSAL: tl.constexpr, PREC: tl.constexpr):
    """Online softmax over key blocks [lo, hi): update running max m, sum l and output acc."""
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        k = _load_rows(k_base, cols, N_K, s_kn, offs_d, HEAD_DIM, D_PAD, MASKED)  # (BLOCK_N, D_PAD)
        v = _load_rows(v_base, cols, N_K, s_kn, offs_d, HEAD_DIM, D_PAD, MASKED)  # (BLOCK_N, D_PAD)
        s = tl.dot(q, tl.trans(k), input_precision=PREC) * qk_scale  # (BLOCK_M, BLOCK_N), base-2 units
        if MASKED:
            keep = cols[None, :] < N_K
            if IS_CAUSAL:
                keep = keep & (cols[None, :] <= rows[:, None])
            s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))  # (BLOCK_M,)
        p = tl.exp2(s - m_new[:, None])  # (BLOCK_M, BLOCK_N), unnormalised probabilities
        alpha = tl.exp2(m_i - m_new)  # rescales what was summed under the old max
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=PREC)  # (BLOCK_M, D_PAD)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _fwd_kernel(Q, K, V, O, L, s_qb, s_qh, s_qn, s_kb, s_kh, s_kn, H, N_Q, N_K, sm_scale,
                HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, IS_CAUSAL: tl.constexpr, PREC: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """O and L for one BLOCK_M block of queries of one (batch, head). O has q's strides, V has k's."""
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1).to(tl.int64)
    q_off, k_off = (bh // H) * s_qb + (bh % H) * s_qh, (bh // H) * s_kb + (bh % H) * s_kh
    rows = start_m + tl.arange(0, BLOCK_M)
    offs_n, offs_d = tl.arange(0, BLOCK_N), tl.arange(0, D_PAD)
    q = _load_rows(Q + q_off, rows, N_Q, s_qn, offs_d, HEAD_DIM, D_PAD, True)  # (BLOCK_M, D_PAD), stays on chip
    m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)  # finite, so a fully masked block gives 0, not NaN
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D_PAD], tl.float32)
    qk_scale = sm_scale * LOG2E
    full_end = (N_K // BLOCK_N) * BLOCK_N  # key blocks [0, full_end) need no mask...
    hi = N_K
    if IS_CAUSAL:  # ...unless the diagonal cuts them; keys after the last query of the block are skipped
        full_end = tl.minimum(full_end, ((start_m + 1) // BLOCK_N) * BLOCK_N)
        hi = tl.minimum(N_K, start_m + BLOCK_M)
    acc, m_i, l_i = _fwd_inner(acc, m_i, l_i, q, K + k_off, V + k_off, s_kn, rows, offs_n, offs_d, 0, full_end,
                               N_K, qk_scale, HEAD_DIM, D_PAD, BLOCK_N, False, IS_CAUSAL, PREC)
    acc, m_i, l_i = _fwd_inner(acc, m_i, l_i, q, K + k_off, V + k_off, s_kn, rows, offs_n, offs_d, full_end, hi,
                               N_K, qk_scale, HEAD_DIM, D_PAD, BLOCK_N, True, IS_CAUSAL, PREC)
    _store_rows(O + q_off, acc / l_i[:, None], rows, N_Q, s_qn, offs_d, HEAD_DIM)
    tl.store(L + bh * N_Q + rows, (m_i + tl.log2(l_i)) * LN2, mask=rows < N_Q)


# ------------------------------------------------------------------------------------ backward

@triton.jit
def _bwd_preprocess(O, DO, Delta, s_qb, s_qh, s_qn, s_ob, s_oh, s_on, H, N_Q,
                    HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr):
    """D = rowsum(dO * O), one fp32 value per query row. O has q's strides, dO its own."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    bh = tl.program_id(1).to(tl.int64)
    offs_d = tl.arange(0, D_PAD)
    o = _load_rows(O + (bh // H) * s_qb + (bh % H) * s_qh, rows, N_Q, s_qn, offs_d, HEAD_DIM, D_PAD, True)
    do = _load_rows(DO + (bh // H) * s_ob + (bh % H) * s_oh, rows, N_Q, s_on, offs_d, HEAD_DIM, D_PAD, True)
    tl.store(Delta + bh * N_Q + rows, tl.sum(o.to(tl.float32) * do.to(tl.float32), 1), mask=rows < N_Q)


@triton.jit
def _dkdv_inner(dk, dv, k, v, q_base, do_base, l_base, d_base, s_qn, s_on, cols, offs_m, offs_d, lo, hi, N_Q,
                qk_scale, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr,
                MASKED: tl.constexpr, IS_CAUSAL: tl.constexpr, PREC: tl.constexpr):
    """Accumulate dK and dV of one key block over query blocks [lo, hi)."""
    for start_m in range(lo, hi, BLOCK_M):
        rows = start_m + offs_m
        q = _load_rows(q_base, rows, N_Q, s_qn, offs_d, HEAD_DIM, D_PAD, MASKED)  # (BLOCK_M, D_PAD)
        do = _load_rows(do_base, rows, N_Q, s_on, offs_d, HEAD_DIM, D_PAD, MASKED)  # (BLOCK_M, D_PAD)
        if MASKED:  # a missing query row gets L = +inf, hence P = 0
            lse = tl.load(l_base + rows, mask=rows < N_Q, other=float("inf"))
            delta = tl.load(d_base + rows, mask=rows < N_Q, other=0.0)
        else:
            lse = tl.load(l_base + rows)
            delta = tl.load(d_base + rows)
        s_t = tl.dot(k, tl.trans(q), input_precision=PREC) * qk_scale  # (BLOCK_N, BLOCK_M) = Sᵀ, base 2
        p_t = tl.exp2(s_t - lse[None, :] * LOG2E)  # Pᵀ, recomputed from L
        if MASKED:
            if IS_CAUSAL:
                p_t = tl.where(cols[:, None] <= rows[None, :], p_t, 0.0)
        dv = tl.dot(p_t.to(do.dtype), do, dv, input_precision=PREC)  # dV += Pᵀ dO
        dp_t = tl.dot(v, tl.trans(do), input_precision=PREC)  # dPᵀ = V dOᵀ
        ds_t = p_t * (dp_t - delta[None, :])  # dSᵀ = Pᵀ * (dPᵀ - D)
        dk = tl.dot(ds_t.to(q.dtype), q, dk, input_precision=PREC)  # dK += dSᵀ Q (scaled at the end)
    return dk, dv


@triton.jit
def _dkdv_kernel(Q, K, V, DO, L, Delta, DK, DV, s_qb, s_qh, s_qn, s_kb, s_kh, s_kn, s_ob, s_oh, s_on,
                 H, N_Q, N_K, sm_scale, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, IS_CAUSAL: tl.constexpr,
                 PREC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """dK and dV for one BLOCK_N block of keys of one (batch, head). V, dK, dV have k's strides."""
    start_n = tl.program_id(0) * BLOCK_N
    bh = tl.program_id(1).to(tl.int64)
    q_base, k_off = Q + (bh // H) * s_qb + (bh % H) * s_qh, (bh // H) * s_kb + (bh % H) * s_kh
    do_base = DO + (bh // H) * s_ob + (bh % H) * s_oh
    l_base, d_base = L + bh * N_Q, Delta + bh * N_Q
    cols = start_n + tl.arange(0, BLOCK_N)
    offs_m, offs_d = tl.arange(0, BLOCK_M), tl.arange(0, D_PAD)
    k = _load_rows(K + k_off, cols, N_K, s_kn, offs_d, HEAD_DIM, D_PAD, True)  # (BLOCK_N, D_PAD), stays on chip
    v = _load_rows(V + k_off, cols, N_K, s_kn, offs_d, HEAD_DIM, D_PAD, True)
    dk = tl.zeros([BLOCK_N, D_PAD], tl.float32)
    dv = tl.zeros([BLOCK_N, D_PAD], tl.float32)
    qk_scale = sm_scale * LOG2E
    full_end = (N_Q // BLOCK_M) * BLOCK_M  # query blocks past it are ragged
    mid = 0  # first query block that needs no causal mask
    if IS_CAUSAL:  # queries before this key block never see it; blocks up to diag_end straddle the diagonal
        lo = (start_n // BLOCK_M) * BLOCK_M
        diag_end = tl.minimum(tl.cdiv(start_n + BLOCK_N - 1, BLOCK_M), tl.cdiv(N_Q, BLOCK_M)) * BLOCK_M
        dk, dv = _dkdv_inner(dk, dv, k, v, q_base, do_base, l_base, d_base, s_qn, s_on, cols, offs_m, offs_d,
                             lo, diag_end, N_Q, qk_scale, HEAD_DIM, D_PAD, BLOCK_M, True, IS_CAUSAL, PREC)
        mid = tl.maximum(lo, diag_end)
    dk, dv = _dkdv_inner(dk, dv, k, v, q_base, do_base, l_base, d_base, s_qn, s_on, cols, offs_m, offs_d,
                         mid, full_end, N_Q, qk_scale, HEAD_DIM, D_PAD, BLOCK_M, False, IS_CAUSAL, PREC)
    dk, dv = _dkdv_inner(dk, dv, k, v, q_base, do_base, l_base, d_base, s_qn, s_on, cols, offs_m, offs_d,
                         tl.maximum(mid, full_end), N_Q, N_Q, qk_scale, HEAD_DIM, D_PAD, BLOCK_M, True,
                         IS_CAUSAL, PREC)
    _store_rows(DK + k_off, dk * sm_scale, cols, N_K, s_kn, offs_d, HEAD_DIM)
    _store_rows(DV + k_off, dv, cols, N_K, s_kn, offs_d, HEAD_DIM)


@triton.jit
def _dq_inner(dq, q, do, lse2, delta, k_base, v_base, s_kn, rows, offs_n, offs_d, lo, hi, N_K, qk_scale,
              HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_N: tl.constexpr,
              MASKED: tl.constexpr, IS_CAUSAL: tl.constexpr, PREC: tl.constexpr):
    """Accumulate dQ of one query block over key blocks [lo, hi)."""
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        k = _load_rows(k_base, cols, N_K, s_kn, offs_d, HEAD_DIM, D_PAD, MASKED)  # (BLOCK_N, D_PAD)
        v = _load_rows(v_base, cols, N_K, s_kn, offs_d, HEAD_DIM, D_PAD, MASKED)
        s = tl.dot(q, tl.trans(k), input_precision=PREC) * qk_scale  # (BLOCK_M, BLOCK_N), base 2
        p = tl.exp2(s - lse2[:, None])  # P, recomputed from L
        if MASKED:
            keep = cols[None, :] < N_K
            if IS_CAUSAL:
                keep = keep & (cols[None, :] <= rows[:, None])
            p = tl.where(keep, p, 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=PREC)  # dP = dO Vᵀ
        ds = p * (dp - delta[:, None])  # dS = P * (dP - D)
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=PREC)  # dQ += dS K (scaled at the end)
    return dq


@triton.jit
def _dq_kernel(Q, K, V, DO, L, Delta, DQ, s_qb, s_qh, s_qn, s_kb, s_kh, s_kn, s_ob, s_oh, s_on,
               H, N_Q, N_K, sm_scale, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, IS_CAUSAL: tl.constexpr,
               PREC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """dQ for one BLOCK_M block of queries of one (batch, head); same key ranges as the forward."""
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1).to(tl.int64)
    q_off, k_off = (bh // H) * s_qb + (bh % H) * s_qh, (bh // H) * s_kb + (bh % H) * s_kh
    rows = start_m + tl.arange(0, BLOCK_M)
    offs_n, offs_d = tl.arange(0, BLOCK_N), tl.arange(0, D_PAD)
    q = _load_rows(Q + q_off, rows, N_Q, s_qn, offs_d, HEAD_DIM, D_PAD, True)
    do = _load_rows(DO + (bh // H) * s_ob + (bh % H) * s_oh, rows, N_Q, s_on, offs_d, HEAD_DIM, D_PAD, True)
    lse2 = tl.load(L + bh * N_Q + rows, mask=rows < N_Q, other=0.0) * LOG2E
    delta = tl.load(Delta + bh * N_Q + rows, mask=rows < N_Q, other=0.0)
    dq = tl.zeros([BLOCK_M, D_PAD], tl.float32)
    qk_scale = sm_scale * LOG2E
    full_end = (N_K // BLOCK_N) * BLOCK_N
    hi = N_K
    if IS_CAUSAL:
        full_end = tl.minimum(full_end, ((start_m + 1) // BLOCK_N) * BLOCK_N)
        hi = tl.minimum(N_K, start_m + BLOCK_M)
    dq = _dq_inner(dq, q, do, lse2, delta, K + k_off, V + k_off, s_kn, rows, offs_n, offs_d, 0, full_end, N_K,
                   qk_scale, HEAD_DIM, D_PAD, BLOCK_N, False, IS_CAUSAL, PREC)
    dq = _dq_inner(dq, q, do, lse2, delta, K + k_off, V + k_off, s_kn, rows, offs_n, offs_d, full_end, hi, N_K,
                   qk_scale, HEAD_DIM, D_PAD, BLOCK_N, True, IS_CAUSAL, PREC)
    _store_rows(DQ + q_off, dq * sm_scale, rows, N_Q, s_qn, offs_d, HEAD_DIM)


# ------------------------------------------------------------------------------------ launching

# (BLOCK_M, BLOCK_N, num_warps, num_stages) the autotuner tries once per shape on a GPU, keeping the
# fastest; one list for head dims up to 64 and one for 65..128. None of them spills registers on an
# H100/H200 in fp16 or bf16, as compiled by tests/attention/test_attention_triton_aot.py (python -m
# helpers.attention.triton_aot prints the compiler's report). At d=128 a 128-row tile needs 8 warps: with 4,
# the fp32 accumulator alone takes 128 registers per thread and the forward spills.
AUTOTUNE = {
    "forward": {64: [(128, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 3), (64, 64, 4, 4)],
                128: [(128, 64, 8, 3), (128, 64, 8, 2), (128, 128, 8, 3), (64, 64, 4, 4)]},
    "dkdv": {64: [(32, 128, 8, 3), (64, 128, 8, 3), (64, 64, 4, 3)],
             128: [(32, 128, 8, 3), (64, 64, 8, 3), (32, 64, 4, 3)]},
    "dq": {64: [(128, 32, 4, 3), (128, 64, 8, 3), (64, 64, 4, 3)],
           128: [(128, 64, 8, 3), (64, 64, 8, 3), (128, 32, 8, 3)]},
}
KERNELS = {"forward": _fwd_kernel, "dkdv": _dkdv_kernel, "dq": _dq_kernel, "preprocess": _bwd_preprocess}
PREPROCESS_BLOCK = 64  # query rows per program of the D = rowsum(dO * O) kernel on a GPU
_KEY = ["N_Q", "N_K", "D_PAD", "IS_CAUSAL", "PREC"]
INTERPRETER_BLOCK = 32  # default tile edge under the interpreter (its cost is per operation, not per FLOP)


def padded_head_dim(d: int) -> int:
    """The tile width a head dim d runs at: the next power of two, at least 16 (extra columns masked)."""
    return max(16, triton.next_power_of_2(d))


def head_dim_class(d_pad: int) -> int:
    """Which AUTOTUNE list serves a padded head dim: 64 (up to 64) or 128."""
    return 64 if d_pad <= 64 else 128


def autotuners(lists: dict) -> dict:
    """{(kernel, head-dim class): the kernel wrapped in triton.autotune over `lists`' configurations}, for
    `lists` shaped like AUTOTUNE ({kernel: {64 | 128: [(BLOCK_M, BLOCK_N, num_warps, num_stages), ...]}})."""
    return {(name, d_class): triton.autotune([triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
                                              for bm, bn, w, s in lists[name][d_class]], key=_KEY)(KERNELS[name])
            for name in lists for d_class in (64, 128)}


TUNED = {} if INTERPRETED or AHEAD_OF_TIME else autotuners(AUTOTUNE)

# What an H200's autotuner picked from AUTOTUNE at every shape it tuned (results/nvidia-h200/flash_check/log.txt:
# d_pad 64 and 128, N from 32 to 16384, causal and not): two forward tiles per head-dim class and one tile per
# backward kernel. Each (dtype, head dim, causal flag, specialisation) then compiles 4 kernels instead of 10.
SHORTLIST = {
    "forward": {64: [(64, 64, 4, 4), (128, 64, 8, 3)], 128: [(128, 64, 8, 3), (128, 128, 8, 3)]},
    "dkdv": {64: [(64, 64, 4, 3)], 128: [(32, 64, 4, 3)]},
    "dq": {64: [(64, 64, 4, 3)], 128: [(128, 64, 8, 3)]},
}
CONFIG_LISTS = {"all": AUTOTUNE, "shortlist": SHORTLIST}


def use_configs(which: str) -> bool:
    """From now on the autotuner tries CONFIG_LISTS[which]: "all" (AUTOTUNE) or "shortlist" (SHORTLIST).

    Kernels already compiled stay compiled; shapes are tuned again among the new lists. Returns False, changing
    nothing, where nothing is autotuned (the interpreter, or compiling ahead of time). Raises ValueError for
    another name."""
    if which not in CONFIG_LISTS:
        raise ValueError(f"which={which!r}; choose one of {', '.join(map(repr, CONFIG_LISTS))}")
    if not TUNED:
        return False
    TUNED.update(autotuners(CONFIG_LISTS[which]))
    return True


def tuned_configs() -> dict[str, str]:
    """The block sizes and warps the autotuner picked, per kernel and tuned shape (GPU only; empty before a run)."""
    picked = {}
    for (name, _), fn in TUNED.items():
        for key, config in getattr(fn, "cache", {}).items():  # key: the values of _KEY, then argument dtypes
            n_q, n_k, d_pad, causal = key[:4]
            picked[f"{name} N={n_q}x{n_k} d_pad={d_pad}{' causal' if causal else ''}"] = str(config)
    return picked


def fixed_config(block_m: int | None, block_n: int | None, d_pad: int, fp32: bool) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) for a launch that is not autotuned.

    That is the interpreter, fp32 ("ieee" products on CUDA cores, a correctness path: 16 x 16 tiles
    and two stages, which keep its operands in registers without spilling), or block sizes given by
    the caller. Large tiles at a large head dim get 8 warps so that the fp32 accumulators fit in
    registers.
    """
    bm, bn = (b or (INTERPRETER_BLOCK if INTERPRETED else 16 if fp32 else 64) for b in (block_m, block_n))
    warps = 8 if max(bm, bn) * d_pad >= 64 * 128 else 4
    return bm, bn, warps, 2 if fp32 else 3


def _launch(name: str, grid_rows: int, grid_axis: str, z: int, args: tuple, meta: dict,
            blocks: tuple[int | None, int | None]) -> None:
    """Run kernel `name` autotuned (GPU, fp16/bf16, no blocks given) or with fixed_config's choice."""
    fp32 = meta["PREC"] == "ieee"
    if TUNED and blocks == (None, None) and not fp32:
        tuned = TUNED[(name, head_dim_class(meta["D_PAD"]))]
        tuned[lambda m: (triton.cdiv(grid_rows, m[grid_axis]), z)](*args, **meta)
        return
    bm, bn, warps, stages = fixed_config(*blocks, meta["D_PAD"], fp32)
    rows_per_program = bm if grid_axis == "BLOCK_M" else bn
    KERNELS[name][(triton.cdiv(grid_rows, rows_per_program), z)](*args, **meta, BLOCK_M=bm, BLOCK_N=bn,
                                                                num_warps=warps, num_stages=stages)


def check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Raise ValueError (or RuntimeError) when these tensors cannot go through the Triton kernels here."""
    if BROKEN:
        raise RuntimeError(BROKEN)
    if q.dim() < 2 or k.shape != v.shape or q.shape[:-2] != k.shape[:-2] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} must be (..., N, d) with "
                         "the same leading dims and d, and k and v of the same shape")
    if not 16 <= q.shape[-1] <= 128:
        raise ValueError(f"head dim {q.shape[-1]} is not supported; these kernels take 16 to 128")
    if not q.dtype == k.dtype == v.dtype or q.dtype not in DTYPES:
        raise ValueError(f"dtypes {q.dtype}, {k.dtype}, {v.dtype} must be equal and one of {DTYPES}")
    if INTERPRETED and q.dtype == torch.bfloat16:
        raise ValueError("bf16 runs on a GPU only: the Triton interpreter's bf16 tl.dot gives wrong results")
    want = "cpu" if INTERPRETED else "cuda"
    if not q.device.type == k.device.type == v.device.type == want:
        raise ValueError(f"tensors are on {q.device.type}; {'the interpreter' if INTERPRETED else 'compiled Triton'} "
                         f"needs them on {want}")


def _dense(x: torch.Tensor) -> bool:
    """True when x's elements fill its memory without gaps or overlaps (so empty_like keeps its strides)."""
    expected = 1
    for i in sorted(range(x.dim()), key=x.stride):
        if x.size(i) != 1 and x.stride(i) != expected:
            return False
        expected *= x.size(i)
    return True


def _as_4d(x: torch.Tensor) -> torch.Tensor:
    """(..., N, d) -> a (B, H, N, d) view (a copy only if it must be), dense, with unit stride along d."""
    x = x.reshape(-1, *x.shape[-3:]) if x.dim() > 4 else x[(None,) * (4 - x.dim())]
    return x if x.stride(-1) == 1 and _dense(x) else x.contiguous()


def _rows_strides(x: torch.Tensor) -> tuple[int, int, int]:
    return x.stride(0), x.stride(1), x.stride(2)


def _meta(q: torch.Tensor, is_causal: bool) -> dict:
    d = q.shape[-1]
    return {"HEAD_DIM": d, "D_PAD": padded_head_dim(d), "IS_CAUSAL": bool(is_causal),
            "PREC": "ieee" if q.dtype == torch.float32 else "tf32"}  # true fp32 products for fp32 inputs


def _prepare(q, k, v):
    """4-D views; k and v made to share strides (the kernels index both with k's)."""
    q4, k4, v4 = _as_4d(q), _as_4d(k), _as_4d(v)
    if k4.stride() != v4.stride():
        k4, v4 = k4.contiguous(), v4.contiguous()
    return q4, k4, v4


class FlashAttentionTriton(torch.autograd.Function):
    """softmax(q kᵀ / sqrt(d)) v by the Triton kernels above; saves only q, k, v, O and L for backward.

    `FlashAttentionTriton.apply(q, k, v, is_causal=False, block_m=None, block_n=None)` with q of
    shape (..., N_q, d) and k, v of shape (..., N_k, d); d from 16 to 128. Causal keeps key j for
    query i when j <= i. Any strides with a unit last one work; O is laid out like q. Block sizes
    default to the autotuner's choice on a GPU.
    """

    @staticmethod
    def forward(ctx, q, k, v, is_causal=False, block_m=None, block_n=None):
        check_inputs(q, k, v)
        q4, k4, v4 = _prepare(q, k, v)  # (B, H, N, d)
        (b, h, n_q, d), n_k = q4.shape, k4.shape[2]
        o4 = torch.empty_like(q4)  # same strides as q4, so O is laid out like q
        lse = torch.empty((b, h, n_q), device=q.device, dtype=torch.float32)
        args = (q4, k4, v4, o4, lse, *_rows_strides(q4), *_rows_strides(k4), h, n_q, n_k, d ** -0.5)
        _launch("forward", n_q, "BLOCK_M", b * h, args, _meta(q, is_causal), (block_m, block_n))
        o, lse = o4.reshape(q.shape), lse.view(q.shape[:-1])
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.is_causal, ctx.blocks = bool(is_causal), (block_m, block_n)
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        q4, k4, v4 = _prepare(q, k, v)
        o4, do4 = o.reshape(q4.shape), _as_4d(do.to(q.dtype))
        if o4.stride() != q4.stride():  # only if q was copied above; the kernels read O with q's strides
            q4, o4 = q4.contiguous(), o4.contiguous()
        (b, h, n_q, d), n_k = q4.shape, k4.shape[2]
        meta = _meta(q, ctx.is_causal)
        delta = torch.empty((b, h, n_q), device=q.device, dtype=torch.float32)  # D = rowsum(dO * O)
        pre = INTERPRETER_BLOCK if INTERPRETED else PREPROCESS_BLOCK
        _bwd_preprocess[(triton.cdiv(n_q, pre), b * h)](o4, do4, delta, *_rows_strides(q4), *_rows_strides(do4), h,
                                                         n_q, HEAD_DIM=d, D_PAD=meta["D_PAD"], BLOCK_M=pre)
        dq, dk, dv = torch.empty_like(q4), torch.empty_like(k4), torch.empty_like(v4)  # strides of q4, k4, v4
        strides = (*_rows_strides(q4), *_rows_strides(k4), *_rows_strides(do4), h, n_q, n_k, d ** -0.5)
        _launch("dkdv", n_k, "BLOCK_N", b * h, (q4, k4, v4, do4, lse, delta, dk, dv, *strides),
                meta, ctx.blocks)
        _launch("dq", n_q, "BLOCK_M", b * h, (q4, k4, v4, do4, lse, delta, dq, *strides), meta, ctx.blocks)
        return dq.reshape(q.shape), dk.reshape(k.shape), dv.reshape(v.shape), None, None, None


def flash_attention_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False) -> torch.Tensor:
    """FlashAttentionTriton.apply with the course's attention signature fn(q, k, v, is_causal)."""
    return FlashAttentionTriton.apply(q, k, v, is_causal)


def kernel_source(name: str) -> str:
    """The Python source of one kernel or helper in this module, e.g. '_fwd_inner' (for the notebook)."""
    fn = globals()[name]
    return inspect.getsource(getattr(fn, "fn", fn))
