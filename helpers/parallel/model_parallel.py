"""Model parallelism on `torch.distributed`: Megatron-style tensor parallelism and pipeline schedules.

Tensor parallelism (Shoeybi et al., 2019, "Megatron-LM"): `TPMLP` splits an MLP's up projection by
columns (each rank computes d_ff/n of the hidden units, no communication) and its down projection
by rows (each rank's partial product is summed by one all-reduce); `TPAttention` gives each rank
n_head/n query heads (and n_kv_head/n key/value heads) and all-reduces after the output
projection. Backward mirrors it: the all-reduce `f` on the block's input gradient. A split layer
computes exactly its dense layer's function and trains exactly the parameters the dense layer trains
(frozen stays frozen, the attention kernel is the dense layer's own); a dense layer whose function the
split would change (its own forward, a parametrized or subclassed projection, extra or tied
parameters, dropout) is refused with a sentence.

`tp_comm_per_layer` counts the bytes a layer's all-reduces send per rank.

Pipeline parallelism: `pipeline_schedule("gpipe"|"1f1b", p, m)` lists each stage's forward and
backward micro-batch steps; `pipeline_step(stage, kind, micro, ...)` runs one training step of a real
module split into stages by that schedule, activations and their gradients sent between ranks;
`bubble_formula` is GPipe's idle share of a step, (p - 1)/(m + p - 1) (Huang et al., 2019);
`replay_schedule` replays a schedule as events with given step, message-delay and overhead times.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils import parametrize

from helpers.gpt.model import MLP, CausalSelfAttention
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


_WIRE_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
_MAX_DIMS = 8


def _send_activation(y: torch.Tensor, dst: int, sends: list) -> None:
    """Send `y` to rank `dst`: a header (dims, shape, dtype) then the tensor, both asynchronous."""
    if not (torch.is_tensor(y) and y.dtype in _WIRE_DTYPES and y.dim() <= _MAX_DIMS):
        what = f"a {y.dtype} tensor of {y.dim()} dims" if torch.is_tensor(y) else f"a {type(y).__name__}"
        raise ValueError(f"pipeline_step: a stage must return one floating tensor of at most {_MAX_DIMS} dims "
                         f"for the next stage, got {what}")
    header = torch.zeros(_MAX_DIMS + 2, dtype=torch.int64)
    header[0], header[-1] = y.dim(), _WIRE_DTYPES.index(y.dtype)
    header[1: 1 + y.dim()] = torch.tensor(y.shape, dtype=torch.int64)
    y = y.detach().contiguous()
    sends += [(dist.isend(header, dst), header), (dist.isend(y, dst), y)]


def _recv_activation(src: int) -> torch.Tensor:
    header = torch.zeros(_MAX_DIMS + 2, dtype=torch.int64)
    dist.recv(header, src)
    dims = int(header[0])
    x = torch.empty([int(d) for d in header[1: 1 + dims]], dtype=_WIRE_DTYPES[int(header[-1])])
    dist.recv(x, src)
    return x


def pipeline_step(stage: nn.Module, kind: str, micro: int, inputs: torch.Tensor | None = None,
                  targets: torch.Tensor | None = None, loss_fn: Callable | None = None) -> list[float] | None:
    """One training step of a pipeline: this rank runs `stage`, its part of the model, by `pipeline_schedule`.

    Rank 0 passes `inputs`, the last rank `targets` and `loss_fn(output, target)` (a scalar, the mean over
    a micro-batch); both split along dim 0 into `micro` equal micro-batches. Each forward sends its
    activation to the next rank, each backward returns the activation's gradient to the previous one
    (point-to-point, asynchronous sends, as in torch.distributed.pipelining). The stage is called as it
    is, so its frozen, unused and tied parameters and its own autograd Functions behave as in a single
    process: each trainable parameter's `.grad` accumulates the sum over micro-batches of
    d(loss_i / micro)/dθ, the full batch's mean-loss gradient (None where the stage never used it).
    A parameter shared by two stages (a tied embedding at both ends) gets each stage's part only: summing
    them across those ranks is the caller's. Returns the micro-batches' losses on the last rank, None
    elsewhere. Raises ValueError for a bad kind or micro, a missing or unevenly split inputs/targets, a
    missing loss_fn, or a stage output that is not one floating tensor.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    steps = pipeline_schedule(kind, world, micro)[rank]
    first, last = rank == 0, rank == world - 1
    for name, t, needed in (("inputs", inputs, first), ("targets", targets, last)):
        if needed and not (torch.is_tensor(t) and t.dim() > 0 and t.shape[0] % micro == 0):
            got = (f"{t.shape[0]} rows" if torch.is_tensor(t) and t.dim() > 0
                   else "None" if t is None else f"a {type(t).__name__}")
            raise ValueError(f"pipeline_step: rank {rank} needs {name}, a tensor whose dim 0 splits into micro={micro} "
                             f"equal micro-batches; got {got}")
    if last and not callable(loss_fn):
        raise ValueError(f"pipeline_step: the last rank ({rank}) needs loss_fn(output, target), got {loss_fn!r}")
    xs = inputs.chunk(micro) if first else None
    ts = targets.chunk(micro) if last else None
    saved: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    losses: list[float] = [0.0] * micro
    sends: list = []  # (work, tensor): a tensor must live until its send completes
    for op, i in steps:
        if op == "F":
            x = xs[i] if first else _recv_activation(rank - 1).requires_grad_()
            y = stage(x)
            if last:
                loss = loss_fn(y, ts[i])
                losses[i] = float(loss.detach())
                saved[i] = (x, loss / micro)
            else:
                _send_activation(y, rank + 1, sends)
                saved[i] = (x, y)
            continue
        x, y = saved.pop(i)
        grad = None
        if not last:
            grad = torch.empty_like(y)
            dist.recv(grad, rank + 1)
        if y.requires_grad:
            torch.autograd.backward(y, grad)
        if not first:
            g = x.grad if x.grad is not None else torch.zeros_like(x)
            sends.append((dist.isend(g, rank - 1), g))
    for work, _ in sends:
        work.wait()
    return losses if last else None


