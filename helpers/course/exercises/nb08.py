"""Notebook 08's exercises: blockwise absmax quantisation, int4 packing, NF4's constant overhead at block 256.

References are `helpers.lowbit.quant`'s own functions, so a learner who passes has written what the notebook's
quantised models run.
"""
from __future__ import annotations

import torch

from helpers.lowbit import quant
from helpers.course.check import Case, register


class WrongDtype(TypeError):
    """Raised by a runner when a learner's tensor has the right values in the wrong dtype."""


def _dtypes(out, names, want):
    """Raise WrongDtype naming the expected dtype when a returned tensor's dtype differs (None passes through)."""
    items = out if isinstance(out, tuple) else (out,)
    for name, item, dtype in zip(names, items, want):
        if isinstance(item, torch.Tensor) and item.dtype != dtype:
            raise WrongDtype(f"{name} are {str(item.dtype).replace('torch.', '')}; the task asks for "
                             f"{str(dtype).replace('torch.', '')}")
    return out


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


def _run_blockwise(fn, case):
    """Call the learner's function and check the dtypes the task asks for (int8 codes, float32 scales)."""
    return _dtypes(fn(*case.args), ("the codes", "the scales"), (torch.int8, torch.float32))


def _float64_scales(w, bits, block):
    """Planted wrong: right values, but the scales in float64."""
    q, s = _blockwise_reference(w, bits, block)
    return q, s.double()


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
    hint="give each block its own axis; ask which code a block's largest |value| should land on, and what "
         "scale a block of zeros can have",
    solution=_blockwise_reference,
    wrong=(_qmax_power_of_two, _per_row, _truncated, _float64_scales),
    cases=_blockwise_cases,
    run=_run_blockwise,
    outputs=("codes", "scales"),
    rtol=1e-6, atol=0.0,
    tolerance="codes exact; scales to relative 1e-6",
)

# ---------------------------------------------------------------- 08.pack (code)


def _pack_cases() -> list[Case]:
    g = torch.Generator().manual_seed(8)
    return [
        Case("one pair: codes [3, 12] -> one byte", (torch.tensor([3, 12], dtype=torch.uint8),)),
        Case("a row of 10 codes", (torch.randint(0, 16, (10,), generator=g, dtype=torch.uint8),)),
        Case("2-D: 3 rows of 6 codes", (torch.randint(0, 16, (3, 6), generator=g, dtype=torch.uint8),)),
        Case("the extremes: codes [[0, 15, 15, 0]] -> two bytes", (torch.tensor([[0, 15, 15, 0]], dtype=torch.uint8),)),
    ]


def _run_pack(fn, case):
    """Call the learner's function and check that it returns uint8 bytes."""
    return _dtypes(fn(*case.args), ("the packed bytes",), (torch.uint8,))


def _int64_bytes(codes):
    """Planted wrong: right values, but int64 instead of uint8 (eight times the memory)."""
    return quant.pack_int4(codes).long()


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
    hint="pair neighbours along the last dimension; a shift moves a code into the high four bits",
    solution=quant.pack_int4,
    wrong=(_high_first, _halves, _int64_bytes),
    cases=_pack_cases,
    run=_run_pack,
    rtol=0.0, atol=0.0,
    tolerance="exact: every byte",
)

# ---------------------------------------------------------------- 08.nf4_bits (value)
# Block 256, so that neither the answer nor its total (4.032 bits) appears in the notebook's tables, whose
# NF4 rows use the GROUPS sizes (64 in smoke; 128, 64, 32 in full). The question asks for the overhead alone:
# in a total near 4 bits the second-level constants (0.0005 bits) sit below any sensible rounding.

register(
    "08.nf4_bits", "value",
    prompt="NF4 with blocks of 256 and double quantisation (8-bit absmax codes in blocks of 256, one fp32 "
           "absmax per 256 blocks): how many bits per parameter do the constants add on top of the 4-bit "
           "codes, ignoring the single fp32 offset? (3 significant figures)",
    hint="for each kind of constant: its width in bits over the number of parameters that share it",
    solution=lambda: 8 / 256 + 32 / (256 * 256),
    wrong=(8 / 256, 32 / 256, 8 / 64 + 32 / (64 * 256), 4 + 8 / 256 + 32 / (256 * 256), 0.032),
    rtol=3e-3,
    tolerance="relative 3e-3: three significant figures pass",
)
