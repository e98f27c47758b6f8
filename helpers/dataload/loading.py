"""Data loading for the course GPT: a realistic dataset, the DataLoader pieces, a memory-mapped baseline.

* `document_lengths` / `DocumentStore`: the stdlib corpus cut into documents of heavy-tailed
  (log-normal) lengths, held either as one numpy array plus offsets ("numpy") or as a Python list of
  `bytes` objects ("python").
* `DocumentDataset`: a map-style `torch.utils.data.Dataset`; item i is document i tokenised on the fly
  (bytes -> int64 ids) after an optional `latency_ms` sleep that stands in for decoding or
  augmentation. An item depends only on its index, so batches are the same for any `num_workers`
  when the sampler has a seeded generator (`make_loader`).
* `collate` / `make_loader` / `shutdown`: padded or packed batches (`helpers.dataload.packing`) from a
  seeded DataLoader, and stopping its workers.
* `rank_indices` / `partition`: each data-parallel rank's indices from `DistributedSampler` (given
  num_replicas and rank, no process group), and how the shards cover the data set.
* `write_token_file` / `MemmapBatches`: nanoGPT's and llm.c's fast path, one flat uint16 token file
  read through `np.memmap`, random windows, no per-item Python work.
* `train_step`: one forward, backward and optimizer step on a batch, with the block-diagonal mask
  for packed rows; `timed_step` / `StepTime`: the same step on the next batch, its wait and copy on the wall
  clock and its compute on both the wall and the thread's CPU clock.
* `host_buffer`: a pageable host tensor whose every page is written, the source of a real
  host-to-device copy (a fresh allocation is the kernel's shared zero page until written).
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, NamedTuple, Sequence

import numpy as np
import torch

from helpers.dataload import packing
from helpers.measure import bench, clock
from helpers.measure.params import positive

# ---------------------------------------------------------------- documents


def document_lengths(n_docs: int, *, median: int, sigma: float = 1.0, min_len: int = 8,
                     max_len: int | None = None, seed: int = 0) -> np.ndarray:
    """Heavy-tailed document lengths: log-normal with the given median and sigma, clipped; (n_docs,) int64.

    Raises ValueError for a count or median that is not a positive int, a negative sigma, min_len < 2, or
    max_len < min_len.
    """
    positive("n_docs", n_docs)
    positive("median", median)
    if sigma < 0 or min_len < 2 or (max_len is not None and max_len < min_len):
        raise ValueError(f"sigma={sigma}, min_len={min_len}, max_len={max_len}: "
                         f"need sigma >= 0, min_len >= 2, max_len >= min_len")
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
    positive("batch_size", batch_size)
    if num_workers < 0:
        raise ValueError(f"num_workers={num_workers} must be >= 0")
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


# ---------------------------------------------------------------- one shard per rank

def rank_indices(n: int, num_replicas: int, *, epoch: int = 0, seed: int = 0, shuffle: bool = True,
                 drop_last: bool = False) -> list[list[int]]:
    """The dataset indices each of `num_replicas` ranks reads in `epoch`: [rank 0's, rank 1's, ...].

    Built with `torch.utils.data.DistributedSampler(range(n), num_replicas=..., rank=r, ...)` for every r
    (no process group is needed when both are given) and its `set_epoch(epoch)`: the shuffle is seeded
    with seed + epoch, the same on every rank, so the ranks agree on one permutation and each takes every
    num_replicas-th index from its own offset. PyTorch's padding rule: with drop_last=False the permutation
    is extended with its own first indices up to ceil(n / num_replicas) * num_replicas, so a few indices are
    read twice; with drop_last=True its tail is cut to floor(n / num_replicas) * num_replicas, so a few
    are not read this epoch. Raises ValueError for n or num_replicas that is not a positive int.
    """
    positive("n", n)
    positive("num_replicas", num_replicas)
    out = []
    for r in range(num_replicas):
        sampler = torch.utils.data.DistributedSampler(range(n), num_replicas=num_replicas, rank=r, shuffle=shuffle,
                                                      seed=seed, drop_last=drop_last)
        sampler.set_epoch(epoch)
        out.append(list(sampler))
    return out


def partition(parts: Sequence[Sequence[int]], n: int) -> dict[str, int]:
    """How rank shards cover range(n): {"ranks", "per_rank" (the largest shard), "distinct" indices read,
    "repeated" (reads beyond the first of an index), "missing" (indices no rank reads), "overlap" (indices
    read by more than one rank)}."""
    reads = [i for p in parts for i in p]
    seen = set(reads)
    owners: dict[int, int] = {}
    for p in parts:
        for i in set(p):
            owners[i] = owners.get(i, 0) + 1
    return {"ranks": len(parts), "per_rank": max((len(p) for p in parts), default=0), "distinct": len(seen),
            "repeated": len(reads) - len(seen), "missing": len(set(range(n)) - seen),
            "overlap": sum(1 for c in owners.values() if c > 1)}


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


# ---------------------------------------------------------------- one training step

def train_step(model, batch: packing.Batch, optimizer, mask: bool) -> None:
    """One training step on a batch: forward (with the block-diagonal mask when `mask`), backward, step."""
    if mask:
        _, loss = packing.forward_packed(model, batch.x, batch.pos, packing.block_causal_mask(batch.doc), batch.y)
    else:
        _, loss = model(batch.x, batch.y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


# ---------------------------------------------------------------- host memory for pinned copies

class StepTime(NamedTuple):
    """One training step's parts, in seconds: wait, copy and compute on the wall clock (each closed by a device
    sync), the batch's real tokens, and compute_cpu: the same compute on the calling thread's CPU clock, the
    seconds the main thread actually ran (below the wall seconds when other work shared its core)."""

    wait: float
    copy: float
    compute: float
    tokens: int
    compute_cpu: float


def timed_step(model, it, optimizer, *, device: str = "cpu", mask: bool = False,
               non_blocking: bool = False) -> StepTime:
    """One `train_step` on the next batch of `it`, timed part by part with `clock.Stopwatch`: a `StepTime`.

    The wait and the copy are wall time (waiting for a worker, or for a copy, is what they measure); the
    compute is read on both clocks, so a caller can quote the thread's own time and the share of the wall time
    it ran. Raises StopIteration when `it` is exhausted."""
    with clock.Stopwatch(tally=False) as wait:
        batch = next(it)
    with clock.Stopwatch(tally=False) as copy:
        batch = batch.to(device, non_blocking=non_blocking)
        bench.sync(device)
    with clock.Stopwatch() as compute:
        train_step(model, batch, optimizer, mask)
        bench.sync(device)
    return StepTime(wait.wall, copy.wall, compute.wall, batch.tokens, compute.cpu)


def host_buffer(nbytes: int) -> torch.Tensor:
    """A pageable uint8 CPU tensor of `nbytes` bytes, every byte written (set to 1).

    A fresh `torch.empty` of many megabytes is memory the kernel has not handed out yet: until a page is
    written, reading it returns the one shared zero page, which stays in the CPU's cache, so a copy from
    it would time the cache, not host memory. Writing every page first gives each its own memory, as a
    real batch has. Raises ValueError for nbytes < 1.
    """
    positive("nbytes", nbytes)
    return torch.empty(nbytes, dtype=torch.uint8).fill_(1)
