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
    e = n * n  # elementwise ops act on an n×n tensor
    if name == "add":            # z = x + y: read x, y; write z
        return f"{n}x{n} + {n}x{n}", e, 3 * e * itemsize
    if name == "gelu":           # read x, write y
        return f"gelu({n}x{n})", 8 * e, 2 * e * itemsize
    if name == "layernorm":      # read x, γ, β; write y
        return f"layernorm({n}x{n})", 7 * e, (2 * e + 2 * n) * itemsize
    if name == "softmax":        # read scores, write probabilities
        return f"softmax({n}x{n}, dim=-1)", 5 * e, 2 * e * itemsize
    if name == "matmul":         # (n×n)@(n×n): 2n³ FLOPs, read A and B, write C
        return f"({n}x{n})@({n}x{n})", 2 * n**3, 3 * e * itemsize
    if name == "gemv":           # (1×n)@(n×n): the weight matrix dominates the bytes
        return f"(1x{n})@({n}x{n})", 2 * e, (e + 2 * n) * itemsize
    if name == "skinny_matmul":  # (m×n)@(n×n) with m = SKINNY_ROWS
        m = SKINNY_ROWS
        return f"({m}x{n})@({n}x{n})", 2 * m * e, (e + 2 * m * n) * itemsize
    if name == "attn_scores":    # Q (h,n,d) @ Kᵀ (h,d,n) -> S (h,n,n)
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
    """The roofline: min(compute peak, bandwidth × intensity), in TFLOP/s."""
    return min(peak_tflops, bandwidth_gbs * intensity / 1e3)


def bound(intensity: float, peak_tflops: float, bandwidth_gbs: float) -> str:
    """'memory' left of the ridge point, 'compute' right of it."""
    return "memory" if intensity < peak_tflops * 1e3 / bandwidth_gbs else "compute"


def measure(op: Op, *, reps: int = 10, warmup: int = 3, device: str = "cpu") -> dict:
    """Time an op with the shared timer (cache flushed) and return seconds, TFLOP/s, GB/s, intensity."""
    from helpers.measure.bench import benchmark, gbps, tflops

    t = benchmark(op.run, warmup=warmup, reps=reps, flush_l2=True, device=device)
    return {"op": op.name, "shape": op.shape, "flops": op.flops, "bytes": op.bytes, "intensity": op.intensity,
            "seconds": t.median, "tflops": tflops(op.flops, t.median), "gbps": gbps(op.bytes, t.median)}


# ---------------------------------------------------------------- what a ceiling sweep says (notebook 00)

HALF_PRECISION_CPU_FLAGS = ("avx512_bf16", "amx_bf16", "avx512_fp16", "amx_fp16")


def cpu_half_precision_flags(cpuinfo: str | None = None) -> list[str] | None:
    """The half-precision matrix instruction flags the CPU lists ([] if none); None where /proc/cpuinfo is unreadable.

    `cpuinfo` is the text of /proc/cpuinfo (read from the machine when None).
    """
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
        except OSError:
            return None
    flags = set(cpuinfo.split())
    return [f for f in HALF_PRECISION_CPU_FLAGS if f in flags]


def percent(fraction: float) -> str:
    """A fraction as a percentage with two significant digits (0.0028 -> '0.28%', 0.26 -> '26%')."""
    percent = 100 * fraction
    return f"{percent:.0f}%" if percent >= 10 else f"{percent:.2g}%"


def peak_findings(sizes: list[int], sweep: dict[str, list[float | None]]) -> list[str]:
    """One sentence per format of a matmul sweep: the size where it peaked, and how far below the peak the
    smallest and the largest sizes stayed. `sweep[dtype][i]` is TFLOP/s at `sizes[i]` (None: not run)."""
    out = []
    for dtype, values in sweep.items():
        pts = [(n, v) for n, v in zip(sizes, values) if v is not None and v > 0]
        if not pts:
            continue
        n_best, best = max(pts, key=lambda p: p[1])
        (n_small, small), (n_large, large) = pts[0], pts[-1]
        smallest = (f"the smallest, n={n_small}, reached {percent(small / best)} of its best" if n_best != n_small
                    else "the smallest size was the fastest")
        if n_best == n_large:
            where = f"peaked at the largest size, n={n_best}"
        else:
            where = f"peaked at n={n_best}, not at the largest size (n={n_large} reached {percent(large / best)} of that)"
        out.append(f"{dtype} {where}; {smallest}.")
    return out


