"""Activation checkpointing strategies for the course GPT, and the arithmetic of what they save (notebook 04).

A strategy is applied to a live `GPT` without changing helpers/gpt/model.py:

* "none": every activation is kept for backward.
* "every": each block is recomputed in backward (the model's own `set_checkpointing(True)`), which is
  what Hugging Face's `gradient_checkpointing_enable()` does per decoder layer.
* "every-k": blocks 0, k, 2k, ... are recomputed (`set_checkpointing`), the others keep everything.
* "sqrt-L": `torch.utils.checkpoint.checkpoint_sequential` over all blocks in round(√L) segments
  (Chen et al., 2016): only segment inputs are kept; it leaves the last segment un-checkpointed.
* "selective-attention": only the attention kernel softmax(qkᵀ)v is recomputed (Korthikanti et al.,
  2022, "selective recomputation"): its T×T scores and probabilities are never kept.
* "selective-mlp": only the MLP activation is recomputed: GELU and the down projection run under a
  checkpoint, so the GELU output (B, T, d_ff) is not kept; with early stop the down matmul is not re-run.

The non-block strategies override attributes of one instance: a block's (or its MLP's) `forward`,
which `nn.Module.__call__` prefers to the class method, or an attention module's `attn_fn`.
`remove_strategy` deletes the overrides. Setting `model.attn_impl` afterwards replaces every
`attn_fn`, so apply the strategy after choosing the kernel.
"""
from __future__ import annotations

import math
from functools import partial

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint, checkpoint_sequential

from helpers.gpt.model import GPT, Block, GPTConfig
from helpers.measure.params import positive


# ---------------------------------------------------------------- strategies

STRATEGIES = ("none", "every", "every-k", "sqrt-L", "selective-attention", "selective-mlp")


def sqrt_segments(n_layer: int) -> int:
    """Segments for the √L strategy: round(√L), at least 1."""
    return max(1, round(math.sqrt(n_layer)))


def every_k_layers(n_layer: int, k: int) -> list[int]:
    """Blocks recomputed by "every-k": 0, k, 2k, ... (k=1 is every block)."""
    positive("k", k)
    return list(range(0, n_layer, k))


def passthrough(x: torch.Tensor) -> torch.Tensor:
    """The forward of blocks 1.. under "sqrt-L": block 0 has already run them all."""
    return x


def run_in_segments(blocks, segments: int, x: torch.Tensor) -> torch.Tensor:
    """All blocks, through checkpoint_sequential; the class forward bypasses the passthrough overrides."""
    fns = [partial(Block.forward, b) for b in blocks]
    if not torch.is_grad_enabled():
        for fn in fns:
            x = fn(x)
        return x
    return checkpoint_sequential(fns, segments, x, use_reentrant=False)


def checkpointed_attention(fn, q, k, v, is_causal):
    """The attention kernel `fn` under a checkpoint ("selective-attention"): q, k, v (B, H, T, d_head) are
    kept as its inputs; the (B, H, T, T) scores and probabilities it computes are freed and rebuilt in backward."""
    if not torch.is_grad_enabled():  # no backward will come (evaluation): nothing to keep or rebuild
        return fn(q, k, v, is_causal)
    # read: q, k, v, which autograd keeps as the checkpoint's inputs; written: only the output (B, H, T, d_head)
    return checkpoint(fn, q, k, v, is_causal, use_reentrant=False)


def _gelu_down(mlp, h: torch.Tensor) -> torch.Tensor:
    return mlp.down(F.gelu(h, approximate="tanh"))


def mlp_recompute_activation(mlp, x: torch.Tensor) -> torch.Tensor:
    """The course MLP, x: (B, T, d_model) -> (B, T, d_model), with GELU and the down projection
    under a checkpoint: the up projection's output (B, T, d_ff) is kept, GELU's output is rebuilt
    in backward (the "selective-mlp" strategy's forward)."""
    h = mlp.up(x)  # (B, T, d_ff), kept: it is the checkpoint's input
    if torch.is_grad_enabled():
        y = checkpoint(_gelu_down, mlp, h, use_reentrant=False)  # GELU(h) is rebuilt in backward
    else:
        y = _gelu_down(mlp, h)
    return mlp.drop(y)  # (B, T, d_model)


def remove_strategy(model: GPT) -> None:
    """Undo any strategy: no block checkpointed, no overridden forward or attention kernel."""
    model.set_checkpointing(False)
    for block in model.blocks:
        block.__dict__.pop("forward", None)
        block.mlp.__dict__.pop("forward", None)
        original = block.attn.__dict__.pop("_attn_fn_before_checkpoint", None)
        if original is not None:
            block.attn.attn_fn = original
    model.__dict__.pop("_checkpoint_strategy", None)


