"""The one timing API of the course: the clock each device is timed on, repeated calls, and the rates made from them."""
from __future__ import annotations

import contextlib
import math
import os
import statistics
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
from helpers.measure import clock as clocks, hardware


@dataclass(frozen=True)
class Timing:
    """Seconds per call: median, inter-quartile range and every raw sample."""

    median: float
    q25: float
    q75: float
    samples: list[float] = field(repr=False)
    warmup: int = 0
    device: str = "cpu"
    resolution: float = 0.0  # the least the timer reports for an empty call on this device (0: unknown)
    clock: str = clocks.WALL  # what the samples were read from: clocks.THREAD, clocks.WALL or clocks.EVENTS
    wall: list[float] = field(default_factory=list, repr=False)  # the same calls' wall seconds (thread clock only)

    @property
    def ran_share(self) -> float | None:
        """On the thread's clock, the fraction of the wall time the thread ran during these calls; else None."""
        if self.clock != clocks.THREAD or not self.wall or sum(self.wall) <= 0:
            return None
        return min(1.0, sum(self.samples) / sum(self.wall))

    @property
    def below_resolution(self) -> bool:
        """True when even the fastest sample is within RESOLUTION_FACTOR of the least the timer reports for an
        empty call: then the timing measures the timer, not the function. (Minima, not medians: a busy
        machine slows both alike, but seldom every sample.)"""
        return bool(self.samples) and min(self.samples) < RESOLUTION_FACTOR * self.resolution

    @property
    def spread(self) -> float:
        """Inter-quartile range relative to the median (0.05 means ±5%-ish noise)."""
        return (self.q75 - self.q25) / self.median if self.median > 0 else 0.0

    @property
    def ms(self) -> float:
        """Median in milliseconds."""
        return self.median * 1e3

    def __str__(self) -> str:
        text = f"{self.ms:.3f} ms (IQR ±{100 * self.spread / 2:.1f}%, n={len(self.samples)})"
        return text + (" [below the timer's resolution: not a measurement]" if self.below_resolution else "")


def quartiles(samples: list[float]) -> tuple[float, float, float]:
    """(median, 25th percentile, 75th percentile) of one or more numbers (timings, per-round ratios)."""
    if len(samples) == 1:
        return samples[0], samples[0], samples[0]
    q = statistics.quantiles(samples, n=4, method="inclusive")
    return statistics.median(samples), q[0], q[2]


