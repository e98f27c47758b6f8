"""A fused row softmax written in Triton: one program per row, online over blocks when a row does not fit.

softmax(x)_j = exp(x_j - m) / sum_k exp(x_k - m), with m = max_k x_k (subtracting m changes nothing
mathematically and keeps exp from overflowing). Written as separate PyTorch ops this reads and writes
the row several times; a fused kernel reads it from memory once and writes the result once.

* A row that fits one block (`BLOCK >= n_cols`): load it, take the max, exponentiate, sum, divide,
  store; one read and one write of the row.
* A longer row: the online softmax (Milakov & Gimelshein, 2018, "Online normalizer calculation for
  softmax"). One pass keeps a running max m and a running sum l = sum exp(x - m); a block with a larger
  max rescales l by exp(m_old - m_new). A second pass writes exp(x - m) / l. Two reads, one write.

Fully masked rows (every entry -inf) give NaN, as `torch.softmax` does: the kernel is a drop-in
replacement, and a NaN says loudly that a row had nothing to attend to. Partly masked rows, even
ones whose first block is all -inf, are finite: the running update never computes -inf - (-inf).

* `softmax_row_kernel`: the kernel; `softmax`: its launch over the last dimension of any tensor;
  `block_for`: the block size and path for a row length; `online_update`: the online step in PyTorch;
  `reference`: what the kernel is checked against.

Without CUDA the kernel runs in Triton's interpreter (numpy, slow, for correctness only): importing
this module switches it on through `helpers.measure.triton_mode` (TRITON_INTERPRET=1) before its own
import of triton; `BROKEN` says why the kernel cannot run in this process, or is None.
"""
from __future__ import annotations

import contextlib

import numpy as np
import torch

from helpers.measure import params, triton_mode

INTERPRETED = not torch.cuda.is_available()
# why the kernel cannot run in this process, if it cannot; set before anything imports triton
BROKEN: str | None = triton_mode.use_interpreter_without_gpu(__name__, INTERPRETED)

import triton  # noqa: E402  (after the interpreter switch)
import triton.language as tl  # noqa: E402

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_BLOCK = 4096  # the longest row kept whole in one block; longer rows go online


@triton.jit
def softmax_row_kernel(x_ptr, y_ptr, n_cols, x_stride, y_stride, BLOCK: tl.constexpr, ONLINE: tl.constexpr):
    """One program = one row. ONLINE=False: the row fits one BLOCK. ONLINE=True: two passes over blocks."""
    row = tl.program_id(0)  # which row this program owns; rows are independent, so no program waits for another
    x_row = x_ptr + row.to(tl.int64) * x_stride  # int64: rows * stride can pass 2**31 elements
    y_row = y_ptr + row.to(tl.int64) * y_stride
    offs = tl.arange(0, BLOCK)  # the BLOCK column offsets one load covers
    if not ONLINE:
        # read the row once; slots past its end read -inf, which adds exp(-inf) = 0 to the sum
        x = tl.load(x_row + offs, mask=offs < n_cols, other=float("-inf")).to(tl.float32)  # read 1x
        z = x - tl.max(x, axis=0)  # max in registers; an all -inf row gives NaN here, as in torch
        e = tl.exp(z)  # in registers: the exponentials are never written to memory
        tl.store(y_row + offs, e / tl.sum(e, axis=0), mask=offs < n_cols)  # write 1x
    else:
        m = tl.full((), float("-inf"), tl.float32)  # running max
        l = tl.zeros((), tl.float32)  # running sum of exp(x - m)
        for start in range(0, n_cols, BLOCK):  # pass 1: read 1x, write nothing; only (m, l) is kept
            cols = start + offs
            x = tl.load(x_row + cols, mask=cols < n_cols, other=float("-inf")).to(tl.float32)
            m_new = tl.maximum(m, tl.max(x, axis=0))
            safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # never -inf - (-inf)
            l = l * tl.exp(m - safe) + tl.sum(tl.exp(x - safe), axis=0)  # the old sum, rescaled to the new max
            m = m_new
        for start in range(0, n_cols, BLOCK):  # pass 2: read 1x, write 1x, with the row's final (m, l)
            cols = start + offs
            x = tl.load(x_row + cols, mask=cols < n_cols, other=float("-inf")).to(tl.float32)
            tl.store(y_row + cols, tl.exp(x - m) / l, mask=cols < n_cols)  # all -inf: 0/0 = NaN


