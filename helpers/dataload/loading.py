"""Data loading for the course GPT: a realistic dataset, a memory-mapped baseline, and where a step's time goes.

* `DocumentStore`: the stdlib corpus cut into documents of heavy-tailed (log-normal) lengths, held
  either as one numpy array plus offsets ("numpy") or as a Python list of `bytes` objects ("python").
* `DocumentDataset`: a map-style `torch.utils.data.Dataset`; item i is document i tokenised on the fly
  (bytes -> int64 ids) after an optional `latency_ms` sleep that stands in for decoding or
  augmentation. An item depends only on its index, so batches are the same for any `num_workers`
  when the sampler has a seeded generator (`make_loader`).
* `write_token_file` / `MemmapBatches`: nanoGPT's and llm.c's fast path, one flat uint16 token file
  read through `np.memmap`, random windows, no per-item Python work.
* `step_breakdown`: per training step, the time spent waiting for the batch, copying it to the
  device and computing, and the share of the step the device was idle.
* `worker_memory`: what a forked worker's unique memory (USS) grows by when it reads every document
  (copy-on-access: reading a Python object writes its reference count, so the page is copied).
* CUDA only: `h2d_bandwidth` (pageable, pinned, pinned on the fly) and `copy_overlap` (a copy on a
  side stream beside compute).
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np
import torch

from helpers.dataload import packing

# ---------------------------------------------------------------- documents


def document_lengths(n_docs: int, *, median: int, sigma: float = 1.0, min_len: int = 8,
                     max_len: int | None = None, seed: int = 0) -> np.ndarray:
    """Heavy-tailed document lengths: log-normal with the given median and sigma, clipped; (n_docs,) int64.

    Raises ValueError for a non-positive count or median, a negative sigma, or max_len < min_len.
    """
    if n_docs < 1 or median < 1 or sigma < 0 or min_len < 2 or (max_len is not None and max_len < min_len):
        raise ValueError(f"n_docs={n_docs}, median={median}, sigma={sigma}, min_len={min_len}, max_len={max_len}: "
                         f"need n_docs, median >= 1, sigma >= 0, min_len >= 2, max_len >= min_len")
    rng = np.random.default_rng(seed)
    n = np.exp(rng.normal(math.log(median), sigma, size=n_docs))
    return np.clip(np.round(n), min_len, max_len if max_len is not None else np.inf).astype(np.int64)


class DocumentStore:
    """Documents cut from one token array, held as "numpy" (one array + offsets) or "python" (list of bytes).

    tokens: 1-D uint8 array or tensor (the corpus); lengths: (n_docs,) document lengths, taken in
    order from the start of `tokens` (which must be long enough). `doc(i)` returns document i's bytes
    as a read-only uint8 numpy array in both layouts.
    """

    def __init__(self, tokens, lengths: Sequence[int], layout: str = "numpy"):
        if layout not in ("numpy", "python"):
            raise ValueError(f"layout={layout!r}; choose 'numpy' or 'python'")
        tokens = tokens.numpy() if isinstance(tokens, torch.Tensor) else np.asarray(tokens)
        lengths = np.asarray(lengths, dtype=np.int64)
        ends = np.cumsum(lengths)
        if tokens.ndim != 1 or tokens.dtype != np.uint8 or len(lengths) == 0 or ends[-1] > len(tokens):
            raise ValueError(f"tokens must be 1-D uint8 holding at least sum(lengths)={int(ends[-1]) if len(ends) else 0} "
                             f"tokens; got {tokens.dtype} shape {tokens.shape}")
        self.layout = layout
        self.offsets = np.concatenate([[0], ends[:-1]]).astype(np.int64)  # (n_docs,)
        self.lengths = lengths
        if layout == "numpy":
            self.data = np.ascontiguousarray(tokens[: ends[-1]])  # one buffer: workers only ever read it
            self.docs = None
        else:
            self.data = None
            self.docs = [tokens[o:o + n].tobytes() for o, n in zip(self.offsets, lengths)]  # n_docs objects

    def __len__(self) -> int:
        return len(self.lengths)

    def doc(self, i: int) -> np.ndarray:
        """Document i's tokens as a uint8 array (a view into the store for "numpy")."""
        if self.layout == "numpy":
            o = self.offsets[i]
            return self.data[o:o + self.lengths[i]]
        return np.frombuffer(self.docs[i], dtype=np.uint8)

    @property
    def nbytes(self) -> int:
        """Bytes of token data held (the Python layout's object headers not included)."""
        return int(self.lengths.sum())