class _CacheFlusher:
    """Overwrites a buffer larger than the last-level cache so the next call starts cold."""

    def __init__(self, device: str):
        if device == "cuda":
            # twice the GPU's L2 (64 MiB when the driver does not say): writing it evicts every line of L2
            l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 64 * 2**20) or 64 * 2**20
            nbytes = 2 * l2
        else:
            nbytes = 64 * 2**20  # larger than any desktop or server CPU's L3 share of one process
        self.buf = torch.empty(nbytes // 4, dtype=torch.float32, device=device)  # allocated once, reused

    def __call__(self) -> None:
        # writes every byte of the buffer (no reads): the cache now holds the buffer's lines, not the timed
        # function's data, so its next call reads its operands from memory
        self.buf.fill_(1.0)


def resolve_device(device: "str | torch.device | None") -> str:
    """The device the timer runs on, 'cpu' or 'cuda', for one the course supports: 'cpu'; 'cuda' or 'cuda:N'
    (a GPU this machine has; the timer then records its CUDA events on the current device, so run on
    another one after `torch.cuda.set_device(N)`); None or 'auto', meaning CUDA when available, else the CPU.
    A `torch.device` is read by its name.

    Raises ValueError, in one sentence naming the allowed values, for anything else ('cdua', 'mps', 'meta',
    'cpu:0', a number), and for 'cuda' or 'cuda:N' on a machine without that GPU.
    """
    if isinstance(device, torch.device):
        device = str(device)
    if device is None or device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        return "cpu"
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    gpus = f"'cuda:0' to 'cuda:{count - 1}'" if count > 1 else "'cuda:0'" if count else "this machine has none"
    allowed = f"use 'cpu', 'cuda', 'cuda:N' ({gpus}), or None / 'auto' (CUDA when available, else the CPU)"
    index = device[5:] if isinstance(device, str) and device.startswith("cuda:") else None
    if device == "cuda" or (index is not None and index.isdigit() and index.isascii()):
        if not count:
            raise ValueError(f"device={device!r} was asked for, but this machine has no CUDA GPU "
                             f"(torch.cuda.is_available() is False); use 'cpu', or None / 'auto'")
        if index is not None and int(index) >= count:
            raise ValueError(f"device={device!r} does not exist: this machine has {count} CUDA GPU"
                             f"{'s' if count > 1 else ''}; {allowed}")
        return "cuda"
    raise ValueError(f"device={device!r} is not a device the course's timer supports; {allowed}")


def sync(device: "str | torch.device") -> None:
    """Wait until the work queued on `device` ("cuda", "cuda:N", a torch.device) has finished: a CUDA sync there,
    nothing on a CPU (which runs each op before it returns). Every clock read around GPU work follows one."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


class ImplausibleTiming(UserWarning):
    """A timing too short for the timer to resolve, or a rate beyond what the device can do."""


RESOLUTION_FACTOR = 2.0  # a call never faster than 2x an empty call's time is mostly the timer's own cost
_OVERHEAD: dict[str, float] = {}


def resolve_clock(device: str, clock: str = "auto") -> str:
    """The clock a timing on `device` ('cpu' or 'cuda') reads. On CUDA, always the GPU's events. On a CPU, "auto"
    is the thread's CPU clock when torch runs on one thread (as `params.setup` sets it) and the wall clock
    otherwise (the thread's clock would miss the other threads' work); "wall" is the wall clock, for code whose
    waiting is the lesson (loader workers, ranks, queues); "thread" insists on the thread's clock and raises
    ValueError when torch runs on more than one thread. A clock this function returned is accepted back, so a
    resolved name can be passed on ("cuda events" only on CUDA). Raises ValueError for any other name."""
    if clock not in ("auto", clocks.WALL, clocks.THREAD, clocks.EVENTS):
        raise ValueError(f"clock={clock!r}; choose 'auto', 'wall' or 'thread'")
    if device == "cuda":
        return clocks.EVENTS
    if clock == clocks.EVENTS:
        raise ValueError(f"clock={clock!r} is read on a CUDA GPU only; on device={device!r} "
                         "choose 'auto', 'wall' or 'thread'")
    if clock == clocks.THREAD and torch.get_num_threads() != 1:
        raise ValueError(f"clock='thread' times one thread, but torch runs on {torch.get_num_threads()}: "
                         "use torch.set_num_threads(1) (or bench.cpu_threads) around the timing, or clock='wall'")
    if clock == "auto":
        return clocks.THREAD if torch.get_num_threads() == 1 else clocks.WALL
    return clock


def _timed_samples(fn: Callable[[], Any], reps: int, device: str, flush: Callable[[], None] | None,
                   clock: str = clocks.WALL, walls: list[float] | None = None) -> list[float]:
    """`reps` timed calls of `fn()` in seconds: CUDA events on CUDA; on a CPU the thread's CPU clock (each call's
    wall seconds appended to `walls`, and tallied in `clock`) or the wall clock (perf_counter)."""
    if device == "cuda":
        torch.cuda.synchronize()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        for s, e in zip(starts, ends):
            if flush:
                flush()
            s.record()
            fn()
            e.record()
        torch.cuda.synchronize()
        return [s.elapsed_time(e) / 1e3 for s, e in zip(starts, ends)]
    samples = []
    for _ in range(reps):
        if flush:
            flush()
        if clock == clocks.THREAD:
            with clocks.Stopwatch() as sw:
                fn()
            samples.append(sw.cpu)
            if walls is not None:
                walls.append(sw.wall)
        else:
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
    return samples


def timer_overhead(device: str | None = None, clock: str = clocks.WALL) -> float:
    """The least the course's timer reports for a call that does nothing on `device` with `clock` (the fastest of
    51 calls, measured once per process), in seconds; never less than the clock's stated resolution."""
    device = resolve_device(device)
    clock = clocks.EVENTS if device == "cuda" else clock
    key = f"{device}/{clock}"
    if key not in _OVERHEAD:
        floor = time.get_clock_info("thread_time" if clock == clocks.THREAD else "perf_counter").resolution
        with _untallied():
            _timed_samples(lambda: None, 5, device, None, clock)  # warm-up: first event records, first calls
            _OVERHEAD[key] = max(min(_timed_samples(lambda: None, 51, device, None, clock)), floor)
    return _OVERHEAD[key]


