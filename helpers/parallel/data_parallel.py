"""Data parallelism written from scratch on `torch.distributed`: DDP, ZeRO-1/2 and FSDP (ZeRO-3).

Every class here runs inside a process group (see `helpers.parallel.distributed.run_on_ranks` or torchrun).
Each wrapper keeps what the wrapped module says about itself, as torch's DDP and FSDP2 do: a frozen
parameter (requires_grad=False) stays frozen, is never reduced and is only broadcast at construction;
a tied parameter is one parameter, reduced once and sharded once; a layer's own forward (and any
autograd Function in it) still defines its output and its gradient. What a wrapper cannot keep, it
refuses with a sentence.

* `DDP(module, bucket_mb=None, overlap=True, find_unused_parameters=False)`: parameters and buffers
  broadcast from rank 0 at construction; during backward each parameter's gradient is all-reduced as
  soon as it is accumulated (one hook per parameter), or, with `bucket_mb`, once every gradient of a
  ~bucket_mb MiB bucket is ready; buckets are launched in a fixed order, the same on every rank.
  `overlap=False` all-reduces everything after backward instead. `finish_gradient_synchronization()`
  waits for the last all-reduce before the optimizer step; `no_sync()` skips communication for
  gradient accumulation. As in torch DDP's default mode, every trainable parameter must get a gradient
  in each synchronised backward: `finish_gradient_synchronization()` raises a RuntimeError naming the
  ones that did not. `find_unused_parameters=True` is torch's flag and rule: the parameters the
  forward's output does not depend on (found by walking its autograd graph) count as ready with a zero
  gradient, a gradient present on some ranks only is averaged with zeros and set on every rank, and
  one that is None on every rank stays None.
* `ShardedOptimizer(params, optimizer_cls, **kwargs)`: ZeRO stage 1 (Rajbhandari et al., 2020). Each
  rank keeps optimizer state only for the parameters it owns, updates them, then broadcasts them.
  `reduce_gradients()` is stage 2's gradient path: each gradient is reduced to its owner only and
  dropped elsewhere (with the same rule for gradients that some ranks lack).
* `FSDP(module, compute_dtype=None)`: ZeRO stage 3 for the module's Linear and Embedding layers:
  each rank stores 1/n of every weight (fp32 "master" shards, the only copies of those weights); a
  layer all-gathers its weight just before use in forward and again in backward, frees it after, and
  reduce-scatters its weight gradient so each rank receives only its shard's.

Helpers used by these and by the notebook's checks: `unique_params`, `broadcast_module`,
`has_grad_on_any_rank`, `tensor_bytes`, `bucket_assignment` (DDP's buckets, torch's rule),
`overlap_prediction` (a backward's step time with and without overlapped all-reduces), and the ZeRO
paper's formulas `zero_formula`, `zero_extra_comm`.
"""
from __future__ import annotations

import contextlib
import weakref
from typing import Iterable

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils import parametrize

from helpers.measure.params import choose, positive
from helpers.parallel.distributed import all_gather_single, reduce_scatter_single


def _tensors(module_or_params, who: str) -> list[torch.Tensor]:
    if isinstance(module_or_params, nn.Module):
        return list(module_or_params.parameters())
    if torch.is_tensor(module_or_params):
        return [module_or_params]
    try:
        items = list(module_or_params)
    except TypeError:
        raise ValueError(f"{who} takes a module or an iterable of parameters, got a "
                         f"{type(module_or_params).__name__}") from None
    for p in items:
        if isinstance(p, dict):
            raise ValueError(f"{who} takes parameters (or a module), not parameter groups: got a dict with keys "
                             f"{sorted(p)}; pass the parameters themselves, one optimizer setting for all")
        if not torch.is_tensor(p):
            raise ValueError(f"{who} takes parameters (or a module), got a {type(p).__name__} among them")
    return items


def unique_params(module_or_params, who: str = "unique_params") -> list[nn.Parameter]:
    """Trainable parameters, each once (a tied weight appears once), in registration order.

    Takes a module or an iterable of tensors; raises ValueError for parameter groups (dicts) or anything
    else (`who` names the caller in the message).
    """
    seen, out = set(), []
    for p in _tensors(module_or_params, who):
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out


