"""Megatron-style tensor parallelism on `torch.distributed` (Shoeybi et al., 2019, "Megatron-LM").

`TPMLP` splits an MLP's up projection by columns (each rank computes d_ff/n of the hidden units, no
communication) and its down projection by rows (each rank's partial product is summed by one
all-reduce); `TPAttention` gives each rank n_head/n query heads (and n_kv_head/n key/value heads) and
all-reduces after the output projection. Backward mirrors it: the all-reduce `f` on the block's input
gradient. A split layer computes exactly its dense layer's function and trains exactly the parameters
the dense layer trains (frozen stays frozen, the attention kernel is the dense layer's own); a dense
layer whose function the split would change (its own forward, a parametrized or subclassed projection,
extra or tied parameters, dropout) is refused with a sentence.

`tp_comm_per_layer` counts the bytes a layer's all-reduces send per rank.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils import parametrize

from helpers.gpt.model import MLP, CausalSelfAttention


class _CopyToTP(torch.autograd.Function):
    """Megatron's f: identity in forward, all-reduce of the gradient in backward."""

    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, g):
        g = g.clone()
        dist.all_reduce(g)
        return g


class _ReduceFromTP(torch.autograd.Function):
    """Megatron's g: all-reduce in forward, identity in backward."""

    @staticmethod
    def forward(ctx, x):
        x = x.clone()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, g):
        return g


