"""FSDP (ZeRO stage 3) written from scratch on `torch.distributed`, for Linear and Embedding layers.

`FSDP(module, compute_dtype=None)`: each rank stores 1/n of every weight of the module's plain Linear
and Embedding layers (fp32 "master" shards, the only copies of those weights); a layer all-gathers its
weight just before use in forward and again in backward, frees it after, and reduce-scatters its weight
gradient so each rank receives only its shard's. Other parameters stay replicated and are averaged as
DDP averages them. As torch's FSDP2 does, it keeps what the module says about itself: a frozen parameter
stays frozen, a tied weight is one shard, a layer with its own forward (or a parametrized weight) stays
whole; what it cannot keep, it refuses with a sentence. It runs inside a process group (see
`helpers.parallel.launch.run_on_ranks` or torchrun).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils import parametrize

from helpers.parallel.collectives import all_gather_single, reduce_scatter_single
from helpers.parallel.ddp import broadcast_module, has_grad_on_any_rank, unique_params


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
    """A Linear whose weight and bias each rank holds 1/n of: gathered whole for the matmul, then let go."""

    @staticmethod
    def forward(ctx, x, w_shard, b_shard, w: _Shard, b: _Shard | None, dtype):
        ctx.meta = (w, b, dtype, x.dtype)
        ctx.save_for_backward(x)  # the input only: never the full weight, which would undo the sharding
        weight = w.gather(dtype)  # all-gather: every rank's slice, the full weight, just before it is used
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
        # the full weight's gradient is computed here, then reduce-scattered: each rank keeps only the average
        # over ranks of its own slice, so no rank holds a full gradient after this layer's backward
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
