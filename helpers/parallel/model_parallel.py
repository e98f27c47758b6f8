"""Model parallelism on `torch.distributed`: Megatron-style tensor parallelism and a pipeline schedule.

Tensor parallelism (Shoeybi et al., 2019, "Megatron-LM"): `TPMLP` splits an MLP's up projection by
columns (each rank computes d_ff/n of the hidden units, no communication) and its down projection
by rows (each rank's partial product is summed by one all-reduce); `TPAttention` gives each rank
n_head/n query heads (and n_kv_head/n key/value heads) and all-reduces after the output
projection. Backward mirrors it: the all-reduce `f` on the block's input gradient.

`tp_comm_per_layer` counts the bytes a layer's all-reduces send per rank.

Pipeline parallelism: `pipeline_schedule("gpipe"|"1f1b", p, m)` lists each stage's forward and
backward micro-batch steps; `bubble_formula` is GPipe's idle share of a step, (p - 1)/(m + p - 1)
(Huang et al., 2019).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from helpers.measure.params import positive


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


class TPMLP(nn.Module):
    """This rank's part of a dense `helpers.gpt.model.MLP` (up: column-parallel, down: row-parallel).

    Input and output (B, T, d_model) are full on every rank; one all-reduce of B*T*d_model in forward,
    one in backward. Raises ValueError when d_ff is not divisible by the world size.
    """

    def __init__(self, dense: nn.Module, rank: int | None = None, world: int | None = None):
        super().__init__()
        rank = dist.get_rank() if rank is None else rank
        world = dist.get_world_size() if world is None else world
        d_ff = dense.up.out_features
        if d_ff % world:
            raise ValueError(f"d_ff={d_ff} is not divisible by {world} ranks")
        self.up_w = nn.Parameter(_rows(dense.up.weight, rank, world))  # (d_ff/n, d_model)
        self.up_b = nn.Parameter(_rows(dense.up.bias, rank, world)) if dense.up.bias is not None else None
        self.down_w = nn.Parameter(_rows(dense.down.weight.t(), rank, world).t().contiguous())  # (d_model, d_ff/n)
        self.down_b = nn.Parameter(dense.down.bias.detach().clone()) if dense.down.bias is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _CopyToTP.apply(x)
        h = F.gelu(F.linear(x, self.up_w, self.up_b), approximate="tanh")  # (B, T, d_ff/n)
        y = _ReduceFromTP.apply(F.linear(h, self.down_w))  # (B, T, d_model), summed over ranks
        return y + self.down_b if self.down_b is not None else y


class TPAttention(nn.Module):
    """This rank's heads of a dense `helpers.gpt.model.CausalSelfAttention`; one all-reduce after out_proj.

    Raises ValueError unless n_head and n_kv_head are divisible by the world size.
    """

    def __init__(self, dense: nn.Module, rank: int | None = None, world: int | None = None):
        super().__init__()
        rank = dist.get_rank() if rank is None else rank
        world = dist.get_world_size() if world is None else world
        H, H_kv, hd = dense.n_head, dense.n_kv_head, dense.head_dim
        if H % world or H_kv % world:
            raise ValueError(f"n_head={H} and n_kv_head={H_kv} must be divisible by {world} ranks")
        self.H, self.H_kv, self.hd = H // world, H_kv // world, hd
        self.q_w = nn.Parameter(_rows(dense.q_proj.weight, rank, world))
        kv = dense.kv_proj.weight.detach().view(2, H_kv, hd, -1)
        self.kv_w = nn.Parameter(kv.chunk(world, dim=1)[rank].reshape(-1, kv.shape[-1]).clone())
        self.q_b = nn.Parameter(_rows(dense.q_proj.bias, rank, world)) if dense.q_proj.bias is not None else None
        self.kv_b = (nn.Parameter(dense.kv_proj.bias.detach().view(2, H_kv, hd).chunk(world, dim=1)[rank]
                                  .reshape(-1).clone()) if dense.kv_proj.bias is not None else None)
        self.out_w = nn.Parameter(_rows(dense.out_proj.weight.t(), rank, world).t().contiguous())
        self.out_b = nn.Parameter(dense.out_proj.bias.detach().clone()) if dense.out_proj.bias is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        x = _CopyToTP.apply(x)
        q = F.linear(x, self.q_w, self.q_b).view(B, T, self.H, self.hd).transpose(1, 2)
        k, v = F.linear(x, self.kv_w, self.kv_b).view(B, T, 2, self.H_kv, self.hd).permute(2, 0, 3, 1, 4)
        if self.H_kv != self.H:
            k = k.repeat_interleave(self.H // self.H_kv, dim=1)
            v = v.repeat_interleave(self.H // self.H_kv, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, -1)
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


# ---------------------------------------------------------------- pipeline

def pipeline_schedule(kind: str, stages: int, micro: int) -> list[list[tuple[str, int]]]:
    """Per stage, the ordered steps [("F", i) or ("B", i)] of one training step.

    "gpipe": all m forwards, then all m backwards (Huang et al., 2019). "1f1b": stage s runs
    p - s warm-up forwards, then alternates one forward and one backward, then drains (Narayanan et
    al., 2019, PipeDream-Flush): the same bubble, at most p - s micro-batches' activations held.
    Raises ValueError for an unknown kind, or stages or micro that is not a positive int.
    """
    if kind not in ("gpipe", "1f1b"):
        raise ValueError(f"kind={kind!r}; choose 'gpipe' or '1f1b'")
    positive("stages", stages)
    positive("micro", micro)
    out = []
    for s in range(stages):
        if kind == "gpipe":
            out.append([("F", i) for i in range(micro)] + [("B", i) for i in range(micro)])
            continue
        warm = min(stages - s, micro)
        steps = [("F", i) for i in range(warm)]
        f, b = warm, 0
        while b < micro:
            steps.append(("B", b))
            b += 1
            if f < micro:
                steps.append(("F", f))
                f += 1
        out.append(steps)
    return out


def bubble_formula(stages: int, micro: int) -> float:
    """GPipe's idle share of a step: (p - 1) / (m + p - 1)."""
    return (stages - 1) / (micro + stages - 1)