class DocumentDataset(torch.utils.data.Dataset):
    """Map-style dataset: item i is document i as int64 token ids (n_i,), after `latency_ms` of sleep.

    The sleep stands in for work a real pipeline does per item (decoding, tokenising with a slow
    tokenizer, augmentation, reading a remote shard); it releases the CPU, as waiting on I/O does.
    """

    def __init__(self, store: DocumentStore, latency_ms: float = 0.0):
        if not isinstance(latency_ms, (int, float)) or isinstance(latency_ms, bool) or latency_ms < 0:
            raise ValueError(f"latency_ms={latency_ms!r} must be a number >= 0")
        self.store, self.latency_ms = store, float(latency_ms)

    def __len__(self) -> int:
        return len(self.store)

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.latency_ms:
            time.sleep(self.latency_ms / 1e3)
        return torch.from_numpy(self.store.doc(i).astype(np.int64))  # (n_i,) int64, a fresh copy


def collate(kind: str, row_len: int) -> Callable[[list[torch.Tensor]], packing.Batch]:
    """The collate function for "pad" (one row per document, padded to row_len) or "pack" (packed rows)."""
    if kind not in ("pad", "pack"):
        raise ValueError(f"collate kind={kind!r}; choose 'pad' or 'pack'")
    if kind == "pad":
        return _Collate(packing.pad_batch, row_len)
    return _Collate(packing.pack_batch, row_len)


@dataclass
class _Collate:  # a class, not a closure, so that spawned workers can pickle it
    fn: Callable
    row_len: int

    def __call__(self, docs: list[torch.Tensor]) -> packing.Batch:
        return self.fn(docs, self.row_len)


def make_loader(dataset: torch.utils.data.Dataset, *, batch_size: int, num_workers: int = 0,
                prefetch_factor: int | None = None, persistent_workers: bool = False, pin_memory: bool = False,
                kind: str = "pad", row_len: int, seed: int = 0) -> torch.utils.data.DataLoader:
    """A DataLoader with a seeded shuffle, so its batches do not depend on num_workers.

    prefetch_factor is only allowed with workers (PyTorch's rule); None means PyTorch's default (2).
    Shut its workers down with `shutdown(loader)` when done.
    """
    if num_workers < 0 or batch_size < 1:
        raise ValueError(f"num_workers={num_workers} must be >= 0 and batch_size={batch_size} >= 1")
    if num_workers == 0 and (prefetch_factor is not None or persistent_workers):
        raise ValueError("prefetch_factor and persistent_workers need num_workers > 0")
    g = torch.Generator().manual_seed(seed)
    return torch.utils.data.DataLoader(
        dataset, batch_size=batch_size, shuffle=True, generator=g, num_workers=num_workers,
        prefetch_factor=prefetch_factor, persistent_workers=persistent_workers, pin_memory=pin_memory,
        collate_fn=collate(kind, row_len), drop_last=True)


def shutdown(loader: torch.utils.data.DataLoader) -> None:
    """Stop the loader's worker processes now (persistent ones would otherwise live until garbage collection)."""
    it = getattr(loader, "_iterator", None)
    if it is not None and hasattr(it, "_shutdown_workers"):
        it._shutdown_workers()
    loader._iterator = None


# ---------------------------------------------------------------- the memory-mapped baseline

def write_token_file(tokens, path: str | os.PathLike) -> Path:
    """Write 1-D token ids as a flat uint16 file (nanoGPT's train.bin layout); returns the path."""
    arr = tokens.numpy() if isinstance(tokens, torch.Tensor) else np.asarray(tokens)
    if arr.ndim != 1 or arr.size == 0 or arr.min() < 0 or arr.max() >= 2 ** 16:
        raise ValueError("tokens must be a non-empty 1-D array of ids in [0, 65536)")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    arr.astype(np.uint16).tofile(path)
    return path