def apply_strategy(model: GPT, strategy: str, k: int = 2) -> str:
    """Set `strategy` (one of STRATEGIES) on `model`, replacing any earlier one; returns a description."""
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy={strategy!r} is unknown; choose one of {', '.join(map(repr, STRATEGIES))}")
    remove_strategy(model)  # start from a model that keeps everything
    L = len(model.blocks)
    if strategy == "none":  # every block keeps all its activations for backward
        text = "no recomputation"
    elif strategy == "every":  # each block keeps only its input (B, T, d_model) and reruns its forward in backward
        model.set_checkpointing(True)
        text = f"all {L} blocks recomputed"
    elif strategy == "every-k":  # blocks 0, k, 2k, ... keep only their input; the others keep everything
        layers = every_k_layers(L, k)
        model.set_checkpointing(layers)
        text = f"blocks {layers} recomputed (every {k})"
    elif strategy == "sqrt-L":  # only each segment's input is kept; a segment reruns all its blocks in backward
        segments = sqrt_segments(L)
        model.blocks[0].forward = partial(run_in_segments, list(model.blocks), segments)
        for block in model.blocks[1:]:
            block.forward = passthrough  # block 0 already ran them all
        units = checkpointed_units(L, strategy)
        text = (f"checkpoint_sequential, {segments} segments: blocks {[list(range(a, b + 1)) for a, b in units]} "
                f"recomputed, the last segment kept whole")
    elif strategy == "selective-attention":  # the block keeps q, k, v; the T×T scores are rebuilt in backward
        for block in model.blocks:
            block.attn._attn_fn_before_checkpoint = block.attn.attn_fn  # remove_strategy puts it back
            block.attn.attn_fn = partial(checkpointed_attention, block.attn.attn_fn)
        text = "attention kernels recomputed in every block"
    else:  # "selective-mlp": the block keeps the up projection's output; GELU's (B, T, d_ff) output is rebuilt
        for block in model.blocks:
            block.mlp.forward = partial(mlp_recompute_activation, block.mlp)
        text = "GELU (and the down projection's input) recomputed in every block"
    model._checkpoint_strategy = (strategy, k)  # a note of the strategy set (remove_strategy deletes it)
    return text


# ---------------------------------------------------------------- what a strategy keeps and recomputes

def checkpointed_units(n_layer: int, strategy: str, k: int = 2) -> list[tuple[int, int]]:
    """(first, last) block of each unit a whole-block strategy recomputes; [] for none and selective ones.

    checkpoint_sequential cuts L blocks into segments of L // segments blocks and checkpoints all but
    the last segment, which also takes the remainder.
    """
    if strategy in ("every", "every-k"):
        return [(i, i) for i in every_k_layers(n_layer, 1 if strategy == "every" else k)]
    if strategy == "sqrt-L":
        segments = sqrt_segments(n_layer)
        size = n_layer // segments
        return [(start, start + size - 1) for start in range(0, size * (segments - 1), size)]
    return []


def recomputed_blocks(n_layer: int, strategy: str, k: int = 2) -> int:
    """How many whole blocks a strategy recomputes (selective ones recompute parts of blocks: 0 here)."""
    return sum(last - first + 1 for first, last in checkpointed_units(n_layer, strategy, k))


def activation_model(n_layer: int, strategy: str, k: int = 2, *, block_bytes: int, input_bytes: int,
                     head_bytes: int, selective_block_bytes: int | None = None) -> dict[str, int]:
    """Bytes kept after forward, and the activation peak in backward, from per-block measurements.

    A plain block keeps `block_bytes` (its input included); a checkpointed unit keeps only its input
    (`input_bytes`); `head_bytes` is everything outside the blocks. Backward runs from the last block
    to the first and frees as it goes, so while unit u is rebuilt the memory holds what the blocks
    before u keep plus u's full activations. Selective strategies keep `selective_block_bytes` per
    block and rebuild one block's difference at a time. Gradient buffers are not modelled.
    """
    if strategy in ("selective-attention", "selective-mlp"):
        if selective_block_bytes is None:
            raise ValueError(f"strategy={strategy!r} needs selective_block_bytes")
        kept = n_layer * selective_block_bytes + head_bytes
        return {"kept": kept, "peak": max(kept, (n_layer - 1) * selective_block_bytes + block_bytes)}
    per_block = [block_bytes] * n_layer
    units = checkpointed_units(n_layer, strategy, k) if strategy != "none" else []
    for first, last in units:
        per_block[first:last + 1] = [input_bytes] + [0] * (last - first)
    kept = sum(per_block) + head_bytes
    rebuilds = [sum(per_block[:first]) + (last - first + 1) * block_bytes for first, last in units]
    return {"kept": kept, "peak": max([kept] + rebuilds)}


