"""Gradient accumulation: k micro-batches, one optimizer step, the same gradient as one big batch.

The gradient of a mean loss over a batch is the mean of the per-token gradients. Splitting the
batch into micro-batches and calling backward on each adds their gradients into `.grad`, so each
micro-batch's loss must be weighted by its share of the batch's tokens:

* "mean"   : loss_i / k, the usual recipe. Exact only when every micro-batch has the same number
             of tokens that count (targets != ignore_index); otherwise it averages the averages.
* "tokens" : loss_i * n_i / N, with n_i the counted tokens of micro-batch i and N = sum n_i. This
             is the batch's global mean whatever the padding, because loss_i * n_i is the
             micro-batch's summed loss.

A micro-batch with no counted token has a mean loss of 0/0 (NaN): both weightings give it weight 0
and skip its backward, and "mean" divides by the number of micro-batches that have a counted token.

Under data parallelism (DDP) every backward all-reduces the gradients across ranks unless the
micro-batches before the last run inside `model.no_sync()`, which PyTorch documents as "Context
manager to disable gradient synchronizations across DDP processes" (DistributedDataParallel docs).

Dropout would draw different masks for different splits; the course presets have dropout 0.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch

from helpers.measure.params import positive


IGNORE_INDEX = -1  # the course GPT's cross_entropy(ignore_index=-1): padded targets count for nothing
WEIGHTINGS = ("mean", "tokens")
MicroBatch = tuple[torch.Tensor, torch.Tensor]


def split_batch(x: torch.Tensor, y: torch.Tensor, accum_steps: int) -> list[MicroBatch]:
    """Cut a (B, T) batch of inputs and targets into `accum_steps` equal micro-batches along B."""
    positive("accum_steps", accum_steps)
    if x.size(0) % accum_steps:
        raise ValueError(f"accum_steps={accum_steps} must divide the batch size {x.size(0)}")
    return list(zip(x.chunk(accum_steps), y.chunk(accum_steps)))


def counted_tokens(targets: torch.Tensor, ignore_index: int = IGNORE_INDEX) -> int:
    """Targets that enter the loss (not equal to ignore_index)."""
    return int((targets != ignore_index).sum())


def loss_weights(micro_batches: Sequence[MicroBatch], weighting: str = "mean",
                 ignore_index: int = IGNORE_INDEX) -> list[float]:
    """The factor each micro-batch's mean loss is multiplied by before its backward.

    "mean": 1/k' for each of the k' micro-batches with a counted token; "tokens": n_i / N. A
    micro-batch without a counted token gets 0 in both (its mean loss is 0/0). Raises ValueError
    for an unknown weighting or when no target of any micro-batch counts.
    """
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting={weighting!r} is not allowed; choose one of {WEIGHTINGS}")
    # read: only the targets; N must be known before the first backward, so every micro-batch is counted first
    counts = [counted_tokens(y, ignore_index) for _, y in micro_batches]  # n_i
    total = sum(counts)  # N, the counted tokens of the whole accumulated batch
    if total == 0:
        raise ValueError("no micro-batch has a target that counts: every target is ignore_index")
    if weighting == "mean":  # the usual recipe: right only when every n_i is the same
        k = sum(n > 0 for n in counts)
        return [1.0 / k if n else 0.0 for n in counts]
    # n_i / N: loss_i * n_i is micro-batch i's summed loss, so the weighted sum is the batch's mean loss
    return [n / total for n in counts]


def accumulate_gradients(model: torch.nn.Module, micro_batches: Sequence[MicroBatch], *,
                         weighting: str = "mean", autocast_dtype: torch.dtype | None = None) -> float:
    """Backward through every micro-batch with its loss weighted; gradients add up in `.grad`.

    Returns the weighted loss (what the accumulated gradient is the gradient of). Micro-batches
    with no counted token are skipped: their mean loss is 0/0 (see `loss_weights`).
    """
    total = torch.zeros(())
    for (x, y), w in zip(micro_batches, loss_weights(micro_batches, weighting)):
        if w == 0.0:
            continue
        with torch.autocast(device_type=x.device.type, dtype=autocast_dtype or torch.bfloat16,
                            enabled=autocast_dtype is not None):
            _, loss = model(x, y)
        (loss * w).backward()
        total = total.to(loss.device) + loss.detach().float() * w  # no host sync per micro-batch
    return float(total)


def accumulation_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                      micro_batches: Sequence[MicroBatch],
                      autocast_dtype: torch.dtype | None = None) -> Callable[[], None]:
    """One optimizer step over the micro-batches (equal-sized, so weighting 'mean'), then zero_grad."""
    def step() -> None:
        accumulate_gradients(model, micro_batches, weighting="mean", autocast_dtype=autocast_dtype)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step


# ---------------------------------------------------------------- comparing gradients

def gradients(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A detached copy of every parameter's gradient, by name (zeros where there is none)."""
    return {n: (p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p))
            for n, p in model.named_parameters()}


