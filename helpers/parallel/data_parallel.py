"""Data parallelism written from scratch on `torch.distributed`: DDP, ZeRO-1/2 and FSDP (ZeRO-3).

Every class here runs inside a process group (see `helpers.parallel.distributed.run_on_ranks` or torchrun).

* `DDP(module, bucket_mb=None, overlap=True)`: parameters broadcast from rank 0 at construction;
  during backward each parameter's gradient is all-reduced as soon as it is accumulated (one hook
  per parameter), or, with `bucket_mb`, once every gradient of a ~bucket_mb MiB bucket is ready;
  `overlap=False` all-reduces everything after backward instead. `finish_gradient_synchronization()`
  waits for the last all-reduce before the optimizer step; `no_sync()` skips communication for
  gradient accumulation. Tied weights are one parameter and are reduced once.
* `ShardedOptimizer(params, optimizer_cls, **kwargs)`: ZeRO stage 1 (Rajbhandari et al., 2020). Each
  rank keeps optimizer state only for the parameters it owns, updates them, then broadcasts them.
  `reduce_gradients()` is stage 2's gradient path: each gradient is reduced to its owner only and
  dropped elsewhere.
* `FSDP(module, compute_dtype=None)`: ZeRO stage 3 for the module's Linear and Embedding layers:
  each rank stores 1/n of every weight (fp32 "master" shards, the only parameters the optimizer
  sees); a layer all-gathers its weight just before use in forward and again in backward, frees it
  after, and reduce-scatters its weight gradient so each rank receives only its shard's.
"""
from __future__ import annotations

import contextlib
from typing import Iterable

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from helpers.measure.params import positive
from helpers.parallel.distributed import all_gather_single, reduce_scatter_single


def unique_params(module_or_params) -> list[nn.Parameter]:
    """Trainable parameters, each once (a tied weight appears once), in registration order."""
    params = module_or_params.parameters() if isinstance(module_or_params, nn.Module) else module_or_params
    seen, out = set(), []
    for p in params:
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out


# ---------------------------------------------------------------- DDP

class DDP(nn.Module):
    """Data-parallel wrapper: forward is the module's; gradients are averaged over the ranks.

    bucket_mb: None (one all-reduce per parameter, launched from its own hook) or a positive size
    in MiB (2^20 bytes, as torch DDP's bucket_cap_mb counts its "MB"): parameters are grouped in reverse
    registration order (roughly the order backward produces their gradients) into buckets of about
    that many MiB; a bucket is flattened into one buffer and all-reduced once all its gradients are
    ready. overlap: False waits until `finish_gradient_synchronization()` to start any communication
    (the naive baseline).
    Wrap a module once: the hooks stay on its parameters, so a second wrapper would reduce twice.
    Raises ValueError for a bucket_mb that is neither None nor a positive number.
    """

    def __init__(self, module: nn.Module, bucket_mb: float | None = None, overlap: bool = True):
        super().__init__()
        if bucket_mb is not None:
            positive("bucket_mb", float(bucket_mb) if type(bucket_mb) is int else bucket_mb, float)
        self.module, self.overlap, self.world = module, overlap, dist.get_world_size()
        self.params = unique_params(module)
        with torch.no_grad():
            for p in list(self.params) + list(module.buffers()):
                dist.broadcast(p, src=0)
        self.buckets: list[list[nn.Parameter]] = []
        if bucket_mb is None:
            self.buckets = [[p] for p in reversed(self.params)]
        else:
            limit, current, size = bucket_mb * 2 ** 20, [], 0
            for p in reversed(self.params):
                current.append(p)
                size += p.numel() * p.element_size()
                if size >= limit:
                    self.buckets.append(current)
                    current, size = [], 0
            if current:
                self.buckets.append(current)
        self._bucket_of = {id(p): i for i, b in enumerate(self.buckets) for p in b}
        self._pending: dict[int, int] = {}
        self._handles: dict[int, tuple] = {}
        self._sync = True
        self.bytes_reduced = 0  # bytes handed to all-reduce since construction
        if overlap:
            for p in self.params:
                p.register_post_accumulate_grad_hook(self._grad_ready)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        """Inside: backward accumulates gradients locally and communicates nothing (gradient accumulation)."""
        old, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = old

    def _launch(self, i: int) -> None:
        bucket = self.buckets[i]
        grads = [p.grad for p in bucket]
        flat = grads[0] if len(grads) == 1 else torch.cat([g.reshape(-1) for g in grads])
        flat.div_(self.world)
        self.bytes_reduced += flat.numel() * flat.element_size()
        self._handles[i] = (dist.all_reduce(flat, async_op=True), flat)

    def _grad_ready(self, p: nn.Parameter) -> None:
        if not self._sync:
            return
        i = self._bucket_of[id(p)]
        self._pending[i] = self._pending.get(i, 0) + 1
        if self._pending[i] == len(self.buckets[i]):
            self._launch(i)

    def finish_gradient_synchronization(self) -> None:
        """Wait for every all-reduce (start them first without overlap); grads then hold the rank average."""
        for i, bucket in enumerate(self.buckets):
            if i not in self._handles and all(p.grad is not None for p in bucket):
                self._launch(i)  # overlap=False, or a bucket whose hooks did not all fire
        for i, (work, flat) in self._handles.items():
            work.wait()
            bucket = self.buckets[i]
            if len(bucket) > 1:
                offset = 0
                for p in bucket:
                    p.grad.copy_(flat[offset: offset + p.numel()].view_as(p.grad))
                    offset += p.numel()
        self._handles.clear()
        self._pending.clear()


