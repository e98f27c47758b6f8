"""Exact FLOP accounting for the course GPT, and the back-of-envelope formulas built on it.

The convention is `torch.utils.flop_counter.FlopCounterMode`'s, so `transformer_flops` equals
what it counts, to the FLOP:

* a matmul (m, k) @ (k, n) costs 2*m*n*k (one multiply and one add per term);
* nothing else costs anything: bias adds, LayerNorm, GELU, softmax, the causal mask, residual
  adds, the loss, the embedding lookup (forward and backward) and the optimizer are all 0;
* attention scores are counted for the full T x T square even though a causal mask discards
  about half of them (`is_causal=True` halves them instead: the FlashAttention benchmark convention);
* backward of a matmul whose two operands both need a gradient is two matmuls of the same size,
  so backward = 2 x forward for every component, assuming every parameter trains. That includes the
  first block's projections (their input, LN(x), needs a gradient through LN's trainable weight even
  if the embeddings were frozen) and the LM head, tied or not (a tied matrix just receives two
  gradients that are added, which is free). Freezing changes this: a frozen (tied) token table drops
  the LM head's weight-gradient matmul, and freezing the embeddings and block 0's ln_1 as well drops
  block 0's q/kv input-gradient matmuls; the counter sees that, this formula does not.

Measuring with FlopCounterMode needs the "naive" attention path on a CPU: there
`scaled_dot_product_attention` runs `_scaled_dot_product_flash_attention_for_cpu`, which the
counter has no formula for, so its forward and backward count 0 FLOPs. On CUDA the flash and
memory-efficient kernels are counted, but their backward is charged 5 attention matmuls instead of
4 (the scores are recomputed; `sdpa_backward_flop_count` in torch/utils/flop_counter.py), so only
the naive path matches `transformer_flops` there too.
"""
from __future__ import annotations

import numbers
import warnings

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from helpers.gpt.model import GPT, GPTConfig
from helpers.measure.params import positive

COMPONENTS = ("embedding", "qkv", "attn_scores", "attn_values", "attn_out", "mlp_up", "mlp_down", "lm_head")
SECONDS_PER_DAY = 86_400


def per_layer_forward(cfg: GPTConfig, batch_size: int, seq_len: int, is_causal: bool) -> dict[str, int]:
    """Forward FLOPs of one block, per component, for batch_size sequences of seq_len tokens.

    Returns {"qkv", "attn_scores", "attn_values", "attn_out", "mlp_up", "mlp_down"}: with tokens = B·T,
    qkv 2·tokens·d·(H + 2·H_kv)·d_h, scores and values 2·B·H·T²·d_h each (halved when `is_causal`),
    attn_out 2·tokens·H·d_h·d, mlp_up and mlp_down 2·tokens·d·d_ff each.
    """
    tokens, d, hd = batch_size * seq_len, cfg.d_model, cfg.head_dim
    attn = 2 * batch_size * cfg.n_head * seq_len * seq_len * hd  # (T, hd) @ (hd, T) per head, and (T, T) @ (T, hd)
    if is_causal:
        attn //= 2  # exact: seq_len**2 * (2 * batch * heads * hd) / 2 is an integer
    return {
        "qkv": 2 * tokens * d * (cfg.n_head + 2 * cfg.n_kv_head) * hd,  # q_proj + kv_proj
        "attn_scores": attn,  # q kᵀ
        "attn_values": attn,  # softmax(.) v
        "attn_out": 2 * tokens * cfg.n_head * hd * d,
        "mlp_up": 2 * tokens * d * cfg.d_ff,
        "mlp_down": 2 * tokens * cfg.d_ff * d,
    }


