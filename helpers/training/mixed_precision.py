"""The training variants notebook 03 compares, one mixed-precision step each: fp32, fp16 autocast
without and with loss scaling (ours or `torch.amp.GradScaler`), bf16 autocast, and bf16 weights with
fp32 master weights (Micikevicius et al., 2018, *Mixed Precision Training*).

A step of a scaled variant: forward under autocast (matmuls in 16 bits, reductions such as the loss
in fp32), backward of S·L, then the scaler unscales the gradients by 1/S in fp32 and skips the
optimizer step if any is inf or NaN. With master weights the 16-bit model's gradients are copied
into fp32 parameters, AdamW updates those, and the result is rounded back into the model.

Built on `precision` (the loss scaler and master weights); the measurements of the variants are in
`mixed_precision_lab`.
"""
from __future__ import annotations

import copy
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from helpers.training.precision import DynamicLossScaler, MasterWeights


VARIANTS = {  # name -> (weights dtype, autocast dtype, loss scaler, fp32 master weights)
    "fp32": (torch.float32, None, None, False),
    "fp16 no scaling": (torch.float32, torch.float16, None, False),
    "fp16 + our scaler": (torch.float32, torch.float16, "ours", False),
    "fp16 + GradScaler": (torch.float32, torch.float16, "torch", False),
    "bf16 autocast": (torch.float32, torch.bfloat16, None, False),
    "bf16 weights + fp32 master": (torch.bfloat16, None, None, True),
}


def variant_format(name: str) -> str:
    """The format a variant's matmuls run in: "fp32", "fp16" or "bf16" (its autocast dtype, else its weights')."""
    if name not in VARIANTS:
        raise ValueError(f"variant {name!r} is unknown; choose one of {', '.join(map(repr, VARIANTS))}")
    weights, autocast, _, _ = VARIANTS[name]
    return {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}[autocast or weights]


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
