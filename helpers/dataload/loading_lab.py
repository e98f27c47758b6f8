"""Notebook 12's measurements: where a training step's time goes, loader sweeps, worker memory, host-to-device copies.

* `Breakdown` / `step_breakdown`: per training step, the time spent waiting for the batch, copying it
  to the device and computing, and the share of the step the device was idle.
* `loader_breakdown` / `sweep` / `sweep_rounds`: a fixed number of warm-up steps, best of rounds (the
  course's goal checks; notebook 12's headlines come from `helpers.dataload.loading_sweep_lab`); `epochs_time`:
  the loader alone over whole epochs.
* `worker_memory`: what a forked worker's unique memory (USS) grows by when it reads every document
  (copy-on-access: reading a Python object writes its reference count, so the page is copied).
* CUDA only: `h2d_bandwidth` (pageable, pinned, pinned on the fly) and `copy_overlap` (a copy on a
  side stream beside compute).
* `breakdown_figure`: stacked wait / copy / compute bars of a sweep.
* `resolve_parameters`: notebook 12's parameters validated at once (with `check_nonnegative`,
  `check_worker_counts`, and the documents every later cell takes), the profile's defaults filled in.
"""
from __future__ import annotations

import math
import multiprocessing as mp
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

import numpy as np
import psutil
import torch

from helpers.dataload import loading, packing
from helpers.gpt import data
from helpers.gpt.model import PRESETS
from helpers.measure import bench, clock, params, protocol
from helpers.measure.params import positive
from helpers.show import plots

# ---------------------------------------------------------------- where a step's time goes

@dataclass
class Breakdown:
    """Seconds per step (medians over the timed steps) and the totals they come from."""

    wait: float  # waiting for the next batch from the loader
    copy: float  # host-to-device copy of the batch (0 on a CPU: nothing to copy)
    compute: float  # forward, backward and optimizer step
    tokens: int  # real (non-padding) tokens per step, summed over the timed steps
    seconds: float  # wall time of the timed steps
    steps: int
    wait_samples: list[float] = field(default_factory=list, repr=False)

    @property
    def step(self) -> float:
        """Median step time in seconds (wait + copy + compute)."""
        return self.wait + self.copy + self.compute

    @property
    def idle(self) -> float:
        """Share of the step the device did not compute (waiting for data and copying)."""
        return (self.wait + self.copy) / self.step if self.step > 0 else 0.0

    @property
    def tokens_per_s(self) -> float:
        """Real tokens trained on per second of wall time."""
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def step_breakdown(model, batches: Iterable[packing.Batch], *, steps: int, warmup: int = 1, device: str = "cpu",
                   mask: bool = False, non_blocking: bool = False, lr: float = 1e-3) -> Breakdown:
    """Train `warmup + steps` steps from `batches` and time the last `steps`: wait, copy and compute per step.

    Each phase is closed by a device synchronisation, so the three add up to the step and the copy is
    never hidden behind compute (this measures the serial cost; overlap is `copy_overlap`'s subject).
    mask=True runs `packing.forward_packed` with the block-diagonal mask and per-document positions.
    Raises ValueError for steps that is not a positive int, a negative warmup, or a loader that runs out
    before `warmup + steps` batches.
    """
    positive("steps", steps)
    if warmup < 0:
        raise ValueError(f"warmup={warmup} must be >= 0")
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    it = iter(batches)
    waits, copies, computes, tokens = [], [], [], 0

    def step(i):
        try:
            return loading.timed_step(model, it, opt, device=device, mask=mask, non_blocking=non_blocking)
        except StopIteration:
            raise ValueError(f"the loader ran out after {i} batches; {warmup + steps} were asked for") from None

    for i in range(warmup):
        step(i)
    bench.sync(device)
    with clock.Stopwatch(tally=False) as timed:  # wall time: the steps include waiting for the loader
        for i in range(warmup, warmup + steps):
            st = step(i)
            waits.append(st.wait)
            copies.append(st.copy)
            computes.append(st.compute)
            tokens += st.tokens
    med = lambda xs: float(np.median(xs))  # noqa: E731
    return Breakdown(med(waits), med(copies), med(computes), tokens, timed.wall, steps, waits)


def loader_breakdown(model, dataset, *, steps: int, warmup: int = 1, device: str = "cpu", **loader_kw) -> Breakdown:
    """`step_breakdown` through a fresh `loading.make_loader(dataset, **loader_kw)`, its workers shut down after.

    The worker start-up is part of the first (warm-up) step, so it is not in the medians but is in
    nothing else either; `loader_kw` must include batch_size and row_len.
    """
    loader = loading.make_loader(dataset, **loader_kw)
    try:
        return step_breakdown(model, loader, steps=steps, warmup=warmup, device=device,
                              mask=loader_kw.get("kind", "pad") == "pack",
                              non_blocking=loader_kw.get("pin_memory", False))
    finally:
        loading.shutdown(loader)