def bubble_formula(stages: int, micro: int) -> float:
    """GPipe's idle share of a step: (p - 1) / (m + p - 1)."""
    return (stages - 1) / (micro + stages - 1)


def replay_schedule(kind: str, stages: int, micro: int, forward_s: float, backward_s: float,
                    delay_s: float = 0.0, overhead_s: float = 0.0) -> dict:
    """The wall time and bubble of one step of `pipeline_schedule(kind, stages, micro)` replayed as events.

    Every forward takes `forward_s`, every backward `backward_s` (seconds); a stage runs its steps in
    order, and a step whose input comes from another stage (an activation from s-1, a gradient from
    s+1) starts `delay_s` after both the message was sent and the stage was free to receive it (the
    delivery, as `dist_lab.run_pipeline` measures it). With delay_s = 0 and equal stages the bubble is
    exactly `bubble_formula(stages, micro)` for both schedules; a delay adds to every receive on the
    step's critical path. `overhead_s`:
    a stage's own time before each step that is not compute (Python, allocation, being descheduled):
    it delays the stage but is not busy. Returns
    {"wall_s", "busy_s" (per stage), "bubble" (1 - sum busy / (stages * wall))}. Raises ValueError for
    a negative time (and what `pipeline_schedule` refuses).
    """
    for name, v in (("forward_s", forward_s), ("backward_s", backward_s), ("delay_s", delay_s),
                    ("overhead_s", overhead_s)):
        if not v >= 0:
            raise ValueError(f"{name}={v!r} must be a number of seconds >= 0")
    plan = pipeline_schedule(kind, stages, micro)
    done: dict[tuple[str, int, int], float] = {}  # (op, micro-batch, stage) -> finish time
    free, pos = [0.0] * stages, [0] * stages
    while any(pos[s] < len(plan[s]) for s in range(stages)):
        progressed = False
        for s in range(stages):
            while pos[s] < len(plan[s]):
                op, i = plan[s][pos[s]]
                if op == "F":
                    dep = ("F", i, s - 1) if s > 0 else None
                else:
                    dep = ("B", i, s + 1) if s < stages - 1 else ("F", i, s)
                if dep is not None and dep not in done:
                    break
                ready = 0.0 if dep is None else done[dep]
                start = max(free[s] + overhead_s, ready) + (delay_s if dep is not None and dep[2] != s else 0.0)
                free[s] = done[(op, i, s)] = start + (forward_s if op == "F" else backward_s)
                pos[s] += 1
                progressed = True
        if not progressed:  # cannot happen for the two schedules; a guard against a malformed plan
            raise RuntimeError(f"replay of {kind} stalled at steps {pos}")
    wall = max(free)
    busy = [micro * (forward_s + backward_s)] * stages
    return {"wall_s": wall, "busy_s": busy, "bubble": 1 - sum(busy) / (stages * wall) if wall > 0 else 0.0}
