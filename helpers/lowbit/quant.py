"""Quantisation formats from scratch: absmax / zero-point integers, int4 packing, NF4 and double quantisation.

Every quantiser here rounds to nearest (RTN), the baseline GPTQ and AWQ improve on.

* **Integer grids.** `quantize(w, bits, scheme, granularity)` maps a float tensor to b-bit integers:
  - absmax (symmetric): scale = max|w| / (2^(b-1) - 1), q = round(w / scale) in [-(2^(b-1)-1), 2^(b-1)-1];
  - zero-point (asymmetric): scale = (max - min) / (2^b - 1), zero = round(-min / scale),
    q = clamp(round(w / scale) + zero, 0, 2^b - 1), so a one-sided range uses every level.
  One scale per tensor ("tensor"), per output row of a (out, in) weight ("channel"), or per run of
  `group_size` consecutive inputs of a row (an int: "group-wise", blockwise).
* **int4 storage.** `pack_int4` stores two 4-bit codes per byte (element 2i in the low nibble, 2i+1 in
  the high one); `unpack_int4` inverts it.
* **NF4** (Dettmers et al., 2023, "QLoRA: Efficient Finetuning of Quantized LLMs"): 16 levels at quantiles
  of N(0, 1) with an exact zero, 7 negative and 8 positive non-zero levels scaled to [-1, 1]. Each block of
  `blocksize` consecutive values (row-major flattening) is divided by its absmax and each value snaps to
  the nearest level. `nf4_codebook()` follows bitsandbytes' `create_normal_map(offset=0.9677083)` recipe
  and equals its table bit for bit; `nf4_quantize` / `nf4_dequantize` equal bitsandbytes'
  `quantize_4bit` / `dequantize_4bit` (quant_type "nf4") bit for bit (tests/lowbit/test_lowbit_quant.py).
  Facts of bitsandbytes' layout used here (read from its source, 0.50): the first element of each pair
  sits in the HIGH nibble; a value exactly on a midpoint between two levels goes to the lower level; the
  last block may be partial; absmax is kept in fp32.
* **Double quantisation** (QLoRA, section 3): the fp32 absmax constants themselves are quantised to 8
  bits in blocks of 256 after subtracting their mean, with bitsandbytes' signed dynamic 8-bit map
  (`dynamic_map()`, the same recipe as its `create_dynamic_map`, bit for bit). Our 8-bit codes of the
  constants are the nearest levels; bitsandbytes' CPU search picks the neighbouring level for some
  constants near a midpoint, so there the two agree to one level, not bit for bit. Bits per parameter
  are counted from the state's tensors by `bits_per_param`: 4 + 32/64 = 4.5 without, about
  4 + 8/64 + 32/(64*256) = 4.127 with.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import torch

from helpers.measure.params import positive

SCHEMES = ("absmax", "zeropoint")
NF4_OFFSET = 0.9677083  # QLoRA's outermost quantile, as in bitsandbytes' create_normal_map


# ---------------------------------------------------------------- integer grids

@dataclass
class Quantized:
    """b-bit integer codes with their scales: `q` (same shape as the source: int8 codes for absmax, uint8
    for zero-point; uint8 packed pairs, last dimension halved, when `packed`), `scale` and `zero` (float32,
    one per block; zero is None for absmax), `block` (values per scale), the source `shape`, `bits` and
    `scheme`."""

    q: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor | None
    block: int
    shape: tuple
    bits: int
    scheme: str
    packed: bool = False

    def nbytes(self) -> int:
        """Bytes of every tensor of the state (codes at their storage width, scales, zeros)."""
        return sum(t.numel() * t.element_size() for t in (self.q, self.scale, self.zero) if t is not None)

    def bits_per_param(self) -> float:
        """Storage bits per source value, measured from the state's tensors (codes are bytes unless
        packed: store int4 with `pack=True` to see 4)."""
        return 8 * self.nbytes() / math.prod(self.shape)

    def packed_bits_per_param(self) -> float:
        """Bits per source value if the codes were packed at `bits` each (scales and zeros as stored):
        what a 3- or 2-bit format costs in a kernel that packs it; equal to `bits_per_param` for packed int4."""
        meta = sum(t.numel() * t.element_size() for t in (self.scale, self.zero) if t is not None)
        return self.bits + 8 * meta / math.prod(self.shape)


def block_size(shape: tuple, granularity: "str | int") -> int:
    """Values per scale for a tensor of `shape`: all of them ("tensor"), one row of the last dimension
    ("channel": a (out, in) weight gets one scale per output), or an int group size, which must divide
    the last dimension. Raises ValueError otherwise."""
    if granularity == "tensor":
        return math.prod(shape)
    if granularity == "channel":
        return shape[-1]
    if isinstance(granularity, str):
        raise ValueError(f"granularity must be 'tensor', 'channel' or a positive group size, not {granularity!r}")
    positive("granularity", granularity)
    if shape[-1] % granularity:
        raise ValueError(f"group size {granularity} does not divide the last dimension {shape[-1]}")
    return granularity


def quantize(w: torch.Tensor, bits: int = 8, scheme: str = "absmax", granularity: "str | int" = "channel",
             *, pack: bool = False) -> Quantized:
    """Round-to-nearest quantisation of `w` (any shape, last dimension = inputs) to `bits` (2..8).

    Returns a `Quantized`; `dequantize` inverts it. `pack=True` (bits=4 only) stores codes two per byte.
    An all-zero block gets scale 1 (it dequantises to zeros exactly). Raises ValueError for bits outside
    2..8, an unknown scheme or granularity, or pack with bits != 4.
    """
    if isinstance(bits, bool) or not isinstance(bits, int) or not 2 <= bits <= 8:
        raise ValueError(f"bits must be an int from 2 to 8, not {bits!r}")
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}, not {scheme!r}")
    if pack and bits != 4:
        raise ValueError("pack=True needs bits=4 (two codes per byte)")
    block = block_size(tuple(w.shape), granularity)
    x = w.detach().float().reshape(-1, block)
    if scheme == "absmax":
        qmax = 2 ** (bits - 1) - 1
        amax = x.abs().amax(1, keepdim=True)
        scale = torch.where(amax > 0, amax / qmax, torch.ones_like(amax))
        q = torch.clamp(torch.round(x / scale), -qmax, qmax)
        zero = None
    else:
        qmax = 2 ** bits - 1
        lo = x.amin(1, keepdim=True).clamp(max=0)  # the range always holds 0, so 0 is exact
        hi = x.amax(1, keepdim=True).clamp(min=0)
        scale = torch.where(hi > lo, (hi - lo) / qmax, torch.ones_like(hi))
        zero = torch.clamp(torch.round(-lo / scale), 0, qmax)
        q = torch.clamp(torch.round(x / scale) + zero, 0, qmax)
        zero = zero.reshape(-1)
    codes = q.to(torch.uint8 if scheme == "zeropoint" else torch.int8).reshape(w.shape)
    if pack:
        codes = pack_int4(codes.to(torch.int16) + (8 if scheme == "absmax" else 0))
    return Quantized(codes, scale.reshape(-1), zero, block, tuple(w.shape), bits, scheme, pack)


def dequantize(qt: Quantized) -> torch.Tensor:
    """Float32 values of a `Quantized` state, in the source shape: (q - zero) * scale per block."""
    q = unpack_int4(qt.q).to(torch.int16) - (8 if qt.scheme == "absmax" else 0) if qt.packed else qt.q
    x = q.float().reshape(-1, qt.block)
    if qt.zero is not None:
        x = x - qt.zero.reshape(-1, 1)
    return (x * qt.scale.reshape(-1, 1)).reshape(qt.shape)


def fake_quantize(w: torch.Tensor, bits: int = 8, scheme: str = "absmax",
                  granularity: "str | int" = "channel") -> torch.Tensor:
    """`dequantize(quantize(w, ...))` in w's dtype: the weight a quantised model effectively uses."""
    return dequantize(quantize(w, bits, scheme, granularity)).to(w.dtype)


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """Pack 4-bit codes (integers 0..15, last dimension even) two per byte: (..., n) -> uint8 (..., n/2),
    element 2i in the low nibble, 2i+1 in the high nibble. Raises ValueError for an odd last dimension
    or a code outside 0..15."""
    if codes.shape[-1] % 2:
        raise ValueError(f"the last dimension ({codes.shape[-1]}) must be even to pack two codes per byte")
    if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) > 15):
        raise ValueError("int4 codes must lie in 0..15 (shift signed codes by 8 first)")
    c = codes.to(torch.uint8)
    return c[..., 0::2] | (c[..., 1::2] << 4)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of `pack_int4`: uint8 (..., n/2) -> uint8 codes 0..15 of shape (..., n)."""
    if packed.dtype != torch.uint8:
        raise ValueError(f"packed codes must be uint8, not {packed.dtype}")
    low, high = packed & 0xF, packed >> 4
    return torch.stack([low, high], -1).reshape(*packed.shape[:-1], 2 * packed.shape[-1])


def error(w: torch.Tensor, w_hat: torch.Tensor) -> float:
    """Relative quantisation error ||w - w_hat|| / ||w|| (Frobenius), a float."""
    w, w_hat = w.detach().float(), w_hat.detach().float()
    return float((w - w_hat).norm() / w.norm().clamp(min=1e-30))


# ---------------------------------------------------------------- NF4 and double quantisation

def nf4_codebook(offset: float = NF4_OFFSET) -> torch.Tensor:
    """The 16 NF4 levels (float32, ascending, -1 ... 0 ... 1) for `offset`, QLoRA's outermost quantile
    (a copy of the cached table `_nf4_codebook` builds)."""
    return _nf4_codebook(offset).clone()


@lru_cache(maxsize=4)
def _nf4_codebook(offset: float) -> torch.Tensor:
    """The 16 NF4 levels (float32, ascending, -1 ... 0 ... 1) built with QLoRA's recipe.

    Positive side: the normal quantiles at 8 evenly spaced probabilities from `offset` down to 0.5,
    dropping 0.5 itself; negative side: minus the quantiles at 7 probabilities from `offset` to 0.5;
    plus an exact 0. The probabilities are float32 (as torch.linspace makes them), the quantiles are
    taken in float64 (torch.special.ndtri, the inverse normal CDF), stored as float32, sorted, and
    divided by the largest. Equal to bitsandbytes' table bit for bit at the default offset.
    """
    pos = torch.special.ndtri(torch.linspace(offset, 0.5, 9)[:-1].double())
    neg = -torch.special.ndtri(torch.linspace(offset, 0.5, 8)[:-1].double())
    levels = torch.cat([pos, torch.zeros(1, dtype=torch.float64), neg]).float().sort().values
    return levels / levels.max()


def dynamic_map() -> torch.Tensor:
    """bitsandbytes' signed dynamic 8-bit map: 256 float32 values in [-1, 1], ascending (a copy of the
    cached table `_dynamic_map` builds)."""
    return _dynamic_map().clone()


@lru_cache(maxsize=1)
def _dynamic_map() -> torch.Tensor:
    """bitsandbytes' signed dynamic 8-bit map (256 float32 values in [-1, 1], ascending), the code the
    absmax constants are stored with under double quantisation (Dettmers et al., 2022, "8-bit Optimizers
    via Block-wise Quantization"). Each of 7 decades 10^-6..10^0 holds evenly spaced means of
    [0.1, 1] sub-intervals (twice as many per decade as the one before), mirrored for negatives, plus 0 and 1."""
    data: list[float] = []
    max_exp = 7
    for i in range(max_exp):
        bounds = torch.linspace(0.1, 1, 2 ** i + 1, dtype=torch.float32)
        means = ((bounds[:-1] + bounds[1:]) / 2.0)
        data += (10 ** (-(max_exp - 1) + i) * means).tolist()
        data += (-(10 ** (-(max_exp - 1) + i)) * means).tolist()
    data += [0.0, 1.0]
    data += [0.0] * (256 - len(data))
    return torch.tensor(sorted(data), dtype=torch.float32)


@dataclass
class NF4State:
    """An NF4-quantised tensor: `packed` uint8 (ceil(n/2), 1) codes, first of a pair in the high nibble;
    `absmax` float32 (one per block) or, with double quantisation, uint8 codes of (absmax - `offset`) with
    `absmax2` (float32, one per 256 constants) and `code2` (the 256-value dynamic map); `shape`, `blocksize`."""

    packed: torch.Tensor
    absmax: torch.Tensor
    shape: tuple
    blocksize: int
    offset: torch.Tensor | None = None
    absmax2: torch.Tensor | None = None
    code2: torch.Tensor | None = None

    @property
    def compress_statistics(self) -> bool:
        """Whether the absmax constants are double-quantised (bitsandbytes' name for it)."""
        return self.absmax2 is not None

    def nbytes(self, *, with_codes: bool = False) -> int:
        """Bytes of the state's tensors: codes, absmax, and under double quantisation the offset and the
        second-level absmax. The 256-entry map (shared by every tensor) counts only with `with_codes`."""
        parts = [self.packed, self.absmax, self.offset, self.absmax2] + ([self.code2] if with_codes else [])
        return sum(t.numel() * t.element_size() for t in parts if t is not None)

    def bits_per_param(self) -> float:
        """Storage bits per source value, from `nbytes()` over the element count."""
        return 8 * self.nbytes() / math.prod(self.shape)


def block_absmax(flat: torch.Tensor, blocksize: int) -> torch.Tensor:
    """max |x| of each block of `blocksize` consecutive values of a 1-D tensor (the last block may be shorter)."""
    pad = -flat.numel() % blocksize
    return torch.nn.functional.pad(flat.abs(), (0, pad)).reshape(-1, blocksize).amax(1)


def nf4_quantize(w: torch.Tensor, blocksize: int = 64, *, compress_statistics: bool = False) -> NF4State:
    """Blockwise NF4 of `w` (fp32/fp16/bf16, any shape; flattened row-major), RTN to the nearest level.

    Returns an `NF4State`; `nf4_dequantize` inverts it. compress_statistics=True (bitsandbytes' name for
    double quantisation) quantises the absmax constants too (blocks of 256, 8-bit dynamic map, after
    subtracting their mean). Raises ValueError for a blocksize
    that is not a power of two from 32 to 4096 (bitsandbytes' range), or an empty tensor.
    """
    if isinstance(blocksize, bool) or not isinstance(blocksize, int) or blocksize < 32 or blocksize > 4096 \
            or blocksize & (blocksize - 1):
        raise ValueError(f"blocksize must be a power of two from 32 to 4096, not {blocksize!r}")
    if w.numel() == 0:
        raise ValueError("cannot quantise an empty tensor")
    code = nf4_codebook()  # the 16 levels in [-1, 1], ascending
    mids = (code[:-1] + code[1:]) / 2  # the 15 boundaries between neighbouring levels
    flat = w.reshape(-1).float()  # read: every value once, row-major, in fp32
    absmax = block_absmax(flat, blocksize)  # one fp32 constant per block: the largest |value| in it
    full = (flat.numel() // blocksize) * blocksize  # values in whole blocks
    inv = 1.0 / absmax.clamp(min=1e-38)  # bitsandbytes multiplies by 1/absmax (a block of zeros stays 0)
    scaled = torch.empty_like(flat)
    scaled[:full] = (flat[:full].reshape(-1, blocksize) * inv[: full // blocksize, None]).reshape(-1)
    if full < flat.numel():
        scaled[full:] = flat[full:] / absmax[-1].clamp(min=1e-38)  # bitsandbytes divides the tail block
    scaled = scaled.clamp(-1, 1)  # every value now in [-1, 1], the codebook's range
    idx = (scaled[:, None] > mids).sum(1).to(torch.uint8)  # a value on a midpoint takes the lower level
    if idx.numel() % 2:
        idx = torch.cat([idx, torch.full((1,), 7, dtype=torch.uint8)])  # pad with the code of 0
    packed = ((idx[0::2] << 4) | idx[1::2]).unsqueeze(1)  # write: two codes a byte, the first in the HIGH nibble
    state = NF4State(packed, absmax, tuple(w.shape), blocksize)
    if compress_statistics:  # double quantisation: the constants themselves in 8 bits, blocks of 256
        state.offset = absmax.mean()  # all positive: centred, they use both halves of the signed map
        state.absmax, state.absmax2 = quantize_blockwise8(absmax - state.offset, 256)
        state.code2 = dynamic_map()
    return state


def quantize_blockwise8(x: torch.Tensor, blocksize: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """8-bit blockwise quantisation with the dynamic map: (uint8 codes of x's shape, float32 absmax per
    block). Each value divided by its block's absmax goes to the nearest of the 256 levels."""
    code = dynamic_map()
    flat = x.reshape(-1).float()
    absmax = block_absmax(flat, blocksize)
    scaled = flat / absmax.repeat_interleave(blocksize)[: flat.numel()]
    # the level at or left of the value, then its right neighbour if strictly closer. bitsandbytes' CPU kernel
    # finds the left level with an approximate search and picks the other neighbour for some values that lie
    # near a midpoint, so the codes agree to one level (tests/lowbit/test_lowbit_quant.py bounds how many differ).
    left = (torch.searchsorted(code, scaled, right=True) - 1).clamp(0, 255)
    right = (left + 1).clamp(max=255)
    idx = torch.where((scaled - code[right]).abs() < (scaled - code[left]).abs(), right, left).to(torch.uint8)
    return idx.reshape(x.shape), absmax


def dequantize_blockwise8(codes: torch.Tensor, absmax: torch.Tensor, blocksize: int = 256) -> torch.Tensor:
    """Float32 values of `quantize_blockwise8`'s codes: map[code] * absmax of its block."""
    vals = dynamic_map()[codes.reshape(-1).long()]
    return (vals * absmax.repeat_interleave(blocksize)[: vals.numel()]).reshape(codes.shape)


def nf4_absmax(state: NF4State) -> torch.Tensor:
    """The float32 absmax per block (recovered from its 8-bit codes under double quantisation)."""
    if not state.compress_statistics:
        return state.absmax
    return dequantize_blockwise8(state.absmax, state.absmax2, 256) + state.offset


def nf4_dequantize(state: NF4State, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Values of an `NF4State` in `dtype` and the source shape: level[code] * absmax of its block,
    computed in float32 and then cast (as bitsandbytes does)."""
    n = math.prod(state.shape)
    p = state.packed.reshape(-1)  # read: the packed bytes, half a byte a value
    idx = torch.stack([p >> 4, p & 0xF], 1).reshape(-1)[:n].long()  # high nibble first, the padding dropped
    vals = nf4_codebook()[idx]  # each code's level in [-1, 1]
    scale = nf4_absmax(state).repeat_interleave(state.blocksize)[:n]  # its block's absmax (from 8 bits under DQ)
    return (vals * scale).reshape(state.shape).to(dtype)  # write: level x absmax, cast last


def nf4_fake_quantize(w: torch.Tensor, blocksize: int = 64, compress_statistics: bool = False) -> torch.Tensor:
    """`nf4_dequantize(nf4_quantize(w, ...))` in w's dtype."""
    return nf4_dequantize(nf4_quantize(w, blocksize, compress_statistics=compress_statistics), w.dtype)


# ---------------------------------------------------------------- one entry point by method name

METHODS = ("int8", "int4", "nf4", "nf4-dq")


def fake_quant(w: torch.Tensor, method: str, group: "str | int" = 64) -> torch.Tensor:
    """The weight `w` after quantisation by `method`, in w's dtype:

    "int8" / "int4": absmax RTN at that width with `group` ("tensor", "channel" or a group size);
    "nf4" / "nf4-dq": NF4 with block size `group` (an int), without / with double quantisation.
    Raises ValueError for an unknown method or an unusable group.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, not {method!r}")
    if method.startswith("nf4"):
        if not isinstance(group, int) or isinstance(group, bool):
            raise ValueError(f"NF4 needs an integer block size, not {group!r}")
        return nf4_fake_quantize(w, group, method == "nf4-dq")
    return fake_quantize(w, 8 if method == "int8" else 4, "absmax", group)


def method_bits(method: str, group: "str | int", shape: tuple) -> float:
    """Storage bits per parameter of `method` at `group` on a tensor of `shape`, measured from the
    quantised state of a zero tensor of that shape (int4 packed)."""
    w = torch.zeros(shape)
    if method.startswith("nf4"):
        return nf4_quantize(w + 1e-3, group, compress_statistics=method == "nf4-dq").bits_per_param()
    bits = 8 if method == "int8" else 4
    return quantize(w, bits, "absmax", group, pack=bits == 4).bits_per_param()  # int8 codes: one byte each
