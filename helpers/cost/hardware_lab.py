"""Notebook 00's lab, over 400 lines because the course map and the reference comparison read the same ceilings.

Its parameters, the matmul panel, the copy sweep's table and figure, the sentences generated from its ceiling
sweeps, the map of the course along the three axes (`COURSE_MAP`) and this run's ceilings beside a reference GPU's.

The measuring primitives (the timer, the matmul per format, the copy fit, the ceilings) are in
`helpers.measure` (`ceilings`); this module turns their numbers into the notebook's panel and findings. A
panel callback is a plain function: the notebook binds the run's context (device, ceilings) with
`functools.partial` and hands it to `helpers.show.widgets.panel`; tests call it directly and inspect the figure.
"""
from __future__ import annotations

import json
from pathlib import Path

from helpers.cost.roofline import OPS, count
from helpers.measure import ceilings, hardware, params
from helpers.measure.bench import Timing
from helpers.show import plots
from helpers.show.units import percent

MIB = 2 ** 20

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
    copy_mb = S.resolve("COPY_SIZES_MB", COPY_SIZES_MB, smoke=default_copy_sizes_mb(S.device),
                        full=[1, 16, 64, 256, 1024, 4096],
                        check=lambda n, v: params.positives(n, _floats(params.listed(n, v)), float))
    tiny = [mb for mb in copy_mb if mb < FP32_MIB]
    if tiny:
        raise ValueError(f"COPY_SIZES_MB={copy_mb!r}: entry {tiny[0]!r} MiB is less than one fp32 element "
                         f"(4 bytes = {FP32_MIB:.3g} MiB), so its copy would move nothing; use sizes of at least "
                         f"{FP32_MIB:.3g} MiB")
    reps = S.resolve("REPS", REPS, smoke=5, full=20, check=params.positive)
    return {"DTYPES": dtypes, "MATMUL_SIZES": sizes, "COPY_SIZES_MB": copy_mb, "REPS": reps}


def default_copy_sizes_mb(device: str = "cpu") -> list[float]:
    """The smoke profile's copy sizes (MiB): four inside any cache (0.25 to 16 MiB) and one to three past it,
    `ceilings.copy_size(device)` times 1, 2 and 4 while the source buffer stays at most 1 GiB, so that the copy
    ceiling is fitted over copies that stream from memory on this machine, whatever its cache."""
    past = ceilings.copy_size(device)
    return [0.25, 1.0, 4.0, 16.0] + [past * k / MIB for k in (1, 2, 4) if k == 1 or past * k <= 2 ** 30]


def emulated_formats(dtypes, device: str) -> dict[str, str]:
    """{dtype: the one sentence} for the formats of `dtypes` emulated on `device` (`hardware.emulated`)."""
    return {d: why for d in dtypes if d in ("bf16", "fp16") and (why := hardware.emulated(d, device))}


def best_sizes(sizes: list[int], ranges: dict[str, list[tuple[float, float, float] | None]],
               emulated: dict[str, str] | None = None) -> dict[str, tuple[float, float, float, int]]:
    """{dtype: (median TFLOP/s, low, high, n)} at the size whose median was highest, for each format of a matmul
    sweep that is not in `emulated` (`emulated_formats`: its time measures the emulation, so it gets no
    ceiling). `ranges[dtype][i]` is (median, low, high) TFLOP/s at `sizes[i]` (`ceilings.tflops_range`; None: not
    run). The low and high bound are that size's IQR: the ceiling is one size's median with its spread."""
    out = {}
    for d, rows in ranges.items():
        if d in (emulated or {}):
            continue
        pts = [(r, n) for r, n in zip(rows, sizes) if r is not None and r[0] > 0]
        if pts:
            (value, lo, hi), n = max(pts, key=lambda p: p[0][0])
            out[d] = (value, lo, hi, n)
    return out


