"""GPTQ and AWQ from scratch on the course GPT's linears, against round-to-nearest (RTN).

Both methods keep the weight format of RTN (b-bit integers with a scale and zero point per output
row and group of `group_size` input columns) and change only *which* integers are stored:

- GPTQ (Frantar et al., 2023, "GPTQ: Accurate Post-Training Quantization for Generative Pre-trained
  Transformers") quantises the columns of W one at a time and spreads each column's rounding error
  over the columns not yet quantised, weighted by the inverse Hessian of the layer's squared output
  error, H = 2 X Xᵀ / n (X: the layer's calibration inputs). With dampening (λ = damp · mean diag H),
  the upper Cholesky factor of H⁻¹, lazy blocks of columns, group size and act-order as options.
- AWQ (Lin et al., 2024, "AWQ: Activation-aware Weight Quantization for LLM Compression and
  Acceleration") scales input channel j of W by s_j = mean|x_j|^α before RTN and divides the
  quantised weight by s_j again (in a deployed model 1/s is folded into the previous operation),
  with α chosen on a grid over [0, 1] to minimise the layer's output error on calibration data.
  α = 0 is RTN itself, so on the calibration data AWQ's error is never above RTN's.

Quantised weights here are *fake-quantised*: stored back in fp32 after rounding, which gives the
same outputs as a packed kernel that dequantises exactly (no speed or memory is measured here).

What it holds: `rtn_quantize`, `gptq_quantize`, `awq_quantize` (one layer's weight), with GPTQ's pieces
`inverse_hessian_factor` and `gptq_columns` (the column loop notebook 08 shows) and the grid of RTN and GPTQ,
`minmax_grid` / `round_to_grid`; `calibration_tokens`
(calibration windows of token ids from the training split), `block_linears` and `collect_inputs` (the
GPT's block linears and their inputs), `hessian`, `output_error`; `quantize_model` (a quantised copy of
the whole GPT with "rtn", "gptq" or "awq", on one CPU thread: `helpers.measure.bench.cpu_threads`).
Notebook 08's layer errors and perplexities with these pieces are measured by `helpers.lowbit.gptq_lab`.
"""
from __future__ import annotations

import copy
import math

import torch
import torch.nn as nn

from helpers.gpt import data
from helpers.measure import bench
from helpers.measure.params import positive

METHODS = ("rtn", "gptq", "awq")


# ---------------------------------------------------------------- threads and validation

def check_bits(bits) -> int:
    """`bits` if it is an int from 2 to 8 (the widths RTN, GPTQ and AWQ accept here), else ValueError."""
    if isinstance(bits, bool) or not isinstance(bits, int) or not 2 <= bits <= 8:
        raise ValueError(f"bits={bits!r} must be an int from 2 to 8")
    return bits


def _check_group(group_size, in_features: int) -> int:
    """The group size to use (None: one group per row); raises ValueError if it does not divide the row."""
    if group_size is None:
        return in_features
    positive("group_size", group_size)
    if in_features % group_size:
        raise ValueError(f"group_size={group_size} must divide the layer's {in_features} input features")
    return group_size


# ---------------------------------------------------------------- RTN

