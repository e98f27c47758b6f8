"""FP8 training from scratch: formats, scaling recipes, an FP8 linear layer and its backward (notebook 07).

Convention used everywhere here: a recipe returns the fp8 tensor `q` and its fp32 `scale`, with
    q = cast(x * scale)        and        x ≈ q / scale,
so `scale` is "fp8 max / amax" (torchao's convention; DeepSeek-V3 and the OCP MX spec store the
reciprocal, amax / fp8 max, as the dequantisation factor: the same number, inverted).

* Formats: `E4M3` (torch.float8_e4m3fn) and `E5M2` (torch.float8_e5m2) of the OCP FP8 spec
  (Micikevicius et al., 2022, "FP8 Formats for Deep Learning"); their facts come from
  `helpers.training.precision.facts`, the course's one table of formats. `grid(dtype)` lists every finite value.
* `cast(x, dtype)`: clamp to ±max, then convert, so that overflow saturates the same way on every
  device and in both formats (a CPU saturates e4m3fn but sends e5m2 to inf). NaN stays NaN.
* Recipes: `tensorwise`, `DelayedScaler` and its one step `delayed_update` (Transformer Engine's
  documented `DelayedScaling`: amax history, margin, "max" / "most_recent"), `rowwise` (torchao's rowwise recipe: per-row
  scales, floored to a power of two, e4m3 for the output gradient too), `blockwise` (DeepSeek-V3:
  1x128 tiles for activations and gradients, 128x128 blocks for weights), `mx` (OCP MX: 32-element
  blocks sharing a power-of-two e8m0 scale; numerics only).
* `scaled_mm`: torch._scaled_mm where the device accepts it (CUDA sm_89+; the CPU in torch 2.13), else
  an fp32 emulation; `blockwise_mm`: the K-chunked product with fp32 promotion every 128 along K
  (on CUDA, torch.nn.functional.scaled_mm's blockwise recipes once they have matched it).
* `Float8Linear`, `convert_to_float8`: the layer and the model swap (LM head and shapes that are not
  multiples of 16 skipped and reported).

Measurements for the notebook (quantisation error, training, speed) are in `helpers.lowbit.fp8_lab`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import io
import logging
import math
import warnings
from typing import Callable

import torch
import torch.nn as nn

from helpers.measure.params import positive, positives
from helpers.training import precision

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
FORMAT_NAMES = {E4M3: "fp8-e4m3fn", E5M2: "fp8-e5m2"}  # the names helpers.training.precision knows them by
EPS = 1e-12  # amax floor, so that an all-zero tensor gets a finite scale (torchao uses the same)
RECIPES = ("tensorwise", "delayed", "rowwise", "blockwise")  # what Float8Linear trains with
NUMERIC_RECIPES = ("tensorwise", "rowwise", "blockwise", "mx")  # what quantise() compares
MX_BLOCK = 32  # OCP Microscaling spec v1.0: 32 elements share one scale
E8M0_MIN, E8M0_MAX = -127, 127  # exponent range of the e8m0 scale (255 encodes NaN)


def _check_dtype(dtype: torch.dtype) -> torch.dtype:
    if dtype not in FORMAT_NAMES:
        raise ValueError(f"dtype={dtype!r} must be torch.float8_e4m3fn or torch.float8_e5m2")
    return dtype


def facts(dtype: torch.dtype) -> precision.FormatFacts:
    """Max, smallest normal and subnormal, mantissa bits of an fp8 dtype (from helpers.training.precision)."""
    return precision.facts(FORMAT_NAMES[_check_dtype(dtype)])


def fmax(dtype: torch.dtype) -> float:
    """The largest finite value of an fp8 dtype: 448 for e4m3fn, 57344 for e5m2."""
    return facts(dtype).max


def grid(dtype: torch.dtype) -> torch.Tensor:
    """Every finite non-negative value of an fp8 dtype, sorted, as fp32 (all 128 positive bit patterns)."""
    values = torch.arange(128, dtype=torch.uint8).view(_check_dtype(dtype)).float()
    return values[torch.isfinite(values)].unique()


def cast(x: torch.Tensor, dtype: torch.dtype = E4M3) -> torch.Tensor:
    """x clamped to ±max of `dtype`, then converted (round to nearest even). ±inf saturate; NaN stays NaN."""
    m = fmax(dtype)
    return x.float().clamp(-m, m).to(dtype)


def amax_to_scale(amax: torch.Tensor, dtype: torch.dtype, power_of_2: bool = False) -> torch.Tensor:
    """scale = max / amax in fp32 (divided in fp64, amax floored at EPS); optionally floored to a power of 2."""
    scale = (fmax(dtype) / amax.double().clamp(min=EPS)).float()
    return torch.exp2(torch.floor(torch.log2(scale))) if power_of_2 else scale


# ---------------------------------------------------------------- recipes

def tensorwise(x: torch.Tensor, dtype: torch.dtype = E4M3) -> tuple[torch.Tensor, torch.Tensor]:
    """One scale for the whole tensor from its amax: (q like x in fp8, scale fp32 scalar)."""
    scale = amax_to_scale(x.abs().max(), dtype)
    return cast(x.float() * scale, dtype), scale


def rowwise(x: torch.Tensor, dim: int = -1, dtype: torch.dtype = E4M3,
            power_of_2: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """One scale per slice, the amax taken along `dim` (dim=-1: per row; dim=0: per column).

    Returns q (x's shape, fp8) and scale (fp32, x's shape with `dim` of size 1). torchao's rowwise
    recipe floors each scale to a power of two, so that scaling changes no mantissa bit.
    """
    scale = amax_to_scale(x.abs().amax(dim=dim, keepdim=True), dtype, power_of_2)
    return cast(x.float() * scale, dtype), scale


def _blocks(x: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, tuple[int, int]]:
    """x (M, K) zero-padded to multiples of block and viewed as (M/b0, b0, K/b1, b1)."""
    if x.dim() != 2:
        raise ValueError(f"blockwise scaling needs a 2-D tensor, got shape {tuple(x.shape)}")
    b0, b1 = block
    M, K = x.shape
    pad = torch.nn.functional.pad(x.float(), (0, -K % b1, 0, -M % b0))
    return pad.view(pad.shape[0] // b0, b0, pad.shape[1] // b1, b1), (M, K)


def blockwise(x: torch.Tensor, block: tuple[int, int] = (1, 128), dtype: torch.dtype = E4M3,
              power_of_2: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """One scale per (b0 x b1) block of a 2-D tensor (DeepSeek-V3: (1, 128) for activations and
    gradients, (128, 128) for weights). Ragged edges are padded with zeros for the amax only.

    Returns q (M, K) fp8 and scale (ceil(M/b0), ceil(K/b1)) fp32.
    """
    if len(block) != 2:
        raise ValueError(f"block={block!r} must be two positive ints")
    positives("block", block)
    tiles, (M, K) = _blocks(x, block)
    scale = amax_to_scale(tiles.abs().amax(dim=(1, 3)), dtype, power_of_2)  # (M/b0, K/b1)
    q = cast(tiles * scale[:, None, :, None], dtype).view(tiles.shape[0] * block[0], -1)
    return q[:M, :K], scale


def expand_scale(scale: torch.Tensor, block: tuple[int, int], shape: tuple[int, int]) -> torch.Tensor:
    """A per-block scale (M/b0, K/b1) repeated to one entry per element, cut to `shape`."""
    full = scale.repeat_interleave(block[0], 0).repeat_interleave(block[1], 1)
    return full[:shape[0], :shape[1]]


def mx(x: torch.Tensor, dtype: torch.dtype = E4M3, block: int = MX_BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """OCP MX block scaling along the last dim: every `block` elements share a power-of-two scale.

    The spec's shared exponent is floor(log2(amax)) - emax, emax being the element format's largest
    exponent (8 for e4m3, 15 for e5m2), clamped to e8m0's range; the block's values are divided by
    2**shared and cast with saturation. Returned here as scale = 2**-shared (multiply to quantise),
    shape (..., ceil(K/block)). An all-zero block gets scale 1.
    """
    emax = math.frexp(fmax(dtype))[1] - 1
    K = x.shape[-1]
    pad = torch.nn.functional.pad(x.float(), (0, -K % block))
    tiles = pad.view(*pad.shape[:-1], -1, block)
    amax = tiles.abs().amax(dim=-1)
    shared = torch.where(amax > 0, torch.floor(torch.log2(amax.clamp(min=2.0 ** -149))) - emax, torch.zeros_like(amax))
    scale = torch.exp2(-shared.clamp(E8M0_MIN, E8M0_MAX))
    q = cast(tiles * scale[..., None], dtype).view(pad.shape)
    return q[..., :K], scale


def element_scales(x: torch.Tensor, recipe: str, dtype: torch.dtype = E4M3, block: int = 128
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """A recipe's fp8 tensor and its scale repeated to one entry per element, for x viewed as (M, K).

    recipe: one of NUMERIC_RECIPES; `block` is the blockwise tile width (1 x block); MX always uses 32.
    Returns (q (M, K) fp8, scale (M, K) fp32), so that x ≈ q / scale elementwise.
    """
    x2 = x.reshape(-1, x.shape[-1]).float()
    if recipe == "tensorwise":
        q, s = tensorwise(x2, dtype)
    elif recipe == "rowwise":
        q, s = rowwise(x2, -1, dtype)
    elif recipe == "blockwise":
        q, s = blockwise(x2, (1, block), dtype)
        s = expand_scale(s, (1, block), x2.shape)
    elif recipe == "mx":
        q, s = mx(x2, dtype)
        s = s.repeat_interleave(MX_BLOCK, -1)[..., :x2.shape[-1]]
    else:
        raise ValueError(f"recipe={recipe!r}; choose one of {', '.join(map(repr, NUMERIC_RECIPES))}")
    return q, s.expand_as(x2)


def quantise(x: torch.Tensor, recipe: str, dtype: torch.dtype = E4M3, block: int = 128) -> torch.Tensor:
    """x quantised with a recipe and dequantised back to fp32 (x's shape): what the matmul effectively sees.

    recipe: one of NUMERIC_RECIPES; `block` is the blockwise tile width (1 x block); MX always uses 32.
    """
    q, s = element_scales(x, recipe, dtype, block)
    return (q.float() / s).reshape(x.shape)


def error_stats(x: torch.Tensor, xq: torch.Tensor) -> dict[str, float]:
    """How far a quantised xq is from x (both (..., K)), in two views.

    rel_error, snr_db: over the whole tensor, ||x - xq|| / ||x|| and 20 log10 of its inverse; the
    largest entries dominate both, so an outlier that is itself kept well hides every row it spoiled.
    row_rel_error, row_snr_db: the same per row (a token), averaged over rows: what a typical
    token loses. Rows that are all zero are left out; an exact result gives SNR inf.
    """
    x2, d2 = x.reshape(-1, x.shape[-1]).double(), (x.double() - xq.double()).reshape(-1, x.shape[-1])
    signal, noise = torch.linalg.vector_norm(x2), torch.linalg.vector_norm(d2)
    rel = (noise / signal).item() if signal > 0 else 0.0
    rows = torch.linalg.vector_norm(x2, dim=-1)
    row_rel = (torch.linalg.vector_norm(d2, dim=-1)[rows > 0] / rows[rows > 0]).mean().item() if (rows > 0).any() else 0.0
    db = lambda r: math.inf if r == 0 else -20 * math.log10(r)  # noqa: E731
    return {"rel_error": rel, "snr_db": db(rel), "row_rel_error": row_rel, "row_snr_db": db(row_rel)}


def saturation_threshold(dtype: torch.dtype = E4M3) -> float:
    """The |value| above which clamping to ±max changes an entry by more than rounding would: max plus half
    the spacing of the format's top binade (e4m3fn: 448 + 16; e5m2: 57344 + 4096). A current-scaling amax
    lands on max up to one fp32 rounding (448.00003), which rounds to 448 anyway: not saturated."""
    f = torch.finfo(dtype)
    return f.max + 2.0 ** math.floor(math.log2(f.max)) * f.eps / 2


def cast_counts(x: torch.Tensor, scale: torch.Tensor | float, dtype: torch.dtype = E4M3) -> dict[str, int]:
    """How a cast at `scale` treats x: entries that saturate (|x·scale| beyond `saturation_threshold`, so
    the clamp, not rounding, decided their value) and nonzero entries that become 0 (underflow)."""
    y = x.float() * scale
    q = cast(y, dtype).float()
    return {"overflow": int((y.abs() > saturation_threshold(dtype)).sum()),
            "underflow": int(((q == 0) & (x != 0)).sum())}


def delayed_update(history: list, amax: float, scale: float, history_len: int, margin: int, algo: str,
                   fp8_max: float) -> tuple[list, float]:
    """One step of delayed scaling: (history with amax pushed, only the newest history_len kept; the scale
    for the next step, fp8_max / reference amax / 2**margin, or `scale` unchanged when the reference, the
    history's max ("max") or last entry ("most_recent"), is 0 or not finite). Plain Python floats."""
    history = (list(history) + [float(amax)])[-history_len:]
    ref = max(history) if algo == "max" else history[-1]
    if ref > 0 and math.isfinite(ref):
        scale = fp8_max / ref / 2.0 ** margin
    return history, scale


class DelayedScaler:
    """Delayed scaling as Transformer Engine's `DelayedScaling` recipe documents it.

    The scale used at step t comes from the amaxes of the previous `history_len` steps (the tensor
    being cast is never looked at before its cast): amax = max of the history ("max") or the last
    entry ("most_recent"), scale = (fp8 max / amax) / 2**margin. Before any history exists the scale
    is 1. A step whose amax is 0 or not finite leaves the scale as it was. Each `cast` casts with the
    current scale, then pushes this tensor's amax into the history and computes the next scale.
    """

    def __init__(self, history_len: int = 16, margin: int = 0, algo: str = "max", dtype: torch.dtype = E4M3):
        positive("history_len", history_len)
        if isinstance(margin, bool) or not isinstance(margin, int) or margin < 0:
            raise ValueError(f"margin={margin!r} must be a non-negative int")
        if algo not in ("max", "most_recent"):
            raise ValueError(f"algo={algo!r}; choose 'max' or 'most_recent'")
        self.history_len, self.margin, self.algo, self.dtype = history_len, margin, algo, _check_dtype(dtype)
        self.history: list[float] = []
        self.scale = torch.tensor(1.0)

    def update(self, amax: float) -> torch.Tensor:
        """Push one step's amax into the history and return the scale for the next step."""
        self.history, scale = delayed_update(self.history, amax, self.scale.item(), self.history_len, self.margin,
                                             self.algo, fmax(self.dtype))
        self.scale = torch.tensor(scale, dtype=torch.float32)
        return self.scale

    def cast(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(q, scale used) for x, then the history update."""
        scale = self.scale
        q = cast(x.float() * scale, self.dtype)
        self.update(x.detach().abs().max().item())
        return q, scale


# ---------------------------------------------------------------- matmuls

_SCALED_MM_REFUSED: dict[tuple, str] = {}
_EMULATE = [False]


@contextlib.contextmanager
def emulated():
    """Within this block every `scaled_mm` takes the fp32 emulation path, not torch._scaled_mm."""
    _EMULATE.append(True)
    try:
        yield
    finally:
        _EMULATE.pop()


def _first_sentence(err: BaseException) -> str:
    """An exception's message cut to what a learner needs: an internal assert's own text is dropped."""
    msg = str(err).splitlines()[0] if str(err) else type(err).__name__
    if "please report a bug to PyTorch." in msg:  # INTERNAL ASSERT FAILED at "...": the reason follows
        msg = msg.split("please report a bug to PyTorch.", 1)[1].strip() or msg
    msg = msg[:160].rstrip()
    return msg if msg.endswith(".") else msg + "."


def scaled_mm_refusal(device: str | torch.device, rowwise: bool = True, aligned: bool = True) -> str | None:
    """Why torch._scaled_mm refused per-row (rowwise=True) or per-tensor scales on `device` in this
    process, so that `scaled_mm` emulated those products in fp32; None if it has not refused them (or
    was not tried yet). torch 2.11 on a CPU, for one, accepts only per-tensor scales.

    aligned=True asks about products whose K and N are multiples of 16 (what every fp8 GEMM of a
    converted layer has when its tokens are too); aligned=False about the others, which CUDA's kernels
    refuse whatever the scales. A refusal of one kind never sends products of the other to the emulation."""
    dev = torch.device(device).type
    return next((why for (d, rw, _, _, al), why in _SCALED_MM_REFUSED.items()
                 if d == dev and rw == rowwise and al == aligned), None)


def mm_aligned(a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> bool:
    """Whether a (M, K) @ b (K, N) has K and N multiples of 16, as torch._scaled_mm requires on CUDA
    (torch's own shape check: mat1.size(1) and both sizes of mat2 divisible by 16; M is free). The
    weight gradient dW = dYᵀ X contracts over the tokens, so there K is the number of tokens."""
    return a_shape[1] % 16 == 0 and b_shape[1] % 16 == 0


def _emulated_mm(a, b, inv_a, inv_b, out_dtype):
    return ((a.float() * inv_a) @ (b.float() * inv_b)).to(out_dtype)


def scaled_mm(a: torch.Tensor, b: torch.Tensor, inv_a: torch.Tensor, inv_b: torch.Tensor,
              out_dtype: torch.dtype = torch.float32, fast_accum: bool = False, emulate: bool = False) -> torch.Tensor:
    """(a / scale_a) @ (b / scale_b) for fp8 a (M, K) and b (K, N); inv_* are 1/scale: scalars, or
    (M, 1) and (1, N) for rowwise. Through torch._scaled_mm (b made column-major, as it requires)
    unless `emulate` or the device refused it once (then fp32 emulation; the reason is kept in
    `_SCALED_MM_REFUSED`, per device, scale kind, dtypes and `mm_aligned`: a refused product with, say, a
    token count that is not a multiple of 16 sends only such products to the emulation, not every later one)."""
    key = (a.device.type, inv_a.numel() > 1, a.dtype, b.dtype, mm_aligned(a.shape, b.shape))
    inv_a, inv_b = inv_a.to(a.device), inv_b.to(a.device)
    if not (emulate or _EMULATE[-1]) and key not in _SCALED_MM_REFUSED and hasattr(torch, "_scaled_mm"):
        a_rm, b_cm = a.contiguous(), b.t().contiguous().t()  # row-major a, column-major b
        try:
            out = torch._scaled_mm(a_rm, b_cm, scale_a=inv_a, scale_b=inv_b, out_dtype=out_dtype,
                                   use_fast_accum=fast_accum)
            return out[0] if isinstance(out, tuple) else out  # torch 2.4 returned (out, amax)
        except (RuntimeError, NotImplementedError) as err:
            _SCALED_MM_REFUSED[key] = _first_sentence(err)
    return _emulated_mm(a, b, inv_a, inv_b, out_dtype)


def _emulated_blockwise_mm(qa, sa, qb, sb, block, b_rows, out_dtype):
    M, K = qa.shape
    N = qb.shape[0]
    inv_b = expand_scale(1.0 / sb, (b_rows, 1), (N, sb.shape[1]))  # (N, K/block)
    out = torch.zeros(M, N, dtype=torch.float32, device=qa.device)
    for c, k0 in enumerate(range(0, K, block)):
        part = qa[:, k0:k0 + block].float() @ qb[:, k0:k0 + block].float().t()  # (M, N), one chunk
        out += part * (1.0 / sa[:, c:c + 1]) * inv_b[:, c][None, :]
    return out.to(out_dtype)


BLOCKWISE_PATH: dict[tuple, str] = {}  # (device, b_rows) -> "native, scales <layout>" or "emulated: <why>"
_SCALE_LAYOUTS = {"row-major": lambda s: s.contiguous(), "column-major": lambda s: s.t().contiguous().t()}


def _native_blockwise_mm(qa, sa, qb, sb, b_rows, layout):
    F = torch.nn.functional
    rec_b = F.ScalingType.BlockWise128x128 if b_rows == 128 else F.ScalingType.BlockWise1x128
    fix = _SCALE_LAYOUTS[layout]
    return F.scaled_mm(qa.contiguous(), qb.contiguous().t(), fix(sa.reciprocal()), F.ScalingType.BlockWise1x128,
                       fix(sb.reciprocal()), rec_b, output_dtype=torch.bfloat16)


def blockwise_mm(qa: torch.Tensor, sa: torch.Tensor, qb: torch.Tensor, sb: torch.Tensor,
                 block: int = 128, b_rows: int = 128, out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """y = A Bᵀ for A (M, K) in 1 x block tiles (scale sa (M, K/block)) and B (N, K) in b_rows x block
    blocks (scale sb (N/b_rows, K/block); b_rows = block for weights, 1 for activations), as
    DeepSeek-V3 computes it: each K-chunk of `block` is multiplied on its own, its partial sum
    dequantised with that chunk's scales and added in fp32 (the "promotion to fp32 every 128 along
    K"). Emulated with one fp32 matmul per chunk; the result is (M, N) in out_dtype.

    On CUDA, torch.nn.functional.scaled_mm's blockwise recipes are tried once per (device, b_rows):
    a layout is kept only if it reproduces the emulation to bf16 rounding (2**-7 of the output's largest
    value); otherwise the emulation is used, and `BLOCKWISE_PATH` says which path ran and why.
    """
    key = (qa.device.type, b_rows)
    native = (qa.is_cuda and block == 128 and not _EMULATE[-1] and hasattr(torch.nn.functional, "scaled_mm")
              and qa.shape[1] % 128 == 0 and not BLOCKWISE_PATH.get(key, "").startswith("emulated"))
    if native and key in BLOCKWISE_PATH:
        return _native_blockwise_mm(qa, sa, qb, sb, b_rows, BLOCKWISE_PATH[key].split()[-1]).to(out_dtype)
    ref = _emulated_blockwise_mm(qa, sa, qb, sb, block, b_rows, out_dtype)
    if native:
        why = "no scale layout matched the emulation"
        for layout in _SCALE_LAYOUTS:
            try:
                y = _native_blockwise_mm(qa, sa, qb, sb, b_rows, layout).float()
            except (RuntimeError, ValueError, NotImplementedError) as err:
                why = str(err).splitlines()[0][:150]
                continue
            if (y - ref.float()).abs().max() <= 2.0 ** -7 * ref.float().abs().max():
                BLOCKWISE_PATH[key] = f"native, scales {layout}"
                return y.to(out_dtype)
        BLOCKWISE_PATH[key] = f"emulated: {why}"
    elif key not in BLOCKWISE_PATH:
        BLOCKWISE_PATH[key] = "emulated: " + ("torch.nn.functional.scaled_mm's blockwise recipes need CUDA"
                                              if not qa.is_cuda else "K is not a multiple of 128, or emulation asked for")
    return ref


# ---------------------------------------------------------------- the layer

def _matmul_fwd(x, w, recipe, scalers):
    """y = x wᵀ for x (M, K), w (N, K) cast per recipe; also the forward's (x, w) scales for backward."""
    if recipe in ("tensorwise", "delayed"):
        (qx, sx), (qw, sw) = ((scalers[0].cast(x), scalers[1].cast(w)) if recipe == "delayed"
                              else (tensorwise(x), tensorwise(w)))
        return scaled_mm(qx, qw.t(), sx.reciprocal(), sw.reciprocal(), x.dtype, fast_accum=True), (sx, sw)
    if recipe == "rowwise":  # per row of x, per output row of w; torchao's rowwise kernel returns bf16
        (qx, sx), (qwt, sw) = rowwise(x, -1), rowwise(w.t(), 0)
        return scaled_mm(qx, qwt, sx.reciprocal(), sw.reciprocal(), torch.bfloat16, fast_accum=True).to(x.dtype), None
    (qx, sx), (qw, sw) = blockwise(x, (1, 128)), blockwise(w, (128, 128))
    return blockwise_mm(qx, sx, qw, sw, 128, 128, x.dtype), None


def _rowwise_mm(a, a_dim, b, b_dim, dtype, out_dtype):
    """a @ b with a scaled along a_dim and b along b_dim, torchao's rowwise backward: an unscaled fp8
    product in bf16, then multiplied by both inverse scales (an fp32 (M, N) factor) in bf16."""
    (qa, sa), (qb, sb) = rowwise(a, a_dim, dtype), rowwise(b, b_dim, dtype)
    one = torch.ones((), device=a.device)
    out = scaled_mm(qa, qb, one, one, torch.bfloat16)
    out *= sa.reciprocal() * sb.reciprocal()
    return out.to(out_dtype)


def _matmul_bwd(x, w, dy, recipe, scalers, fwd_scales):
    """(dx, dw) = (dy w, dyᵀ x) for dy (M, N), with dy cast per recipe (e5m2 for tensorwise/delayed)."""
    if recipe in ("tensorwise", "delayed"):
        if recipe == "delayed":
            (qg, sg), (sx, sw) = scalers[2].cast(dy), fwd_scales
            qx, qw = cast(x.float() * sx), cast(w.float() * sw)
        else:
            (qg, sg), (qx, sx), (qw, sw) = tensorwise(dy, E5M2), tensorwise(x), tensorwise(w)
        inv_g = sg.reciprocal()
        dx = scaled_mm(qg, qw, inv_g, sw.reciprocal(), x.dtype)
        dw = scaled_mm(qg.t(), qx, inv_g, sx.reciprocal(), x.dtype)
        return dx, dw
    if recipe == "rowwise":  # e4m3 for the gradient too; scales along each product's outer dims
        return _rowwise_mm(dy, -1, w, 0, E4M3, x.dtype), _rowwise_mm(dy.t(), -1, x, 0, E4M3, x.dtype)
    qg, sg = blockwise(dy, (1, 128))
    qwt, swt = blockwise(w.t(), (128, 128))
    dx = blockwise_mm(qg, sg, qwt, swt, 128, 128, x.dtype)  # (M, K): contraction over N
    qgt, sgt = blockwise(dy.t(), (1, 128))  # 128 x 1 tiles of dy: contraction over tokens
    qxt, sxt = blockwise(x.t(), (1, 128))
    return dx, blockwise_mm(qgt, sgt, qxt, sxt, 128, 1, x.dtype)


class Float8Matmul(torch.autograd.Function):
    """y = x Wᵀ with both operands in fp8 per `recipe`; backward dX = dY W and dW = dYᵀ X in fp8.

    x (M, K) and W (N, K) are kept in high precision for backward (casts are recomputed there, as
    torchao does), except that "delayed" reuses its forward scales.
    """

    @staticmethod
    def forward(ctx, x, w, recipe, scalers):
        y, fwd_scales = _matmul_fwd(x, w, recipe, scalers)
        ctx.save_for_backward(x, w)
        ctx.recipe, ctx.scalers, ctx.fwd_scales = recipe, scalers, fwd_scales
        return y

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        dx, dw = _matmul_bwd(x, w, dy.contiguous(), ctx.recipe, ctx.scalers, ctx.fwd_scales)
        return dx, dw, None, None


class Float8Linear(nn.Linear):
    """nn.Linear computing y = x Wᵀ + b through `Float8Matmul`; x (..., in_features) -> (..., out_features).

    recipe: one of RECIPES; "delayed" keeps a `DelayedScaler` for x, W (e4m3) and dY (e5m2) with
    `history_len`. The bias is added in high precision after the product.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, recipe: str = "tensorwise",
                 history_len: int = 16, device=None, dtype=None):
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        if recipe not in RECIPES:
            raise ValueError(f"recipe={recipe!r}; choose one of {', '.join(map(repr, RECIPES))}")
        self.recipe = recipe
        self.scalers = ((DelayedScaler(history_len), DelayedScaler(history_len), DelayedScaler(history_len, dtype=E5M2))
                        if recipe == "delayed" else None)

    @classmethod
    def from_linear(cls, lin: nn.Linear, recipe: str, history_len: int = 16) -> "Float8Linear":
        """A Float8Linear sharing `lin`'s weight and bias (the same Parameter objects)."""
        new = cls(lin.in_features, lin.out_features, bias=lin.bias is not None, recipe=recipe,
                  history_len=history_len, device="meta")
        new.weight, new.bias = lin.weight, lin.bias
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        device = x.device.type
        if torch.is_autocast_enabled(device):  # as F.linear under autocast (and torchao): the input is
            x = x.to(torch.get_autocast_dtype(device))  # cast to the autocast dtype, so y comes out in it
        with torch.autocast(device, enabled=False):  # the recipe's own arithmetic, untouched by autocast
            y = Float8Matmul.apply(x.reshape(-1, x.shape[-1]), self.weight, self.recipe, self.scalers)
        y = y.reshape(*x.shape[:-1], self.out_features)
        return y + self.bias.to(y.dtype) if self.bias is not None else y

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, recipe={self.recipe}"


def convert_to_float8(model: nn.Module, recipe: str, module_filter: Callable[[nn.Module, str], bool] | None = None,
                      history_len: int = 16, skip: tuple[str, ...] = ("lm_head",)) -> dict[str, object]:
    """Swap the nn.Linear layers of `model` for Float8Linear in place; return what was done.

    Skipped, with the reason: names in `skip` (the LM head: the logits' precision matters most and
    the course GPT ties it to the embedding), layers whose in or out features are not multiples of
    16 (what fp8 matmul kernels require), and layers `module_filter(module, name)` refuses.
    Returns {"converted": [names], "skipped": {name: reason}}.
    """
    if recipe not in RECIPES:
        raise ValueError(f"recipe={recipe!r}; choose one of {', '.join(map(repr, RECIPES))}")
    converted, skipped = [], {}
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            if type(child) is not nn.Linear:
                continue
            if child_name in skip or full in skip:
                skipped[full] = "LM head"
            elif child.in_features % 16 or child.out_features % 16:
                skipped[full] = f"{child.in_features}x{child.out_features} not multiples of 16"
            elif module_filter is not None and not module_filter(child, full):
                skipped[full] = "refused by module_filter"
            else:
                setattr(module, child_name, Float8Linear.from_linear(child, recipe, history_len))
                converted.append(full)
    return {"converted": converted, "skipped": skipped}


# ---------------------------------------------------------------- torchao, quietly

def import_torchao():
    """torchao.float8, imported with its import-time noise silenced (logged warnings about optional
    CUDA extensions, deprecation warnings); returns (module, None) or (None, reason)."""
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            import torchao.float8 as ao_float8  # heavy and noisy: imported here, with its warnings silenced
        return ao_float8, None
    except Exception as err:  # ImportError, or a torch/torchao version mismatch raising at import
        return None, f"torchao could not be imported ({type(err).__name__}: {str(err).splitlines()[0][:120]})"
    finally:
        logging.disable(previous)


TORCHAO_RECIPES = ("tensorwise", "rowwise")  # the torchao recipes this course compares against
_TORCHAO_PROBLEMS: dict[tuple[str, str], str | None] = {}


def torchao_problem(recipe: str, device: str | torch.device = "cpu") -> str | None:
    """None when torchao's float8 training with `recipe` runs here; else one sentence saying why not.

    The probe: a tiny fp32 linear (32 -> 32, bias, 16 tokens) converted by torchao with `recipe`, one
    forward and backward on `device`; its outcome is cached per (recipe, device type). Catches, for
    example, torch 2.11 on a CPU, whose torch._scaled_mm accepts only per-tensor scales, so that
    torchao's rowwise recipe raises there while its tensorwise recipe runs.
    Raises ValueError for a recipe outside TORCHAO_RECIPES.
    """
    if recipe not in TORCHAO_RECIPES:
        raise ValueError(f"recipe={recipe!r}; choose one of {', '.join(map(repr, TORCHAO_RECIPES))}")
    dev = torch.device(device)
    key = (recipe, dev.type)
    if key not in _TORCHAO_PROBLEMS:
        ao, why = import_torchao()
        if ao is None:
            _TORCHAO_PROBLEMS[key] = why.rstrip(".") + "."
        else:
            try:
                with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []):
                    torch.manual_seed(0)
                    lin = torchao_convert(nn.Sequential(nn.Linear(32, 32, device=dev)), recipe)
                    x = torch.randn(16, 32, device=dev, requires_grad=True)
                    lin(x).sum().backward()
                _TORCHAO_PROBLEMS[key] = None
            except Exception as err:  # noqa: BLE001: any failure means "cannot compare here", said once
                _TORCHAO_PROBLEMS[key] = (f"torchao's {recipe} recipe does not run on {dev.type} with torch "
                                          f"{torch.__version__}, which raises {type(err).__name__}: {_first_sentence(err)}")
    return _TORCHAO_PROBLEMS[key]


def torchao_convert(model: nn.Module, recipe: str, skip: tuple[str, ...] = ("lm_head",),
                    emulate: bool = False) -> nn.Module:
    """torchao's convert_to_float8_training on `model` in place with its named recipe and our skips.

    emulate=True sets torchao's own `emulate` option: each fp8 product runs as an fp32 matmul of the
    same fp8 values and scales (what `emulated()` does for ours), not torch._scaled_mm.
    Raises RuntimeError saying why when torchao cannot be imported."""
    ao, why = import_torchao()
    if ao is None:
        raise RuntimeError(why)
    config = ao.Float8LinearConfig.from_recipe_name(recipe)
    if emulate:
        config = dataclasses.replace(config, emulate=True)
    keep = lambda mod, fqn: fqn.split(".")[-1] not in skip and fqn not in skip  # noqa: E731
    return ao.convert_to_float8_training(model, config=config, module_filter_fn=keep)