# ---------------------------------------------------------------- ZeRO-1 and ZeRO-2

class ShardedOptimizer:
    """ZeRO-1: `optimizer_cls(owned params, **kwargs)` on each rank, then the updates broadcast.

    Parameters are assigned to ranks greedily, largest first, to the rank with the fewest elements
    so far, so every rank owns about 1/n of the elements. `step()` expects averaged gradients (from
    DDP, or from `reduce_gradients()` for ZeRO-2). Raises ValueError for an empty parameter list.
    """

    def __init__(self, params: Iterable[nn.Parameter], optimizer_cls: type, **kwargs):
        self.params = unique_params(params)
        if not self.params:
            raise ValueError("ShardedOptimizer needs at least one parameter")
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        load = [0] * self.world
        self.owner: dict[int, int] = {}
        for p in sorted(self.params, key=lambda q: -q.numel()):
            r = min(range(self.world), key=lambda k: load[k])
            self.owner[id(p)] = r
            load[r] += p.numel()
        self.owned = [p for p in self.params if self.owner[id(p)] == self.rank]
        self.optimizer = optimizer_cls(self.owned or [torch.zeros(0, requires_grad=True)], **kwargs)

    def reduce_gradients(self) -> None:
        """ZeRO-2's gradient path: average each gradient onto its owner and drop it on the other ranks."""
        for p in self.params:
            if p.grad is None:
                continue
            p.grad.div_(self.world)
            dist.reduce(p.grad, dst=self.owner[id(p)])
            if self.owner[id(p)] != self.rank:
                p.grad = None

    def step(self) -> None:
        """Update the owned parameters, then broadcast every parameter from its owner."""
        self.optimizer.step()
        with torch.no_grad():
            works = [dist.broadcast(p, src=self.owner[id(p)], async_op=True) for p in self.params]
            for w in works:
                w.wait()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    def state_bytes(self) -> int:
        """Bytes of optimizer state this rank holds."""
        return sum(t.numel() * t.element_size() for s in self.optimizer.state.values() for t in s.values()
                   if torch.is_tensor(t) and t.dim() > 0)


# ---------------------------------------------------------------- FSDP (ZeRO-3)