def copy_sweep(sizes_mb, device: str, reps: int, per_call: Timing, progress=lambda xs, desc: xs):
    """Time a copy of each size in `sizes_mb` (MiB; `ceilings.copy_timing`) and fit the copy ceiling over them
    (`ceilings.fitted_copy_ceiling`, with `per_call`, a one-element copy's timing, as the per-call cost). When no size
    streams from memory with its bytes dominating, one copy of `ceilings.copy_size(device)` is added (said in a
    printed sentence) and the fit made again. Returns (source bytes per size, their timings, the CopyCeiling or
    None). `progress(sizes, desc)` wraps the loop (a progress bar)."""
    sizes = [max(4, int(mb * MIB)) for mb in sizes_mb]
    timings = [ceilings.copy_timing(n, device, reps=reps, warmup=2) for n in progress(sizes, desc="copy sizes")]
    fit = ceilings.fitted_copy_ceiling(sizes, timings, per_call, device)
    if fit is None:
        big = ceilings.copy_size(device)
        print(f"no copy of COPY_SIZES_MB streams from memory with its bytes dominating, so one copy of {big / MIB:g} "
              "MiB (past the last-level cache) is added to the sweep for the ceiling.")
        sizes, timings = sizes + [big], timings + [ceilings.copy_timing(big, device, reps=reps, warmup=2)]
        fit = ceilings.fitted_copy_ceiling(sizes, timings, per_call, device)
    return sizes, timings, fit


def copy_bandwidths(sizes: list[int], timings: list[Timing], fixed_s: float) -> list[tuple | None]:
    """Per size, (median, low, high) GB/s of its bytes with the per-call cost `fixed_s` taken out of the median,
    75th and 25th percentile times; None where the per-call cost is all of the median time (no bytes to see)."""
    out = []
    for n, t in zip(sizes, timings):
        moved = ceilings.copy_moved(n)
        rate = lambda secs: moved / (secs - fixed_s) / 1e9 if secs > fixed_s else None  # noqa: E731
        mid = rate(t.median)
        out.append(None if mid is None else (mid, rate(t.q75) or 0.0, rate(t.q25) or float("inf")))
    return out


def copy_rows(sizes: list[int], timings: list[Timing], fixed_s: float, device: str = "cpu") -> list[list]:
    """The copy sweep's table: MiB, median µs (IQR), GB/s of the whole call, GB/s with the per-call cost taken
    out (IQR), the per-call cost's share of the time, and whether the copy streams from memory."""
    rows = []
    for n, t, bw in zip(sizes, timings, copy_bandwidths(sizes, timings, fixed_s)):
        rows.append([n / MIB, f"{t.median * 1e6:.4g} ({t.q25 * 1e6:.4g}-{t.q75 * 1e6:.4g})",
                     ceilings.copy_moved(n) / t.median / 1e9,
                     "per-call cost only" if bw is None else f"{bw[0]:.3g} ({bw[1]:.3g}-{bw[2]:.3g})",
                     percent(min(1.0, fixed_s / t.median)), "memory" if ceilings.past_cache(n, device) else "cache"])
    return rows


COPY_COLUMNS = ["MiB", "µs per copy (IQR)", "GB/s, whole call", "GB/s, per-call cost out (IQR)", "per-call share",
                "served from"]