def transformer_flops(config: GPTConfig, batch_size: int, seq_len: int, *, backward: bool = True,
                      is_causal: bool = False, recompute_layers: int = 0) -> dict[str, dict[str, int]]:
    """FLOPs of one training step (forward, backward) per component, in FlopCounterMode's convention.

    Returns {component: {"forward": int, "backward": int, "total": int}} for every name in
    COMPONENTS, plus "total" (the sum over components). With backward=False every "backward" is 0.
    `is_causal=True` halves attn_scores and attn_values (only the unmasked half is useful work).
    `recompute_layers` blocks under activation checkpointing run their forward again in backward,
    which adds one block's forward FLOPs each to "backward" (the LM head is never recomputed).
    PyTorch's non-reentrant checkpoint stops recomputing once every tensor backward needs is back
    ("early stop", on by default); with dropout 0 no backward needs the block's last matmul's output,
    so it measures one `mlp_down` per recomputed block less than this textbook count. Run inside
    `torch.utils.checkpoint.set_checkpoint_early_stop(False)` to recompute, and count, everything.
    """
    if not 0 <= recompute_layers <= config.n_layer:
        raise ValueError(f"recompute_layers={recompute_layers} must be in 0..n_layer={config.n_layer}")
    if seq_len > config.seq_len:
        raise ValueError(f"seq_len={seq_len} is longer than the model's seq_len={config.seq_len}")
    layer = per_layer_forward(config, batch_size, seq_len, is_causal)
    forward = {"embedding": 0, **{k: config.n_layer * v for k, v in layer.items()},
               "lm_head": 2 * batch_size * seq_len * config.d_model * config.vocab_size}
    out: dict[str, dict[str, int]] = {}
    for name in COMPONENTS:
        fwd = forward[name]
        bwd = (2 * fwd + recompute_layers * layer.get(name, 0)) if backward else 0
        out[name] = {"forward": fwd, "backward": bwd, "total": fwd + bwd}
    out["total"] = {key: sum(out[name][key] for name in COMPONENTS) for key in ("forward", "backward", "total")}
    return out


def flops_table(breakdown: dict[str, dict[str, int]]) -> str:
    """A fixed-width text table of `transformer_flops`' result, in GFLOPs, with each row's share."""
    grand = breakdown["total"]["total"] or 1
    lines = [f"{'component':<12}{'forward':>14}{'backward':>14}{'total':>14}{'share':>8}"]
    for name, row in breakdown.items():
        lines.append(f"{name:<12}" + "".join(f"{row[k] / 1e9:>14.3f}" for k in ("forward", "backward", "total"))
                     + f"{100 * row['total'] / grand:>7.1f}%")
    return "\n".join(lines) + "\n(GFLOPs)"


def matmul_params(config: GPTConfig) -> int:
    """Weights that each token multiplies once per forward: every block's linears and the LM head."""
    d, hd = config.d_model, config.head_dim
    per_block = d * (config.n_head + 2 * config.n_kv_head) * hd + config.n_head * hd * d + 2 * d * config.d_ff
    return config.n_layer * per_block + d * config.vocab_size


MATMUL_LIKE = ("mm", "mv", "dot", "matmul", "linear", "conv", "attention", "einsum")


class SeenOps(TorchDispatchMode):
    """A dispatch mode that records in `ops` every aten op run under it (the ops FlopCounterMode also sees)."""

    def __init__(self):
        super().__init__()
        self.ops = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.add(func._overloadpacket)
        return func(*args, **(kwargs or {}))


def uncounted_ops(seen, registry) -> list[str]:
    """Names of matmul-like ops in `seen` (names containing MATMUL_LIKE words) without a formula in `registry`."""
    return sorted(str(op) for op in seen if op not in registry
                  and any(word in str(op).rsplit(".", 1)[-1] for word in MATMUL_LIKE))


