"""Profiler evidence for a claim about where time or memory goes.

`profile(fn)` runs `fn` under `torch.profiler` and returns the top ops by *self* time (time spent
in the op itself, not in the ops it calls, so the rows add up to at most 100% of the profiled time)
and saves a Chrome-format trace that Perfetto (https://ui.perfetto.dev) or chrome://tracing opens.
On CUDA the ranking is by device (kernel) time, on a CPU by CPU time.

`memory_snapshot(fn)` records CUDA allocator history while `fn` runs and dumps a pickle that
PyTorch's memory visualiser (https://pytorch.org/memory_viz) draws as the active-memory timeline
(PyTorch docs, "Understanding CUDA Memory Usage"). It needs CUDA: on other devices it returns None
and says so in one sentence.
"""
from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from torch.profiler import ProfilerActivity
from torch.profiler import profile as torch_profile

from helpers.measure import results
from helpers.show.tables import table


@dataclass
class Profile:
    """What `profile` measured. `rows`: (op, self ms per step, calls per step, share of profiled self time)."""

    rows: list[tuple[str, float, float, float]]
    device: str
    steps: int
    total_ms: float
    trace_path: Path | None = None
    notes: list[str] = field(default_factory=list)

    def table(self) -> str:
        """The rows as a printable table, with where the trace was saved."""
        unit = "device" if self.device == "cuda" else "CPU"
        text = table(["op", f"self {unit} ms/step", "calls/step", "share"],
                     [[name, f"{ms:.3f}", f"{calls:g}", f"{share:.1%}"] for name, ms, calls, share in self.rows])
        text += f"\n(top {len(self.rows)} ops by self {unit} time over {self.steps} profiled steps; " \
                f"{self.total_ms:.3f} ms/step of self time in all)"
        if self.trace_path:
            text += f"\ntrace for Perfetto / chrome://tracing: {self.trace_path}"
        return "\n".join([text, *self.notes])


# Leaf aten GEMM ops (what a CPU profile shows): the composites aten::linear / aten::matmul are left out, since
# they call these and counting both would count one multiply two or three times.
_ATEN_MATMULS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")
# Words in CUDA GEMM kernel names (nvjet: cuBLAS's kernels on Hopper).
_GEMM_KERNEL_WORDS = ("gemm", "cublas", "cutlass", "xmma", "nvjet")


def is_matmul(op: str) -> bool:
    """True for a profiler row that is a matrix multiply: a leaf aten GEMM op (aten::mm, addmm, bmm, baddbmm,
    on a CPU) or a GEMM kernel (CUDA: ...gemm..., cublas..., cutlass..., xmma..., nvjet...). Attention kernels
    (fused "fmha" kernels, even those built on CUTLASS) and composites (aten::linear, aten::matmul) are not."""
    if op in _ATEN_MATMULS:
        return True
    name = op.lower()
    return "fmha" not in name and any(word in name for word in _GEMM_KERNEL_WORDS)


