"""FP8 from scratch: the formats and the scaling recipes (notebook 07).

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
* What a recipe costs: `quantise` / `element_scales` (x through a recipe and back), `error_stats`,
  `saturation_threshold` and `cast_counts` (entries that saturate or underflow).

The fp8 matmuls, `Float8Linear` and the model swap are `helpers.lowbit.fp8_linear`; the notebook's
measurements are `helpers.lowbit.fp8_lab` and `helpers.lowbit.fp8_train_lab`.
"""
from __future__ import annotations

import math

import torch

from helpers.measure.params import positive, positives
from helpers.training import precision

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
FORMAT_NAMES = {E4M3: "fp8-e4m3fn", E5M2: "fp8-e5m2"}  # the names helpers.training.precision knows them by
EPS = 1e-12  # amax floor, so that an all-zero tensor gets a finite scale (torchao uses the same)
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
    m = fmax(dtype)  # 448 for e4m3fn, 57344 for e5m2
    # clamp first: a plain .to() need not saturate the same way in both formats or on every device
    return x.float().clamp(-m, m).to(dtype)


def amax_to_scale(amax: torch.Tensor, dtype: torch.dtype, power_of_2: bool = False) -> torch.Tensor:
    """scale = max / amax in fp32 (divided in fp64, amax floored at EPS); optionally floored to a power of 2."""
    scale = (fmax(dtype) / amax.double().clamp(min=EPS)).float()  # amax * scale lands on the format's max
    # a power of two changes only the exponent, so multiplying by it adds no rounding of its own
    return torch.exp2(torch.floor(torch.log2(scale))) if power_of_2 else scale


# ---------------------------------------------------------------- recipes

def tensorwise(x: torch.Tensor, dtype: torch.dtype = E4M3) -> tuple[torch.Tensor, torch.Tensor]:
    """One scale for the whole tensor from its amax: (q like x in fp8, scale fp32 scalar)."""
    scale = amax_to_scale(x.abs().max(), dtype)  # one read of the whole tensor for its amax
    return cast(x.float() * scale, dtype), scale  # a second read, scaled and cast; x is approximately q / scale


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
    # Python's max() keeps a NaN only when it comes first; a NaN anywhere in the window makes the reference NaN,
    # as a tensor amax over the history does in Transformer Engine, so the scale is left as it was
    ref = (math.nan if any(h != h for h in history) else max(history)) if algo == "max" else history[-1]
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