def copy_figure(sizes: list[int], timings: list[Timing], per_call: Timing, ceiling: "ceilings.CopyCeiling | None",
                title: str = "copy: per-call cost + bytes / bandwidth"):
    """Two panels: the time per copy against the bytes it moves (medians with IQR bars, the per-call cost and
    the fitted line per-call + bytes / bandwidth), and each size's GB/s with the per-call cost taken out beside
    the copy ceiling and its IQR band."""
    fig, (ax1, ax2) = plots.figure(2)
    moved = [ceilings.copy_moved(n) for n in sizes]
    us = [t.median * 1e6 for t in timings]
    ax1.errorbar(moved, us, yerr=[[(t.median - t.q25) * 1e6 for t in timings],
                                  [(t.q75 - t.median) * 1e6 for t in timings]], marker="o", ls="", label="measured")
    fixed = ceiling.fixed_s if ceiling else per_call.median
    ax1.axhline(per_call.median * 1e6, ls=":", color="grey", label=f"one-element copy {per_call.median * 1e6:.3g} µs")
    if ceiling:
        xs = [moved[0] / 2] + moved + [moved[-1] * 2]
        ax1.plot(xs, [(fixed + x / ceiling.gbps / 1e9) * 1e6 for x in xs], ls="--",
                 label=f"{fixed * 1e6:.3g} µs + bytes / {ceiling.gbps:.3g} GB/s")
    ax1.set_xscale("log", base=2)
    ax1.set_yscale("log")
    ax1.set_xlabel("bytes moved (read + write)")
    ax1.set_ylabel("µs per copy")
    ax1.set_title(title)
    ax1.legend(fontsize=8)
    mb = [n / MIB for n in sizes]
    bws = copy_bandwidths(sizes, timings, fixed)
    pts = [(m, b) for m, b in zip(mb, bws) if b is not None]
    if pts:
        ax2.errorbar([m for m, _ in pts], [b[0] for _, b in pts],
                     yerr=[[b[0] - b[1] for _, b in pts], [min(b[2], 10 * b[0]) - b[0] for _, b in pts]],
                     marker="o", label="per-call cost taken out")
    if ceiling:
        ax2.axhline(ceiling.gbps, ls="--", color="grey", label=f"copy ceiling {ceiling.gbps:.3g} GB/s")
        ax2.axhspan(ceiling.lo, ceiling.hi, color="grey", alpha=0.2)
    ax2.set_xscale("log", base=2)
    ax2.set_xlabel("buffer size (MiB)")
    ax2.set_ylabel("GB/s")
    ax2.set_title("bandwidth of the bytes")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    return fig


def copy_findings(sizes: list[int], timings: list[Timing], per_call: Timing,
                  ceiling: "ceilings.CopyCeiling | None", device: str = "cpu") -> list[str]:
    """Sentences from a copy sweep: the per-call cost, the ceiling and where it came from, and, for each copy
    inside the cache, whether its bytes moved faster than memory's (only when the IQRs are apart) or the
    per-call cost hid them."""
    fixed = ceiling.fixed_s if ceiling else per_call.median
    llc, name = hardware.last_level_cache(device)
    cache = f"the {llc / MIB:g} MiB {name} cache" if llc else "the cache"
    out = [f"per-call cost: a one-element copy took {per_call.median * 1e6:.3g} µs (IQR {per_call.q25 * 1e6:.3g}-"
           f"{per_call.q75 * 1e6:.3g})" + (f"; the fit over the copies past {cache} puts it at {fixed * 1e6:.3g} µs."
                                          if ceiling else ".")]
    if ceiling:
        span = ", ".join(f"{n / MIB:g}" for n in ceiling.sizes)
        out.append(f"memory's copy bandwidth: {ceiling.gbps:.3g} GB/s (the fit on the quartile times: "
                   f"{ceiling.lo:.3g}-{ceiling.hi:.3g}), from the copies of {span} MiB, past {cache}, where the "
                   f"per-call cost was at most {percent(ceiling.fixed_share)} of the time: the bytes dominate, so "
                   "this is the bandwidth, and the ceiling the later notebooks use.")
    else:
        out.append(f"no copy of this sweep streams from memory with its bytes dominating (at least "
                   f"{ceilings.copy_size(device) / MIB:g} MiB, the per-call cost under "
                   f"{percent(ceilings.FIXED_SHARE_MAX)} of its time), so it gives no copy ceiling.")
    inside = [(n, t, b) for n, t, b in zip(sizes, timings, copy_bandwidths(sizes, timings, fixed))
              if not ceilings.past_cache(n, device)]
    hidden = [n for n, t, b in inside if fixed >= ceilings.FIXED_SHARE_MAX * t.median]
    if hidden:
        out.append(f"at {', '.join(f'{n / MIB:g}' for n in hidden)} MiB the per-call cost was "
                   f"{percent(ceilings.FIXED_SHARE_MAX)} or more of the time: those copies time the call as much as "
                   "the bytes, and their whole-call GB/s understates the bandwidth.")
    if ceiling:
        faster = [(n, b) for n, t, b in inside if b is not None and b[1] > ceiling.hi]
        close = [n for n, t, b in inside if b is not None and b[1] <= ceiling.hi and b[2] >= ceiling.lo]
        if faster:
            out.append("inside " + cache + ", with the per-call cost out: " + "; ".join(
                f"{n / MIB:g} MiB at {b[0]:.3g} GB/s ({b[0] / ceiling.gbps:.2g}x memory's)" for n, b in faster)
                + ". Their IQRs lie above the ceiling's: that is cache bandwidth, not memory's.")
        if close:
            out.append(f"at {', '.join(f'{n / MIB:g}' for n in close)} MiB, inside {cache}, the bandwidth's IQR "
                       "overlaps memory's: this run cannot tell cache from memory there (other work on the machine "
                       "shares the cache, and a buffer near its size partly misses it).")
    return out


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
    timing, flops = ceilings.matmul_timing(n, dtype, device, reps=reps)
    achieved, lo, hi = ceilings.tflops_range(timing, flops)
    print(f"{dtype}, n={n}: {achieved:.3g} TFLOP/s (IQR {lo:.3g}-{hi:.3g})")
    if emulated_formats([dtype], device):
        print(emulated_formats([dtype], device)[dtype] + "; it has no measured ceiling here.")
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