@contextlib.contextmanager
def quiet_stderr():
    """Send what native code writes to file descriptor 2 to /dev/null for the duration."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _self_us(event: Any, on_cuda: bool) -> float:
    if on_cuda:
        for attr in ("self_device_time_total", "self_cuda_time_total"):
            if hasattr(event, attr):
                return float(getattr(event, attr))
    return float(event.self_cpu_time_total)


def _profiled(fn: Callable[[], Any], steps: int, warmup: int):
    """(the profiler after `steps` calls of `fn` that followed `warmup` unprofiled ones, whether CUDA was traced)."""
    on_cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    for _ in range(warmup):
        fn()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda else [])
    prof = torch_profile(activities=activities)
    with quiet_stderr():  # the profiler's C++ side announces its start and stop on file descriptor 2
        prof.start()
    try:
        for _ in range(steps):
            fn()
        if on_cuda:
            torch.cuda.synchronize()
    finally:
        with quiet_stderr():
            prof.stop()
    return prof, on_cuda


def profile(fn: Callable[[], Any], *, steps: int = 3, warmup: int = 1, top: int = 10,
            trace_dir: str | os.PathLike | None = None, name: str = "trace") -> Profile:
    """Profile `steps` calls of `fn` (after `warmup` unprofiled ones); save the trace under `trace_dir`.

    `trace_dir=None` saves into the run's results folder (`helpers.measure.results.results_dir()/traces`).
    Raises ValueError for steps < 1, warmup < 0 or top < 1.
    """
    if steps < 1 or warmup < 0 or top < 1:
        raise ValueError(f"steps={steps}, warmup={warmup}, top={top}: need steps >= 1, warmup >= 0, top >= 1")
    prof, on_cuda = _profiled(fn, steps, warmup)
    events = [e for e in prof.key_averages() if _self_us(e, on_cuda) > 0]
    total = sum(_self_us(e, on_cuda) for e in events)
    events.sort(key=lambda e: _self_us(e, on_cuda), reverse=True)
    rows = [(e.key, _self_us(e, on_cuda) / steps / 1e3, e.count / steps, _self_us(e, on_cuda) / total if total else 0.0)
            for e in events[:top]]
    if trace_dir is None:
        trace_dir = results.results_dir() / "traces"
    folder = Path(trace_dir)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(tmp)
        os.replace(tmp, path)  # a reader never sees a half-written trace
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return Profile(rows, "cuda" if on_cuda else "cpu", steps, total / steps / 1e3, path)


def memory_snapshot(fn: Callable[[], Any], path: str | os.PathLike, *, max_entries: int = 100_000) -> Path | None:
    """Record CUDA allocations while `fn` runs and save the snapshot for pytorch.org/memory_viz.

    Returns the path, or None (after printing one sentence) when CUDA is not available.
    """
    if not torch.cuda.is_available():
        print("memory snapshot skipped: the allocator history it draws is CUDA's, and this run has no CUDA device")
        return None
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.cuda.memory._record_memory_history(max_entries=max_entries)
    try:
        fn()
        torch.cuda.synchronize()
        tmp = path.with_name(f".{path.name}.tmp")
        torch.cuda.memory._dump_snapshot(str(tmp))
        os.replace(tmp, path)
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    return path


@dataclass
class Shares:
    """What `category_shares` measured: each category's share of the profiled self time (summing to 1), the
    self time per step in ms, and the device whose time it is (kernel time on CUDA, CPU time otherwise)."""

    shares: dict[str, float]
    ms_per_step: float
    device: str


def _chain(event: Any) -> list[str]:
    """The names of an event and of every op it was called from, innermost first."""
    names = []
    while event is not None:
        names.append(event.name)
        event = event.cpu_parent
    return names


def category_shares(fn: Callable[[], Any], categorize: Callable[[list[str]], str], *, steps: int = 2,
                    warmup: int = 1) -> Shares:
    """Profile `steps` calls of `fn` (after `warmup`) and sum every op's self time (its kernels' time on CUDA) into
    the category `categorize(names)` gives it, `names` being the op and every op it was called from, innermost
    first (so a range such as "Optimizer.step#AdamW.step" claims every op inside it). Raises ValueError for
    steps < 1 or warmup < 0."""
    if steps < 1 or warmup < 0:
        raise ValueError(f"steps={steps}, warmup={warmup}: need steps >= 1 and warmup >= 0")
    prof, on_cuda = _profiled(fn, steps, warmup)
    totals: dict[str, float] = {}
    for e in prof.events():
        if getattr(e, "device_type", None) is not None and "CUDA" in str(e.device_type):
            continue  # a kernel's own event: its time is counted with the op that launched it
        us = _self_us(e, on_cuda)
        if us > 0:
            cat = categorize(_chain(e))
            totals[cat] = totals.get(cat, 0.0) + us
    total = sum(totals.values())
    return Shares({k: v / total for k, v in totals.items()} if total else {}, total / steps / 1e3,
                  "cuda" if on_cuda else "cpu")