def _rows(t: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    return t.detach().chunk(world, dim=0)[rank].clone()


def _param(t: torch.Tensor, like: torch.Tensor) -> nn.Parameter:
    """`t` as a new Parameter that trains exactly when its source `like` does."""
    return nn.Parameter(t, requires_grad=like.requires_grad)


def _check_dense(who: str, dense: nn.Module, cls: type, linears: tuple[str, ...], dropout: str) -> None:
    """Refuse, in one sentence, a dense layer the split would not compute the same function for."""
    if not isinstance(dense, cls) or type(dense).forward is not cls.forward:
        raise ValueError(f"{who} splits a helpers.gpt.model.{cls.__name__}, got {type(dense).__name__}"
                         + (" whose forward is its own" if isinstance(dense, cls) else "")
                         + f": the split layer computes {cls.__name__}'s function, so it would compute another one")
    for name in linears:
        layer = getattr(dense, name)
        if not (isinstance(layer, nn.Linear) and type(layer).forward is nn.Linear.forward) \
                or parametrize.is_parametrized(layer) or not isinstance(layer._parameters.get("weight"), nn.Parameter):
            raise ValueError(f"{who}: dense.{name} is a {type(layer).__name__} whose own forward (or parametrization) "
                             "defines its output and gradient; the split computes a plain nn.Linear's")
    allowed = {f"{n}.{k}" for n in linears for k in ("weight", "bias")}
    named = list(dense.named_parameters(remove_duplicate=False))
    extra = sorted(n for n, _ in named if n not in allowed)
    if extra:
        raise ValueError(f"{who}: dense has parameters {extra} besides those of {', '.join(linears)}, which the "
                         "split layer would drop")
    by_id: dict[int, list[str]] = {}
    for n, p in named:
        by_id.setdefault(id(p), []).append(n)
    tied = [names for names in by_id.values() if len(names) > 1]
    if tied:
        raise ValueError(f"{who}: {' and '.join(tied[0])} are one tied parameter, which the split would cut in two "
                         "different ways (or copy twice); untie them")
    p = getattr(dense, dropout).p
    if p:
        raise ValueError(f"{who}: dense.{dropout} has p={p}; the split layer has no dropout (after the all-reduce "
                         "it would need the same random mask on every rank): build the dense layer with dropout=0")


class TPMLP(nn.Module):
    """This rank's part of a dense `helpers.gpt.model.MLP` (up: column-parallel, down: row-parallel).

    Input and output (B, T, d_model) are full on every rank; one all-reduce of B*T*d_model in forward,
    one in backward. Each split parameter has its source's requires_grad (a frozen layer stays frozen).
    Raises ValueError when d_ff is not divisible by the world size, and for a dense layer the split
    would change: not an MLP (or one with its own forward), up/down not plain nn.Linear (an own forward,
    a parametrization), parameters besides up's and down's, a tied parameter, or dropout > 0.
    """

    def __init__(self, dense: nn.Module, rank: int | None = None, world: int | None = None):
        super().__init__()
        _check_dense("TPMLP", dense, MLP, ("up", "down"), "drop")
        rank = dist.get_rank() if rank is None else rank
        world = dist.get_world_size() if world is None else world
        d_ff = dense.up.out_features
        if d_ff % world:
            raise ValueError(f"d_ff={d_ff} is not divisible by {world} ranks")
        up, down = dense.up, dense.down
        self.up_w = _param(_rows(up.weight, rank, world), up.weight)  # (d_ff/n, d_model)
        self.up_b = _param(_rows(up.bias, rank, world), up.bias) if up.bias is not None else None
        self.down_w = _param(_rows(down.weight.t(), rank, world).t().contiguous(), down.weight)  # (d_model, d_ff/n)
        self.down_b = _param(down.bias.detach().clone(), down.bias) if down.bias is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _CopyToTP.apply(x)
        h = F.gelu(F.linear(x, self.up_w, self.up_b), approximate="tanh")  # (B, T, d_ff/n)
        y = _ReduceFromTP.apply(F.linear(h, self.down_w))  # (B, T, d_model), summed over ranks
        return y + self.down_b if self.down_b is not None else y


class TPAttention(nn.Module):
    """This rank's heads of a dense `helpers.gpt.model.CausalSelfAttention`; one all-reduce after out_proj.

    The dense layer's own attention kernel (`dense.attn_fn`, an autograd Function or any callable
    fn(q, k, v, is_causal)) runs on this rank's heads, so its forward and gradient are the dense layer's.
    Each split parameter has its source's requires_grad.
    Raises ValueError unless n_head and n_kv_head are divisible by the world size, and for a dense layer
    the split would change (as TPMLP: its own forward, projections that are not plain nn.Linear, extra or
    tied parameters, dropout > 0).
    """

    def __init__(self, dense: nn.Module, rank: int | None = None, world: int | None = None):
        super().__init__()
        _check_dense("TPAttention", dense, CausalSelfAttention, ("q_proj", "kv_proj", "out_proj"), "resid_drop")
        rank = dist.get_rank() if rank is None else rank
        world = dist.get_world_size() if world is None else world
        H, H_kv, hd = dense.n_head, dense.n_kv_head, dense.head_dim
        if H % world or H_kv % world:
            raise ValueError(f"n_head={H} and n_kv_head={H_kv} must be divisible by {world} ranks")
        self.H, self.H_kv, self.hd = H // world, H_kv // world, hd
        self.attn_fn = dense.attn_fn
        q, kvp, o = dense.q_proj, dense.kv_proj, dense.out_proj
        self.q_w = _param(_rows(q.weight, rank, world), q.weight)
        kv = kvp.weight.detach().view(2, H_kv, hd, -1)
        self.kv_w = _param(kv.chunk(world, dim=1)[rank].reshape(-1, kv.shape[-1]).clone(), kvp.weight)
        self.q_b = _param(_rows(q.bias, rank, world), q.bias) if q.bias is not None else None
        self.kv_b = (_param(kvp.bias.detach().view(2, H_kv, hd).chunk(world, dim=1)[rank].reshape(-1).clone(), kvp.bias)
                     if kvp.bias is not None else None)
        self.out_w = _param(_rows(o.weight.t(), rank, world).t().contiguous(), o.weight)
        self.out_b = _param(o.bias.detach().clone(), o.bias) if o.bias is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        x = _CopyToTP.apply(x)
        q = F.linear(x, self.q_w, self.q_b).view(B, T, self.H, self.hd).transpose(1, 2)
        k, v = F.linear(x, self.kv_w, self.kv_b).view(B, T, 2, self.H_kv, self.hd).permute(2, 0, 3, 1, 4)
        if self.H_kv != self.H:
            k = k.repeat_interleave(self.H // self.H_kv, dim=1)
            v = v.repeat_interleave(self.H // self.H_kv, dim=1)
        y = self.attn_fn(q, k, v, True).transpose(1, 2).reshape(B, T, -1)
        y = _ReduceFromTP.apply(F.linear(y, self.out_w))
        return y + self.out_b if self.out_b is not None else y


def tp_comm_per_layer(batch: int, seq: int, d_model: int, world: int, bytes_per: int = 4) -> dict[str, float]:
    """Bytes each rank sends per transformer layer under Megatron TP (ring all-reduce of B*T*d each).

    Forward: 2 all-reduces (attention, MLP); backward: 2 more. A ring all-reduce of N bytes sends
    2(n-1)/n * N per rank.
    """
    n_bytes = batch * seq * d_model * bytes_per
    per_ar = 2 * (world - 1) / world * n_bytes
    return {"all_reduces": 4, "message_bytes": n_bytes, "sent_per_rank": 4 * per_ar}