def peak_findings(sizes: list[int], sweep: dict[str, list[float | None]],
                  ranges: dict[str, list[tuple[float, float, float] | None]] | None = None) -> list[str]:
    """One sentence per format of a matmul sweep: the size where it peaked, and how far below the peak the
    smallest and the largest sizes stayed. `sweep[dtype][i]` is TFLOP/s at `sizes[i]` (None: not run).
    With `ranges` ((median, low, high) per size, as `best_sizes` takes), a size whose IQR overlaps the best
    size's is not ranked below it: the sentence names every such size as reaching the best alike."""
    out = []
    for dtype, values in sweep.items():
        pts = [(n, v) for n, v in zip(sizes, values) if v is not None and v > 0]
        if not pts:
            continue
        n_best, best = max(pts, key=lambda p: p[1])
        (n_small, small), (n_large, large) = pts[0], pts[-1]
        rows = dict(zip(sizes, (ranges or {}).get(dtype) or [None] * len(sizes)))
        tied = [n for n, _ in pts if rows.get(n) and rows.get(n_best) and rows[n][2] >= rows[n_best][1]] or [n_best]
        smallest = (f"the smallest, n={n_small}, reached {percent(small / best)} of its best" if n_small not in tied
                    else "the smallest size was the fastest" if len(tied) == 1
                    else "the smallest size was among the fastest")
        if len(tied) > 1:
            where = (f"reached its best at n={', '.join(map(str, tied))} alike (their IQRs overlap)"
                     + (f"; n={n_large}, the largest, reached {percent(large / best)} of that" if n_large not in tied
                        else ""))
        elif n_best == n_large:
            where = f"peaked at the largest size, n={n_best}"
        else:
            where = (f"peaked at n={n_best}, not at the largest size (n={n_large} reached {percent(large / best)} "
                     "of that)")
        out.append(f"{dtype} {where}; {smallest}.")
    return out