def minmax_grid(w: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Asymmetric min-max grid of each row of w (rows, cols): scale and zero point, each (rows, 1).

    The range always contains 0 (as in GPTQ's reference quantiser), so an all-zero row is exact."""
    qmax = 2 ** bits - 1
    lo = w.amin(dim=1, keepdim=True).clamp(max=0)
    hi = w.amax(dim=1, keepdim=True).clamp(min=0)
    scale = (hi - lo) / qmax
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    zero = torch.round(-lo / scale)
    return scale, zero


def round_to_grid(w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, bits: int) -> torch.Tensor:
    """Round w to the grid scale·(q − zero), q ∈ {0 … 2^bits − 1}, and return the dequantised values."""
    q = torch.clamp(torch.round(w / scale) + zero, 0, 2 ** bits - 1)
    return scale * (q - zero)


def rtn_quantize(W: torch.Tensor, bits: int, group_size: int | None = None) -> torch.Tensor:
    """Round-to-nearest: W (out, in) fake-quantised to `bits` with a min-max scale and zero point per
    output row and group of `group_size` consecutive input columns (None: the whole row).

    Returns a float32 tensor of W's shape. Raises ValueError for bits outside 2..8 or a group size
    that does not divide `in`."""
    check_bits(bits)
    out_f, in_f = W.shape
    g = _check_group(group_size, in_f)
    w = W.detach().float().reshape(out_f * (in_f // g), g)  # one row per (output row, group)
    scale, zero = minmax_grid(w, bits)
    return round_to_grid(w, scale, zero, bits).reshape(out_f, in_f)


# ---------------------------------------------------------------- calibration data and errors

def calibration_tokens(n: int = 8, seq_len: int = 128, seed: int = 0) -> torch.Tensor:
    """`n` random windows of `seq_len` token ids (n, seq_len), int64, from the corpus's training split."""
    positive("n", n)
    positive("seq_len", seq_len)
    g = torch.Generator().manual_seed(seed)
    x, _ = data.get_batch(data.load_corpus("train"), n, seq_len, "cpu", generator=g)
    return x


def block_linears(model: nn.Module) -> dict[str, nn.Linear]:
    """The nn.Linear layers inside the GPT's blocks, in execution order, by qualified name.

    The embeddings, LayerNorms and the LM head (tied to the token embedding) are left out: they stay
    in full precision in every quantised model here."""
    return {name: m for name, m in model.named_modules()
            if isinstance(m, nn.Linear) and name.startswith("blocks.")}


@torch.no_grad()
def collect_inputs(model: nn.Module, calib: torch.Tensor, names=None) -> dict[str, torch.Tensor]:
    """Inputs of each named linear (default: `block_linears`) when `model` runs on `calib` (B, T):
    {name: X (B·T, in_features) float32}, captured with forward hooks in one forward pass."""
    layers = block_linears(model)
    names = list(layers) if names is None else list(names)
    got: dict[str, torch.Tensor] = {}
    hooks = [layers[n].register_forward_hook(
        lambda mod, inp, out, n=n: got.__setitem__(n, inp[0].detach().reshape(-1, inp[0].shape[-1]).float()))
        for n in names]
    try:
        was = model.training
        model.eval()
        model(calib.to(next(model.parameters()).device))
        model.train(was)
    finally:
        for h in hooks:
            h.remove()
    return got


def hessian(X: torch.Tensor) -> torch.Tensor:
    """H = 2 XᵀX / n for inputs X (n, in): the Hessian of the mean squared output error ||WX − ŴX||²
    with respect to each row of Ŵ, (in, in) float32."""
    X = X.float()
    return 2.0 * X.T @ X / X.shape[0]


def output_error(W: torch.Tensor, W_hat: torch.Tensor, X: torch.Tensor) -> float:
    """Relative output error ||X (W − Ŵ)ᵀ||_F / ||X Wᵀ||_F on inputs X (n, in); W, Ŵ (out, in)."""
    W = W.detach().float()
    ref = X @ W.T
    return float(torch.linalg.norm(X @ (W - W_hat.float()).T) / torch.linalg.norm(ref).clamp_min(1e-30))


# ---------------------------------------------------------------- GPTQ

def inverse_hessian_factor(H: torch.Tensor, damp: float = 0.01) -> torch.Tensor:
    """U, the upper Cholesky factor of (H + λI)⁻¹ with λ = damp · mean(diag H): (in, in) float32, the only form of
    the inverse Hessian GPTQ's column loop reads (row j of U from the diagonal on holds what quantising column j
    does to the columns after it, once the columns before it are fixed)."""
    H = H + damp * torch.mean(torch.diag(H)) * torch.eye(H.shape[0], device=H.device)
    return torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True)


def gptq_columns(W: torch.Tensor, U: torch.Tensor, bits: int, group_size: int, block_size: int) -> torch.Tensor:
    """GPTQ's column loop (Frantar et al., 2023, Alg. 1): the fake-quantised weight Q (out, in) float32.

    W (out, in) float32 is updated in place (pass a copy); U is `inverse_hessian_factor(H)`; `group_size` input
    columns share a grid (in: one grid per row, from the whole row); `block_size` columns form a lazy block (a
    multiple of group_size), whose error reaches the later columns in one matmul."""
    in_f = W.shape[1]
    Q = torch.zeros_like(W)
    scale, zero = minmax_grid(W, bits)  # one grid per row when there are no groups (as the reference does)
    for i1 in range(0, in_f, block_size):
        i2 = min(i1 + block_size, in_f)
        W1, U1 = W[:, i1:i2].clone(), U[i1:i2, i1:i2]  # read: this block's columns and its corner of U
        Err1 = torch.zeros_like(W1)  # the scaled error of each column of the block, for the update after it
        for i in range(i2 - i1):
            col = i1 + i
            if group_size < in_f and col % group_size == 0:  # a group starts: its grid from the weights as updated
                scale, zero = minmax_grid(W1[:, i:i + group_size], bits)
            w = W1[:, i:i + 1]  # (out, 1): column col, carrying the error fed back from the columns before it
            q = round_to_grid(w, scale, zero, bits)
            Q[:, col:col + 1] = q  # write: the quantised column, final
            err = (w - q) / U1[i, i]  # its rounding error over U's diagonal
            W1[:, i:] -= err @ U1[i:i + 1, i:]  # feed it back into the block's columns not yet quantised
            Err1[:, i:i + 1] = err
        W[:, i2:] -= Err1 @ U[i1:i2, i2:]  # the whole block's errors into every later column, in one matmul
    return Q


def gptq_quantize(W: torch.Tensor, H: torch.Tensor, bits: int, group_size: int | None = None, *,
                  act_order: bool = False, damp: float = 0.01, block_size: int = 128) -> torch.Tensor:
    """GPTQ: W (out, in) fake-quantised to `bits`, column by column with error feedback through H⁻¹.

    H (in, in) is `hessian(X)` of the layer's calibration inputs. Steps (Frantar et al., 2023, Alg. 1):
    columns whose input is always 0 (H_jj = 0) are zeroed; λ = damp · mean(diag H) is added to the
    diagonal; U = upper Cholesky factor of H⁻¹ (`inverse_hessian_factor`); then `gptq_columns`: for each
    column j, q_j = RTN(w_j) and the error (w_j − q_j) / U_jj is subtracted from the later columns times
    U_j,j+1:. Updates to columns
    beyond the current lazy block of `block_size` columns are applied once per block (same result,
    fewer memory passes). Without groups each row's grid comes from the whole row before the first
    column; with `group_size`, a group's scale and zero point are fixed when its first column is
    reached, from the weights as updated so far. `act_order` processes columns in order of
    decreasing H_jj (the groups are then runs of columns in that order, as in the reference's
    act-order without static groups). Returns float32 (out, in). Raises ValueError for bad options or
    a Hessian whose shape does not match."""
    check_bits(bits)
    out_f, in_f = W.shape
    g = _check_group(group_size, in_f)
    if H.shape != (in_f, in_f):
        raise ValueError(f"H has shape {tuple(H.shape)}; the layer needs ({in_f}, {in_f})")
    if not (isinstance(damp, (int, float)) and 0 < damp < 1):
        raise ValueError(f"damp={damp!r} must be in (0, 1)")
    positive("block_size", block_size)
    W = W.detach().float().clone()
    H = H.detach().float().clone()
    dead = torch.diag(H) == 0
    H[dead, dead] = 1.0
    W[:, dead] = 0.0
    perm = torch.argsort(torch.diag(H), descending=True) if act_order else None
    if perm is not None:
        W, H = W[:, perm], H[perm][:, perm]
    U = inverse_hessian_factor(H, damp)
    if g < in_f:  # keep each group inside one lazy block, so its grid sees the updated weights
        block_size = g * max(1, block_size // g)
    Q = gptq_columns(W, U, bits, g, block_size)
    if perm is not None:
        Q = Q[:, torch.argsort(perm)]
    return Q


# ---------------------------------------------------------------- AWQ

def awq_quantize(W: torch.Tensor, X: torch.Tensor, bits: int, group_size: int | None = None, *,
                 grid: int = 20) -> tuple[torch.Tensor, float]:
    """AWQ's activation-aware scaling: (Ŵ, α) with Ŵ = RTN(W · s) / s per input channel.

    s = mean|x|^α over the calibration inputs X (n, in) (clamped at 1e-4), normalised by
    sqrt(max s · min s) as in the authors' code; α runs over `grid` + 1 points of [0, 1] and the α with
    the smallest `output_error` on X wins (ties: the smaller α). α = 0 is plain RTN. W (out, in) -> Ŵ
    float32. Raises ValueError for bad bits, group size or grid.

    Simplifications against the authors' code (llm-awq): the error is this linear's output, not the
    output of the block around it, each linear gets its own s (a deployed model folds 1/s into the
    previous operation, so q_proj and kv_proj, which share a LayerNorm, would share one s; before
    mlp.down the GELU is in the way and 1/s would scale the activations at run time), and there is no
    search for clipped ranges."""
    check_bits(bits)
    positive("grid", grid)
    W = W.detach().float()
    _check_group(group_size, W.shape[1])
    X = X.float()
    x_mean = X.abs().mean(dim=0)  # (in,)
    G = X.T @ X  # (in, in): ||X Δᵀ||² = Σ (Δ G) ∘ Δ, cheaper than X Δᵀ when there are more rows than columns
    best = (math.inf, 0.0, None)
    for k in range(grid + 1):
        alpha = k / grid
        s = (x_mean ** alpha).clamp_min(1e-4)
        s = s / torch.sqrt(s.max() * s.min())
        W_hat = rtn_quantize(W * s, bits, group_size) / s
        D = W - W_hat
        err = float(((D @ G) * D).sum())
        if err < best[0]:
            best = (err, alpha, W_hat)
    return best[2], best[1]


# ---------------------------------------------------------------- a whole model

def _quantize_one(W, X, method, bits, group_size, act_order):
    if method == "rtn":
        return rtn_quantize(W, bits, group_size), {}
    if method == "gptq":
        return gptq_quantize(W, hessian(X), bits, group_size, act_order=act_order), {}
    W_hat, alpha = awq_quantize(W, X, bits, group_size)
    return W_hat, {"alpha": alpha}


@torch.no_grad()
def quantize_model(model: nn.Module, method: str, bits: int, group_size: int | None, calib: torch.Tensor | None,
                   *, act_order: bool = False) -> nn.Module:
    """A copy of the course GPT whose block linears are fake-quantised with `method` ("rtn", "gptq" or
    "awq") to `bits` with `group_size` (None: one group per row). `model` is not changed.

    calib: calibration token ids (B, T) (see `calibration_tokens`); GPTQ and AWQ need it, RTN ignores
    it (None allowed). The layers are done in execution order and each one's inputs are taken from
    the copy with the earlier layers already quantised (sequential, as GPTQ's reference does).
    Embeddings, LayerNorms and the tied LM head stay fp32. The copy carries `.quantization`: a dict of
    method, bits, group_size and per-layer {"error": relative output error on calib, "alpha": AWQ's α}.
    Raises ValueError for an unknown method, bad bits/group size, or a missing calib."""
    if method not in METHODS:
        raise ValueError(f"method={method!r}; choose one of {', '.join(map(repr, METHODS))}")
    check_bits(bits)
    if method != "rtn" and calib is None:
        raise ValueError(f"method={method!r} needs calibration tokens (calib), got None")
    q = copy.deepcopy(model).eval()
    layers = block_linears(q)
    for lin in layers.values():
        _check_group(group_size, lin.in_features)
    info = {"method": method, "bits": bits, "group_size": group_size, "layers": {}}
    with bench.cpu_threads(next(q.parameters()).device):
        for name, lin in layers.items():
            X = collect_inputs(q, calib, [name])[name] if calib is not None else None
            W = lin.weight.detach().float()
            W_hat, extra = _quantize_one(W, X, method, bits, group_size, act_order)
            err = output_error(W, W_hat, X) if X is not None else float("nan")
            lin.weight.copy_(W_hat.to(lin.weight.dtype))
            info["layers"][name] = {"error": err, **extra}
    q.quantization = info
    return q
