"""The training variants notebook 03 compares (fp32, fp16 with and without loss scaling, bf16, master
weights), one step of each, and what they cost in memory; built on `helpers.precision`.
"""
from __future__ import annotations

import copy
import math
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from .bench import saved_breakdown
from .precision import DynamicLossScaler, MasterWeights

VARIANTS = {  # name -> (weights dtype, autocast dtype, loss scaler, fp32 master weights)
    "fp32": (torch.float32, None, None, False),
    "fp16 no scaling": (torch.float32, torch.float16, None, False),
    "fp16 + our scaler": (torch.float32, torch.float16, "ours", False),
    "fp16 + GradScaler": (torch.float32, torch.float16, "torch", False),
    "bf16 autocast": (torch.float32, torch.bfloat16, None, False),
    "bf16 weights + fp32 master": (torch.bfloat16, None, None, True),
}


@dataclass
class Run:
    """A model, optimizer and (optional) scaler / master weights set up for one variant."""

    name: str
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    autocast: torch.dtype | None
    scaler: Any = None
    master: MasterWeights | None = None

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The forward pass (under autocast when the variant uses it); returns the mean loss."""
        ctx = torch.autocast(x.device.type, dtype=self.autocast) if self.autocast else nullcontext()
        with ctx:
            return self.model(x, y)[1]

    def step(self, x: torch.Tensor, y: torch.Tensor, stats: bool = True) -> dict[str, Any]:
        """One training step; returns loss, scale, whether the update was skipped, share of zero gradients.

        With stats=False nothing is read back to the host (for timing) and {} is returned.
        """
        self.optimizer.zero_grad(set_to_none=True)
        self.model.zero_grad(set_to_none=True)
        loss = self.loss(x, y)
        scale = self.scaler.get_scale() if self.scaler and stats else None
        (self.scaler.scale(loss) if self.scaler else loss).backward()
        if self.master:
            self.master.grads_to_master()
        if stats:
            grads = [p.grad for g in self.optimizer.param_groups for p in g["params"] if p.grad is not None]
            zeros = torch.stack([(g == 0).sum() for g in grads]).sum().item() / sum(g.numel() for g in grads)
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        if self.master:
            self.master.master_to_model()
        if not stats:
            return {}
        skipped = bool(self.scaler) and self.scaler.get_scale() < scale  # the scale only shrinks after inf/NaN
        return {"loss": loss.item(), "scale": scale, "skipped": skipped, "zero_fraction": zeros}


def make_run(name: str, base: torch.nn.Module, *, lr: float, device: str, init_scale: float = 2.0**16,
             growth_interval: int = 2000) -> Run:
    """A fresh copy of `base` set up for variant `name` (a key of VARIANTS), with AdamW at `lr`."""
    if name not in VARIANTS:
        raise ValueError(f"variant {name!r} is unknown; choose one of {', '.join(map(repr, VARIANTS))}")
    weights, autocast, scaler_kind, use_master = VARIANTS[name]
    model = copy.deepcopy(base).to(device=device, dtype=weights)
    master = MasterWeights(model) if use_master else None
    optimizer = torch.optim.AdamW(master.params if master else model.parameters(), lr=lr)
    scaler = None
    if scaler_kind == "ours":
        scaler = DynamicLossScaler(init_scale, growth_interval=growth_interval)
    elif scaler_kind == "torch":
        scaler = torch.amp.GradScaler(device, init_scale=init_scale, growth_interval=growth_interval)
    return Run(name, model, optimizer, autocast, scaler, master)


def memory_breakdown(run: Run, x: torch.Tensor, y: torch.Tensor, step: bool = True) -> dict[str, int]:
    """Bytes of weights, fp32 master copies, gradients, optimizer state and saved activations after a step.

    With step=False the caller promises a step just ran (gradients and optimizer state exist).
    """
    if step:
        run.step(x, y)
    weights = sum(p.nbytes for p in run.model.parameters())
    grads = sum(p.grad.nbytes for p in run.model.parameters() if p.grad is not None)
    if run.master:
        grads += sum(m.grad.nbytes for m in run.master.params if m.grad is not None)
    opt_state = sum(v.nbytes for st in run.optimizer.state.values() for v in st.values() if torch.is_tensor(v))
    saved = saved_breakdown(lambda: run.loss(x, y), list(run.model.parameters()))
    return {"weights": weights, "master": run.master.nbytes() if run.master else 0, "grads": grads,
            "optimizer": opt_state, "activations": saved["activations"], "weight_copies": saved["weight_copies"]}


def thin(values: list[torch.Tensor], max_values: int) -> torch.Tensor:
    """Every k-th entry of each flattened tensor, on the CPU: about max_values (at most one more per tensor)."""
    total = sum(v.numel() for v in values)
    stride = max(1, math.ceil(total / max_values))
    return torch.cat([v.detach().flatten()[::stride].float().cpu() for v in values])


def gradient_samples(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor,
                     max_values: int = 4_000_000) -> dict[str, torch.Tensor]:
    """|gradient| values of one fp32 backward: every parameter, and every Linear layer's output.

    Large models are thinned to at most `max_values` per kind by keeping every k-th value, which keeps
    each tensor's share of the sample proportional to its size.
    """
    outputs: list[torch.Tensor] = []
    hooks = [m.register_full_backward_hook(lambda mod, gin, gout: outputs.append(gout[0].detach()))
             for m in model.modules() if isinstance(m, torch.nn.Linear)]
    try:
        model.zero_grad(set_to_none=True)
        model(x, y)[1].backward()
    finally:
        for h in hooks:
            h.remove()
    weights = thin([p.grad for p in model.parameters() if p.grad is not None], max_values).abs()
    model.zero_grad(set_to_none=True)
    return {"weight gradients": weights, "activation gradients": thin(outputs, max_values).abs()}


