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
    elif dtype != "fp32" and hardware.emulated(dtype, S.device):
        print(hardware.emulated(dtype, S.device) + "; this notebook's roof and points are then those of the emulation.")
    return {"DTYPE": dtype, "TORCH_DTYPE": hardware.torch_dtype(dtype),
            "N": S.resolve("N", N, smoke=512, full=8192, check=params.positive),
            "REPS": S.resolve("REPS", REPS, smoke=5, full=20, check=params.positive)}


def measure(op: roofline.Op, *, reps: int = 10, warmup: int = 3, device: str = "cpu") -> dict:
    """Time an op with the shared timer (cache flushed before every call; on a CPU with torch on one thread, the
    thread's own CPU clock).

    Returns {"op", "shape", "flops", "bytes", "intensity" (FLOP/B), "seconds" (median), "q25", "q75" (seconds),
    "tflops", "gbps" (at the median), "tflops_lo", "tflops_hi", "gbps_lo", "gbps_hi" (at the 75th and 25th
    percentile times: the IQR of the rate), "clock"}.
    """
    t = benchmark(op.run, warmup=warmup, reps=reps, flush_l2=True, device=device)
    return {"op": op.name, "shape": op.shape, "flops": op.flops, "bytes": op.bytes, "intensity": op.intensity,
            "seconds": t.median, "q25": t.q25, "q75": t.q75, "clock": t.clock,
            "tflops": tflops(op.flops, t.median), "gbps": gbps(op.bytes, t.median),
            "tflops_lo": tflops(op.flops, t.q75), "tflops_hi": tflops(op.flops, t.q25),
            "gbps_lo": gbps(op.bytes, t.q75), "gbps_hi": gbps(op.bytes, t.q25)}


def place(m: dict, peak_tflops: float, bandwidth_gbs: float) -> dict:
    """`measure`'s dict with its place on the roofline added: "bound" ('memory' or 'compute'), "attainable_tflops",
    and "fraction_of_ceiling" (achieved over attainable) with "fraction_lo" and "fraction_hi" from the rate's IQR."""
    attainable = roofline.attainable_tflops(m["intensity"], peak_tflops, bandwidth_gbs)
    return {**m, "bound": roofline.bound(m["intensity"], peak_tflops, bandwidth_gbs), "attainable_tflops": attainable,
            "fraction_of_ceiling": m["tflops"] / attainable, "fraction_lo": m["tflops_lo"] / attainable,
            "fraction_hi": m["tflops_hi"] / attainable}


def headline(measured: list[dict]) -> dict:
    """Notebook 01's summary headline from `place`d ops: the matmul's TFLOP/s and its fraction of its roofline,
    each a median with its IQR (value, unit, (low, high)). Both are compute-bound work timed against a ceiling
    measured the same way, so they hold on a shared CPU. The memory-bound ops stay in the notebook's table and
    verdict, not here: at the smoke size they are cache-resident, per-call work whose rates and fractions another
    process's turns on the core moved by 1.5-1.8x even on the thread's clock (the GEMV's GB/s 1.55x; the median
    op's fraction of its roof, a memory-bound op, 33% quiet and 57% loaded)."""
    mm = {m["op"]: m for m in measured}["matmul"]
    return {"matmul achieved": (mm["tflops"], "TFLOP/s", (mm["tflops_lo"], mm["tflops_hi"])),
            "matmul, fraction of its roofline": (
                100 * mm["fraction_of_ceiling"], "%", (100 * mm["fraction_lo"], 100 * mm["fraction_hi"]))}


def roofline_panel(op: str, n: int, dtype: str, *, device: str = "cpu", ceiling_tflops: float,
                   bandwidth_gbs: float, background: Sequence[dict] = (), reps: int = 3):
    """Measure one op at size n and draw it on the roofline, other ops faded behind it.

    `dtype` is one of PANEL_DTYPES (ValueError otherwise); `background`: `measure` dicts drawn in grey.
    Prints the op's intensity, rates and bound; returns the figure.
    """
    params.choose("dtype", dtype, PANEL_DTYPES)
    if dtype != "fp32" and hardware.emulated(dtype, device):
        print(hardware.emulated(dtype, device) + "; this point measures the emulation.")
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
    attainable), and "fraction_lo"/"fraction_hi" (`place`) when known: then a point counts as above its roof only
    when its whole IQR is. Says which ops were memory- and compute-bound at this ridge point, which ran above
    their roof (and what that means for each kind of bound), which sat at it within the noise, and which reached
    less than `low` of it.
    """
    if not measured:
        return []
    ridge = peak_tflops * 1e3 / bandwidth_gbs
    names = lambda ms: ", ".join(m["op"] for m in ms) or "none"  # noqa: E731
    mem = [m for m in measured if m["bound"] == "memory"]
    comp = [m for m in measured if m["bound"] == "compute"]
    out = [f"at this ridge point ({ridge:.3g} FLOP/B) the count puts {len(mem)} ops left of it (memory-bound: "
           f"{names(mem)}) and {len(comp)} right of it (compute-bound: {names(comp)})."]
    lo = lambda m: m.get("fraction_lo", m["fraction_of_ceiling"])  # noqa: E731
    hi = lambda m: m.get("fraction_hi", m["fraction_of_ceiling"])  # noqa: E731

    def pct(ms):
        return ", ".join(f"{m['op']} {percent(m['fraction_of_ceiling'])}" + (
            f" (IQR {percent(lo(m))}-{percent(hi(m))})" if "fraction_lo" in m else "") for m in ms)

    over = lambda ms: [m for m in ms if lo(m) > 1]  # noqa: E731
    if over(mem):
        out.append(f"above the memory roof: {pct(over(mem))}. A flushed op cannot beat memory bandwidth from "
                   "memory, so part of its operands stayed in cache (small sizes), or the measured bandwidth "
                   "ceiling is below this device's best.")
    if over(comp):
        out.append(f"above the compute roof: {pct(over(comp))}. This is a ceiling problem: the measured compute "
                   "ceiling is not this device's best (measured at other sizes, or under other load), so every "
                   "fraction of it printed here is too high by the same factor.")
    at_roof = [m for m in measured if lo(m) <= 1 < m["fraction_of_ceiling"]]
    if at_roof:
        out.append(f"at their roof within the noise: {pct(at_roof)}; the IQR reaches below 100%, so this run "
                   "cannot say they beat it.")
    slow = [m for m in measured if m["fraction_of_ceiling"] < low]
    if slow:
        out.append(f"below {low:.0%} of their roof: {pct(slow)}. Their cost is not what the count says: "
                   "instructions the count ignores (transcendentals, reductions across a row), a fixed cost "
                   "per call that dominates at this size, or other work on the machine sharing its caches.")
    fits = [m for m in measured if low <= m["fraction_of_ceiling"] <= 1]
    if fits:
        out.append(f"between {low:.0%} and 100% of their roof: {pct(fits)}.")
    return out