@contextlib.contextmanager
def _untallied() -> Iterator[None]:
    """Keep the timer's own calibration out of the thread clock's tally."""
    saved = dict(clocks._tally)
    try:
        yield
    finally:
        clocks._tally.update(saved)


# Generous bounds that only a wrong timing crosses. A CPU core: 2,048 operations per cycle (twice the
# 1,024 bf16 operations per cycle that Wikipedia's 'Advanced Matrix Extensions' article gives for Intel
# AMX on 4th-gen Xeon) and 512 bytes per cycle (far above what a core's L1 cache serves), at 6.5 GHz.
CPU_FLOP_PER_CYCLE, CPU_BYTES_PER_CYCLE, CPU_MAX_HZ = 2048, 512, 6.5e9
GPU_UNKNOWN_TFLOPS, GPU_UNKNOWN_GBS = 10_000.0, 50_000.0  # a GPU missing from hardware.PEAKS


def plausible_tflops(device: str | None = None) -> float:
    """An upper bound in TFLOP/s that no correct timing on `device` exceeds: on a GPU in hardware.PEAKS,
    twice its highest dense datasheet peak (2:4 sparsity doubles it); on a CPU, the per-core bound above."""
    if resolve_device(device) == "cuda":
        peak = hardware.peaks_for()
        dense = [peak.tflops(d) for d in hardware.MATMUL_DTYPES if peak.tflops(d)] if peak else []
        return 2 * max(dense) if dense else GPU_UNKNOWN_TFLOPS
    return (os.cpu_count() or 1) * CPU_FLOP_PER_CYCLE * CPU_MAX_HZ / 1e12


def plausible_gbps(device: str | None = None) -> float:
    """An upper bound in GB/s that no correct timing on `device` exceeds: on a GPU in hardware.PEAKS, ten times
    its memory bandwidth (caches are faster than memory); on a CPU, the per-core bound above."""
    if resolve_device(device) == "cuda":
        peak = hardware.peaks_for()
        return 10 * peak.bandwidth_gbs if peak else GPU_UNKNOWN_GBS
    return (os.cpu_count() or 1) * CPU_BYTES_PER_CYCLE * CPU_MAX_HZ / 1e9


def _rate(amount: float, seconds: "float | Timing", unit: str, scale: float, limit: float | None,
          device: str | None, bound: Callable[[str | None], float]) -> float:
    """amount / seconds / scale, or NaN with an ImplausibleTiming warning when the timing cannot be trusted."""
    if isinstance(seconds, Timing):
        timing, device = seconds, seconds.device if device is None else device
        secs = timing.median
        too_short = timing.below_resolution
        floor = RESOLUTION_FACTOR * timing.resolution
    else:
        secs = float(seconds)
        floor = timer_overhead("cpu")  # no timer in this course reports less than the fastest empty perf_counter call
        too_short = not math.isfinite(secs) or secs < floor
    if too_short:
        warnings.warn(ImplausibleTiming(f"a timing of {secs:.3g} s is below what the timer can resolve "
                                        f"(~{floor:.2g} s): no {unit} figure is given"), stacklevel=3)
        return math.nan
    rate = amount / secs / scale
    limit = bound(device) if limit is None else limit
    if rate > limit:
        warnings.warn(ImplausibleTiming(f"{rate:.3g} {unit} is beyond what this device can do (bound "
                                        f"{limit:.3g} {unit}): the timing or the count is wrong, so no "
                                        f"{unit} figure is given"), stacklevel=3)
        return math.nan
    return rate