class MemmapBatches:
    """Random (batch_size, seq_len) windows of a uint16 token file, read through np.memmap.

    Iterating yields `packing.Batch` objects with no padding (every slot a token, positions 0..T-1,
    one "document" per row), so they go through the same step as the DataLoader's. The memmap is
    reopened for every batch, as nanoGPT does to avoid its memory growing.
    """

    def __init__(self, path: str | os.PathLike, batch_size: int, seq_len: int, seed: int = 0):
        self.path, self.batch_size, self.seq_len = Path(path), batch_size, seq_len
        self.n = self.path.stat().st_size // 2
        if self.n < seq_len + 1:
            raise ValueError(f"{self.path} holds {self.n} tokens; a window needs {seq_len + 1}")
        self.rng = np.random.default_rng(seed)

    def __iter__(self):
        return self

    def __next__(self) -> packing.Batch:
        data = np.memmap(self.path, dtype=np.uint16, mode="r")
        starts = self.rng.integers(0, self.n - self.seq_len, size=self.batch_size)
        w = torch.from_numpy(np.stack([data[s:s + self.seq_len + 1].astype(np.int64) for s in starts]))  # (B, T+1)
        B, T = self.batch_size, self.seq_len
        return packing.Batch(w[:, :-1], w[:, 1:].contiguous(), torch.arange(T).expand(B, T),
                             torch.arange(B)[:, None].expand(B, T).contiguous(), B * T)


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


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def train_step(model, batch: packing.Batch, optimizer, mask: bool) -> None:
    """One training step on a batch: forward (with the block-diagonal mask when `mask`), backward, step."""
    if mask:
        _, loss = packing.forward_packed(model, batch.x, batch.pos, packing.block_causal_mask(batch.doc), batch.y)
    else:
        _, loss = model(batch.x, batch.y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def step_breakdown(model, batches: Iterable[packing.Batch], *, steps: int, warmup: int = 1, device: str = "cpu",
                   mask: bool = False, non_blocking: bool = False, lr: float = 1e-3) -> Breakdown:
    """Train `warmup + steps` steps from `batches` and time the last `steps`: wait, copy and compute per step.

    Each phase is closed by a device synchronisation, so the three add up to the step and the copy is
    never hidden behind compute (this measures the serial cost; overlap is `copy_overlap`'s subject).
    mask=True runs `packing.forward_packed` with the block-diagonal mask and per-document positions.
    Raises ValueError when the loader runs out before `warmup + steps` batches.
    """
    if steps < 1 or warmup < 0:
        raise ValueError(f"steps={steps} must be >= 1 and warmup={warmup} >= 0")
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    it = iter(batches)
    waits, copies, computes, tokens = [], [], [], 0
    start = None
    for i in range(warmup + steps):
        if i == warmup:
            _sync(device)
            start = time.perf_counter()
        t0 = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:
            raise ValueError(f"the loader ran out after {i} batches; {warmup + steps} were asked for") from None
        t1 = time.perf_counter()
        batch = batch.to(device, non_blocking=non_blocking)
        _sync(device)
        t2 = time.perf_counter()
        train_step(model, batch, opt, mask)
        _sync(device)
        t3 = time.perf_counter()
        if i >= warmup:
            waits.append(t1 - t0)
            copies.append(t2 - t1)
            computes.append(t3 - t2)
            tokens += batch.tokens
    seconds = time.perf_counter() - start
    med = lambda xs: float(np.median(xs))  # noqa: E731
    return Breakdown(med(waits), med(copies), med(computes), tokens, seconds, steps, waits)


def loader_breakdown(model, dataset, *, steps: int, warmup: int = 1, device: str = "cpu", **loader_kw) -> Breakdown:
    """`step_breakdown` through a fresh `make_loader(dataset, **loader_kw)`, whose workers are shut down after.

    The worker start-up is part of the first (warm-up) step, so it is not in the medians but is in
    nothing else either; `loader_kw` must include batch_size and row_len.
    """
    loader = make_loader(dataset, **loader_kw)
    try:
        return step_breakdown(model, loader, steps=steps, warmup=warmup, device=device,
                              mask=loader_kw.get("kind", "pad") == "pack",
                              non_blocking=loader_kw.get("pin_memory", False))
    finally:
        shutdown(loader)


def sweep(make_model: Callable[[], torch.nn.Module], dataset, configs: Sequence[dict], *, steps: int,
          warmup: int = 1, device: str = "cpu", **common) -> list[dict]:
    """`loader_breakdown` for each loader configuration (a dict of make_loader keywords over `common`).

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
    tokens/s of every round. Raises ValueError when `rounds` < 1.
    """
    if type(rounds) is not int or rounds < 1:
        raise ValueError(f"rounds={rounds!r} must be an int >= 1")
    runs: list[list[dict]] = [[] for _ in configs]
    for k in range(rounds):
        order = list(range(len(configs)))[:: -1 if k % 2 else 1]
        for i in order:
            runs[i].append(sweep(make_model, dataset, [configs[i]], steps=steps, warmup=warmup, device=device,
                                 **common)[0])
    return [{**max(rs, key=lambda r: r["tokens_per_s"]), "tokens_per_s_rounds": [r["tokens_per_s"] for r in rs]}
            for rs in runs]


def epochs_time(dataset, *, epochs: int, **loader_kw) -> float:
    """Seconds to iterate `epochs` epochs of `make_loader(dataset, **loader_kw)` (no model): start-up cost included."""
    loader = make_loader(dataset, **loader_kw)
    try:
        t0 = time.perf_counter()
        for _ in range(epochs):
            for _batch in loader:
                pass
        return time.perf_counter() - t0
    finally:
        shutdown(loader)


# ---------------------------------------------------------------- memory per worker

def _uss(pid: int | None = None) -> int:
    import psutil

    return psutil.Process(pid).memory_full_info().uss


def _touch_all(store: DocumentStore, conn) -> None:
    before = _uss()
    total = 0
    for i in range(len(store)):
        total += int(store.doc(i)[0])  # read one byte of every document, as a worker reading items would
    conn.send((before, _uss(), total))
    conn.close()


def worker_memory(store: DocumentStore) -> dict[str, int]:
    """Fork one process (as a DataLoader worker is forked on Linux), read every document, report its USS.

    Returns {"uss_before", "uss_after", "growth"} in bytes: the worker's unique memory before and after
    the reads. Reading a Python object writes its reference count, so every page holding an object
    header is copied into the worker; a numpy array is one object and its data pages stay shared.
    Raises RuntimeError where fork is unavailable (Windows; macOS defaults to spawn, which copies
    the whole dataset into each worker instead).
    """
    import multiprocessing as mp

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

def host_buffer(nbytes: int) -> torch.Tensor:
    """A pageable uint8 CPU tensor of `nbytes` bytes, every byte written (set to 1).

    A fresh `torch.empty` of many megabytes is memory the kernel has not handed out yet: until a page is
    written, reading it returns the one shared zero page, which stays in the CPU's cache, so a copy from
    it would time the cache, not host memory. Writing every page first gives each its own memory, as a
    real batch has. Raises ValueError for nbytes < 1.
    """
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 1:
        raise ValueError(f"nbytes={nbytes!r} must be a positive int")
    return torch.empty(nbytes, dtype=torch.uint8).fill_(1)


def h2d_bandwidth(sizes: Sequence[int], *, reps: int = 10) -> list[dict[str, float]]:
    """Host-to-device GB/s per size in bytes: pageable `.to()`, pinned `.to(non_blocking=True)`, and
    pin-on-the-fly (`.pin_memory()` then the non-blocking copy, every time). CUDA only (RuntimeError otherwise).

    Each number is bytes / median time of `reps` copies, each synchronised (CUDA events via helpers.measure.bench).
    The source buffers come from `host_buffer`: written memory, not the zero page of a fresh allocation.
    """
    from helpers.measure import bench

    if not torch.cuda.is_available():
        raise RuntimeError("host-to-device bandwidth needs a CUDA device")
    rows = []
    for n in sizes:
        pageable = host_buffer(n)
        pinned = host_buffer(n).pin_memory()
        dst = torch.empty(n, dtype=torch.uint8, device="cuda")
        fns = {"pageable": lambda: dst.copy_(pageable),
               "pinned": lambda: dst.copy_(pinned, non_blocking=True),
               "pin on the fly": lambda: dst.copy_(pageable.pin_memory(), non_blocking=True)}
        t = bench.benchmark_interleaved(fns, reps=reps, warmup=2, device="cuda")
        rows.append({"bytes": n, **{k: n / v.median / 1e9 for k, v in t.items()}})
        del pageable, pinned, dst
    return rows


def copy_overlap(nbytes: int, matmul_n: int, *, reps: int = 10) -> dict[str, float]:
    """Seconds for a pinned host-to-device copy alone, a matmul alone, and both with the copy on a side stream.

    Returns {"copy", "compute", "both", "hidden"}: hidden is the share of the shorter one that the
    overlap saved, (copy + compute - both) / min(copy, compute), clipped to [0, 1]. CUDA only.
    """
    from helpers.measure import bench

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

    t = bench.benchmark_interleaved({"copy": copy, "compute": compute, "both": both}, reps=reps, warmup=2,
                                    device="cuda")
    c, m, b = t["copy"].median, t["compute"].median, t["both"].median
    return {"copy": c, "compute": m, "both": b, "hidden": min(1.0, max(0.0, (c + m - b) / min(c, m)))}


def breakdown_figure(rows: Sequence[dict], labels: Sequence[str], *, title: str = "", ax=None):
    """Horizontal stacked bars of wait / copy / compute ms per step, one bar per row of `sweep`; returns the figure."""
    from helpers.show import plots

    fig, ax = plots.figure(figsize=(8, 0.45 * len(rows) + 1.6)) if ax is None else (ax.figure, ax)
    left = np.zeros(len(rows))
    for part, color in (("wait_ms", "tab:red"), ("copy_ms", "tab:orange"), ("compute_ms", "tab:green")):
        vals = np.array([r[part] for r in rows], dtype=float)
        ax.barh(list(labels), vals, left=left, color=color, label=part[:-3])
        left += vals
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