def broadcast_module(module: nn.Module) -> None:
    """Copy rank 0's parameters (trainable and frozen) and buffers to every rank, as torch DDP does at start."""
    seen = set()
    with torch.no_grad():
        for t in list(module.parameters()) + list(module.buffers()):
            if id(t) not in seen:
                seen.add(id(t))
                dist.broadcast(t, src=0)


def has_grad_on_any_rank(params: list[torch.Tensor]) -> list[bool]:
    """Per parameter, whether its `.grad` is set on at least one rank (one all-reduce of a flag each).

    The ranks must agree before they reduce: a gradient that one rank lacks (a layer its batch did not
    use) is reduced with zeros in its place, one that no rank has stays None.
    """
    if not params:
        return []
    flags = torch.tensor([p.grad is not None for p in params], dtype=torch.int32, device=params[0].device)
    dist.all_reduce(flags)
    return [bool(f) for f in flags.tolist()]


# ---------------------------------------------------------------- DDP

_DDP_OF: "weakref.WeakValueDictionary[int, DDP]" = weakref.WeakValueDictionary()  # id(param) -> its DDP


def bucket_assignment(nbytes: list[int], bucket_bytes: float) -> list[list[int]]:
    """DDP's buckets: positions of `nbytes` (gradient sizes in bytes, in the order backward produces
    them) grouped in order, each bucket closed as soon as its bytes reach `bucket_bytes`; the last one
    may be smaller. The rule of torch's `_compute_bucket_assignment_by_size` for tensors of one dtype
    and device with a single size limit. Raises ValueError for a bucket size that is not positive."""
    if not bucket_bytes > 0:
        raise ValueError(f"bucket_bytes={bucket_bytes!r} must be a positive number of bytes")
    buckets, current, size = [], [], 0
    for i, n in enumerate(nbytes):
        current.append(i)
        size += n
        if size >= bucket_bytes:
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    return buckets


def overlap_prediction(compute_s: list[float], comm_s: list[float]) -> dict[str, float]:
    """Step time of a backward whose layer k takes compute_s[k] and whose gradient all-reduce then takes
    comm_s[k] (seconds, in backward order), on one communication channel: "sequential" (every
    all-reduce after backward: sum of both) and "overlapped" (each all-reduce starts when its gradient
    is ready and the previous all-reduce is done: c_k = max(ready_k, c_(k-1)) + comm_s[k], ready_k the
    running sum of compute). Overlap hides min(compute, communication) at best. Raises ValueError for
    lists of different lengths, empty ones or a negative time."""
    if len(compute_s) != len(comm_s) or not compute_s:
        raise ValueError(f"compute_s and comm_s need one time per layer each, got {len(compute_s)} and {len(comm_s)}")
    if min(compute_s) < 0 or min(comm_s) < 0:
        raise ValueError("times must be >= 0 seconds")
    ready = done = 0.0
    for c, k in zip(compute_s, comm_s):
        ready += c
        done = max(ready, done) + k
    return {"sequential": sum(compute_s) + sum(comm_s), "overlapped": done}


def _grad_nodes(output) -> set[int]:
    """ids of the leaf tensors (parameters) the autograd graph behind `output` reaches."""
    stack, seen, found = [], set(), set()

    def collect(o):
        if torch.is_tensor(o):
            if o.grad_fn is not None:
                stack.append(o.grad_fn)
            elif o.requires_grad:
                found.add(id(o))
        elif isinstance(o, (list, tuple)):
            for x in o:
                collect(x)
        elif isinstance(o, dict):
            for x in o.values():
                collect(x)

    collect(output)
    while stack:
        fn = stack.pop()
        if fn in seen:
            continue
        seen.add(fn)
        variable = getattr(fn, "variable", None)  # an AccumulateGrad node: the leaf it writes .grad of
        if variable is not None:
            found.add(id(variable))
        stack.extend(f for f, _ in fn.next_functions if f is not None)
    return found


