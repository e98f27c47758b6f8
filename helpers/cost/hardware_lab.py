"""Notebook 00's lab: its parameters, the matmul panel and the sentences generated from its ceiling sweeps.

The measuring primitives (the timer, the matmul per format, the ceilings) are in `helpers.measure`;
this module turns their numbers into the notebook's panel and findings. A panel callback is a plain
function: the notebook binds the run's context (device, ceilings) with `functools.partial` and hands
it to `helpers.show.widgets.panel`; tests call it directly and inspect the figure.
"""
from __future__ import annotations

from helpers.cost.roofline import OPS, count
from helpers.measure import ceilings, hardware, params
from helpers.show import plots
from helpers.show.units import percent

HALF_PRECISION_CPU_FLAGS = ("avx512_bf16", "amx_bf16", "avx512_fp16", "amx_fp16")
FP32_MIB = 4 / 2**20  # one fp32 element, in MiB: the smallest copy `ceilings.measure_copy_bandwidth` moves
SCALED_MM_MULTIPLE = 16  # torch._scaled_mm (the fp8 matmul) wants every dimension a multiple of 16


def _floats(values):
    """Ints of a list as floats (so that COPY_SIZES_MB=[1, 16] is accepted); anything else unchanged."""
    return [float(x) if type(x) is int else x for x in values] if isinstance(values, (list, tuple)) else values


def resolve_parameters(S: params.Setup, *, DTYPES, MATMUL_SIZES, COPY_SIZES_MB, REPS) -> dict:
    """Notebook 00's parameters, validated at once and with the profile's defaults filled in: {name: value}.

    Raises ValueError naming the parameter when a later cell could not use a value: a DTYPES list of
    which no format runs on this device (nothing would be timed), an fp8 sweep here with a matmul size
    that is not a multiple of 16 (torch._scaled_mm refuses it), a copy size below one fp32 element
    (4 bytes: the copy would move nothing and its bandwidth would be 0 GB/s).
    """
    every = list(hardware.MATMUL_DTYPES)
    dtypes = S.resolve("DTYPES", DTYPES, smoke=every, full=every, check=lambda n, v: params.choices(n, v, every))
    runs = [d for d in dtypes if not hardware.matmul_unsupported(d, S.device)]
    if not runs:
        here = ", ".join(repr(d) for d in every if not hardware.matmul_unsupported(d, S.device))
        raise ValueError(f"DTYPES={dtypes!r}: none of these formats runs on this {S.device} "
                         f"({hardware.matmul_unsupported(dtypes[0], S.device)}), so nothing would be timed; "
                         f"include one of {here}")
    sizes = S.resolve("MATMUL_SIZES", MATMUL_SIZES, smoke=[64, 128, 256, 512],
                      full=[512, 1024, 2048, 4096, 8192, 16384], check=params.positives)
    odd = [n for n in sizes if n % SCALED_MM_MULTIPLE]
    if "fp8" in runs and odd:
        raise ValueError(f"MATMUL_SIZES={sizes!r}: the fp8 matmul (torch._scaled_mm) needs sizes that are multiples "
                         f"of {SCALED_MM_MULTIPLE}, and {odd[0]} is not; round it to a multiple of "
                         f"{SCALED_MM_MULTIPLE} or leave 'fp8' out of DTYPES")
    copy_mb = S.resolve("COPY_SIZES_MB", COPY_SIZES_MB, smoke=[0.25, 1, 4, 16, 64], full=[1, 16, 64, 256, 1024, 4096],
                        check=lambda n, v: params.positives(n, _floats(params.listed(n, v)), float))
    tiny = [mb for mb in copy_mb if mb < FP32_MIB]
    if tiny:
        raise ValueError(f"COPY_SIZES_MB={copy_mb!r}: entry {tiny[0]!r} MiB is less than one fp32 element "
                         f"(4 bytes = {FP32_MIB:.3g} MiB), so its copy would move nothing; use sizes of at least "
                         f"{FP32_MIB:.3g} MiB")
    reps = S.resolve("REPS", REPS, smoke=5, full=20, check=params.positive)
    return {"DTYPES": dtypes, "MATMUL_SIZES": sizes, "COPY_SIZES_MB": copy_mb, "REPS": reps}


def matmul_panel(dtype: str, n: int, *, device: str = "cpu", ceiling_tflops: dict | None = None,
                 peak: hardware.Peak | None = None, reps: int = 5):
    """Time one n×n×n matmul in `dtype` and draw it as bars beside the measured ceiling and the datasheet.

    `ceiling_tflops`: {dtype: TFLOP/s} measured by the notebook; `peak`: the device's datasheet row.
    Prints the achieved TFLOP/s; returns the figure, or None (after printing why) when `device`
    cannot run `dtype`.
    """
    why = hardware.matmul_unsupported(dtype, device)
    if why:
        print(f"{dtype}: {why}.")
        return None
    achieved = ceilings.measure_matmul_tflops(n, dtype, device, reps=reps)
    print(f"{dtype}, n={n}: {achieved:.3g} TFLOP/s")
    bars = {f"{dtype} n={n}": achieved, "measured ceiling": (ceiling_tflops or {}).get(dtype),
            "datasheet": peak.tflops(dtype) if peak else None}
    return plots.bars(bars, ylabel="TFLOP/s", title=f"{dtype} matmul, n={n}")


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
    their ridge points (FLOP/B), counted against notebook 01's ops at size `n`. Empty on CUDA.

    `best`: {dtype: best TFLOP/s}; `ridge`: {dtype: FLOP/B}; `flags`: `cpu_half_precision_flags()`.
    """
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
