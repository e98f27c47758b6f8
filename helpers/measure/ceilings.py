"""What the device does in practice: its measured matmul throughput and copy bandwidth, and the ceilings
notebook 00 records for the later notebooks (the best of that record and a measurement made now).

Every timing here is `bench.benchmark`'s: on a CPU with torch on one thread (as `params.setup` leaves it) the
thread's own CPU clock, so a ceiling measured on a busy machine is the quiet machine's. A copy's time is a
per-call cost plus its bytes over the bandwidth (`fit_copy`); the copy ceiling is the bandwidth of copies
that stream from memory, with the per-call cost fitted and taken out (`fitted_copy_ceiling`)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from helpers.measure.bench import Timing, benchmark, cpu_threads
from helpers.measure.hardware import capabilities, last_level_cache, matmul_fn, matmul_unsupported
from helpers.measure.params import positive
from helpers.measure.results import device_name, load_results, results_dir


def matmul_timing(n: int, dtype: str = "fp32", device: str | None = None, reps: int = 10, warmup: int = 3, *,
                  m: int | None = None, k: int | None = None) -> tuple[Timing, int] | None:
    """(Timing, FLOPs) of an n×n×n matmul in `dtype` ((m×k)@(k×n) when m or k is given, as `matmul_fn`), on the
    clock `bench.benchmark` reads; None where the dtype cannot run here."""
    device = device or ("cuda" if capabilities()["cuda"] else "cpu")
    if matmul_unsupported(dtype, device):
        return None
    fn, flops = matmul_fn(n, dtype, device, m=m, k=k)
    return benchmark(fn, warmup=warmup, reps=reps, device=device), flops


def tflops_range(timing: Timing, flops: float) -> tuple[float, float, float]:
    """(median, low, high) TFLOP/s of `flops` done in `timing`'s median, 75th and 25th percentile times."""
    return flops / timing.median / 1e12, flops / timing.q75 / 1e12, flops / timing.q25 / 1e12


def measure_matmul_tflops(n: int, dtype: str = "fp32", device: str | None = None,
                          reps: int = 10, warmup: int = 3, *, m: int | None = None,
                          k: int | None = None) -> float | None:
    """Measured TFLOP/s (the median call's) of an n×n×n matmul in `dtype` ((m×k)@(k×n) when m or k is given,
    as `matmul_fn`); None where the dtype cannot run here."""
    timed = matmul_timing(n, dtype, device, reps, warmup, m=m, k=k)
    return None if timed is None else tflops_range(*timed)[0]