class _Shard:
    """A full tensor's shape and the rank's fp32 slice of it (padded so every rank's slice is equal)."""

    def __init__(self, full: torch.Tensor, rank: int, world: int):
        self.shape, self.numel = full.shape, full.numel()
        per = -(-self.numel // world)
        flat = torch.zeros(per * world, dtype=torch.float32)
        flat[: self.numel] = full.detach().reshape(-1).float()
        self.param = nn.Parameter(flat[rank * per: (rank + 1) * per].clone())
        self.per, self.world = per, world

    def gather(self, dtype: torch.dtype) -> torch.Tensor:
        """The full tensor, all-gathered from every rank's shard, in `dtype`."""
        out = torch.empty(self.per * self.world, dtype=dtype, device=self.param.device)
        all_gather_single(out, self.param.detach().to(dtype))
        return out[: self.numel].view(self.shape)

    def scatter_grad(self, grad_full: torch.Tensor) -> torch.Tensor:
        """This rank's slice of the rank-average of `grad_full` (reduce-scatter, in fp32)."""
        flat = torch.zeros(self.per * self.world, dtype=torch.float32, device=grad_full.device)
        flat[: self.numel] = grad_full.reshape(-1).float()
        out = torch.empty(self.per, dtype=torch.float32, device=grad_full.device)
        reduce_scatter_single(out, flat)
        return out.div_(self.world)


class _ShardedLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w_shard, b_shard, w: _Shard, b: _Shard | None, dtype):
        ctx.meta = (w, b, dtype, x.dtype)
        ctx.save_for_backward(x)
        weight = w.gather(dtype)
        bias = b.gather(dtype) if b is not None else None
        return F.linear(x.to(dtype), weight, bias).to(x.dtype)  # the gathered weight is freed here

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        w, b, dtype, xdtype = ctx.meta
        weight = w.gather(dtype)  # gathered again: nothing full was kept between forward and backward
        g = grad_out.to(dtype)
        grad_x = (g @ weight).to(xdtype)
        grad_w = w.scatter_grad(g.reshape(-1, g.shape[-1]).t() @ x.to(dtype).reshape(-1, x.shape[-1]))
        grad_b = b.scatter_grad(g.reshape(-1, g.shape[-1]).sum(0)) if b is not None else None
        return grad_x, grad_w, grad_b, None, None, None


class _ShardedEmbedding(torch.autograd.Function):
    @staticmethod
    def forward(ctx, idx, w_shard, w: _Shard, dtype):
        ctx.meta = (w, dtype)
        ctx.save_for_backward(idx)
        return F.embedding(idx, w.gather(dtype)).float()

    @staticmethod
    def backward(ctx, grad_out):
        (idx,) = ctx.saved_tensors
        w, dtype = ctx.meta
        full = torch.zeros(w.shape, dtype=torch.float32, device=grad_out.device)
        full.index_add_(0, idx.reshape(-1), grad_out.reshape(-1, w.shape[1]).float())
        return None, w.scatter_grad(full), None, None


