"""Data parallelism written from scratch on `torch.distributed`: DDP, and the helpers ZeRO and FSDP share.

Every class here runs inside a process group (see `helpers.parallel.launch.run_on_ranks` or torchrun).
DDP keeps what the wrapped module says about itself, as torch's DDP does: a frozen parameter
(requires_grad=False) stays frozen, is never reduced and is only broadcast at construction; a tied
parameter is one parameter, reduced once; a layer's own forward (and any autograd Function in it) still
defines its output and its gradient. What it cannot keep, it refuses with a sentence.

`DDP(module, bucket_mb=None, overlap=True, find_unused_parameters=False)`: parameters and buffers
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

Helpers used by DDP, by `zero` and `fsdp`, and by the notebook's checks: `unique_params`,
`broadcast_module`, `has_grad_on_any_rank`; `bucket_assignment` (DDP's buckets, torch's rule) and
`overlap_prediction` (a backward's step time with and without overlapped all-reduces).
"""
from __future__ import annotations

import contextlib
import dataclasses
import weakref

import torch
import torch.distributed as dist
import torch.nn as nn

from helpers.measure.params import choose, positive


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
        elif dataclasses.is_dataclass(o) and not isinstance(o, type):  # a model output object, as torch DDP reads it
            for f in dataclasses.fields(o):
                collect(getattr(o, f.name))

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
        """Start every bucket that is complete, in bucket order, stopping at the first one still waiting."""
        # in order, even when a later bucket fills first: every rank then issues the same all-reduces in the
        # same sequence, so the k-th all-reduce of one rank meets the k-th of every other
        while self._next < len(self.buckets) and self._waiting[self._next] == 0:
            self._launch(self._next)
            self._next += 1

    def _launch(self, i: int) -> None:
        """Flatten bucket i's gradients into one buffer and start its all-reduce without waiting for it."""
        # a parameter that got no gradient (find_unused_parameters) takes part with zeros
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.buckets[i]]
        # one message for the whole bucket: one latency instead of one per tensor, paid with a copy in
        flat = grads[0] if len(grads) == 1 else torch.cat([g.reshape(-1) for g in grads])
        flat.div_(self.world)  # the all-reduce sums, so divide first: the ranks' sum of grad/n is the mean
        self.bytes_reduced += flat.numel() * flat.element_size()
        # async_op=True returns at once: backward goes on computing earlier layers while this bucket travels;
        # finish_gradient_synchronization() waits on the handle and copies the sums back into each .grad
        # (a one-tensor bucket is reduced in its .grad itself)
        self._handles[i] = (dist.all_reduce(flat, async_op=True), flat)

    def _grad_ready(self, p: nn.Parameter) -> None:
        """The hook: autograd calls it once p.grad holds this backward's whole gradient for p."""
        if not self._sync:  # inside no_sync(): the gradient only accumulates locally
            return
        # only with find_unused_parameters: parameters this forward did not use will get no gradient, so no
        # hook fires for them; the first hook of the backward counts them as ready, or their buckets would wait
        # forever
        if self._unused:  # the first gradient of this backward: the unused parameters are ready too
            unused, self._unused = self._unused, set()
            for q in self.params:
                if id(q) in unused:
                    self._mark(q)
        self._mark(p)  # one gradient fewer for its bucket to wait for
        if self.overlap:  # start what is complete now, while backward continues
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