def copy_moved(nbytes: int) -> int:
    """Bytes a copy of an `nbytes` fp32 buffer moves: each element (at least one) read once and written once."""
    return 2 * 4 * max(1, int(nbytes) // 4)


def copy_timing(nbytes: int, device: str | None = None, reps: int = 10, warmup: int = 3) -> Timing:
    """Timing of a device-to-device copy of an `nbytes` fp32 buffer (at least one element) into another, on the
    clock `bench.benchmark` reads (on a CPU with torch on one thread, the thread's own CPU clock)."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    src = torch.empty(max(1, int(nbytes) // 4), dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    return benchmark(lambda: dst.copy_(src), warmup=warmup, reps=reps, device=device)


def measure_copy_bandwidth(nbytes: int = 2**28, device: str | None = None,
                           reps: int = 10, warmup: int = 3) -> float:
    """Measured GB/s of one device-to-device copy (bytes read plus bytes written, over the median call's time,
    per-call cost included: use it where the bytes dominate, as at `copy_size`)."""
    return copy_moved(nbytes) / copy_timing(nbytes, device, reps, warmup).median / 1e9


FIXED_SHARE_MAX = 0.10  # a copy whose per-call cost is under 10% of its time measures its bytes, not its calls


def fit_copy(moved, seconds) -> tuple[float, float]:
    """(per-call seconds, GB/s): the least-squares line seconds = fixed + moved / bandwidth through the points
    (bytes moved, seconds per copy), each residual taken relative to its time, so that a 2 µs copy and a 20 ms
    one count alike. A negative intercept (the per-call cost lost in the noise) is refitted through zero.

    Raises ValueError for fewer than two distinct sizes, a time that is not positive, or times that do not grow
    with the bytes (no bandwidth to fit)."""
    pts = [(float(x), float(t)) for x, t in zip(moved, seconds)]
    if len({x for x, _ in pts}) < 2 or any(t <= 0 for _, t in pts):
        raise ValueError(f"fit_copy needs at least two sizes with positive times, got {pts!r:.120}")
    # the model t = a + b*x (a: seconds per call, b: seconds per byte); its relative residual (t - a - b*x) / t
    # is 1 - a*u - b*v with u = 1/t and v = x/t, a plain linear least-squares problem in (a, b)
    u = [1 / t for _, t in pts]  # minimise sum((1 - a*u - b*v)^2) over the points
    v = [x / t for x, t in pts]
    # the normal equations [suu suv; suv svv] (a, b) = (su, sv), solved by Cramer's rule
    suu, svv, suv = sum(a * a for a in u), sum(b * b for b in v), sum(a * b for a, b in zip(u, v))
    su, sv = sum(u), sum(v)
    det = suu * svv - suv * suv
    fixed, per_byte = ((su * svv - sv * suv) / det, (suu * sv - suv * su) / det) if det > 0 else (-1.0, 0.0)
    if fixed < 0:  # a per-call cost below zero is noise: fit the line through the origin, b = sv / svv
        fixed, per_byte = 0.0, sv / svv
    if per_byte <= 0:
        raise ValueError("the copy times do not grow with the bytes moved: there is no bandwidth to fit")
    return fixed, 1e-9 / per_byte  # seconds per byte -> GB/s (1e9 bytes per second)


def past_cache(nbytes: int, device: str | None = None) -> bool:
    """Whether a copy of an `nbytes` buffer streams from memory: it is at least `copy_size(device)`, past the
    last-level cache by the rule the one measured copy of `bandwidth_ceiling` follows."""
    return int(nbytes) >= copy_size(device)


@dataclass(frozen=True)
class CopyCeiling:
    """Memory's copy bandwidth from a sweep (`fitted_copy_ceiling`): GB/s fitted on the median times, with the same fit
    on the 75th and 25th percentile times as its low and high bound; the per-call cost the fit found; the
    source buffers' bytes of the sizes it used; the per-call cost's largest share of their times; the clock."""

    gbps: float
    lo: float
    hi: float
    fixed_s: float
    sizes: tuple[int, ...]
    fixed_share: float
    clock: str


def fitted_copy_ceiling(sizes, timings, per_call: Timing, device: str | None = None) -> CopyCeiling | None:
    """The copy ceiling of a sweep: `fit_copy` over the one-element copy `per_call` (its time is the per-call
    cost) and the sizes past the cache (`past_cache`) whose per-call cost is below FIXED_SHARE_MAX of their time,
    so the bytes dominate every size it uses. `sizes`: source bytes; `timings`: their `copy_timing`s. None when
    no size qualifies (all inside the cache, or the per-call cost too large a share)."""
    x0 = copy_moved(4)
    use = [i for i, n in enumerate(sizes) if past_cache(n, device)]
    fixed = per_call.median
    for _ in range(2):  # fit, drop the sizes the fitted per-call cost dominates, fit again
        use = [i for i in use if fixed < FIXED_SHARE_MAX * timings[i].median]
        if not use:
            return None
        xs = [x0] + [copy_moved(sizes[i]) for i in use]
        fixed, gbps = fit_copy(xs, [per_call.median] + [timings[i].median for i in use])
    lo = fit_copy(xs, [per_call.q75] + [timings[i].q75 for i in use])[1]
    hi = fit_copy(xs, [per_call.q25] + [timings[i].q25 for i in use])[1]
    return CopyCeiling(gbps, min(lo, hi, gbps), max(lo, hi, gbps), fixed, tuple(int(sizes[i]) for i in use),
                       max(fixed / timings[i].median for i in use), timings[use[0]].clock)


CEILINGS_RECORD = "hardware_ceilings"


def load_ceilings(folder=None) -> dict | None:
    """The ceilings notebook 00 recorded for *this* device in the results folder, or None."""
    rec = load_results(folder or results_dir()).get(CEILINGS_RECORD)
    if rec is None or rec.get("device") != device_name():
        return None
    return rec["metrics"]


def _measure_shape(size, dtype: str, device: str | None, reps: int) -> float | None:
    """TFLOP/s of one matmul: `size` is n (square n x n x n) or (m, k, n); None where dtype cannot run."""
    m, k, n = (size, size, size) if isinstance(size, int) else size
    return measure_matmul_tflops(n, dtype, device, reps=reps, warmup=min(reps, 3), m=m, k=k)


def _shape_name(size) -> str:
    return f"n={size}" if isinstance(size, int) else "({}x{})@({}x{})".format(size[0], size[1], size[1], size[2])


def matmul_ceiling(dtype: str, sizes, device: str | None = None, reps: int = 5) -> tuple[float | None, str]:
    """(TFLOP/s, where it came from): the best of notebook 00's recorded ceiling for this device and
    the matmuls over `sizes` measured now (each an int n for n x n x n, or an (m, k, n) shape such as
    a model's own GEMMs). A ceiling is the best of every measurement available: a lower one would make
    fractions of it exceed 100%. None (with the reason as source) where `dtype` cannot run here.
    """
    recorded = load_ceilings()
    best_rec = recorded["matmul_tflops"].get(dtype) if recorded else None
    measured = [(t, s) for t, s in ((_measure_shape(s, dtype, device, reps), s) for s in sizes) if t is not None]
    now = max(measured, key=lambda ts: ts[0]) if measured else None
    shapes = ", ".join(_shape_name(s) for s in sizes)
    if best_rec is None:
        if now is None:
            return None, f"{dtype} matmul cannot run on this device"
        return now[0], (f"measured just now at {shapes}" if len(sizes) == 1 else
                        f"measured just now: the best of {shapes}, reached at {_shape_name(now[1])}")
    if now is None or best_rec >= now[0]:
        return best_rec, (f"notebook 00, this results folder (best of that record and {shapes} measured now"
                          + (f", {now[0]:.4g} TFLOP/s)" if now else ")"))
    return now[0], (f"measured just now: the best of {shapes}, reached at {_shape_name(now[1])}, above notebook "
                    f"00's record of {best_rec:.4g} TFLOP/s in this results folder")


COPY_CEILINGS: dict[tuple, tuple[float, str]] = {}  # this process's copy ceilings, by (device, threads, folder)


def copy_size(device: str | None = None) -> int:
    """Bytes of the source buffer of a copy-bandwidth ceiling: on a GPU 1 GiB; on a CPU the smallest power of
    two at or above its last-level cache, at least 64 MiB (also when the cache size is unknown) and at most
    1 GiB, so that the copy's traffic (source and destination, at least twice the cache) streams from memory."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if torch.device(device).type != "cpu":
        return 2 ** 30
    llc = last_level_cache("cpu")[0] or 2 ** 26
    return min(2 ** 30, 1 << max(26, (llc - 1).bit_length()))


def _recorded_copy_source(recorded: dict) -> str:
    """Which copies notebook 00's recorded `copy_gbps` came from, for a ceiling's source."""
    sizes = recorded.get("copy_sizes_mb")
    if sizes:
        span = f"{sizes[0]:g} MiB" if len(sizes) == 1 else f"{sizes[0]:g}-{sizes[-1]:g} MiB"
        n = recorded.get("copy_threads")
        on = f" on {n} thread{'s' if n != 1 else ''}" if n else ""
        return f"copies of {span} past the cache{on}, per-call cost fitted out"
    mb = _recorded_copy_mb()
    return "its largest copy" if mb is None else f"its largest copy, {mb:g} MiB"


def _recorded_copy_mb() -> float | None:
    """The largest copy (MiB) of notebook 00's copy sweep in this results folder (a record made before the copy
    ceiling was fitted took its `copy_gbps` from that copy alone), or None without that record."""
    sweep = load_results(results_dir()).get("hardware_copy_sweep")
    sizes = (sweep or {}).get("metrics", {}).get("sizes_mb") if isinstance(sweep, dict) else None
    return float(sizes[-1]) if sizes else None


def bandwidth_ceiling(device: str | None = None, *, threads: int | None = None, reps: int = 5
                      ) -> tuple[float, str]:
    """(GB/s, where it came from): the copy bandwidth every GB/s of the course is set against, the one rule.

    Made once per process (a notebook run) for each (device, threads, results folder) and reused
    (`COPY_CEILINGS`). On a CPU the copy runs on `threads` torch intra-op threads (None: the current count,
    one after `params.setup`), timed on the clock `bench.benchmark` reads: with one thread, the thread's own
    CPU clock. It is notebook 00's recorded `copy_gbps` for this device (`fitted_copy_ceiling` of its sweep; the
    source names the copies) when the results folder holds one measured on as many threads (a record that
    does not say its thread count applies only when `threads` is None); otherwise one copy of
    `copy_size(device)` bytes measured now (read + write, GB = 1e9 B, `reps` timed copies after one warm-up;
    at that size the per-call cost is a negligible share of the time). The source states the size and
    thread count."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    cpu = torch.device(device).type == "cpu"
    if threads is not None:
        positive("threads", threads)
    key = (device, threads if cpu else None, str(results_dir()))
    if key in COPY_CEILINGS:
        return COPY_CEILINGS[key]
    recorded = load_ceilings()
    want = (threads or torch.get_num_threads()) if cpu else None
    rec_threads = (recorded or {}).get("copy_threads")
    applies = bool(recorded and recorded.get("copy_gbps")) and (
        not cpu or (threads is None if rec_threads is None else rec_threads == want))
    if applies:
        out = (float(recorded["copy_gbps"]),
               f"notebook 00's record for this device ({_recorded_copy_source(recorded)}), this results folder")
    else:
        nbytes = copy_size(device)
        n = (threads or torch.get_num_threads()) if cpu else None
        with cpu_threads(device, n or 1):  # on a GPU it changes nothing
            gbps = measure_copy_bandwidth(nbytes, device, reps=reps, warmup=1)
        llc, name = last_level_cache(device)
        where = ("" if not llc else
                 f", {'past' if 2 * nbytes > llc else 'inside'} the {llc / 2**20:g} MiB {name} cache")
        on = f" on {n} thread{'s' if n != 1 else ''}" if cpu else ""
        why = ("notebook 00 has no record for this device in this results folder"
               if not (recorded and recorded.get("copy_gbps")) else
               "notebook 00's whole-machine record does not apply to a step timed on fewer threads"
               if rec_threads is None else
               f"notebook 00's record, on {rec_threads} thread{'s' if rec_threads != 1 else ''}, does not apply "
               f"to a step timed on {n}")
        out = gbps, f"measured just now: one {nbytes / 2**20:g} MiB copy{on}{where}; {why}"
    COPY_CEILINGS[key] = out
    return out
