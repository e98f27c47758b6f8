"""The one timing API of the course, plus memory measurement (CUDA peak, and saved-for-backward bytes)."""
from __future__ import annotations

import gc
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch


@dataclass(frozen=True)
class Timing:
    """Seconds per call: median, inter-quartile range and every raw sample."""

    median: float
    q25: float
    q75: float
    samples: list[float] = field(repr=False)
    warmup: int = 0
    device: str = "cpu"

    @property
    def spread(self) -> float:
        """Inter-quartile range relative to the median (0.05 means ±5%-ish noise)."""
        return (self.q75 - self.q25) / self.median if self.median > 0 else 0.0

    @property
    def ms(self) -> float:
        """Median in milliseconds."""
        return self.median * 1e3

    def __str__(self) -> str:
        return f"{self.ms:.3f} ms (IQR ±{100 * self.spread / 2:.1f}%, n={len(self.samples)})"


def _quantiles(samples: list[float]) -> tuple[float, float, float]:
    if len(samples) == 1:
        return samples[0], samples[0], samples[0]
    q = statistics.quantiles(samples, n=4, method="inclusive")
    return statistics.median(samples), q[0], q[2]


class _CacheFlusher:
    """Overwrites a buffer larger than the last-level cache so the next call starts cold."""

    def __init__(self, device: str):
        if device == "cuda":
            l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 64 * 2**20) or 64 * 2**20
            nbytes = 2 * l2
        else:
            nbytes = 64 * 2**20  # larger than any desktop or server CPU's L3 share of one process
        self.buf = torch.empty(nbytes // 4, dtype=torch.float32, device=device)

    def __call__(self) -> None:
        self.buf.fill_(1.0)


def resolve_device(device: str | None) -> str:
    """'cuda' if asked for or (when None/'auto') if available, else 'cpu'."""
    if device in (None, "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda"):
        return "cuda"
    return "cpu"


def benchmark(fn: Callable[[], Any], *, warmup: int = 3, reps: int = 10, flush_l2: bool = False,
              device: str | None = None) -> Timing:
    """Time `fn()`: `warmup` untimed calls, then `reps` timed calls, synchronised on CUDA.

    On CUDA each call is bracketed by CUDA events (GPU time, no launch gaps hidden); on CPU by
    `time.perf_counter`. With `flush_l2`, a buffer larger than the cache is overwritten before
    every timed call (outside the timed region), so each call reads from memory, not cache.
    """
    if warmup < 0 or reps < 1:
        raise ValueError(f"warmup={warmup} must be >= 0 and reps={reps} >= 1")
    device = resolve_device(device)
    flush = _CacheFlusher(device) if flush_l2 else None
    for _ in range(warmup):
        fn()
    samples: list[float] = []
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
        samples = [s.elapsed_time(e) / 1e3 for s, e in zip(starts, ends)]
    else:
        for _ in range(reps):
            if flush:
                flush()
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
    med, q25, q75 = _quantiles(samples)
    return Timing(med, q25, q75, samples, warmup, device)


def benchmark_interleaved(fns: dict[str, Callable[[], Any]], *, reps: int = 10, warmup: int = 1,
                          device: str | None = None) -> dict[str, Timing]:
    """Time several callables round-robin, one timed call of each per round; a `Timing` per name.

    On a shared or noisy machine a burst of other work then slows every candidate alike, instead of
    whichever happened to be timed at that moment, so their ratio is more trustworthy.
    """
    if warmup < 0 or reps < 1:
        raise ValueError(f"warmup={warmup} must be >= 0 and reps={reps} >= 1")
    device = resolve_device(device)
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            samples[name] += benchmark(fn, warmup=0, reps=1, device=device).samples
    return {name: Timing(*_quantiles(xs), xs, warmup, device) for name, xs in samples.items()}


def tflops(flops: float, seconds: float) -> float:
    """Counted FLOPs and seconds -> TFLOP/s."""
    return flops / seconds / 1e12


def gbps(nbytes: float, seconds: float) -> float:
    """Counted bytes and seconds -> GB/s (10^9 bytes per second)."""
    return nbytes / seconds / 1e9


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


def release_memory() -> None:
    """Free what a failed or finished step left behind (call it after the except block, once its frames are gone)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def peak_cuda_memory(fn: Callable[[], Any]) -> int | None:
    """Bytes of CUDA memory `fn()` needed above what was allocated before it; None without CUDA."""
    if not torch.cuda.is_available():
        return None
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


def _storage_key(t: torch.Tensor) -> tuple[int, int] | None:
    try:
        s = t.untyped_storage()
        return s.data_ptr(), s.nbytes()
    except (RuntimeError, NotImplementedError):  # tensors without storage (e.g. some subclasses)
        return None


@dataclass
class SavedTensors:
    """What a forward pass kept for backward: distinct storages, their bytes and their shapes."""

    nbytes: int = 0
    count: int = 0
    shapes: list[tuple[int, ...]] = field(default_factory=list)


def saved_tensors(fn: Callable[[], Any], ignore: Iterable[torch.Tensor] = ()) -> SavedTensors:
    """Run `fn()` and account for every tensor autograd saves for backward (each storage once).

    Tensors in `ignore` (typically the model's parameters, which are not activations) are left
    out. Works on every device, so activation memory can be measured without a GPU.
    """
    skip = {k for k in map(_storage_key, ignore) if k}
    seen: set[tuple[int, int]] = set()
    out = SavedTensors()

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = _storage_key(t)
        if key and key not in skip and key not in seen:
            seen.add(key)
            out.nbytes += key[1]
            out.count += 1
            out.shapes.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return out


def _is_weight_copy(t: torch.Tensor, params: set[int]) -> bool:
    """True for autocast's low-precision copy of a parameter: grad_fn leads (via views) to AccumulateGrad."""
    fn = t.grad_fn
    for _ in range(4):
        if fn is None:
            return False
        if fn.name() == "torch::autograd::AccumulateGrad":
            return id(fn.variable) in params
        nxt = [f for f, _ in fn.next_functions if f is not None]
        if len(nxt) != 1:
            return False
        fn = nxt[0]
    return False


def saved_breakdown(fn: Callable[[], Any], params: Iterable[torch.Tensor]) -> dict[str, int]:
    """Bytes `fn()` saves for backward, split into activations and autocast's copies of `params`."""
    params = list(params)
    skip = {p.untyped_storage().data_ptr() for p in params}
    ids = {id(p) for p in params}
    seen: set[int] = set()
    out = {"activations": 0, "weight_copies": 0}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        if s.data_ptr() not in skip and s.data_ptr() not in seen:
            seen.add(s.data_ptr())
            out["weight_copies" if _is_weight_copy(t, ids) else "activations"] += s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return out


def saved_tensor_bytes(fn: Callable[[], Any], ignore: Iterable[torch.Tensor] = ()) -> int:
    """Bytes of the distinct tensors `fn()` saves for backward (see `saved_tensors`)."""
    return saved_tensors(fn, ignore).nbytes