def measure_flops(model: GPT, idx: torch.Tensor, targets: torch.Tensor | None = None, *,
                  backward: bool = True) -> dict[str, int]:
    """What FlopCounterMode counts for model(idx, targets), and for its backward when asked.

    Returns {"forward", "backward", "total"} in FLOPs. Warns (UserWarning) when the model ran a
    matmul-like op the counter has no formula for, such as SDPA's CPU kernel
    `_scaled_dot_product_flash_attention_for_cpu`: those FLOPs are counted as 0, so the total is low.
    The blind spot is detected from the ops that actually ran, whatever the attention was called.
    """
    from torch.utils.flop_counter import FlopCounterMode  # heavy: it imports triton (see measure.triton_mode)
    seen = SeenOps()  # every aten op that runs, so that an op the counter cannot count is caught below
    with FlopCounterMode(display=False) as counter, seen:
        logits, loss = model(idx, targets)  # the forward: every matmul it dispatches, 2 FLOPs per multiply-add
    fwd, bwd = counter.get_total_flops(), 0
    if backward:
        scalar = loss if loss is not None else logits.float().sum()  # without targets, any scalar of the logits
        with FlopCounterMode(display=False) as counter, seen:  # a fresh counter: the backward's matmuls alone
            scalar.backward()
        bwd = counter.get_total_flops()
    # a matmul-like op the counter has no formula for ran but counted 0: say so rather than report a low total
    registry = getattr(counter, "flop_registry", None)  # absent in old torch: no check rather than false alarms
    blind = uncounted_ops(seen.ops, registry) if registry is not None else []
    if blind:
        warnings.warn(f"FlopCounterMode has no formula for {', '.join(blind)}, which this model ran, so it "
                      "counted 0 FLOPs for them and the total is too low; on a CPU use the 'naive' attention "
                      "(model.attn_impl = 'naive') to count attention", stacklevel=2)
    return {"forward": fwd, "backward": bwd, "total": fwd + bwd}


def six_nd(n_params: float, n_tokens: float) -> float:
    """Training FLOPs ≈ 6·N·D: 2 per parameter per token forward, 4 backward (Kaplan et al., 2020)."""
    # forward 2 (a multiply and an add per weight); backward 4 (the input's gradient and the weight's, 2 each)
    return 6 * n_params * n_tokens


def palm_flops_per_token(n_params: float, n_layer: int, n_head: int, head_dim: int, seq_len: int) -> float:
    """Training FLOPs per token with attention: 6N + 12·L·H·Q·T (Chowdhery et al., 2022, appendix B).

    Equals `transformer_flops(...)["total"]["total"] / tokens` exactly when N is `matmul_params`
    (the 12·L·H·Q·T term is the full, non-causal T x T scores and values, forward and backward).
    """
    # per layer and token, the scores q·k and the weighted values p·v are 2·H·Q·T FLOPs each forward (4·H·Q·T),
    # times 3 for forward + backward: 12·H·Q·T. No weight is involved, so 6N leaves them out.
    return 6 * n_params + 12 * n_layer * n_head * head_dim * seq_len


def mfu(achieved_flops_per_s: float, peak_flops_per_s: float | None) -> float | None:
    """Model FLOPs utilisation, achieved / peak (both in FLOP/s); None (with a warning) when the peak is unknown.

    Raises ValueError when the peak is not a positive number.
    """
    if peak_flops_per_s is None:
        warnings.warn("no peak FLOP/s known for this device, so MFU is None (no default peak is assumed)",
                      stacklevel=2)
        return None
    positive("peak_flops_per_s", peak_flops_per_s, numbers.Real)
    return achieved_flops_per_s / peak_flops_per_s


def training_days(n_params: float, n_tokens: float, peak_flops_per_s: float, n_gpus: int,
                  mfu: float) -> float:
    """Days to train on n_gpus at the given MFU: 6·N·D / (peak · n_gpus · MFU) / 86 400 s.

    `peak_flops_per_s` in FLOP/s per GPU. Raises ValueError unless the peak and `n_gpus` (an int) are
    positive and `mfu` is in (0, 1].
    """
    positive("peak_flops_per_s", peak_flops_per_s, numbers.Real)
    positive("n_gpus", n_gpus)
    if positive("mfu", mfu, numbers.Real) > 1:
        raise ValueError(f"mfu={mfu!r} must be in (0, 1]")
    return six_nd(n_params, n_tokens) / (peak_flops_per_s * n_gpus * mfu) / SECONDS_PER_DAY
