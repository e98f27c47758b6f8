"""Quantised matmuls: LLM.int8's outlier decomposition, weight-only int8 / int4 linears, a Triton int4 kernel.

* **LLM.int8** (Dettmers et al., 2022, "LLM.int8(): 8-bit Matrix Multiplication for Transformers at
  Scale"): X (tokens, in) @ W^T with W (out, in). Every input column holding a value with |x| >= threshold
  is an outlier feature; those columns are multiplied in floating point, the rest "vector-wise" in int8:
  each row of X and each row of W gets its own absmax scale, the int8 products are summed exactly
  (int32 in bitsandbytes; float64 here, which is exact at these sizes), and the sum is multiplied by
  both scales. bitsandbytes' `Linear8bitLt` in eval mode differs in three ways. (1) It keeps W only in
  int8, so its outlier columns use the dequantised int8 weight: `outlier_weight="int8"` reproduces that.
  (2) Its row scale of X is taken after zeroing only the values with |x| >= threshold, so the smaller
  values of an outlier column still count in their row's absmax (those columns' int8 codes are zeroed
  afterwards); the paper, and `row_scale="paper"`, leave the whole outlier columns out of the row
  absmax. `row_scale="bitsandbytes"` follows bitsandbytes' rule. (3) It casts X to fp16 first, which
  `row_scale="bitsandbytes"` does too. The two rules give the same scales while every value of an
  outlier column is at or above the threshold; once the threshold falls inside an outlier column's
  range of |x|, that column's values below it set their rows' scale under bitsandbytes' rule and
  flatten the int8 part, so the paper's rule and bitsandbytes' output drift apart, while bitsandbytes'
  rule stays within fp16 rounding of it (facts read from bitsandbytes 0.50's source: the default backend's
  `int8_vectorwise_quant`; `int8_mixed_scaled_mm`).
* **Weight-only linears** for decode: the weight is stored in int8 (one scale per output row) or int4
  (zero-point, one scale and zero per `group_size` inputs, packed two per byte) and dequantised inside the
  matmul; activations stay in 16/32-bit. At batch 1 decode reads every weight once per token, so fewer
  bytes per weight is fewer seconds per token; at large batch the matmul becomes compute-bound and the
  dequantisation work is pure overhead.
* **`int4_matmul`**: a Triton kernel that unpacks the nibbles, applies scale and zero per group and
  accumulates x @ w^T in fp32 tiles. Without CUDA it runs in Triton's interpreter, which this module
  switches on for itself when it is imported (`helpers.measure.triton_mode`): correct, slow, untimed.
  `BROKEN` says why the kernel cannot run in this process (e.g. triton imported earlier in compiled
  mode, as `import bitsandbytes` does), or is None.
"""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from helpers.lowbit import quant, w8a8
from helpers.measure import triton_mode

INTERPRETED = not torch.cuda.is_available()
# why the int4 kernel cannot run in this process, if it cannot; set before anything imports triton
BROKEN: str | None = triton_mode.use_interpreter_without_gpu(__name__, INTERPRETED)
try:
    import triton  # noqa: E402  (after the interpreter switch)
    import triton.language as tl  # noqa: E402
except ImportError:  # pragma: no cover - triton ships with torch's Linux wheels; BROKEN says so
    triton = tl = None


# ---------------------------------------------------------------- LLM.int8