def half_precision_findings(best: dict[str, float], ridge: dict[str, float], device: str,
                            flags: list[str] | None, n: int = 1024) -> list[str]:
    """On a CPU: how much slower (or faster) fp16/bf16 matmuls ran than fp32, why, and what that did to
    their ridge points (FLOP/B), counted against notebook 01's ops at size `n`. Empty on CUDA."""
    if device != "cpu" or not best.get("fp32"):
        return []
    out, slow = [], []
    for dtype in ("fp16", "bf16"):
        if not best.get(dtype):
            continue
        ratio = best["fp32"] / best[dtype]
        if ratio < 1.5:
            out.append(f"{dtype} matmuls reached {1 / ratio:.2g}x fp32's best throughput.")
            continue
        slow.append(dtype)
        above = [op for op in OPS if count(op, n, 2)[1] / count(op, n, 2)[2] > ridge[dtype]]
        out.append(f"{dtype} matmuls ran {ratio:.2g}x slower than fp32 at their best. That lowers the {dtype} ridge "
                   f"point to {ridge[dtype]:.2g} FLOP/B (fp32: {ridge['fp32']:.2g}): {len(above)} of notebook 01's "
                   f"{len(OPS)} ops (n={n}) would count as compute-bound in {dtype} here, the opposite of a GPU, "
                   f"where half precision has the higher peak.")
    if not out:
        return out
    if flags is None:
        out.append("This system does not say which matrix instructions its CPU has (no /proc/cpuinfo).")
    elif not flags:
        out.append("Why: this CPU lists none of the half-precision matrix instructions ("
                   + ", ".join(HALF_PRECISION_CPU_FLAGS) + "), so there is no native fp16/bf16 matmul path here; "
                   "the products run in kernels that convert to fp32 as they go.")
    elif slow:
        out.append(f"This CPU lists {', '.join(flags)}, yet {' and '.join(slow)} ran slower: this PyTorch build "
                   f"did not use those units for these sizes.")
    else:
        out.append(f"This CPU lists half-precision matrix instructions ({', '.join(flags)}).")
    return out


def findings(measured: list[dict], peak_tflops: float, bandwidth_gbs: float, low: float = 0.2) -> list[str]:
    """Sentences about a measured set of ops, generated from the numbers (notebook 01's verdict).

    Each entry of `measured` is `measure`'s dict plus "bound" and "fraction_of_ceiling" (achieved over
    attainable). Says which ops were memory- and compute-bound at this ridge point, which ran above their
    roof (and what that means for each kind of bound), and which reached less than `low` of it.
    """
    if not measured:
        return []
    ridge = peak_tflops * 1e3 / bandwidth_gbs
    names = lambda ms: ", ".join(m["op"] for m in ms) or "none"  # noqa: E731
    mem = [m for m in measured if m["bound"] == "memory"]
    comp = [m for m in measured if m["bound"] == "compute"]
    out = [f"at this ridge point ({ridge:.3g} FLOP/B) the count puts {len(mem)} ops left of it (memory-bound: "
           f"{names(mem)}) and {len(comp)} right of it (compute-bound: {names(comp)})."]
    over = lambda ms: [m for m in ms if m["fraction_of_ceiling"] > 1]  # noqa: E731
    pct = lambda ms: ", ".join(f"{m['op']} {percent(m['fraction_of_ceiling'])}" for m in ms)  # noqa: E731
    if over(mem):
        out.append(f"above the memory roof: {pct(over(mem))}. A flushed op cannot beat memory bandwidth from "
                   "memory, so part of its operands stayed in cache (small sizes), or the measured bandwidth "
                   "ceiling is below this device's best.")
    if over(comp):
        out.append(f"above the compute roof: {pct(over(comp))}. This is a ceiling problem: the measured compute "
                   "ceiling is not this device's best (measured at other sizes, or under other load), so every "
                   "fraction of it printed here is too high by the same factor.")
    slow = [m for m in measured if m["fraction_of_ceiling"] < low]
    if slow:
        out.append(f"below {low:.0%} of their roof: {pct(slow)}. Their cost is not what the count says: "
                   "instructions the count ignores (transcendentals, reductions across a row), a fixed cost "
                   "per call that dominates at this size, or other work on the machine while they ran.")
    fits = [m for m in measured if low <= m["fraction_of_ceiling"] <= 1]
    if fits:
        out.append(f"between {low:.0%} and 100% of their roof: {pct(fits)}.")
    return out