def half_precision_findings(best: dict[str, float], ridge: dict[str, float], device: str,
                            flags: list[str] | None, n: int = 1024, *,
                            spread: dict[str, tuple[float, float]] | None = None,
                            emulated: dict[str, str] | None = None) -> list[str]:
    """On a CPU: how much slower (or faster) fp16/bf16 matmuls ran than fp32, why, and what that did to
    their ridge points (FLOP/B), counted against notebook 01's ops at size `n`. Empty on CUDA.

    `best`: {dtype: best TFLOP/s}; `ridge`: {dtype: FLOP/B}; `flags`: `cpu_half_precision_flags()`;
    `spread`: {dtype: (low, high) TFLOP/s} of each best (with it, two formats whose ranges overlap are not
    ranked); `emulated`: {dtype: sentence} (`emulated_formats`): such a format gets its sentence and no ratio
    or ridge point, since its time measures the emulation.
    """
    if device != "cpu" or not best.get("fp32"):
        return []
    out, slow, emulated, spread = [], [], emulated or {}, spread or {}
    for dtype in ("fp16", "bf16"):
        if dtype in emulated:
            out.append(emulated[dtype] + "; it is kept out of the ceilings and the ridge points.")
            slow.append(dtype)
            continue
        if not best.get(dtype):
            continue
        ratio = best["fp32"] / best[dtype]
        (lo32, hi32), (lo, hi) = spread.get("fp32", (best["fp32"],) * 2), spread.get(dtype, (best[dtype],) * 2)
        if dtype in spread and "fp32" in spread and not (hi < lo32 or hi32 < lo):
            out.append(f"{dtype} and fp32 matmuls cannot be ranked in this run: at their best sizes their IQRs "
                       f"overlap ({dtype} {lo:.3g}-{hi:.3g}, fp32 {lo32:.3g}-{hi32:.3g} TFLOP/s).")
            continue
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
        has = [d for d in slow if any(d in f for f in flags)]
        lacks = [d for d in slow if d not in has]
        if lacks:
            out.append(f"This CPU lists {', '.join(flags)}, none of them for {' or '.join(lacks)}: those products run "
                       "in kernels that convert to fp32 as they go.")
        if has:
            out.append(f"This CPU lists {', '.join(flags)}, yet {' and '.join(has)} ran slower: this PyTorch build "
                       f"did not use those units for these sizes.")
    else:
        out.append(f"This CPU lists half-precision matrix instructions ({', '.join(flags)}).")
    return out


# ---------------------------------------------------------------- the three axes, and the course's map of them

AXES = ("memory", "compute", "communication")  # the first source text's three axes of efficiency (section 1.1)
# (axis, the bottleneck a learner observes, what they would measure, the technique, the notebook that builds and
# measures it, the key of this run's number that applies there or None)
COURSE_MAP = (
    ("compute", "achieved FLOP/s far under the datasheet", "each format's best matmul TFLOP/s", "measured ceilings",
     "00", "matmul"),
    ("compute", "an op runs under its roofline", "its FLOP/B against the ridge point", "arithmetic intensity, roofline",
     "01", "ridge"),
    ("compute", "a step slower than 6ND predicts", "MFU against the measured ceiling", "exact FLOP counts, MFU", "02",
     None),
    ("compute", "fp32 matmuls below the half-precision peak", "step time, loss gap to fp32",
     "mixed precision, loss scaling", "03", None),
    ("memory", "activations fill memory at long sequences", "bytes saved for backward, recompute time",
     "activation checkpointing", "04", None),
    ("memory", "the batch you want does not fit", "tokens per optimizer step, step time", "gradient accumulation",
     "05", None),
    ("memory", "attention slower than its FLOPs say", "bytes to and from memory against the copy bandwidth",
     "FlashAttention (tiling, online softmax)", "06", "copy"),
    ("compute", "bf16 matmuls at their peak", "fp8 matmul TFLOP/s, loss gap", "FP8 training", "07", None),
    ("memory", "the weights do not fit, or decode reads too many bytes", "bytes of weights, tokens/s, loss gap",
     "int8/int4/NF4 quantization, QLoRA", "08", None),
    ("compute", "many small kernels, each paying a per-call cost", "kernel count, time with compile time apart",
     "torch.compile, Triton fusion", "09", "per_call"),
    ("memory", "decode's tokens/s set by the bytes one step reads", "achieved GB/s against the copy bandwidth",
     "KV cache, GQA/MQA, paging, continuous batching", "10", "copy"),
    ("memory", "one pass over the weights per token at batch 1", "tokens per target pass, tokens/s",
     "speculative decoding", "11", None),
    ("communication", "the device waits for the next batch", "loader wait's share of the step",
     "loader workers, prefetch, pinned memory, packing", "12", None),
    ("communication", "step time grows with the ranks", "all-reduce time against bytes (latency, bandwidth)",
     "ring all-reduce, DDP overlap, ZeRO/FSDP, TP/PP", "13", None),
    ("all three", "gains that do not multiply", "a ladder of step times, each technique alone and stacked",
     "the combination", "14", None),
)
MAP_COLUMNS = ["axis", "bottleneck you observe", "what you measure", "technique", "notebook", "this run"]


