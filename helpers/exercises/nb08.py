"""Notebook 08's exercises: blockwise absmax quantisation, int4 packing, NF4's bits per parameter at block 128.

References are `helpers.quant`'s own functions, so a learner who passes has written what the notebook's
quantised models run.
"""
from __future__ import annotations

import torch

from helpers import quant
from helpers.check import Case, register

# ---------------------------------------------------------------- 08.blockwise (code)


def _blockwise_reference(w: torch.Tensor, bits: int, block: int):
    """(int8 codes like w, float32 scales (rows, cols // block)): absmax RTN per block of a row."""
    qt = quant.quantize(w, bits, "absmax", block)
    return qt.q, qt.scale.reshape(w.shape[0], w.shape[1] // block)


def _mat(seed: int, rows: int, cols: int, spread: float = 2.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, cols, generator=g) * torch.exp2(torch.randn(rows, 1, generator=g) * spread)


def _blockwise_cases() -> list[Case]:
    zero_block = _mat(3, 4, 32)
    zero_block[1, 16:] = 0.0
    negative = _mat(4, 3, 24)
    negative[2, 5] = -40.0  # the block's absmax is a negative value
    return [
        Case("8 bits, blocks of 16", (_mat(1, 6, 64), 8, 16)),
        Case("4 bits, odd rows (5), blocks of 8", (_mat(2, 5, 24), 4, 8)),
        Case("a block of zeros (scale 1)", (zero_block, 4, 16)),
        Case("an outlier of -40 in one block", (negative, 8, 12)),
        Case("3 bits, one block per row", (_mat(5, 7, 10), 3, 10)),
    ]


def _qmax_power_of_two(w, bits, block):
    """Planted wrong: divides by 2^(bits-1) (one level too many), so the absmax maps below the top code."""
    x = w.reshape(w.shape[0], -1, block)
    amax = x.abs().amax(-1, keepdim=True)
    scale = torch.where(amax > 0, amax / 2 ** (bits - 1), torch.ones_like(amax))
    q = torch.round(x / scale).clamp(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    return q.to(torch.int8).reshape(w.shape), scale.squeeze(-1)


def _per_row(w, bits, block):
    """Planted wrong: one scale per row, repeated for every block."""
    q, s = _blockwise_reference(w, bits, w.shape[1])
    return q, s.expand(w.shape[0], w.shape[1] // block).contiguous()


def _truncated(w, bits, block):
    """Planted wrong: truncation toward zero instead of rounding to nearest."""
    x = w.reshape(w.shape[0], -1, block)
    qmax = 2 ** (bits - 1) - 1
    amax = x.abs().amax(-1, keepdim=True)
    scale = torch.where(amax > 0, amax / qmax, torch.ones_like(amax))
    return torch.trunc(x / scale).to(torch.int8).reshape(w.shape), scale.squeeze(-1)


register(
    "08.blockwise", "code",
    prompt="write absmax_blockwise(w, bits, block): w (rows, cols), cols a multiple of block -> (int8 codes of "
           "w's shape, float32 scales of shape (rows, cols // block)), round to nearest, symmetric grid",
    hint="view w as (rows, cols // block, block); the largest |value| of each block maps to the top code "
         "2^(bits-1) - 1; a block of zeros needs a scale that is not 0; round, clamp, cast to int8",
    solution=_blockwise_reference,
    wrong=(_qmax_power_of_two, _per_row, _truncated),
    cases=_blockwise_cases,
    outputs=("codes", "scales"),
    rtol=1e-6, atol=0.0,
    tolerance="codes exact; scales to relative 1e-6",
)

# ---------------------------------------------------------------- 08.pack (code)


def _pack_cases() -> list[Case]:
    g = torch.Generator().manual_seed(8)
    return [
        Case("one pair", (torch.tensor([3, 12], dtype=torch.uint8),)),
        Case("a row of 10 codes", (torch.randint(0, 16, (10,), generator=g, dtype=torch.uint8),)),
        Case("2-D: 3 rows of 6 codes", (torch.randint(0, 16, (3, 6), generator=g, dtype=torch.uint8),)),
        Case("the extremes 0 and 15", (torch.tensor([[0, 15, 15, 0]], dtype=torch.uint8),)),
    ]


def _high_first(codes):
    """Planted wrong: the first code of a pair in the high nibble (bitsandbytes' NF4 order, not this course's int4)."""
    c = codes.to(torch.uint8)
    return (c[..., 0::2] << 4) | c[..., 1::2]


def _halves(codes):
    """Planted wrong: pairs the first half of a row with the second half instead of neighbours."""
    c = codes.to(torch.uint8)
    n = c.shape[-1] // 2
    return c[..., :n] | (c[..., n:] << 4)


register(
    "08.pack", "code",
    prompt="write pack_int4(codes): uint8 codes 0..15 of shape (..., n), n even -> uint8 (..., n // 2), "
           "element 2i in the low four bits of byte i and element 2i+1 in the high four bits",
    hint="take the even-indexed and odd-indexed codes with a step-2 slice along the last dimension; shifting "
         "left by 4 multiplies by 16; combine with bitwise or",
    solution=quant.pack_int4,
    wrong=(_high_first, _halves),
    cases=_pack_cases,
    rtol=0.0, atol=0.0,
    tolerance="exact: every byte",
)

# ---------------------------------------------------------------- 08.nf4_bits (value)

register(
    "08.nf4_bits", "value",
    prompt="NF4 with blocks of 128 and double quantisation (8-bit absmax codes in blocks of 256, one fp32 "
           "absmax per 256 blocks): how many bits does one parameter cost, ignoring the single fp32 offset?",
    hint="4 bits of code, plus each block's 8-bit constant shared by its 128 values, plus each fp32 "
         "second-level constant shared by 256 blocks of 128 values",
    solution=lambda: 4 + 8 / 128 + 32 / (128 * 256),
    wrong=(4 + 32 / 128, 4 + 8 / 64 + 32 / (64 * 256), 4.0, 4 + 8 / 128),
    rtol=1e-4,
)
