"""Memory measurement: a CUDA step's peak, the bytes autograd saves for backward (on every device, so activation
memory is measured without a GPU), and freeing what a failed step left behind."""
from __future__ import annotations

import gc
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch


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
