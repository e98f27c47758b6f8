"""The instructor panels' callbacks: plain functions, callable and testable without a kernel.

A notebook binds the run's context (device, ceilings) with `functools.partial` and hands the
result to `helpers.show.widgets.panel`; tests call the same functions directly and inspect the figure.
"""
from __future__ import annotations

from typing import Sequence

from helpers.measure import ceilings, hardware
from helpers.show import plots
from helpers.cost import roofline



def matmul_panel(dtype: str, n: int, *, device: str = "cpu", ceiling_tflops: dict | None = None,
                 peak: hardware.Peak | None = None, reps: int = 5):
    """Notebook 00: time one n³ matmul in `dtype`; bars beside the measured ceiling and the datasheet."""
    why = hardware.matmul_unsupported(dtype, device)
    if why:
        print(f"{dtype}: {why}.")
        return None
    achieved = ceilings.measure_matmul_tflops(n, dtype, device, reps=reps)
    print(f"{dtype}, n={n}: {achieved:.3g} TFLOP/s")
    bars = {f"{dtype} n={n}": achieved, "measured ceiling": (ceiling_tflops or {}).get(dtype),
            "datasheet": peak.tflops(dtype) if peak else None}
    return plots.bars(bars, ylabel="TFLOP/s", title=f"{dtype} matmul, n={n}")


def roofline_panel(op: str, n: int, dtype: str, *, device: str = "cpu", ceiling_tflops: float,
                   bandwidth_gbs: float, background: Sequence[dict] = (), reps: int = 3):
    """Notebook 01: measure one op at size n and draw it on the roofline, other ops faded behind it."""
    if dtype not in ("fp32", "fp16", "bf16"):
        raise ValueError(f"dtype={dtype!r} is not allowed; choose one of ('fp32', 'fp16', 'bf16')")
    m = roofline.measure(roofline.build(op, n, hardware.torch_dtype(dtype), device), reps=reps, device=device)
    where = roofline.bound(m["intensity"], ceiling_tflops, bandwidth_gbs)
    print(f"{op} n={n} {dtype}: {m['intensity']:.3g} FLOP/B, {m['tflops']:.3g} TFLOP/s, "
          f"{m['gbps']:.3g} GB/s, {where}-bound")
    xs = [m["intensity"], ceiling_tflops * 1e3 / bandwidth_gbs] + [b["intensity"] for b in background]
    fig = plots.roofline({"measured ceiling": ceiling_tflops}, bandwidth_gbs,
                         [(f"{op} n={n}", m["intensity"], m["tflops"])], title=f"{op}, n={n}, {dtype}",
                         intensity_range=(min(xs) / 4, max(xs) * 4))  # the roof spans the faded points too
    if background:
        fig.axes[0].scatter([b["intensity"] for b in background], [b["tflops"] for b in background],
                            color="grey", alpha=0.3, s=20)
    return fig
