"""Held-out loss per window, and the noise a loss difference must exceed before two models are ranked.

`pretrained.validation_loss` is a mean over fixed, seeded windows of the held-out split. `window_losses`
returns each of those windows' losses, so two models scored on the same windows give paired samples: the
gap between them is the mean of the per-window differences and its noise the standard error of that mean.
A gap counts when it exceeds `NOISE_K` standard errors (`gap_separated`); the sentences (`yardstick`,
`compare_losses`) say so in numbers, and say "cannot be told apart" otherwise.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from helpers.gpt import data
from helpers.measure.params import positive

NOISE_K = 2.0  # a gap counts when it exceeds NOISE_K standard errors of the per-window difference


@torch.no_grad()
def window_losses(model: nn.Module, tokens: torch.Tensor, *, batches: int, batch: int, seq_len: int | None = None,
                  seed: int = 1234) -> torch.Tensor:
    """Cross-entropy (nats/byte) of every held-out window `pretrained.validation_loss` averages (the same seeded
    draws): a float64 tensor of batches * batch values whose mean is that validation loss. Runs in eval mode on
    the model's device and restores the mode. Raises ValueError for batches that is not a positive int."""
    seq_len = seq_len or model.config.seq_len
    device = next(model.parameters()).device
    g = torch.Generator().manual_seed(seed)
    was = model.training
    model.eval()
    out = []
    for _ in range(positive("batches", batches)):
        x, y = data.get_batch(tokens, batch, seq_len, device, generator=g)
        logits = model(x)[0].float()
        ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="none")
        out.append(ce.reshape(y.shape).mean(1).double().cpu())
    model.train(was)
    return torch.cat(out)


def loss_gap(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    """(mean of a - b, standard error of that mean) over paired per-window losses (the same windows): the
    yardstick a loss difference must exceed to be ranked. Raises ValueError for unpaired or single windows."""
    if a.shape != b.shape or a.dim() != 1 or a.numel() < 2:
        raise ValueError(f"need two 1-D tensors of the same windows (at least 2); got {tuple(a.shape)} and {tuple(b.shape)}")
    d = (a - b).double()
    return float(d.mean()), float(d.std() / math.sqrt(d.numel()))


def gap_separated(a: torch.Tensor, b: torch.Tensor, k: float = NOISE_K) -> bool:
    """Whether the paired loss gap a - b exceeds k of its standard errors."""
    mean, se = loss_gap(a, b)
    return abs(mean) > k * se


def yardstick(a: torch.Tensor, b: torch.Tensor, k: float = NOISE_K) -> str:
    """The words for the noise yardstick of a - b: 'k x the standard error of the per-window difference'."""
    _, se = loss_gap(a, b)
    return f"yardstick {k:g} x the standard error of the per-window difference, {k * se:.4f} nats/byte over {a.numel()} windows"


def compare_losses(name_a: str, a: torch.Tensor, name_b: str, b: torch.Tensor, k: float = NOISE_K) -> str:
    """One sentence on two models' held-out losses on the same windows: which is lower and by how much when
    the gap exceeds the yardstick (`gap_separated`), else that this run cannot tell them apart."""
    mean, _ = loss_gap(a, b)
    if not gap_separated(a, b, k):
        return (f"{name_a} and {name_b} cannot be told apart: {abs(mean):.4f} nats/byte apart, within the noise "
                f"({yardstick(a, b, k)})")
    lo, hi = (name_a, name_b) if mean < 0 else (name_b, name_a)
    return f"{lo}'s loss is below {hi}'s by {abs(mean):.4f} nats/byte ({yardstick(a, b, k)})"
