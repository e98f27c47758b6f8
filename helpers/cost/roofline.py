"""Arithmetic intensity by hand: FLOPs and bytes of common transformer ops, and where they sit on a roofline.

Every op is parametrised by one size `n` so a slider can move it. FLOP conventions (stated, not
hidden): a multiply-add is 2 FLOPs; add = 1 FLOP/element; GELU (tanh form) = 8 FLOPs/element
counting tanh as one; LayerNorm = 7 FLOPs/element (mean, subtract, square, sum, scale by 1/σ,
multiply by γ, add β); softmax = 5 FLOPs/element (max, subtract, exp, sum, divide). Bytes are the
minimum traffic: every input read once, every output written once.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

OPS = ("add", "gelu", "layernorm", "softmax", "matmul", "gemv", "skinny_matmul", "attn_scores")
SKINNY_ROWS = 16  # tokens in a small decode batch: the 'skinny' matmul
ATTN_HEADS, ATTN_HEAD_DIM = 16, 64  # batch·heads and head dim of the QKᵀ example


@dataclass(frozen=True)
class Op:
    """An op at a given size: what it computes, its counted FLOPs and bytes, and a runnable closure."""

    name: str
    shape: str
    flops: int
    bytes: int
    run: Callable[[], torch.Tensor]
    inputs: tuple[torch.Tensor, ...]

    @property
    def intensity(self) -> float:
        """FLOPs per byte of minimum memory traffic."""
        return self.flops / self.bytes


def count(name: str, n: int, itemsize: int) -> tuple[str, int, int]:
    """(shape description, FLOPs, bytes) of op `name` at size n with `itemsize`-byte elements."""
    e = n * n  # elements of one n×n tensor, the size every elementwise op reads and writes
    if name == "add":            # 1 FLOP per element; read x and y, write z: three n×n tensors
        return f"{n}x{n} + {n}x{n}", e, 3 * e * itemsize
    if name == "gelu":           # 8 FLOPs per element (tanh counted as one); read x, write y
        return f"gelu({n}x{n})", 8 * e, 2 * e * itemsize
    if name == "layernorm":      # 7 FLOPs per element; read x and the two length-n vectors γ and β, write y
        return f"layernorm({n}x{n})", 7 * e, (2 * e + 2 * n) * itemsize
    if name == "softmax":        # 5 FLOPs per element; read the scores, write the probabilities
        return f"softmax({n}x{n}, dim=-1)", 5 * e, 2 * e * itemsize
    if name == "matmul":         # (n×n)@(n×n): n² outputs of n multiply-adds, 2n³ FLOPs; read A and B, write C
        return f"({n}x{n})@({n}x{n})", 2 * n**3, 3 * e * itemsize
    if name == "gemv":           # (1×n)@(n×n): 2n² FLOPs; the n×n weights dominate the bytes, each used once
        return f"(1x{n})@({n}x{n})", 2 * e, (e + 2 * n) * itemsize
    if name == "skinny_matmul":  # (m×n)@(n×n) with m = SKINNY_ROWS: each weight read once, used m times
        m = SKINNY_ROWS
        return f"({m}x{n})@({n}x{n})", 2 * m * e, (e + 2 * m * n) * itemsize
    if name == "attn_scores":    # Q (h,n,d) @ Kᵀ (h,d,n) -> S (h,n,n): read Q and K, write the h n×n score matrices
        h, d = ATTN_HEADS, ATTN_HEAD_DIM
        return f"QKᵀ: ({h},{n},{d})@({h},{d},{n})", 2 * h * n * n * d, (2 * h * n * d + h * e) * itemsize
    raise ValueError(f"op={name!r} is not allowed; choose one of {OPS}")


def build(name: str, n: int, dtype: torch.dtype = torch.float32, device: str = "cpu") -> Op:
    """Allocate inputs for op `name` at size n and return it with its counted FLOPs and bytes."""
    shape, flops, nbytes = count(name, n, torch.finfo(dtype).bits // 8)
    r = lambda *s: torch.randn(*s, dtype=dtype, device=device)  # noqa: E731
    if name == "add":
        inputs = (r(n, n), r(n, n))
        fn = lambda: inputs[0] + inputs[1]  # noqa: E731
    elif name == "gelu":
        inputs = (r(n, n),)
        fn = lambda: F.gelu(inputs[0], approximate="tanh")  # noqa: E731
    elif name == "layernorm":
        inputs = (r(n, n), r(n), r(n))
        fn = lambda: F.layer_norm(inputs[0], (n,), inputs[1], inputs[2])  # noqa: E731
    elif name == "softmax":
        inputs = (r(n, n),)
        fn = lambda: torch.softmax(inputs[0], dim=-1)  # noqa: E731
    elif name == "attn_scores":
        inputs = (r(ATTN_HEADS, n, ATTN_HEAD_DIM), r(ATTN_HEADS, n, ATTN_HEAD_DIM))
        fn = lambda: inputs[0] @ inputs[1].transpose(-2, -1)  # noqa: E731
    else:  # the three matmul shapes differ only in the rows of the left operand
        rows = {"matmul": n, "gemv": 1, "skinny_matmul": SKINNY_ROWS}[name]
        inputs = (r(rows, n), r(n, n))
        fn = lambda: inputs[0] @ inputs[1]  # noqa: E731
    return Op(name, shape, flops, nbytes, fn, inputs)


def attainable_tflops(intensity: float, peak_tflops: float, bandwidth_gbs: float) -> float:
    """The roofline (Williams, Waterman & Patterson, 2009): min(P, W·I) in TFLOP/s.

    `intensity` I in FLOP/B, `peak_tflops` P in TFLOP/s, `bandwidth_gbs` W in GB/s (W·I / 1e3 is TFLOP/s).
    """
    # memory's roof: W bytes per second, each carrying I FLOPs (GB/s times FLOP/B is GFLOP/s, /1e3 TFLOP/s);
    # compute's roof: P. The op reaches at most the lower of the two.
    return min(peak_tflops, bandwidth_gbs * intensity / 1e3)


def bound(intensity: float, peak_tflops: float, bandwidth_gbs: float) -> str:
    """'memory' left of the ridge point P/W (in FLOP/B: peak_tflops·1e3 / bandwidth_gbs), 'compute' at or right of it."""
    # the ridge point is the intensity where the two roofs meet, W·I = P; below it the bytes limit the op
    return "memory" if intensity < peak_tflops * 1e3 / bandwidth_gbs else "compute"