def course_map_rows(measured: dict[str, tuple[float, float, float, str]]) -> list[list]:
    """COURSE_MAP as table rows, the last column this run's number where one applies: `measured` is {key: (median,
    low, high, unit and condition)} for the keys COURSE_MAP names ("matmul", "ridge", "copy", "per_call"); a row
    whose key this run did not measure, or that has none, says which notebook measures it."""
    rows = []
    for axis, seen, measure, technique, nb, key in COURSE_MAP:
        if key in measured:
            v, lo, hi, unit = measured[key]
            here = f"{v:.3g} ({lo:.3g}-{hi:.3g}) {unit}"
        else:
            here = "measured there" if nb != "00" else "-"
        rows.append([axis, seen, measure, technique, nb, here])
    return rows


def reference_ceilings(folder) -> dict | None:
    """The `hardware_ceilings` record in a reference folder (`results/<gpu>/`), or None where there is none."""
    path = Path(folder) / "hardware_ceilings.json"
    return json.loads(path.read_text()) if path.is_file() else None


def beside_reference(best: dict[str, float], copy_gbps: float, ref: dict) -> list[list]:
    """Rows of this run's ceilings beside a reference GPU's recorded ones (`reference_ceilings`): quantity, this run,
    the reference, the reference's share of its datasheet. Formats missing on either side are left out."""
    m, sheet = ref["metrics"], ref["metrics"].get("datasheet") or {}
    share = lambda v, s: "-" if not s else percent(v / s)  # noqa: E731
    rows = [[f"{d} matmul TFLOP/s", best[d], m["matmul_tflops"][d], share(m["matmul_tflops"][d], sheet.get("tflops", {}).get(d))]
            for d in best if d in m.get("matmul_tflops", {})]
    rows.append(["copy GB/s", copy_gbps, m["copy_gbps"], share(m["copy_gbps"], sheet.get("bandwidth_gbs"))])
    return rows


def efficiency_gap_claim(rows: list[list], ref: dict | None, device: str, has_datasheet: bool) -> dict:
    """`claims.verdict`'s keywords for the second source text's section 5 claim that a modern GPU's efficiency and
    a mobile GPU's differ little (H100 against Apple M1): "not testable", with why and what stands nearest."""
    near = "; ".join(f"{q}: {here:.3g} here, {there:.3g} on the reference ({s} of its datasheet)" for q, here, there, s in rows)
    when = ref["date"][:10] if ref else None
    why = ("it compares achieved-over-peak efficiency on an H100 and on an M1 GPU measured by the same code; this run has "
           f"one {device}" + ("" if has_datasheet else " with no datasheet peak in the course's table, so no efficiency of its own")
           + ", and the course's reference records are an H200's" + (f" (results/nvidia-h200, {when})" if when else ""))
    return dict(claim_id="gpu-efficiency-gap-small", notebook="00",
                claim="the efficiency gap between a modern GPU (H100) and a mobile one (M1) is small",
                source="the second source text, section 5", verdict="not testable", reason=why,
                measured=near or f"this {device}'s ceilings only", unit="x", claimed=(0.8, 1.25))