def batch_gradients(model: torch.nn.Module, micro_batches: Sequence[MicroBatch], *,
                    weighting: str | None = None) -> tuple[float, dict[str, torch.Tensor]]:
    """Zero the gradients, then (loss, gradients) of one pass: the concatenated batch when weighting
    is None (the reference), else the micro-batches accumulated with that weighting."""
    model.zero_grad(set_to_none=True)  # .grad adds up across backwards: start from nothing
    if weighting is None:  # the reference: one backward through all micro-batches at once
        x = torch.cat([mb[0] for mb in micro_batches])  # (sum b_i, T)
        y = torch.cat([mb[1] for mb in micro_batches])  # (sum b_i, T)
        _, loss = model(x, y)  # the mean over every counted target of the batch
        loss.backward()
        value = loss.item()
    else:  # one backward per micro-batch, each loss weighted by loss_weights; the gradients add up in .grad
        value = accumulate_gradients(model, micro_batches, weighting=weighting)
    grads = gradients(model)  # written: a copy of every .grad, by parameter name
    model.zero_grad(set_to_none=True)  # leave the model clean for the next comparison
    return value, grads


def max_gradient_error(grads: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> float:
    """Largest |g - g_ref| over all parameters, relative to the largest |g_ref| of that parameter."""
    return max(((grads[n] - r).abs().max() / r.abs().max().clamp_min(1e-30)).item() for n, r in reference.items())


def _flat_pair(grads: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Both gradients as float64 vectors, parameters in the reference's order; ValueError if the names differ."""
    if set(grads) != set(reference):
        raise ValueError(f"the gradients name different parameters: {sorted(set(grads) ^ set(reference))}")
    return tuple(torch.cat([g[n].detach().reshape(-1).double() for n in reference]) for g in (grads, reference))


def gradient_error(grads: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> float:
    """Norm-relative error ||g - g_ref|| / ||g_ref||, every parameter's gradient as one vector (float64).

    0 for identical gradients; 1 for a zero gradient or for g = 2 g_ref. Raises ValueError when the
    names differ or the reference is all zeros.
    """
    g, r = _flat_pair(grads, reference)
    norm = r.norm()
    if norm == 0:
        raise ValueError("the reference gradient is all zeros: a relative error is undefined")
    return float((g - r).norm() / norm)


def gradient_cosine(grads: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> float:
    """Cosine similarity of the two gradients as single vectors: 1 = same direction (any length)."""
    g, r = _flat_pair(grads, reference)
    return float(torch.nn.functional.cosine_similarity(g, r, dim=0))


def pad_to_lengths(y: torch.Tensor, lengths: torch.Tensor | Sequence[int],
                   ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """A copy of targets y (B, T) with every position t >= lengths[b] set to ignore_index (padding).

    Raises ValueError unless there is one length per row, each in 0..T.
    """
    lengths = torch.as_tensor(lengths, device=y.device)
    if lengths.shape != (y.size(0),) or bool((lengths < 0).any()) or bool((lengths > y.size(1)).any()):
        raise ValueError(f"lengths {lengths.tolist()} must hold one value in 0..{y.size(1)} per row of y {tuple(y.shape)}")
    out = y.clone()
    out[torch.arange(y.size(1), device=y.device)[None, :] >= lengths[:, None]] = ignore_index  # (B, T) mask
    return out


# ---------------------------------------------------------------- effective batch

def effective_batch(micro_batch: int, accum_steps: int, dp_ranks: int = 1, seq_len: int | None = None) -> dict:
    """Sequences (and tokens, given seq_len) per optimizer step: micro-batch x accumulation x ranks."""
    for name, v in (("micro_batch", micro_batch), ("accum_steps", accum_steps), ("dp_ranks", dp_ranks)):
        positive(name, v)
    sequences = micro_batch * accum_steps * dp_ranks
    out = {"micro_batch": micro_batch, "accum_steps": accum_steps, "dp_ranks": dp_ranks, "sequences": sequences,
           "per_rank_sequences": micro_batch * accum_steps}
    if seq_len is not None:
        out["tokens"] = sequences * seq_len
    return out


def accum_steps_for(target_sequences: int, micro_batch: int, dp_ranks: int = 1) -> int:
    """Accumulation steps that reach exactly `target_sequences` per optimizer step."""
    per_pass = micro_batch * dp_ranks
    if target_sequences % per_pass:
        raise ValueError(f"target_sequences={target_sequences} is not a multiple of micro_batch x dp_ranks = {per_pass}")
    return target_sequences // per_pass