def max_batch(budget_bytes: float, static_bytes: float, per_sample_bytes: float) -> int:
    """The largest batch with static + batch × per_sample <= budget (0 when even one sample does not fit)."""
    positive("per_sample_bytes", float(per_sample_bytes), float)
    return max(0, math.floor((budget_bytes - static_bytes) / per_sample_bytes))


# ---------------------------------------------------------------- activation bytes

def korthikanti_bytes(s: int, b: int, h: int, a: int) -> int:
    """Activation bytes of one layer, 16-bit, no recompute: s·b·h·(34 + 5·a·s/h) (Korthikanti et al., 2022)."""
    return 34 * s * b * h + 5 * a * s * s * b


def activation_crossover(h: int, a: int, layer_param_bytes: int, b: int = 1) -> float:
    """The sequence length s at which one layer's activations (`korthikanti_bytes`, 16-bit) equal
    `layer_param_bytes`, the bytes of that layer's weights: the positive root of
    5·a·b·s² + 34·b·h·s - layer_param_bytes = 0. Below it the weights are the larger, above it the activations,
    and the s² term makes the gap grow fast. A larger micro-batch b moves the crossover down. Raises ValueError
    for a non-positive size."""
    for name, v in (("h", h), ("a", a), ("layer_param_bytes", layer_param_bytes), ("b", b)):
        positive(name, v)
    qa, qb = 5 * a * b, 34 * b * h
    return (-qb + math.sqrt(qb * qb + 4 * qa * layer_param_bytes)) / (2 * qa)

def course_block_terms(cfg: GPTConfig, b: int, s: int, *, attn: str, autocast: bool,
                       device: str = "cpu") -> dict[str, int]:
    """The bytes one course-GPT block keeps for backward, term by term (dropout 0, as the course trains).

    `autocast=False` is fp32 everywhere; `autocast=True` is 16-bit autocast (fp16 or bf16), where the
    residual stream and LayerNorm stay fp32 and each linear casts its own input to 16-bit. `attn` is
    "naive" (scores materialised) or "sdpa" (PyTorch's CPU flash kernel layout). `device` matters
    for naive attention under autocast: CUDA's autocast runs softmax in fp32, so the block keeps the
    fp32 probabilities (softmax's backward) and their 16-bit copy (the P·V matmul's input); CPU
    autocast leaves softmax in 16-bit, one tensor serving both.
    """
    if attn not in ("naive", "sdpa"):
        raise ValueError(f"attn={attn!r} must be 'naive' or 'sdpa'")
    p = 2 if autocast else 4  # bytes per element of the matmul inputs
    sbh, a = s * b * cfg.d_model, cfg.n_head
    terms = {
        "ln_1 input (fp32 residual)": 4 * sbh,
        "ln_1, ln_2 mean and rstd (fp32)": 2 * 2 * 4 * s * b,
        "ln_1 output as q_proj/kv_proj input": p * sbh * (2 if autocast else 1),  # autocast casts it twice
    }
    if attn == "naive":
        terms |= {"q and kᵀ (contiguous copies for bmm)": 2 * p * sbh, "v": p * sbh}
        if autocast and device.startswith("cuda"):
            terms |= {"softmax probabilities (B, H, T, T), fp32 on CUDA": 4 * a * s * s * b,
                      "their 16-bit copy (P·V input)": p * a * s * s * b}
        else:
            terms |= {"softmax probabilities (B, H, T, T)": p * a * s * s * b}
        terms |= {"causal mask (T, T) bool": s * s, "attention output (out_proj input)": p * sbh}
    else:
        terms |= {"q": p * sbh, "k and v": 2 * p * sbh, "log-sum-exp (B, H, T) fp32": 4 * a * s * b,
                  "attention output (= out_proj input)": p * sbh}
    terms |= {
        "ln_2 input (fp32 residual)": 4 * sbh,
        "ln_2 output as up input": p * sbh,
        "GELU input (B, T, d_ff)": p * s * b * cfg.d_ff,
        "GELU output = down input": p * s * b * cfg.d_ff,
    }
    return terms