class DDP(nn.Module):
    """Data-parallel wrapper: forward is the module's; gradients are averaged over the ranks.

    bucket_mb: None (one all-reduce per parameter, launched from its own hook) or a positive size
    in MiB (2^20 bytes, as torch DDP's bucket_cap_mb counts its "MB"): parameters are grouped in reverse
    registration order (roughly the order backward produces their gradients) into buckets of about
    that many MiB; a bucket is flattened into one buffer and all-reduced once all its gradients are
    ready and every bucket before it has been launched (the same order on every rank, so the ranks'
    all-reduces always pair up). overlap: False waits until `finish_gradient_synchronization()` to start
    any communication (the naive baseline). find_unused_parameters: torch DDP's flag (see the module
    docstring); with False, a trainable parameter without a gradient after a synchronised backward is a
    RuntimeError naming it.
    Only trainable parameters are reduced; frozen ones are broadcast at construction and left alone.
    Raises ValueError for a bucket_mb that is neither None nor a positive number, a module without a
    trainable parameter, or a parameter another DDP already hooks (its gradient would be averaged twice);
    RuntimeError for a forward before the last backward's gradients were synchronised, and for a
    parameter that gets two gradients before `finish_gradient_synchronization()`.
    """

    def __init__(self, module: nn.Module, bucket_mb: float | None = None, overlap: bool = True,
                 find_unused_parameters: bool = False):
        super().__init__()
        if not isinstance(module, nn.Module):
            raise ValueError(f"DDP wraps an nn.Module, got a {type(module).__name__}")
        if bucket_mb is not None:
            positive("bucket_mb", float(bucket_mb) if type(bucket_mb) is int else bucket_mb, float)
        choose("overlap", overlap, (True, False))
        choose("find_unused_parameters", find_unused_parameters, (True, False))
        self.module, self.overlap, self.find_unused = module, overlap, find_unused_parameters
        self.world = dist.get_world_size()
        self.params = unique_params(module)
        self._names = {}
        for name, p in module.named_parameters():
            self._names.setdefault(id(p), name)
        if not self.params:
            raise ValueError(f"DDP: the {type(module).__name__} has no parameter that requires a gradient, so "
                             "there is nothing to average; unfreeze one (requires_grad_(True)) or run it without DDP")
        for p in self.params:
            other = _DDP_OF.get(id(p))
            if other is not None and any(q is p for q in other.params):
                raise ValueError(f"DDP: parameter {self._names[id(p)]!r} is already hooked by another DDP, which "
                                 "would average its gradient a second time; wrap each module once (wrap a "
                                 "copy.deepcopy of it for a second wrapper)")
        broadcast_module(module)
        order = list(reversed(self.params))
        if bucket_mb is None:
            self.buckets: list[list[nn.Parameter]] = [[p] for p in order]
        else:
            plan = bucket_assignment([p.numel() * p.element_size() for p in order], bucket_mb * 2 ** 20)
            self.buckets = [[order[i] for i in b] for b in plan]
        self._bucket_of = {id(p): i for i, b in enumerate(self.buckets) for p in b}
        self._handles: dict[int, tuple] = {}
        self._sync = True
        self.bytes_reduced = 0  # bytes handed to all-reduce since construction
        self._reset()
        for p in self.params:
            p.register_post_accumulate_grad_hook(self._grad_ready)  # also without overlap: it tracks readiness
            _DDP_OF[id(p)] = self

    def _reset(self) -> None:
        self._handles.clear()
        self._ready: set[int] = set()
        self._waiting = [len(b) for b in self.buckets]  # gradients each bucket still waits for
        self._next = 0  # the next bucket to launch
        self._unused: set[int] | None = None  # find_unused_parameters: what the forward did not use

    def _drain(self) -> None:
        """Wait for what was launched (the other ranks launched the same) and forget this iteration."""
        for work, _ in self._handles.values():
            work.wait()
        self._reset()

    def forward(self, *args, **kwargs):
        if self._ready:
            self._drain()
            raise RuntimeError("DDP: the last backward's gradients were never averaged; call "
                               "finish_gradient_synchronization() after every backward, before the next forward")
        out = self.module(*args, **kwargs)
        if self.find_unused and self._sync and torch.is_grad_enabled():
            reached = _grad_nodes(out)
            unused = {id(p) for p in self.params if id(p) not in reached}
            self._unused = unused if self._unused is None else self._unused & unused
        return out

    @contextlib.contextmanager
    def no_sync(self):
        """Inside: backward accumulates gradients locally and communicates nothing (gradient accumulation)."""
        old, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = old

    def _name(self, p: nn.Parameter) -> str:
        return self._names.get(id(p), f"<parameter of shape {tuple(p.shape)}>")

    def _mark(self, p: nn.Parameter) -> None:
        if id(p) in self._ready:
            self._drain()
            raise RuntimeError(f"DDP: parameter {self._name(p)!r} got a second gradient before "
                               "finish_gradient_synchronization(): call it after every backward, accumulate "
                               "micro-batches inside no_sync()" + (", and use a parameter only inside forward"
                                                                   if self.find_unused else ""))
        self._ready.add(id(p))
        self._waiting[self._bucket_of[id(p)]] -= 1

    def _launch_ready(self) -> None:
        while self._next < len(self.buckets) and self._waiting[self._next] == 0:
            self._launch(self._next)
            self._next += 1

    def _launch(self, i: int) -> None:
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.buckets[i]]
        flat = grads[0] if len(grads) == 1 else torch.cat([g.reshape(-1) for g in grads])
        flat.div_(self.world)
        self.bytes_reduced += flat.numel() * flat.element_size()
        self._handles[i] = (dist.all_reduce(flat, async_op=True), flat)

    def _grad_ready(self, p: nn.Parameter) -> None:
        if not self._sync:
            return
        if self._unused:  # the first gradient of this backward: the unused parameters are ready too
            unused, self._unused = self._unused, set()
            for q in self.params:
                if id(q) in unused:
                    self._mark(q)
        self._mark(p)
        if self.overlap:
            self._launch_ready()

    def finish_gradient_synchronization(self) -> None:
        """Wait for every all-reduce (start them first without overlap); grads then hold the rank average.

        Does nothing when no synchronised backward ran since the last call. Raises RuntimeError naming
        the trainable parameters that got no gradient (find_unused_parameters=False).
        """
        if not self._ready and self._unused is None:
            return
        missing = [p for p in self.params if id(p) not in self._ready]
        if missing and not self.find_unused:
            self._drain()
            names = ", ".join(repr(self._name(p)) for p in missing)
            one = len(missing) == 1
            raise RuntimeError(f"DDP: {names} got no gradient in this backward (the loss does not depend on "
                               f"{'it' if one else 'them'}), so {'its bucket' if one else 'their buckets'} would "
                               "never be averaged; pass find_unused_parameters=True (as for torch DDP) or freeze "
                               f"{'it' if one else 'them'} with requires_grad_(False) before wrapping")
        for p in missing:
            self._mark(p)
        self._launch_ready()
        anywhere = dict(zip(map(id, self.params), has_grad_on_any_rank(self.params))) if self.find_unused else {}
        for i, (work, flat) in sorted(self._handles.items()):
            work.wait()
            bucket, offset = self.buckets[i], 0
            for p in bucket:
                part = flat[offset: offset + p.numel()].view_as(p)
                offset += p.numel()
                if p.grad is None:
                    if anywhere.get(id(p)):
                        p.grad = part.clone() if len(bucket) > 1 else part
                elif len(bucket) > 1:
                    p.grad.copy_(part)
        self._reset()