def rowwise_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Vector-wise absmax int8 of a 2-D tensor: (int8 codes, float32 absmax per row). Zero rows get absmax 1."""
    amax = x.float().abs().amax(1)
    amax = torch.where(amax > 0, amax, torch.ones_like(amax))
    return torch.round(x.float() * (127.0 / amax[:, None])).to(torch.int8), amax


ROW_SCALES = ("paper", "bitsandbytes")


def llm_int8_matmul(x: torch.Tensor, w: torch.Tensor, threshold: float = 6.0,
                    outlier_weight: str = "float", row_scale: str = "paper") -> tuple[torch.Tensor, torch.Tensor]:
    """LLM.int8's mixed-precision x @ w^T: x (tokens, in), w (out, in) -> ((tokens, out) float32, outlier
    column indices int64).

    threshold <= 0 turns the decomposition off (plain vector-wise int8). outlier_weight "float" uses w
    itself for the outlier columns (the paper); "int8" uses the dequantised int8 weight (bitsandbytes'
    Linear8bitLt with has_fp16_weights=False). row_scale "paper": each row's int8 scale of x is the absmax
    of its non-outlier columns; "bitsandbytes": x is cast to fp16, only the values with |x| >= threshold
    are zeroed before the row absmax, and the outlier columns' codes are zeroed after it (see the module
    docstring: the two differ once the threshold falls inside an outlier column's range). Raises
    ValueError for non-2-D inputs, mismatched inner sizes, an unknown outlier_weight or row_scale.
    """
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"need x (tokens, in) and w (out, in); got {tuple(x.shape)} and {tuple(w.shape)}")
    if outlier_weight not in ("float", "int8"):
        raise ValueError(f"outlier_weight must be 'float' or 'int8', not {outlier_weight!r}")
    if row_scale not in ROW_SCALES:
        raise ValueError(f"row_scale must be one of {ROW_SCALES}, not {row_scale!r}")
    x = x.half().float() if row_scale == "bitsandbytes" else x.float()
    outliers = (x.abs() >= threshold) if threshold > 0 else torch.zeros_like(x, dtype=torch.bool)
    cols = torch.nonzero(outliers.any(0)).reshape(-1)
    if row_scale == "paper":
        regular = x.clone()
        regular[:, cols] = 0.0
        qx, sx = rowwise_int8(regular)
    else:
        qx, sx = rowwise_int8(x.masked_fill(outliers, 0.0))
        qx[:, cols] = 0
    qw, sw = rowwise_int8(w)
    acc = qx.double() @ qw.double().T  # exact integer sums (|sum| < 2^53)
    out = (acc * (sx[:, None].double() * sw[None, :].double()) / 127.0 ** 2).float()
    if cols.numel():
        w_out = w.float() if outlier_weight == "float" else qw.float() * (sw[:, None] / 127.0)
        out = out + x[:, cols] @ w_out[:, cols].T
    return out, cols


def bnb_int8_linear(w: torch.Tensor, threshold: float = 6.0):
    """bitsandbytes' `Linear8bitLt` (no bias, int8 weights, eval mode) holding `w` (out, in); a module."""
    import bitsandbytes as bnb  # heavy: it imports triton, and only this comparison needs it
    m = bnb.nn.Linear8bitLt(w.shape[1], w.shape[0], bias=False, has_fp16_weights=False, threshold=threshold)
    m.load_state_dict({"weight": w.detach().float().clone()})
    return m.to(w.device).eval()


def planted_outliers(tokens: int, features: int, columns: int = 3, size: float = 20.0, seed: int = 0) -> torch.Tensor:
    """Activations N(0, 1) of shape (tokens, features) with `columns` feature columns scaled by `size`:
    the systematic outlier features LLM.int8 describes."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, features, generator=g)
    cols = torch.randperm(features, generator=g)[:columns]
    x[:, cols] *= size
    return x


# ---------------------------------------------------------------- weight-only linears

class WeightOnlyLinear(nn.Module):
    """A linear layer with its weight stored in int8 (per output row) or int4 (zero-point, per group,
    packed), dequantised inside the matmul. Build it with `WeightOnlyLinear.from_linear(linear, bits,
    group_size)`. forward(x (..., in)) -> (..., out) in x's dtype. `backend`: "torch" (int4: unpack,
    dequantise, F.linear; int8: convert inside F.linear, scale the output), "triton" (int4: `int4_matmul`),
    "compile" (int8: the same under torch.compile), "cpu_int4" (int4: PyTorch's CPU int4 kernel,
    `w8a8.int4_cpu_matmul`) or "fused" (int8: `int8_fused_linear`, PyTorch's
    int8 weight-only kernel, which reads each int8 weight once with no float copy of the weight)."""

    def __init__(self, in_features: int, out_features: int, bits: int, group_size: int, bias: torch.Tensor | None):
        super().__init__()
        self.in_features, self.out_features, self.bits, self.group_size = in_features, out_features, bits, group_size
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)
        self.backend = "torch"

    @classmethod
    def from_linear(cls, linear: nn.Linear, bits: int = 8, group_size: int = 64) -> "WeightOnlyLinear":
        """Quantise `linear`'s weight (RTN). Raises ValueError for bits not 8 or 4, or a group size that
        does not divide in_features (int4)."""
        if bits not in (8, 4):
            raise ValueError(f"bits must be 8 or 4, not {bits!r}")
        w = linear.weight.detach()
        m = cls(linear.in_features, linear.out_features, bits, group_size, linear.bias)
        if bits == 8:
            q, s = rowwise_int8(w)
            m.register_buffer("qweight", q)
            m.register_buffer("scale", (s / 127.0).to(w.dtype))
        else:
            qt = quant.quantize(w, 4, "zeropoint", group_size)
            n_groups = w.shape[1] // group_size
            m.register_buffer("qweight", quant.pack_int4(qt.q))
            m.register_buffer("scale", qt.scale.reshape(w.shape[0], n_groups).contiguous())
            m.register_buffer("zero", qt.zero.reshape(w.shape[0], n_groups).contiguous())
        return m

    def dequantized(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The (out, in) weight this layer multiplies by, in `dtype`."""
        if self.bits == 8:
            return (self.qweight.to(dtype) * self.scale[:, None].to(dtype))
        codes = quant.unpack_int4(self.qweight).float().reshape(self.out_features, -1, self.group_size)
        w = (codes - self.zero[..., None]) * self.scale[..., None]
        return w.reshape(self.out_features, self.in_features).to(dtype)

    def weight_bytes(self) -> int:
        """Bytes of the stored weight state (codes, scales, zeros)."""
        return sum(b.numel() * b.element_size() for b in self.buffers())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.bits == 8:  # gpt-fast's form: int8 -> x.dtype inside the matmul, per-row scale on the output
            fn = (_compiled_int8() if self.backend == "compile" else
                  int8_fused_linear if self.backend == "fused" else _int8_linear)
            y = fn(x, self.qweight, self.scale)
        elif self.backend == "cpu_int4":  # PyTorch's CPU int4 kernel on the same codes, packed on first use
            if getattr(self, "_cpu_int4", None) is None:
                codes = quant.unpack_int4(self.qweight).reshape(self.out_features, self.in_features)
                self._cpu_int4 = w8a8.int4_cpu_pack(codes, self.scale, self.zero)
            y = w8a8.int4_cpu_matmul(x.reshape(-1, self.in_features).float(), *self._cpu_int4,
                                     self.group_size).reshape(*x.shape[:-1], self.out_features).to(x.dtype)
        elif self.backend == "triton":
            y = int4_matmul(x.reshape(-1, self.in_features), self.qweight, self.scale, self.zero,
                            self.group_size).reshape(*x.shape[:-1], self.out_features)
        else:
            y = F.linear(x, self.dequantized(x.dtype))
        return y if self.bias is None else y + self.bias.to(y.dtype)


