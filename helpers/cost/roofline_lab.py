"""Notebook 01's lab: its parameters, timing the ops of `roofline`, the roofline panel, and the verdict sentences.

The ops, their counted FLOPs and bytes and the roofline formula are in `helpers.cost.roofline`;
this module times them with the shared timer and says, from the numbers, where each one landed.
"""
from __future__ import annotations

from typing import Sequence

from helpers.cost import roofline
from helpers.measure import hardware, params
from helpers.measure.bench import benchmark, gbps, tflops
from helpers.show import plots
from helpers.show.units import percent

PANEL_DTYPES = ("fp32", "fp16", "bf16")


def resolve_parameters(S: params.Setup, *, DTYPE, N, REPS) -> dict:
    """Notebook 01's parameters, validated at once and with the profile's defaults filled in: {name: value},
    plus "TORCH_DTYPE". Raises ValueError naming the first bad parameter.

    DTYPE None is bf16 on CUDA (fp16 on a GPU without bf16 units) and fp32 on a CPU; bf16 asked for on a
    GPU without bf16 units becomes fp16, with a printed sentence.
    """
    default = ("bf16" if hardware.capabilities()["bf16"] else "fp16") if S.device == "cuda" else "fp32"
    dtype = S.resolve("DTYPE", DTYPE, smoke=default, full=default, check=lambda n, v: params.choose(n, v, PANEL_DTYPES))
    if dtype == "bf16" and S.device == "cuda" and not hardware.capabilities()["bf16"]:
        print("this GPU has no bf16 units (a T4?), so this notebook runs in fp16 instead of the requested bf16")
        dtype = "fp16"
    return {"DTYPE": dtype, "TORCH_DTYPE": hardware.torch_dtype(dtype),
            "N": S.resolve("N", N, smoke=512, full=8192, check=params.positive),
            "REPS": S.resolve("REPS", REPS, smoke=5, full=20, check=params.positive)}


def measure(op: roofline.Op, *, reps: int = 10, warmup: int = 3, device: str = "cpu") -> dict:
    """Time an op with the shared timer (cache flushed before every call).

    Returns {"op", "shape", "flops", "bytes", "intensity" (FLOP/B), "seconds" (median), "tflops", "gbps"}.
    """
    t = benchmark(op.run, warmup=warmup, reps=reps, flush_l2=True, device=device)
    return {"op": op.name, "shape": op.shape, "flops": op.flops, "bytes": op.bytes, "intensity": op.intensity,
            "seconds": t.median, "tflops": tflops(op.flops, t.median), "gbps": gbps(op.bytes, t.median)}


def roofline_panel(op: str, n: int, dtype: str, *, device: str = "cpu", ceiling_tflops: float,
                   bandwidth_gbs: float, background: Sequence[dict] = (), reps: int = 3):
    """Measure one op at size n and draw it on the roofline, other ops faded behind it.

    `dtype` is one of PANEL_DTYPES (ValueError otherwise); `background`: `measure` dicts drawn in grey.
    Prints the op's intensity, rates and bound; returns the figure.
    """
    params.choose("dtype", dtype, PANEL_DTYPES)
    m = measure(roofline.build(op, n, hardware.torch_dtype(dtype), device), reps=reps, device=device)
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
