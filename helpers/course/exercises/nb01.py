"""Notebook 01's exercises: the FLOPs and bytes of a SwiGLU MLP (code), and batching a skinny matmul (numbers).

The SwiGLU reference does not trust a formula: its matmul FLOPs come from PyTorch's
`FlopCounterMode` run on meta tensors (no memory, no compute, any size), its elementwise FLOPs
from the stated convention, and its bytes from the sizes of the tensors it reads and writes (the
course's minimum-traffic byte model, as in `helpers.cost.roofline`).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from helpers.course import check
from helpers.measure import hardware

SILU_FLOPS = 4   # SiLU(a) = a / (1 + exp(-a)): negate, exp, add 1, divide (exp counted as one, like tanh)
GATE_FLOPS = 1   # SiLU(x W1) ⊙ (x W3): one multiply per hidden element


def swiglu(x: torch.Tensor, w1: torch.Tensor, w3: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """SwiGLU MLP (Shazeer, 2020): (SiLU(x W1) ⊙ x W3) W2. x (T, d); w1, w3 (d, f); w2 (f, d) -> (T, d)."""
    return (F.silu(x @ w1) * (x @ w3)) @ w2


def reference_counts(tokens: int, dim: int, hidden: int, dtype: torch.dtype) -> tuple[int, int]:
    """(FLOPs, minimum bytes) of `swiglu` on (tokens, dim) inputs with hidden size `hidden`, counted
    from FlopCounterMode (matmuls, on meta tensors) plus the elementwise convention, and tensor sizes."""
    from torch.utils.flop_counter import FlopCounterMode  # heavy: it imports triton (see measure.triton_mode)
    x = torch.empty(tokens, dim, dtype=dtype, device="meta")
    w1, w3 = (torch.empty(dim, hidden, dtype=dtype, device="meta") for _ in range(2))
    w2 = torch.empty(hidden, dim, dtype=dtype, device="meta")
    with FlopCounterMode(display=False) as counter:
        y = swiglu(x, w1, w3, w2)
    flops = counter.get_total_flops() + (SILU_FLOPS + GATE_FLOPS) * tokens * hidden
    nbytes = sum(t.numel() * t.element_size() for t in (x, w1, w3, w2, y))
    return int(flops), int(nbytes)


def _one_flop_per_mac(tokens, dim, hidden, dtype):
    s = torch.finfo(dtype).bits // 8
    return 3 * tokens * dim * hidden + 5 * tokens * hidden, (2 * tokens * dim + 3 * dim * hidden) * s


def _two_projections(tokens, dim, hidden, dtype):
    s = torch.finfo(dtype).bits // 8
    return 4 * tokens * dim * hidden + 5 * tokens * hidden, (2 * tokens * dim + 2 * dim * hidden) * s


def _always_fp32(tokens, dim, hidden, dtype):
    return 6 * tokens * dim * hidden + 5 * tokens * hidden, (2 * tokens * dim + 3 * dim * hidden) * 4


def _swiglu_cases() -> list[check.Case]:
    return [
        check.Case("one token, odd hidden size, fp32", (1, 64, 171, torch.float32)),
        check.Case("7 tokens, bf16", (7, 96, 256, torch.bfloat16)),
        check.Case("tiny odd sizes, fp16", (3, 5, 11, torch.float16)),
        check.Case("Llama-2-7B MLP, 2048 tokens, bf16", (2048, 4096, 11008, torch.bfloat16)),
        check.Case("a wide MLP, 512 tokens, fp32", (512, 8192, 28672, torch.float32)),
    ]


check.register(
    "01.swiglu", "code",
    prompt="write swiglu_counts(tokens, dim, hidden, dtype) -> (FLOPs, bytes) of a SwiGLU MLP",
    hint="three matmuls, each 2 FLOPs per multiply-add; then SiLU and the gate on every hidden element; bytes: "
         "x, the three weight matrices and the output, each once, at the dtype's element size",
    solution=reference_counts, wrong=(_one_flop_per_mac, _two_projections, _always_fp32),
    cases=_swiglu_cases, rtol=0.0, atol=0.0,
    tolerance="exact: FlopCounterMode for the matmuls, tensor sizes for the bytes",
    outputs=("FLOPs", "bytes"))


def _skinny_intensity(rows: int, n: int, itemsize: int) -> float:
    """FLOP/B of a (rows×n)@(n×n) matmul under the course's byte model (read both, write the result)."""
    return 2 * rows * n * n / ((n * n + 2 * rows * n) * itemsize)


def _intensity_64() -> float:
    return _skinny_intensity(64, 8192, 2)


check.register(
    "01.skinny64", "value",
    prompt="FLOP/B of a bf16 (64×8192)@(8192×8192) matmul (64 decode tokens through one weight matrix)",
    hint="the same counting as the table's skinny matmul, with 64 rows: 2·m·n² FLOPs over the bytes of both "
         "operands and the result",
    solution=_intensity_64, wrong=(_intensity_64() * 2, _skinny_intensity(16, 8192, 2)), rtol=0.01)


def _decode_batch() -> float:
    ridge, n, s = hardware.PEAKS["h100"].ridge_point("bf16"), 8192, 2
    # 2·m·n / ((n + 2m)·s) = ridge  =>  m = ridge·s·n / (2n - 2·ridge·s)
    return ridge * s * n / (2 * n - 2 * ridge * s)


check.register(
    "01.decode_batch", "value",
    prompt="rows m at which a bf16 (m×8192)@(8192×8192) matmul reaches the H100 SXM's datasheet ridge point",
    hint="write the intensity as a function of m, set it equal to hardware.PEAKS['h100'].ridge_point('bf16') "
         "and solve for m; it is not simply the ridge point, because the m×n operands cost bytes too",
    solution=_decode_batch, wrong=(hardware.PEAKS["h100"].ridge_point("bf16"), _decode_batch() * 2), rtol=0.01)