def sweep(make_model: Callable[[], torch.nn.Module], dataset, configs: Sequence[dict], *, steps: int,
          warmup: int = 1, device: str = "cpu", **common) -> list[dict]:
    """`loader_breakdown` for each loader configuration (a dict of `loading.make_loader` keywords over `common`).

    Every configuration trains a fresh `make_model()` (call torch.manual_seed inside it for equal
    weights). Returns one row per configuration: its keywords, then wait_ms, copy_ms, compute_ms,
    step_ms (medians), idle (share of the step) and tokens_per_s (real tokens over wall time).
    """
    rows = []
    for cfg in configs:
        model = make_model().to(device)
        bd = loader_breakdown(model, dataset, steps=steps, warmup=warmup, device=device, **{**common, **cfg})
        rows.append({**cfg, "wait_ms": 1e3 * bd.wait, "copy_ms": 1e3 * bd.copy, "compute_ms": 1e3 * bd.compute,
                     "step_ms": 1e3 * bd.step, "idle": bd.idle, "tokens_per_s": bd.tokens_per_s})
    return rows


def sweep_rounds(make_model: Callable[[], torch.nn.Module], dataset, configs: Sequence[dict], *, steps: int,
                 rounds: int = 2, warmup: int = 1, device: str = "cpu", **common) -> list[dict]:
    """`sweep` repeated `rounds` times, interleaved (round 1 in order, round 2 reversed, ...).

    The machine's load drifts over a sweep; interleaving spreads that drift over every configuration.
    Returns one row per configuration (in the order of `configs`): the round with the most tokens/s
    (its wait_ms, copy_ms, compute_ms, step_ms, idle, tokens_per_s), plus `tokens_per_s_rounds`, the
    tokens/s of every round. Raises ValueError when `rounds` is not a positive int.
    """
    positive("rounds", rounds)
    runs: list[list[dict]] = [[] for _ in configs]
    for k in range(rounds):
        order = list(range(len(configs)))[:: -1 if k % 2 else 1]
        for i in order:
            runs[i].append(sweep(make_model, dataset, [configs[i]], steps=steps, warmup=warmup, device=device,
                                 **common)[0])
    return [{**max(rs, key=lambda r: r["tokens_per_s"]), "tokens_per_s_rounds": [r["tokens_per_s"] for r in rs]}
            for rs in runs]


def epochs_time(dataset, *, epochs: int, **loader_kw) -> float:
    """Seconds to iterate `epochs` epochs of `loading.make_loader(dataset, **loader_kw)`, with no model.

    The workers' start-up is included.
    """
    loader = loading.make_loader(dataset, **loader_kw)
    try:
        with clock.Stopwatch(tally=False) as sw:  # wall time: the main thread waits for the workers
            for _ in range(epochs):
                for _batch in loader:
                    pass
        return sw.wall
    finally:
        loading.shutdown(loader)


# ---------------------------------------------------------------- memory per worker

def _uss(pid: int | None = None) -> int:
    return psutil.Process(pid).memory_full_info().uss


def _touch_all(store: loading.DocumentStore, conn) -> None:
    before = _uss()
    total = 0
    for i in range(len(store)):
        total += int(store.doc(i)[0])  # read one byte of every document, as a worker reading items would
    conn.send((before, _uss(), total))
    conn.close()


def worker_memory(store: loading.DocumentStore) -> dict[str, int]:
    """Fork one process (as a DataLoader worker is forked on Linux), read every document, report its USS.

    Returns {"uss_before", "uss_after", "growth"} in bytes: the worker's unique memory before and after
    the reads. Reading a Python object writes its reference count, so every page holding an object
    header is copied into the worker; a numpy array is one object and its data pages stay shared.
    Raises RuntimeError where fork is unavailable (Windows; macOS defaults to spawn, which copies
    the whole dataset into each worker instead).
    """
    if "fork" not in mp.get_all_start_methods():
        raise RuntimeError("this platform cannot fork; workers start by spawn and each gets a pickled copy")
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_touch_all, args=(store, child), daemon=True)
    proc.start()
    try:
        if not parent.poll(120):
            raise RuntimeError("the forked reader did not answer within 120 s")
        before, after, _ = parent.recv()
    finally:
        proc.join(10)
        if proc.is_alive():
            proc.kill()
            proc.join()
    return {"uss_before": before, "uss_after": after, "growth": after - before}


# ---------------------------------------------------------------- CUDA: pinned memory and overlap