def _int8_linear(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x (..., in) @ q (out, in) int8, converted to x's dtype inside F.linear, times the per-row scale (out,)."""
    return F.linear(x, q.to(x.dtype)) * scale.to(x.dtype)


def int8_fused_linear(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x (..., in) @ q (out, in) int8 times the per-row scale (out,), in one call of PyTorch's int8 weight-only
    matmul (`torch._weight_int8pack_mm`, the kernel torchao's int8 weight-only layout calls on a CPU): the
    int8 weight is converted inside the kernel's loop, so each weight is read once as one byte. Same result
    as `_int8_linear` to fp32 rounding; x in fp32, bf16 or fp16."""
    y = torch._weight_int8pack_mm(x.reshape(-1, x.shape[-1]), q, scale.to(x.dtype))
    return y.reshape(*x.shape[:-1], q.shape[0])


_COMPILED = None
# Inductor's option under which a matmul with one row (batch-1 decode) becomes a multiply-and-sum that Inductor
# writes itself, so the int8 -> bf16 conversion is fused into that kernel's loads and each weight is read once
# as one byte. Without it the matmul stays cuBLAS's and the conversion is a kernel of its own that writes a bf16
# copy of the weight for cuBLAS to read (1 + 2 + 2 bytes moved per weight, against bf16's 2). gpt-fast sets it
# process-wide (torch._inductor.config.coordinate_descent_tuning = True); in torch 2.11 and later the rewrite is
# in torch/_inductor/decomposition.py's `mm`, for GPUs only, so a CPU compiles as before.
FUSED_MATVEC = {"coordinate_descent_tuning": True}


def _compiled_int8():
    """`_int8_linear` under torch.compile with FUSED_MATVEC: at batch 1 on a GPU, Inductor fuses the
    int8 -> bf16 conversion into the matrix-vector product's loads instead of writing a bf16 copy of the
    weight first (gpt-fast's recipe)."""
    global _COMPILED
    if _COMPILED is None:
        _COMPILED = torch.compile(_int8_linear, dynamic=True, options=FUSED_MATVEC)
    return _COMPILED


def swap_linears(model: nn.Module, make) -> nn.Module:
    """Replace every nn.Linear inside `model.blocks` (attention and MLP projections; embeddings and the
    output head stay in full precision, as bitsandbytes' and torchao's defaults skip lm_head) with
    `make(linear)`; returns the model, changed in place."""
    for block in model.blocks:
        for name, child in list(block.named_modules()):
            for attr, sub in list(child.named_children()):
                if isinstance(sub, nn.Linear):
                    setattr(child, attr, make(sub))
    return model


# ---------------------------------------------------------------- the Triton int4 kernel

if triton is not None:
    @triton.jit
    def _int4_mm_kernel(x_ptr, p_ptr, s_ptr, z_ptr, y_ptr, M, N, K, G,
                        sxm, sxk, spn, ssn, sym,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, IEEE: tl.constexpr):
        """y[m, n] = sum_k x[m, k] * (code[n, k] - zero[n, k // G]) * scale[n, k // G]; one (M, N) tile a program."""
        rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            rk = k0 + tl.arange(0, BLOCK_K)
            x = tl.load(x_ptr + rm[:, None] * sxm + rk[None, :] * sxk,
                        mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
            wmask = (rn[None, :] < N) & (rk[:, None] < K)  # the weight tile is (BLOCK_K, BLOCK_N)
            byte = tl.load(p_ptr + rn[None, :] * spn + rk[:, None] // 2, mask=wmask, other=0).to(tl.int32)
            code = (byte >> ((rk[:, None] % 2) * 4)) & 0xF  # even k: low nibble, odd k: high nibble
            g = rk[:, None] // G
            s = tl.load(s_ptr + rn[None, :] * ssn + g, mask=wmask, other=0.0)
            z = tl.load(z_ptr + rn[None, :] * ssn + g, mask=wmask, other=0.0)
            w = ((code.to(tl.float32) - z) * s).to(x.dtype)
            if IEEE:
                acc += tl.dot(x, w, input_precision="ieee")
            else:
                acc += tl.dot(x, w)
        tl.store(y_ptr + rm[:, None] * sym + rn[None, :], acc.to(y_ptr.dtype.element_ty),
                 mask=(rm[:, None] < M) & (rn[None, :] < N))


def int4_matmul(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor,
                group_size: int, *, block_n: int = 32, block_k: int = 64) -> torch.Tensor:
    """x (M, K) @ W^T with W (N, K) stored as `WeightOnlyLinear`'s int4: packed uint8 (N, K/2), scale and
    zero float32 (N, K/group_size). Returns (M, N) in x's dtype, accumulated in fp32 (fp32 inputs are
    multiplied in IEEE fp32, not TF32). Raises RuntimeError when Triton cannot run here, ValueError for
    mismatched shapes, a group size that is not a multiple of 2, a CPU tensor where a GPU is present, or bf16
    activations in Triton's interpreter (which returns values around 1e10 for them: its bf16 support is
    incomplete, as for the course's softmax and FlashAttention kernels).
    """
    if BROKEN:
        raise RuntimeError(BROKEN)
    if INTERPRETED and x.dtype == torch.bfloat16:
        raise ValueError("bf16 activations run on a GPU only: Triton's interpreter computes them wrong; use fp32 "
                         "or fp16 here")
    if x.dim() != 2 or packed.dim() != 2 or packed.shape[1] * 2 != x.shape[1]:
        raise ValueError(f"need x (M, K) and packed (N, K/2); got {tuple(x.shape)} and {tuple(packed.shape)}")
    if group_size % 2 or x.shape[1] % group_size or scale.shape != (packed.shape[0], x.shape[1] // group_size):
        raise ValueError(f"scale {tuple(scale.shape)} does not fit K={x.shape[1]} in groups of {group_size}")
    if not INTERPRETED and not x.is_cuda:
        raise ValueError("with a GPU present the kernel is compiled for it; move the tensors to CUDA")
    M, K = x.shape
    N = packed.shape[0]
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    block_m = 16
    grid = (triton.cdiv(M, block_m), triton.cdiv(N, block_n))
    _int4_mm_kernel[grid](x, packed, scale.float().contiguous(), zero.float().contiguous(), y, M, N, K, group_size,
                          x.stride(0), x.stride(1), packed.stride(0), scale.shape[1], y.stride(0),
                          BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, IEEE=x.dtype == torch.float32)
    return y


# ---------------------------------------------------------------- torchao (CUDA only)

def torchao_weight_only(linear: nn.Linear, bits: int, group_size: int = 64) -> "nn.Module | str":
    """A copy of `linear` quantised by torchao's weight-only config (int8: Int8WeightOnlyConfig; int4:
    Int4WeightOnlyConfig(group_size)), or one sentence saying why it cannot run here (torchao missing,
    no CUDA: its int4 weight-only kernels need a GPU)."""
    if not torch.cuda.is_available():
        return "torchao's weight-only kernels are compared on a GPU only (its int4 path needs CUDA); this run has none"
    try:
        from torchao.quantization import (  # heavy: only the GPU comparison needs torchao
            Int4WeightOnlyConfig, Int8WeightOnlyConfig, quantize_)
    except ImportError as err:
        return f"torchao is not importable here ({err})"
    model = nn.Sequential(copy.deepcopy(linear)).to("cuda", torch.bfloat16)
    config = Int8WeightOnlyConfig() if bits == 8 else Int4WeightOnlyConfig(group_size=group_size)
    try:
        quantize_(model, config)
    except Exception as err:  # noqa: BLE001 - a kernel missing for this GPU: say so, do not crash
        return f"torchao's int{bits} weight-only config failed here ({type(err).__name__}: {err})"
    return model