class FSDP(nn.Module):
    """ZeRO-3 over the Linear and Embedding layers of `module`; other parameters stay replicated.

    compute_dtype: None (fp32) or torch.bfloat16/float16: weights are gathered and used in that dtype,
    while the shards (master weights) and their gradients stay fp32. The shards are this module's
    parameters for the optimizer (`fsdp.parameters()`); replicated parameters (LayerNorms) are
    averaged by `finish_gradient_synchronization()`. Tied weights share one shard.
    Raises ValueError for a compute_dtype that is not a floating dtype.
    """

    def __init__(self, module: nn.Module, compute_dtype: torch.dtype | None = None):
        super().__init__()
        if compute_dtype is not None and not (isinstance(compute_dtype, torch.dtype) and compute_dtype.is_floating_point):
            raise ValueError(f"compute_dtype={compute_dtype!r} must be None or a floating torch dtype")
        self.dtype = compute_dtype or torch.float32
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        with torch.no_grad():
            for p in unique_params(module):
                dist.broadcast(p, src=0)
        self.names: dict[str, _Shard] = {}  # full name -> shard (tied names share one)
        by_id: dict[int, _Shard] = {}
        shards = []
        for mname, sub in module.named_modules():
            if not isinstance(sub, (nn.Linear, nn.Embedding)):
                continue
            for pname in ("weight", "bias"):
                p = sub._parameters.get(pname)
                if p is None:
                    continue
                if id(p) not in by_id:
                    by_id[id(p)] = _Shard(p, self.rank, self.world)
                    shards.append(by_id[id(p)].param)
                self.names[f"{mname}.{pname}" if mname else pname] = by_id[id(p)]
            self._wrap(sub, by_id)
        for sub in module.modules():
            if isinstance(sub, (nn.Linear, nn.Embedding)):
                for pname in ("weight", "bias"):
                    if sub._parameters.get(pname) is not None:
                        del sub._parameters[pname]
        self.shards = nn.ParameterList(shards)
        self.module = module
        self.replicated = unique_params(module)

    def _wrap(self, sub: nn.Module, by_id: dict) -> None:
        dtype = self.dtype
        w = by_id[id(sub.weight)]
        if isinstance(sub, nn.Embedding):
            sub.forward = lambda idx: _ShardedEmbedding.apply(idx, w.param, w, dtype)
        else:
            b = by_id[id(sub.bias)] if sub.bias is not None else None
            sub.forward = lambda x: _ShardedLinear.apply(x, w.param, b.param if b else None, w, b, dtype)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish_gradient_synchronization(self) -> None:
        """Average the replicated parameters' gradients (the shards' were reduce-scattered in backward)."""
        for p in self.replicated:
            if p.grad is not None:
                p.grad.div_(self.world)
                dist.all_reduce(p.grad)

    def gather_full_params(self) -> dict[str, torch.Tensor]:
        """Every parameter at full size (fp32), under the wrapped module's own state-dict names."""
        out = {name: shard.gather(torch.float32).clone() for name, shard in self.names.items()}
        for name, p in self.module.named_parameters(remove_duplicate=False):
            out[name] = p.detach().clone()
        return out


# ---------------------------------------------------------------- memory per rank

def tensor_bytes(tensors: Iterable[torch.Tensor | None]) -> int:
    """Bytes of the distinct storages among `tensors` (None skipped; a tied weight counted once)."""
    seen, total = set(), 0
    for t in tensors:
        if t is None:
            continue
        key = (t.untyped_storage().data_ptr(), t.device)
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
    return total


def zero_formula(stage: int, n_params: int, world_size: int, bytes_param: int = 4, bytes_grad: int = 4,
                 bytes_state: int = 8) -> dict[str, float]:
    """Bytes per rank of parameters, gradients and optimizer state at ZeRO `stage` (0 = plain DDP).

    Rajbhandari et al. (2020), section 5: stage 1 shards the optimizer state, 2 also the gradients,
    3 also the parameters. Their mixed-precision Adam is bytes_param=2, bytes_grad=2, bytes_state=12
    (fp32 master copy, momentum, variance); plain fp32 Adam, as trained here, is 4, 4, 8.
    """
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"stage={stage!r}; choose 0, 1, 2 or 3")
    n, psi = world_size, n_params
    out = {"params": bytes_param * psi / (n if stage >= 3 else 1),
           "grads": bytes_grad * psi / (n if stage >= 2 else 1),
           "state": bytes_state * psi / (n if stage >= 1 else 1)}
    out["total"] = sum(out.values())
    return out


def zero_extra_comm(stage: int, n_params: int, bytes_param: int = 4) -> float:
    """Bytes each rank sends per step at ZeRO `stage` (0 = DDP), counted as in the ZeRO paper, section 7.

    Stages 1 and 2: reduce-scatter + all-gather = the same 2Ψ elements as an all-reduce (1.0x);
    stage 3: parameters all-gathered in forward and again in backward plus the gradient
    reduce-scatter = 3Ψ (1.5x). Returns bytes per rank for a ring on many ranks. Raises ValueError for a
    stage other than 0-3.
    """
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"stage={stage!r}; choose 0, 1, 2 or 3")
    factor = {0: 2.0, 1: 2.0, 2: 2.0, 3: 3.0}[stage]
    return factor * n_params * bytes_param
