"""Bytes one decode step reads: the course's one definition, used wherever a GB/s is computed from a model.

A decode step of batch 1 reads every weight once and the key/value cache it attends over. It does not read
the whole position table: one row per new token. So `decode_step_bytes(model, cache_bytes)` is

    sum over every distinct parameter and buffer of the model, in the format it is stored in
    - all of the position table's rows but one
    + cache_bytes (the K and V the step attends over: 2 x layers x tokens x KV heads x head_dim x element size)

"Stored format" matters for quantised layers: a weight-only int8 or int4 linear
(`helpers.lowbit.quant_linear.WeightOnlyLinear`) keeps its codes, scales and zeros as buffers, and those are
what the step reads; a bitsandbytes NF4 weight is a uint8 parameter of packed codes; a tensor subclass that
wraps its storage (torchao's quantised tensors) is counted through its inner tensors (`tensor_bytes`). A
tensor shared by two modules (the tied LM head and token table) is counted once.
"""
from __future__ import annotations

from typing import Iterable

import torch
from torch import nn


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes a tensor occupies as stored: numel x element size for an ordinary tensor; for a wrapper subclass
    that implements `__tensor_flatten__` (torchao's quantised tensors), the sum over its inner tensors."""
    flatten = getattr(t, "__tensor_flatten__", None)
    if flatten is not None:
        names, _ = flatten()
        return sum(tensor_bytes(getattr(t, name)) for name in names)
    return t.numel() * t.element_size()


def storage_bytes(tensors: Iterable[torch.Tensor | None]) -> int:
    """Bytes of the distinct storages among `tensors`: a tensor seen twice, two views of one storage or a tied
    weight count once; anything that is not a tensor (None) and meta tensors (no storage) are skipped. What a
    rank, an optimizer or a fine-tuning variant holds in memory, as the allocator sees it."""
    seen, total = set(), 0
    for t in tensors:
        if not torch.is_tensor(t) or t.device.type == "meta":
            continue
        key = (t.device, t.untyped_storage().data_ptr())
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
    return total


def stored_bytes(model: nn.Module) -> int:
    """Bytes of every distinct parameter and buffer of `model` as stored (`tensor_bytes`); a tensor reachable
    from two modules (a tied LM head) is counted once."""
    seen: set[int] = set()
    total = 0
    for t in list(model.parameters()) + list(model.buffers()):
        if id(t) not in seen:
            seen.add(id(t))
            total += tensor_bytes(t)
    return total


def decode_step_bytes(model: nn.Module, cache_bytes: int = 0) -> int:
    """Bytes one batch-1 decode step of `model` reads: `stored_bytes(model)` less all the rows but one of its
    position table (`model.wpe`, when it has one) plus `cache_bytes`, the K and V the step attends over (0:
    weights only). Raises ValueError for a negative cache_bytes."""
    if cache_bytes < 0:
        raise ValueError(f"cache_bytes={cache_bytes!r} must be >= 0")
    n = stored_bytes(model)
    wpe = getattr(model, "wpe", None)
    if isinstance(wpe, nn.Embedding):
        table = tensor_bytes(wpe.weight)
        n -= table - table // wpe.weight.shape[0]
    return n + int(cache_bytes)


def training_floor_bytes(config, batch: int) -> int:
    """A floor on the memory one fp32 training step of a course GPT of `config` at `batch` sequences needs, from
    the configuration alone (no model is built): 16 bytes per parameter (weights, gradients and AdamW's two
    moments, fp32) and each block's input kept for the backward pass, 4 bytes per number. Real steps need more;
    a size whose floor does not fit the machine cannot run."""
    d, kv = config.d_model, config.n_kv_head * (config.d_model // config.n_head)
    block = 2 * d * d + 2 * d * kv + 2 * d * config.d_ff  # q, o; k, v; the MLP's two matrices (biases left out)
    n_params = config.vocab_size * d + config.seq_len * d + config.n_layer * block
    return 16 * n_params + 4 * batch * config.seq_len * d * config.n_layer
