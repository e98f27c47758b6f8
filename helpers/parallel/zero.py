"""ZeRO stages 1 and 2 written from scratch on `torch.distributed`, and the ZeRO paper's formulas.

`ShardedOptimizer(params, optimizer_cls, **kwargs)`: ZeRO stage 1 (Rajbhandari et al., 2020). Each rank
keeps optimizer state only for the parameters it owns, updates them, then broadcasts them.
`reduce_gradients()` is stage 2's gradient path: each gradient is reduced to its owner only and dropped
elsewhere (a gradient some ranks lack counts as zeros there). It runs inside a process group (see
`helpers.parallel.launch.run_on_ranks` or torchrun); stage 3 is `helpers.parallel.fsdp`.

Memory per rank: `zero_formula` (the paper's bytes per rank of parameters, gradients and optimizer
state at each stage; the bytes a rank holds are counted by `helpers.gpt.footprint.storage_bytes`) and `zero_extra_comm` (bytes each rank sends
per step at each stage).
"""
from __future__ import annotations

from typing import Iterable

import torch
import torch.distributed as dist
import torch.nn as nn

from helpers.parallel.ddp import has_grad_on_any_rank, unique_params


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
            if not anywhere:  # no rank computed this gradient: nothing to average
                continue
            if p.grad is None:  # this rank did not use p, others did: its share of the sum is zeros
                p.grad = torch.zeros_like(p)
            p.grad.div_(self.world)  # each rank's share of the mean
            dist.reduce(p.grad, dst=self.owner[id(p)])  # summed onto the one rank that updates p
            if self.owner[id(p)] != self.rank:
                p.grad = None  # ZeRO-2's saving: every other rank frees its copy of this gradient

    def step(self) -> None:
        """Update the owned parameters, then broadcast every parameter from its owner."""
        self.optimizer.step()  # AdamW's state exists for the owned parameters only: ZeRO-1's saving
        with torch.no_grad():
            # every parameter travels from the rank that updated it to all the others, all at once
            works = [dist.broadcast(p, src=self.owner[id(p)], async_op=True) for p in self.params]
            for w in works:
                w.wait()  # after this, every rank holds the same updated weights

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


# ---------------------------------------------------------------- memory per rank

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