def h2d_bandwidth(sizes: Sequence[int], *, reps: int = 10) -> list[dict[str, float]]:
    """Host-to-device GB/s per size in bytes: pageable `.to()`, pinned `.to(non_blocking=True)`, and
    pin-on-the-fly (`.pin_memory()` then the non-blocking copy, every time). CUDA only (RuntimeError otherwise).

    Each number is bytes / median time by the course's protocol (`protocol.compare`: warmed up until steady,
    at least `reps` interleaved rounds, CUDA events); "separated" says whether the three timings' IQRs are disjoint;
    "pinned_speedup" (pageable time / pinned time) and "otf_slowdown" (pin-on-the-fly time / pageable time) are
    (ratio of medians, lo, hi) with the IQR bounds of `protocol.ratio`.
    The source buffers come from `loading.host_buffer`: written memory, not the zero page of a fresh allocation.
    """
    if not torch.cuda.is_available():
        raise RuntimeError("host-to-device bandwidth needs a CUDA device")
    rows = []
    for n in sizes:
        pageable = loading.host_buffer(n)
        pinned = loading.host_buffer(n).pin_memory()
        dst = torch.empty(n, dtype=torch.uint8, device="cuda")
        fns = {"pageable": lambda: dst.copy_(pageable),
               "pinned": lambda: dst.copy_(pinned, non_blocking=True),
               "pin on the fly": lambda: dst.copy_(pageable.pin_memory(), non_blocking=True)}
        t = protocol.compare(fns, device="cuda", min_reps=reps, max_reps=3 * reps, budget_s=5.0)
        bounds = lambda r: (r.value, r.lo, r.hi)  # noqa: E731
        rows.append({"bytes": n, **{k: n / v.median / 1e9 for k, v in t.timings.items()},
                     "separated": t.rankable(), "pinned_speedup": bounds(t.ratio("pageable", "pinned")),
                     "otf_slowdown": bounds(t.ratio("pin on the fly", "pageable"))})
    return rows


def copy_overlap(nbytes: int, matmul_n: int, *, reps: int = 10) -> dict[str, float]:
    """Seconds for a pinned host-to-device copy alone, a matmul alone, and both with the copy on a side stream.

    Returns {"copy", "compute", "both", "hidden"}: hidden is the share of the shorter one that the
    overlap saved, (copy + compute - both) / min(copy, compute), clipped to [0, 1]. CUDA only.
    """
    if not torch.cuda.is_available():
        raise RuntimeError("copy/compute overlap needs a CUDA device")
    src = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    a = torch.randn(matmul_n, matmul_n, device="cuda", dtype=torch.bfloat16)
    side = torch.cuda.Stream()

    def copy():
        dst.copy_(src, non_blocking=True)

    def compute():
        a @ a

    def both():
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            dst.copy_(src, non_blocking=True)
        a @ a
        torch.cuda.current_stream().wait_stream(side)

    t = protocol.compare({"copy": copy, "compute": compute, "both": both}, device="cuda", min_reps=reps,
                         max_reps=3 * reps, budget_s=5.0)
    c, m, b = t["copy"].median, t["compute"].median, t["both"].median
    return {"copy": c, "compute": m, "both": b, "hidden": min(1.0, max(0.0, (c + m - b) / min(c, m)))}


# ---------------------------------------------------------------- the figure

def breakdown_figure(rows: Sequence[dict], labels: Sequence[str], *, title: str = "", ax=None,
                     step_iqr: Sequence[tuple[float, float]] | None = None):
    """Horizontal stacked bars of wait / copy / compute ms per step (medians), one bar per row; returns the figure.

    step_iqr: the (q25, q75) ms of each row's whole step, drawn as a black line across the bar's end
    (the medians of the parts need not add up to the median step exactly).
    """
    fig, ax = plots.figure(figsize=(8, 0.45 * len(rows) + 1.6)) if ax is None else (ax.figure, ax)
    left = np.zeros(len(rows))
    for part, color in (("wait_ms", "tab:red"), ("copy_ms", "tab:orange"), ("compute_ms", "tab:green")):
        vals = np.array([r[part] for r in rows], dtype=float)
        ax.barh(list(labels), vals, left=left, color=color, label=part[:-3])
        left += vals
    if step_iqr is not None:
        for y, (lo, hi) in enumerate(step_iqr):
            ax.plot([lo, hi], [y, y], color="black", lw=2, label="step IQR" if y == 0 else None)
    ax.set(xlabel="ms per step (medians)", title=title)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------- parameter checks for notebook 12

def check_nonnegative(name: str, value) -> float:
    """`value` as a float if it is a finite int or float >= 0, else ValueError naming the parameter."""
    if type(value) not in (int, float) or not 0 <= value < math.inf:
        raise ValueError(f"{name}={value!r} must be a finite number >= 0")
    return float(value)


