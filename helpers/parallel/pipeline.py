"""Pipeline parallelism on `torch.distributed`: the GPipe and 1F1B schedules, run and priced.

`pipeline_schedule("gpipe"|"1f1b", p, m)` lists each stage's forward and backward micro-batch steps;
`pipeline_step(stage, kind, micro, ...)` runs one training step of a real module split into stages by
that schedule, activations and their gradients sent between ranks (`send_activation` and
`recv_activation` carry a tensor of any shape, `split_micro_batches` checks and cuts the step's inputs);
`bubble_formula` is GPipe's idle share of a step, (p - 1)/(m + p - 1) (Huang et al., 2019);
`replay_schedule` replays a schedule as events with given step, message-delay and overhead times.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist
import torch.nn as nn

from helpers.measure.params import positive


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
        if kind == "gpipe":  # every micro-batch forward, then every one backward: m activations held at the peak
            out.append([("F", i) for i in range(micro)] + [("B", i) for i in range(micro)])
            continue
        # warm-up: enough forwards to fill the pipe below this stage; the last stage needs one, the first p
        warm = min(stages - s, micro)
        steps = [("F", i) for i in range(warm)]
        f, b = warm, 0
        while b < micro:  # steady state: each backward frees a micro-batch's activations, then one more forward
            steps.append(("B", b))
            b += 1
            if f < micro:  # once every forward has run, only the backwards are left: the drain
                steps.append(("F", f))
                f += 1
        out.append(steps)
    return out


_WIRE_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
_MAX_DIMS = 8


def send_activation(y: torch.Tensor, dst: int, sends: list) -> None:
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


def recv_activation(src: int) -> torch.Tensor:
    """Receive the next activation `send_activation` sent from rank `src`: its header, then the tensor."""
    header = torch.zeros(_MAX_DIMS + 2, dtype=torch.int64)
    dist.recv(header, src)
    dims = int(header[0])
    x = torch.empty([int(d) for d in header[1: 1 + dims]], dtype=_WIRE_DTYPES[int(header[-1])])
    dist.recv(x, src)
    return x


def split_micro_batches(rank: int, world: int, micro: int, inputs: torch.Tensor | None,
                        targets: torch.Tensor | None, loss_fn: Callable | None) -> tuple[tuple | None, tuple | None]:
    """(inputs cut into `micro` micro-batches along dim 0 on rank 0, else None; the same of targets on the last
    rank, else None). Raises ValueError for a missing or unevenly split inputs/targets or, on the last rank, a
    loss_fn that is not callable."""
    first, last = rank == 0, rank == world - 1
    for name, t, needed in (("inputs", inputs, first), ("targets", targets, last)):
        if needed and not (torch.is_tensor(t) and t.dim() > 0 and t.shape[0] % micro == 0):
            got = (f"{t.shape[0]} rows" if torch.is_tensor(t) and t.dim() > 0
                   else "None" if t is None else f"a {type(t).__name__}")
            raise ValueError(f"pipeline_step: rank {rank} needs {name}, a tensor whose dim 0 splits into micro={micro} "
                             f"equal micro-batches; got {got}")
    if last and not callable(loss_fn):
        raise ValueError(f"pipeline_step: the last rank ({rank}) needs loss_fn(output, target), got {loss_fn!r}")
    return (inputs.chunk(micro) if first else None), (targets.chunk(micro) if last else None)


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
    steps = pipeline_schedule(kind, world, micro)[rank]  # this stage's ("F", i) and ("B", i), in order
    first, last = rank == 0, rank == world - 1
    xs, ts = split_micro_batches(rank, world, micro, inputs, targets, loss_fn)
    saved: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # micro-batch -> (its input, its output)
    losses: list[float] = [0.0] * micro
    sends: list = []  # (work, tensor): a tensor must live until its send completes
    for op, i in steps:
        if op == "F":
            # the input: rank 0 reads its micro-batch, every other stage receives the previous stage's
            # activation and asks for its gradient, which the backward will send back
            x = xs[i] if first else recv_activation(rank - 1).requires_grad_()
            y = stage(x)
            if last:
                loss = loss_fn(y, ts[i])
                losses[i] = float(loss.detach())
                saved[i] = (x, loss / micro)  # each micro-batch's share of the batch's mean loss
            else:
                send_activation(y, rank + 1, sends)  # on to the next stage, without waiting for it
                saved[i] = (x, y)  # kept until this micro-batch's backward: the activations a stage holds
            continue
        x, y = saved.pop(i)
        grad = None
        if not last:  # d(loss)/d(output) comes back from the next stage
            grad = torch.empty_like(y)
            dist.recv(grad, rank + 1)
        if y.requires_grad:  # backward through this stage: .grad of its parameters accumulates, x.grad is set
            torch.autograd.backward(y, grad)
        if not first:  # d(loss)/d(input) is the previous stage's output gradient: send it back
            g = x.grad if x.grad is not None else torch.zeros_like(x)
            sends.append((dist.isend(g, rank - 1), g))
    for work, _ in sends:  # every message delivered before the step ends
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
    delivery, as `pipeline_lab.run_pipeline` measures it). With delay_s = 0 and equal stages the bubble is
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