# ---------------------------------------------------------------- ZeRO-1 and ZeRO-2

class ShardedOptimizer:
    """ZeRO-1: `optimizer_cls(owned params, **kwargs)` on each rank, then the updates broadcast.

    Parameters are assigned to ranks greedily, largest first, to the rank with the fewest elements
    so far, so every rank owns about 1/n of the elements; frozen parameters are left out, as an
    optimizer never updates them. `step()` expects averaged gradients (from DDP, or from
    `reduce_gradients()` for ZeRO-2). Raises ValueError for parameter groups (dicts) or a list without
    a trainable parameter.
    """

    def __init__(self, params: Iterable[nn.Parameter], optimizer_cls: type, **kwargs):
        self.params = unique_params(params, "ShardedOptimizer")
        if not self.params:
            raise ValueError("ShardedOptimizer needs at least one parameter that requires a gradient")
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
        """ZeRO-2's gradient path: average each gradient onto its owner and drop it on the other ranks.

        A gradient some ranks lack counts as zeros there; one that no rank has stays None (unchanged).
        """
        for p, anywhere in zip(self.params, has_grad_on_any_rank(self.params)):
            if not anywhere:
                continue
            if p.grad is None:
                p.grad = torch.zeros_like(p)
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
    """A full tensor's shape and the rank's slice of it (padded so every rank's slice is equal).

    The slice is a new Parameter with the original's requires_grad, in fp32 or the original's dtype when
    that is wider (the master copy).
    """

    def __init__(self, full: torch.Tensor, rank: int, world: int):
        self.shape, self.numel = full.shape, full.numel()
        self.dtype = torch.promote_types(full.dtype, torch.float32)
        per = -(-self.numel // world)
        flat = torch.zeros(per * world, dtype=self.dtype, device=full.device)
        flat[: self.numel] = full.detach().reshape(-1).to(self.dtype)
        self.param = nn.Parameter(flat[rank * per: (rank + 1) * per].clone(), requires_grad=full.requires_grad)
        self.per, self.world = per, world

    def gather(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The full tensor, all-gathered from every rank's shard, in `dtype` (None: the master dtype)."""
        dtype = dtype or self.dtype
        out = torch.empty(self.per * self.world, dtype=dtype, device=self.param.device)
        all_gather_single(out, self.param.detach().to(dtype))
        return out[: self.numel].view(self.shape)

    def scatter_grad(self, grad_full: torch.Tensor) -> torch.Tensor:
        """This rank's slice of the rank-average of `grad_full` (reduce-scatter, in the master dtype)."""
        flat = torch.zeros(self.per * self.world, dtype=self.dtype, device=grad_full.device)
        flat[: self.numel] = grad_full.reshape(-1).to(self.dtype)
        out = torch.empty(self.per, dtype=self.dtype, device=grad_full.device)
        reduce_scatter_single(out, flat)
        return out.div_(self.world)


class _GatherFull(torch.autograd.Function):
    """The full tensor of a shard (all-gather); backward reduce-scatters its gradient onto the shard."""

    @staticmethod
    def forward(ctx, shard_param, shard: _Shard, dtype):
        ctx.shard = shard
        return shard.gather(dtype)

    @staticmethod
    def backward(ctx, grad):
        return ctx.shard.scatter_grad(grad), None, None


class _ShardedLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w_shard, b_shard, w: _Shard, b: _Shard | None, dtype):
        ctx.meta = (w, b, dtype, x.dtype)
        ctx.save_for_backward(x)
        weight = w.gather(dtype)
        bias = b.gather(dtype) if b is not None else None
        return F.linear(x.to(weight.dtype), weight, bias).to(x.dtype)  # the gathered weight is freed here

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        w, b, dtype, xdtype = ctx.meta
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        grad_x = grad_w = grad_b = None
        g = grad_out.to(dtype or w.dtype)
        if need_x:
            weight = w.gather(dtype)  # gathered again: nothing full was kept between forward and backward
            grad_x = (g @ weight).to(xdtype)
        g2 = g.reshape(-1, g.shape[-1])
        if need_w:
            grad_w = w.scatter_grad(g2.t() @ x.to(g.dtype).reshape(-1, x.shape[-1]))
        if need_b and b is not None:
            grad_b = b.scatter_grad(g2.sum(0))
        return grad_x, grad_w, grad_b, None, None, None


class _ShardedEmbedding(torch.autograd.Function):
    @staticmethod
    def forward(ctx, idx, w_shard, w: _Shard, dtype, padding_idx, scale_grad_by_freq):
        ctx.meta = (w, padding_idx, scale_grad_by_freq)
        ctx.save_for_backward(idx)
        return F.embedding(idx, w.gather(dtype)).to(w.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        (idx,) = ctx.saved_tensors
        w, padding_idx, by_freq = ctx.meta
        flat_idx = idx.reshape(-1)
        full = torch.zeros(w.shape, dtype=w.dtype, device=grad_out.device)
        full.index_add_(0, flat_idx, grad_out.reshape(-1, w.shape[1]).to(w.dtype))
        if by_freq:  # each row's gradient divided by how often its index occurs in this batch
            full /= torch.bincount(flat_idx, minlength=w.shape[0]).clamp(min=1).unsqueeze(1).to(w.dtype)
        if padding_idx is not None:
            full[padding_idx] = 0  # the padding row never learns
        return None, w.scatter_grad(full), None, None, None, None


class _FSDPState:
    """What a sharded layer needs from its FSDP: compute dtype, world size, and whether forward is running."""

    def __init__(self, dtype: torch.dtype | None, world: int):
        self.dtype, self.world, self.active = dtype, world, False


class _ShardedLayer:
    """Mixed into a Linear/Embedding whose parameters FSDP sharded (the class FSDP gives the layer).

    forward runs the sharded path. `weight` and `bias` read as the full tensors (all-gathered, with a
    gradient that reduce-scatters onto the shard) while the FSDP's forward runs, so code that uses them
    outside the layer's own forward (a tied head, an autograd Function over the weight) still works;
    outside forward, reading them raises RuntimeError (not AttributeError, which would
    hide the message behind nn.Module's own) saying where the full values are.
    """

    def _full(self, which: str):
        shard = self._fsdp_shards[which]
        if shard is None:
            return None
        if not self._fsdp.active:
            raise RuntimeError(f"FSDP shards this {type(self).__name__}'s {which} over {self._fsdp.world} ranks: "
                                 "it exists whole only during the FSDP's forward; read it with "
                                 "fsdp.gather_full_params() (called on every rank)")
        return _GatherFull.apply(shard.param, shard, self._fsdp.dtype)

    weight = property(lambda self: self._full("weight"))
    bias = property(lambda self: self._full("bias"))

    def forward(self, x):
        w, dtype = self._fsdp_shards["weight"], self._fsdp.dtype
        if isinstance(self, nn.Embedding):
            return _ShardedEmbedding.apply(x, w.param, w, dtype, self.padding_idx, self.scale_grad_by_freq)
        b = self._fsdp_shards["bias"]
        return _ShardedLinear.apply(x, w.param, b.param if b else None, w, b, dtype)

    def extra_repr(self) -> str:
        if isinstance(self, nn.Embedding):
            base = nn.Embedding.extra_repr(self)
        else:
            base = (f"in_features={self.in_features}, out_features={self.out_features}, "
                    f"bias={self._fsdp_shards['bias'] is not None}")
        return f"{base}, sharded over {self._fsdp.world} ranks"


_SHARDED_CLASSES: dict[type, type] = {}


def _sharded_class(cls: type) -> type:
    if cls not in _SHARDED_CLASSES:
        _SHARDED_CLASSES[cls] = type(cls.__name__, (_ShardedLayer, cls), {"__module__": cls.__module__})
    return _SHARDED_CLASSES[cls]


def _stock_layer(sub: nn.Module) -> bool:
    """A Linear or Embedding that computes exactly what the stock layer does (FSDP's sharded path replaces it).

    Not one whose class overrides forward, whose weight is parametrized or computed by a hook (weight_norm),
    or whose weight is not its own Parameter.
    """
    if isinstance(sub, nn.Linear):
        stock = type(sub).forward is nn.Linear.forward
    elif isinstance(sub, nn.Embedding):
        stock = type(sub).forward is nn.Embedding.forward
    else:
        return False
    return stock and not parametrize.is_parametrized(sub) and isinstance(sub._parameters.get("weight"), nn.Parameter)


class FSDP(nn.Module):
    """ZeRO-3 over the plain Linear and Embedding layers of `module`; other parameters stay replicated.

    compute_dtype: None (the master dtype, fp32) or torch.bfloat16/float16: weights are gathered and
    used in that dtype, while the shards (master weights) and their gradients stay fp32. The shards are
    this module's parameters for the optimizer (`fsdp.parameters()`), each with its original's
    requires_grad; replicated parameters (LayerNorms, other modules' own parameters) are averaged by
    `finish_gradient_synchronization()`. Tied weights share one shard. A layer stays replicated (its
    own forward in charge) when its class overrides forward, its weight is parametrized, or one of its
    parameters is also a parameter of a module that is not sharded (the tie is kept whole).
    Every rank must call the same sharded layers in the same order in each step (their all-gathers pair up).
    Raises ValueError for a compute_dtype that is not a floating dtype, a module FSDP already wraps, and an
    Embedding with max_norm (it rescales weight rows in place in forward) or sparse=True.
    """

    def __init__(self, module: nn.Module, compute_dtype: torch.dtype | None = None):
        super().__init__()
        if compute_dtype is not None and not (isinstance(compute_dtype, torch.dtype) and compute_dtype.is_floating_point):
            raise ValueError(f"compute_dtype={compute_dtype!r} must be None or a floating torch dtype")
        if not isinstance(module, nn.Module):
            raise ValueError(f"FSDP wraps an nn.Module, got a {type(module).__name__}")
        if any(isinstance(sub, _ShardedLayer) for sub in module.modules()):
            raise ValueError("FSDP: this module is already wrapped by an FSDP (its layers are sharded); wrap it once")
        self.dtype = compute_dtype
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        layers = self._shardable(module)
        broadcast_module(module)
        state = _FSDPState(compute_dtype, self.world)
        self._state = state
        self.names: dict[str, _Shard] = {}  # full name -> shard (tied names share one)
        by_id: dict[int, _Shard] = {}
        shards = []
        for mname, sub in module.named_modules(remove_duplicate=False):
            if id(sub) not in layers:
                continue
            for pname in ("weight", "bias"):
                p = sub._parameters.get(pname)
                if p is None:
                    continue
                if id(p) not in by_id:
                    by_id[id(p)] = _Shard(p, self.rank, self.world)
                    shards.append(by_id[id(p)].param)
                self.names[f"{mname}.{pname}" if mname else pname] = by_id[id(p)]
        for sub in module.modules():
            if id(sub) in layers:
                sub._fsdp_shards = {k: by_id[id(sub._parameters[k])] if sub._parameters.get(k) is not None else None
                                    for k in ("weight", "bias")}
                for pname in ("weight", "bias"):
                    sub._parameters.pop(pname, None)
                sub._fsdp = state
                sub.__class__ = _sharded_class(type(sub))
        self.shards = nn.ParameterList(shards)
        self.module = module
        self.replicated = unique_params(module)

    @staticmethod
    def _shardable(module: nn.Module) -> set[int]:
        """ids of the layers to shard: stock Linear/Embedding layers none of whose parameters is also a
        parameter of a layer that stays whole (repeated until no tie crosses the boundary)."""
        owners: dict[int, list[nn.Module]] = {}
        for mname, sub in module.named_modules(remove_duplicate=False):
            for p in sub._parameters.values():
                if p is not None:
                    owners.setdefault(id(p), []).append(sub)
            if isinstance(sub, nn.Embedding) and _stock_layer(sub) and (sub.max_norm is not None or sub.sparse):
                if sub.max_norm is not None:
                    what, why, fix = (f"max_norm={sub.max_norm}", "it rescales rows of its weight in place during "
                                      "forward, which a shard cannot do", "without max_norm")
                else:
                    what, why, fix = ("sparse=True", "its gradient is sparse, which the reduce-scatter cannot take",
                                      "with sparse=False")
                raise ValueError(f"FSDP: Embedding {mname or '(the module)'!r} has {what}: {why}; build it {fix}")
        layers = {id(sub): sub for sub in module.modules() if _stock_layer(sub)}
        changed = True
        while changed:
            changed = False
            for key, sub in list(layers.items()):
                if any(id(o) not in layers for p in sub._parameters.values() if p is not None for o in owners[id(p)]):
                    del layers[key]
                    changed = True
        return set(layers)

    def forward(self, *args, **kwargs):
        active, self._state.active = self._state.active, True
        try:
            return self.module(*args, **kwargs)
        finally:
            self._state.active = active

    def finish_gradient_synchronization(self) -> None:
        """Average the replicated parameters' gradients (the shards' were reduce-scattered in backward).

        A gradient some ranks lack (a layer their batch did not use) counts as zeros there and is set on
        every rank; one that no rank has stays None.
        """
        works = []
        for p, anywhere in zip(self.replicated, has_grad_on_any_rank(self.replicated)):
            if not anywhere:
                continue
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            p.grad.div_(self.world)
            works.append(dist.all_reduce(p.grad, async_op=True))
        for w in works:
            w.wait()

    def gather_full_params(self) -> dict[str, torch.Tensor]:
        """Every parameter at full size (the master dtype), under the wrapped module's own state-dict names.

        Collective: call it on every rank.
        """
        out = {name: shard.gather().clone() for name, shard in self.names.items()}
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