def check_worker_counts(name: str, values) -> list[int]:
    """`values` as a list if it is a non-empty list or tuple of ints >= 0 (0: load in the main process)."""
    if isinstance(values, (str, bytes)) or not isinstance(values, (list, tuple)) or not values or any(
            type(w) is not int or w < 0 for w in values):
        raise ValueError(f"{name}={values!r} must be a non-empty list of ints >= 0")
    return list(values)


MIN_DOC = 8  # notebook 12's documents are at least 8 tokens long (loading.document_lengths' min_len)
PANEL_STEPS = 3  # timed steps of the panel's one-configuration sweep
EXAMPLE_BATCHES = 4  # the packing checks and the packing-vs-padding step take 4 x BATCH documents


def documents_needed(batch: int, steps: int, batches: Sequence[int], workers: Sequence[int]) -> int:
    """The fewest documents notebook 12's cells can run on: each loader drops its last partial batch and must
    give 1 warm-up + `steps` full batches (the panel's 1 + PANEL_STEPS), at `batch` and, when some worker count
    is above 0, at every size of `batches`; the packing examples take EXAMPLE_BATCHES x `batch` documents."""
    sizes = [batch] + ([b for b in batches if b != batch] if max(workers) > 0 else [])
    return max(EXAMPLE_BATCHES * batch, batch * (1 + max(steps, PANEL_STEPS)), max(sizes) * (1 + steps))


def resolve_parameters(S: params.Setup, *, MODEL, ROW_LEN, N_DOCS, MEDIAN_LEN, LATENCY_MS, BATCH, WORKERS, PREFETCH,
                       BATCHES, STEPS, REPS) -> dict:
    """Notebook 12's parameters, validated at once and with the profile's defaults filled in: {name: value}.

    Raises ValueError naming the first bad parameter, and where a later cell could not use a value: a
    ROW_LEN below MIN_DOC (documents are at least that long and clipped to one row), a MEDIAN_LEN not below
    ROW_LEN, fewer documents than `documents_needed`, or more than the training corpus holds.
    """
    R = S.resolve
    out = {"MODEL": R("MODEL", MODEL, smoke="tiny", full="small10m", check=lambda n, v: params.choose(n, v, PRESETS)),
           "ROW_LEN": R("ROW_LEN", ROW_LEN, smoke=64, full=256, check=params.positive),
           "N_DOCS": R("N_DOCS", N_DOCS, smoke=3000, full=40000, check=params.positive),
           "MEDIAN_LEN": R("MEDIAN_LEN", MEDIAN_LEN, smoke=24, full=80, check=params.positive),
           "LATENCY_MS": R("LATENCY_MS", LATENCY_MS, smoke=10.0, full=0.5, check=check_nonnegative),
           "BATCH": R("BATCH", BATCH, smoke=8, full=64, check=params.positive),
           "WORKERS": R("WORKERS", WORKERS, smoke=[0, 2], full=[0, 2, 4, 8], check=check_worker_counts),
           "PREFETCH": R("PREFETCH", PREFETCH, smoke=[2], full=[1, 2, 8], check=params.positives),
           "BATCHES": R("BATCHES", BATCHES, smoke=[8], full=[64, 256], check=params.positives),
           "STEPS": R("STEPS", STEPS, smoke=8, full=20, check=params.positive),
           "REPS": R("REPS", REPS, smoke=8, full=20, check=params.positive)}
    row_len, n_docs, median = out["ROW_LEN"], out["N_DOCS"], out["MEDIAN_LEN"]
    if row_len < MIN_DOC:
        raise ValueError(f"ROW_LEN={row_len} must be at least {MIN_DOC}: documents are at least {MIN_DOC} tokens long "
                         "and each must fit one row")
    if median >= row_len:
        raise ValueError(f"MEDIAN_LEN={median} must be below ROW_LEN={row_len}: documents are clipped to one row")
    need = documents_needed(out["BATCH"], out["STEPS"], out["BATCHES"], out["WORKERS"])
    if n_docs < need:
        raise ValueError(f"N_DOCS={n_docs} is too few: each loader drops its last partial batch and must give 1 + "
                         f"STEPS full batches (the panel 1 + {PANEL_STEPS}) of BATCH={out['BATCH']}"
                         + (f" and of every size in BATCHES={out['BATCHES']}" if max(out["WORKERS"]) > 0 else "")
                         + f", and the packing examples take {EXAMPLE_BATCHES} x BATCH; use at least {need}")
    lengths = loading.document_lengths(n_docs, median=median, sigma=1.0, min_len=MIN_DOC, max_len=row_len, seed=S.seed)
    corpus = len(data.load_corpus("train"))
    if lengths.sum() > corpus:
        raise ValueError(f"N_DOCS={n_docs} documents need {lengths.sum()} tokens; the corpus has {corpus}")
    return out