def block_for(n_cols: int, max_block: int | None = None) -> tuple[int, bool]:
    """(BLOCK, online) for rows of `n_cols`: the next power of two if it is <= max_block (default MAX_BLOCK),
    else max_block and the online two-pass loop. Raises ValueError for n_cols < 1 or a max_block that is not
    a power of two >= 16."""
    cap = MAX_BLOCK if max_block is None else max_block
    params.positive("n_cols", n_cols)
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 16 or cap & (cap - 1):
        raise ValueError(f"max_block={max_block!r} must be a power of two >= 16")
    block = max(16, 1 << (n_cols - 1).bit_length())
    return (block, False) if block <= cap else (cap, True)


def _warps(block: int) -> int:
    """Warps per program: 4 up to 1024 elements a block, 8 up to 4096, 16 beyond (one row in registers)."""
    return 4 if block <= 1024 else 8 if block <= 4096 else 16


def softmax(x: torch.Tensor, max_block: int | None = None, kernel=None) -> torch.Tensor:
    """Softmax over the last dimension of `x` (..., n) with the Triton kernel; same shape and dtype as x.

    Statistics are kept in fp32 whatever the input dtype. `max_block` caps the block (a power of two);
    rows longer than it use the online two-pass loop (pass a small one to exercise that path on short rows).
    `kernel`: the kernel to launch, with `softmax_row_kernel`'s arguments (None: that one; notebook 09 passes
    the one its cell defines).
    Raises ValueError for an empty last dimension, a dtype outside DTYPES (and bf16 in the interpreter,
    whose bf16 support is incomplete) or a CPU tensor where a GPU is present, RuntimeError when Triton
    cannot run in this process.
    """
    if BROKEN:
        raise RuntimeError(BROKEN)
    if x.dtype not in DTYPES:
        raise ValueError(f"dtype {x.dtype} is not supported; use one of {', '.join(map(str, DTYPES))}")
    if INTERPRETED and x.dtype == torch.bfloat16:
        raise ValueError("bf16 runs on a GPU only (Triton's interpreter handles fp32 and fp16)")
    if not INTERPRETED and not x.is_cuda:
        raise ValueError(f"x is on {x.device}: with a GPU present the kernel is compiled for it; move x to CUDA")
    if x.dim() == 0 or x.shape[-1] == 0:
        raise ValueError(f"x of shape {tuple(x.shape)} has no last dimension to normalise")
    n_cols = x.shape[-1]
    block, online = block_for(n_cols, max_block)
    rows = x.reshape(-1, n_cols)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty_like(rows)
    if rows.shape[0]:
        with _quiet_nan():  # the interpreter's numpy warns on a fully masked row's -inf - (-inf): NaN is intended
            launch = kernel or softmax_row_kernel
            launch[(rows.shape[0],)](rows, out, n_cols, rows.stride(0), out.stride(0),  # one program per row
                                     BLOCK=block, ONLINE=online, num_warps=_warps(block))
    return out.reshape(x.shape)


def online_update(m: torch.Tensor, l: torch.Tensor, block: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One step of the online softmax in PyTorch, what the kernel's first pass does per block.

    m, l: (rows,) running max and running sum of exp(x - m) so far (start: -inf and 0);
    block: (rows, B) the next block of each row. Returns the new (m, l). A row whose entries so far are
    all -inf keeps m = -inf and l = 0 (never -inf - (-inf) = NaN), so a later finite block still counts.
    """
    m_new = torch.maximum(m, block.amax(-1))
    safe = torch.where(m_new == float("-inf"), torch.zeros_like(m_new), m_new)
    return m_new, l * torch.exp(m - safe) + torch.exp(block - safe[:, None]).sum(-1)


def _quiet_nan():
    """numpy's errstate(invalid='ignore') in the interpreter; nothing on a GPU."""
    if not INTERPRETED:
        return contextlib.nullcontext()
    return np.errstate(invalid="ignore")


def reference(x: torch.Tensor) -> torch.Tensor:
    """torch.softmax over the last dim, computed in fp32 and cast back (what the kernel is checked against)."""
    return torch.softmax(x.float(), dim=-1).to(x.dtype)