def benchmark(fn: Callable[[], Any], *, warmup: int = 3, reps: int = 10, flush_l2: bool = False,
              device: str | None = None, clock: str = "auto") -> Timing:
    """Time `fn()`: `warmup` untimed calls, then `reps` timed calls, synchronised on CUDA.

    On CUDA each call is bracketed by CUDA events (GPU time, no launch gaps hidden). On a CPU the clock is
    `resolve_clock(device, clock)`'s: with torch on one thread, the thread's own CPU clock (what the code did,
    not what the scheduler did; each call's wall time is kept in `Timing.wall`), else `time.perf_counter`.
    With `flush_l2`, a buffer larger than the cache is overwritten before every timed call (outside the
    timed region), so each call reads from memory, not cache.
    """
    if warmup < 0 or reps < 1:
        raise ValueError(f"warmup={warmup} must be >= 0 and reps={reps} >= 1")
    device = resolve_device(device)
    read = resolve_clock(device, clock)
    flush = _CacheFlusher(device) if flush_l2 else None
    for _ in range(warmup):
        fn()
    walls: list[float] = []
    samples = _timed_samples(fn, reps, device, flush, read, walls)
    med, q25, q75 = quartiles(samples)
    timing = Timing(med, q25, q75, samples, warmup, device, timer_overhead(device, read), read, walls)
    if timing.below_resolution:
        warnings.warn(ImplausibleTiming(
            f"the fastest call took {min(samples):.3g} s, less than {RESOLUTION_FACTOR:g}x the least the timer "
            f"reports for an empty call ({timing.resolution:.2g} s): this measures the timer, not the function"),
            stacklevel=2)
    return timing


def benchmark_interleaved(fns: dict[str, Callable[[], Any]], *, reps: int = 10, warmup: int = 1,
                          device: str | None = None, clock: str = "auto") -> dict[str, Timing]:
    """Time several callables round-robin, one timed call of each per round; a `Timing` per name, on the clock
    `benchmark` would read.

    On a shared or noisy machine a burst of other work then slows every candidate alike, instead of
    whichever happened to be timed at that moment, so their ratio is more trustworthy.
    """
    if warmup < 0 or reps < 1:
        raise ValueError(f"warmup={warmup} must be >= 0 and reps={reps} >= 1")
    device = resolve_device(device)
    read = resolve_clock(device, clock)
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    walls: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            samples[name] += _timed_samples(fn, 1, device, None, read, walls[name])
    over = timer_overhead(device, read)
    return {name: Timing(*quartiles(xs), xs, warmup, device, over, read, walls[name]) for name, xs in samples.items()}


def tflops(flops: float, seconds: "float | Timing", *, device: str | None = None,
           limit: float | None = None) -> float:
    """Counted FLOPs and seconds (or a `Timing`) -> TFLOP/s.

    Refuses what cannot be a measurement: returns NaN and warns `ImplausibleTiming` when the timing is
    below the timer's resolution (for a float: shorter than an empty timed call) or the rate exceeds
    `limit` (default `plausible_tflops(device)`; `device` defaults to the Timing's, else the current one).
    """
    return _rate(flops, seconds, "TFLOP/s", 1e12, limit, device, plausible_tflops)


def gbps(nbytes: float, seconds: "float | Timing", *, device: str | None = None,
         limit: float | None = None) -> float:
    """Counted bytes and seconds (or a `Timing`) -> GB/s (10^9 bytes per second); NaN and a warning for
    an implausible timing, as `tflops` (default limit `plausible_gbps(device)`)."""
    return _rate(nbytes, seconds, "GB/s", 1e9, limit, device, plausible_gbps)


def recoverable_failure(err: BaseException) -> str | None:
    """How a sweep records `err` and goes on ("out of memory: ...", "error: ..."), or None if it must stop.

    Out-of-memory errors and a library kernel's refusal (cuDNN finding no plan, say) leave CUDA
    usable; an illegal memory access or a device-side assert does not, and neither does anything
    that is not a RuntimeError.
    """
    first = (str(err).strip().splitlines() or [""])[0][:120]
    if isinstance(err, torch.cuda.OutOfMemoryError):
        return f"out of memory: {first}"
    broken = ("illegal memory", "device-side assert", "unspecified launch failure")
    if not isinstance(err, RuntimeError) or any(s in first.lower() for s in broken):
        return None
    return f"error: {first}"


@contextlib.contextmanager
def cpu_threads(device, n: int = 1) -> Iterator[None]:
    """Run the block with `n` torch intra-op threads when `device` is a CPU, restoring the count after; on
    another device, change nothing. On a CPU shared with other work a parallel loop waits at its end for its
    slowest thread, and one descheduled thread costs a whole scheduler slice: small kernels timed on two
    threads then measure the scheduler, and small matmuls run faster on one thread."""
    if torch.device(device).type != "cpu":
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
