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

What notebook 08 calls:
- `calibration_tokens(n, seq_len, seed)`: calibration windows (token ids) from the training split;
- `quantize_model(model, method, bits, group_size, calib)`: a quantised copy of the GPT for a
  perplexity row ("rtn", "gptq" or "awq"; its `.quantization` attribute holds per-layer errors);
- `layer_error_rows(model, calib, bits=(4, 3), group_size)` and `layer_error_section(...)`: the
  output error ||WX − ŴX|| / ||WX|| of RTN, GPTQ and AWQ on every linear of the model, as rows and
  as a printed table with a sentence generated from the numbers;
- `layer_error_figure(rows)`: those errors, RTN on x against GPTQ and AWQ on y;
- `perplexity_section(model, calib, bits=(4, 3), group_size, val_tokens)`: held-out perplexity of
  RTN, GPTQ and AWQ at each bit width, printed and returned.

Smoke cost on the "tiny" preset (a 2-core CPU shared with other jobs, about 2-3× an idle one's), with
calib = calibration_tokens(4, 128): `layer_error_section(model, calib, test=...)` 3 s,
`perplexity_section(model, calib, bits=(4, 3), batches=2)` 7 s (six quantised copies).
On the tiny preset, 4- and 3-bit quantisation (groups of 64) moved held-out perplexity by under
0.3% in the runs made while writing this module, so there the layer errors are where the methods
separate; whether perplexity separates them on a larger preset is for the notebook's run to show.

Lower-level pieces: `rtn_quantize`, `gptq_quantize`, `awq_quantize`, `collect_inputs`, `hessian`,
`output_error`.
"""
from __future__ import annotations

import contextlib
import copy
import math

import torch
import torch.nn as nn

from helpers.gpt import data
from helpers.show import plots, tables

METHODS = ("rtn", "gptq", "awq")


# ---------------------------------------------------------------- validation

@contextlib.contextmanager
def cpu_threads(device, n: int = 1):
    """Run the block with `n` intra-op threads when `device` is a CPU (its many small matmuls and
    column updates run faster on one thread than on threads fighting other processes); else as is."""
    if torch.device(device).type != "cpu":
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _check_bits(bits) -> int:
    if isinstance(bits, bool) or not isinstance(bits, int) or not 2 <= bits <= 8:
        raise ValueError(f"bits={bits!r} must be an int from 2 to 8")
    return bits


def _check_group(group_size, in_features: int) -> int:
    """The group size to use (None: one group per row); raises ValueError if it does not divide the row."""
    if group_size is None:
        return in_features
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size <= 0:
        raise ValueError(f"group_size={group_size!r} must be a positive int or None (one group per row)")
    if in_features % group_size:
        raise ValueError(f"group_size={group_size} must divide the layer's {in_features} input features")
    return group_size


# ---------------------------------------------------------------- RTN

def _scale_zero(w: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Asymmetric min-max grid of each row of w (rows, cols): scale and zero point, each (rows, 1).

    The range always contains 0 (as in GPTQ's reference quantiser), so an all-zero row is exact."""
    qmax = 2 ** bits - 1
    lo = w.amin(dim=1, keepdim=True).clamp(max=0)
    hi = w.amax(dim=1, keepdim=True).clamp(min=0)
    scale = (hi - lo) / qmax
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    zero = torch.round(-lo / scale)
    return scale, zero


def _fake_quant(w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, bits: int) -> torch.Tensor:
    """Round w to the grid scale·(q − zero), q ∈ {0 … 2^bits − 1}, and return the dequantised values."""
    q = torch.clamp(torch.round(w / scale) + zero, 0, 2 ** bits - 1)
    return scale * (q - zero)


def rtn_quantize(W: torch.Tensor, bits: int, group_size: int | None = None) -> torch.Tensor:
    """Round-to-nearest: W (out, in) fake-quantised to `bits` with a min-max scale and zero point per
    output row and group of `group_size` consecutive input columns (None: the whole row).

    Returns a float32 tensor of W's shape. Raises ValueError for bits outside 2..8 or a group size
    that does not divide `in`."""
    _check_bits(bits)
    out_f, in_f = W.shape
    g = _check_group(group_size, in_f)
    w = W.detach().float().reshape(out_f * (in_f // g), g)  # one row per (output row, group)
    scale, zero = _scale_zero(w, bits)
    return _fake_quant(w, scale, zero, bits).reshape(out_f, in_f)


# ---------------------------------------------------------------- calibration data and errors

def calibration_tokens(n: int = 8, seq_len: int = 128, seed: int = 0) -> torch.Tensor:
    """`n` random windows of `seq_len` token ids (n, seq_len), int64, from the corpus's training split."""
    if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
        raise ValueError(f"n={n!r} must be a positive int")
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len <= 0:
        raise ValueError(f"seq_len={seq_len!r} must be a positive int")
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

def gptq_quantize(W: torch.Tensor, H: torch.Tensor, bits: int, group_size: int | None = None, *,
                  act_order: bool = False, damp: float = 0.01, block_size: int = 128) -> torch.Tensor:
    """GPTQ: W (out, in) fake-quantised to `bits`, column by column with error feedback through H⁻¹.

    H (in, in) is `hessian(X)` of the layer's calibration inputs. Steps (Frantar et al., 2023, Alg. 1):
    columns whose input is always 0 (H_jj = 0) are zeroed; λ = damp · mean(diag H) is added to the
    diagonal; U = upper Cholesky factor of H⁻¹; then for each column j, q_j = RTN(w_j) and the error
    (w_j − q_j) / U_jj is subtracted from the later columns times U_j,j+1:. Updates to columns
    beyond the current lazy block of `block_size` columns are applied once per block (same result,
    fewer memory passes). Without groups each row's grid comes from the whole row before the first
    column; with `group_size`, a group's scale and zero point are fixed when its first column is
    reached, from the weights as updated so far. `act_order` processes columns in order of
    decreasing H_jj (the groups are then runs of columns in that order, as in the reference's
    act-order without static groups). Returns float32 (out, in). Raises ValueError for bad options or
    a Hessian whose shape does not match."""
    _check_bits(bits)
    out_f, in_f = W.shape
    g = _check_group(group_size, in_f)
    if H.shape != (in_f, in_f):
        raise ValueError(f"H has shape {tuple(H.shape)}; the layer needs ({in_f}, {in_f})")
    if not (isinstance(damp, (int, float)) and 0 < damp < 1):
        raise ValueError(f"damp={damp!r} must be in (0, 1)")
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
        raise ValueError(f"block_size={block_size!r} must be a positive int")
    W = W.detach().float().clone()
    H = H.detach().float().clone()
    dead = torch.diag(H) == 0
    H[dead, dead] = 1.0
    W[:, dead] = 0.0
    perm = torch.argsort(torch.diag(H), descending=True) if act_order else None
    if perm is not None:
        W, H = W[:, perm], H[perm][:, perm]
    H += damp * torch.mean(torch.diag(H)) * torch.eye(in_f, device=H.device)
    U = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True)
    if g < in_f:  # keep each group inside one lazy block, so its grid sees the updated weights
        block_size = g * max(1, block_size // g)
    Q = torch.zeros_like(W)
    scale, zero = _scale_zero(W, bits)  # one grid per row when there are no groups (as the reference does)
    for i1 in range(0, in_f, block_size):
        i2 = min(i1 + block_size, in_f)
        W1, U1 = W[:, i1:i2].clone(), U[i1:i2, i1:i2]
        Err1 = torch.zeros_like(W1)
        for i in range(i2 - i1):
            col = i1 + i
            if g < in_f and col % g == 0:
                scale, zero = _scale_zero(W1[:, i:i + g], bits)
            w = W1[:, i:i + 1]
            q = _fake_quant(w, scale, zero, bits)
            Q[:, col:col + 1] = q
            err = (w - q) / U1[i, i]
            W1[:, i:] -= err @ U1[i:i + 1, i:]
            Err1[:, i:i + 1] = err
        W[:, i2:] -= Err1 @ U[i1:i2, i2:]
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
    _check_bits(bits)
    if isinstance(grid, bool) or not isinstance(grid, int) or grid <= 0:
        raise ValueError(f"grid={grid!r} must be a positive int")
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
    _check_bits(bits)
    if method != "rtn" and calib is None:
        raise ValueError(f"method={method!r} needs calibration tokens (calib), got None")
    q = copy.deepcopy(model).eval()
    layers = block_linears(q)
    for lin in layers.values():
        _check_group(group_size, lin.in_features)
    info = {"method": method, "bits": bits, "group_size": group_size, "layers": {}}
    with cpu_threads(next(q.parameters()).device):
        for name, lin in layers.items():
            X = collect_inputs(q, calib, [name])[name] if calib is not None else None
            W = lin.weight.detach().float()
            W_hat, extra = _quantize_one(W, X, method, bits, group_size, act_order)
            err = output_error(W, W_hat, X) if X is not None else float("nan")
            lin.weight.copy_(W_hat.to(lin.weight.dtype))
            info["layers"][name] = {"error": err, **extra}
    q.quantization = info
    return q


# ---------------------------------------------------------------- notebook sections

@torch.no_grad()
def layer_error_rows(model: nn.Module, calib: torch.Tensor, bits=(4, 3), group_size: int | None = 64,
                     act_order: bool = False, test: torch.Tensor | None = None) -> list[dict]:
    """Per linear and bit width: the relative output error ||X(W − Ŵ)ᵀ|| / ||XWᵀ|| of RTN, GPTQ and AWQ,
    each layer quantised alone from the full-precision model's inputs on `calib` (B, T) token ids.

    The error is measured on the inputs of `test` token ids (windows the fit did not see) when given,
    else on the calibration inputs themselves. Returns [{"layer", "bits", "rtn", "gptq", "awq", "alpha"}]
    in execution order."""
    bits = [_check_bits(b) for b in bits]
    rows = []
    with cpu_threads(next(model.parameters()).device):
        inputs = collect_inputs(model, calib)
        held = inputs if test is None else collect_inputs(model, test)
        for name, lin in block_linears(model).items():
            W, X, Xt = lin.weight.detach().float(), inputs[name], held[name]
            H = hessian(X)
            for b in bits:
                awq, alpha = awq_quantize(W, X, b, group_size)
                rows.append({"layer": name, "bits": b,
                             "rtn": output_error(W, rtn_quantize(W, b, group_size), Xt),
                             "gptq": output_error(W, gptq_quantize(W, H, b, group_size, act_order=act_order), Xt),
                             "awq": output_error(W, awq, Xt), "alpha": alpha})
    return rows


def _geomean(values) -> float:
    values = list(values)
    return math.exp(sum(math.log(max(v, 1e-30)) for v in values) / len(values))


def layer_error_section(model: nn.Module, calib: torch.Tensor, bits=(4, 3), group_size: int | None = 64,
                        act_order: bool = False, test: torch.Tensor | None = None) -> list[dict]:
    """Print `layer_error_rows` as a table and, per bit width, one sentence from the numbers: in how many
    layers GPTQ and AWQ beat RTN and the geometric mean of their error ratios. Returns the rows."""
    rows = layer_error_rows(model, calib, bits, group_size, act_order, test)
    where = "the calibration windows themselves" if test is None else "windows the calibration did not see"
    print(f"Relative output error ||X(W − Ŵ)ᵀ|| / ||XWᵀ|| of each linear, measured on {where}:")
    print(tables.table(["layer", "bits", "RTN error", "GPTQ error", "AWQ error", "AWQ α"],
                       [[r["layer"], r["bits"], f"{r['rtn']:.4f}", f"{r['gptq']:.4f}", f"{r['awq']:.4f}",
                         f"{r['alpha']:.2f}"] for r in rows]))
    gs = "one group per row" if group_size is None else f"groups of {group_size}"
    for b in sorted({r["bits"] for r in rows}, reverse=True):
        sel = [r for r in rows if r["bits"] == b]
        n = len(sel)
        g_win = sum(r["gptq"] < r["rtn"] for r in sel)
        a_win = sum(r["awq"] < r["rtn"] for r in sel)
        g_ratio = _geomean(r["gptq"] / r["rtn"] for r in sel)
        a_ratio = _geomean(r["awq"] / r["rtn"] for r in sel)
        zero = sum(r["alpha"] == 0 for r in sel)
        print(f"{b}-bit, {gs}: GPTQ's output error is below RTN's in {g_win} of {n} layers "
              f"(geometric mean {g_ratio:.2f}× RTN's), AWQ's in {a_win} of {n} ({a_ratio:.2f}× RTN's)"
              + (f"; in {zero} layer{'s' if zero != 1 else ''} AWQ's search chose α = 0, which is RTN itself"
                 if zero else "") + ".")
    return rows


def layer_error_figure(rows: list[dict], ax=None):
    """Output error of every linear, RTN against GPTQ and AWQ, on log axes: one marker per layer and bit
    width (rows from `layer_error_rows`); points under the diagonal beat RTN."""
    fig, ax = plots.axes(ax, "layer output error: RTN (x) against GPTQ and AWQ (y)")
    markers = {b: m for b, m in zip(sorted({r["bits"] for r in rows}, reverse=True), "os^vD")}
    for i, method in enumerate(("gptq", "awq")):
        for b, mk in markers.items():
            sel = [r for r in rows if r["bits"] == b]
            ax.scatter([r["rtn"] for r in sel], [r[method] for r in sel], marker=mk, color=plots.COLORS[i],
                       label=f"{method.upper()} {b}-bit", alpha=0.8)
    lo = min(min(r["gptq"], r["awq"], r["rtn"]) for r in rows) * 0.8
    hi = max(r["rtn"] for r in rows) * 1.2
    ax.plot([lo, hi], [lo, hi], color="gray", ls="--", lw=1, label="equal to RTN")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("RTN relative output error")
    ax.set_ylabel("method's relative output error")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def perplexity_section(model: nn.Module, calib: torch.Tensor, bits=(4, 3), group_size: int | None = 64,
                       val_tokens: torch.Tensor | None = None, *, batches: int = 4) -> list[dict]:
    """Held-out validation loss and perplexity of the fp32 model and of RTN / GPTQ / AWQ copies at each
    bit width (`quantize_model`), on `batches` fixed windows of `val_tokens` (default: the held-out split).

    Prints a table and one sentence per bit width from the numbers. Returns
    [{"method", "bits", "val_loss", "perplexity"}], the fp32 row first (bits 32)."""
    from helpers.gpt.pretrained import validation_loss

    def row(method, b, m):
        loss = validation_loss(m, val_tokens, batches=batches)
        return {"method": method, "bits": b, "val_loss": loss, "perplexity": math.exp(loss)}

    with cpu_threads(next(model.parameters()).device):
        rows = [row("fp32", 32, model)]
        for b in bits:
            for method in METHODS:
                rows.append(row(method, b, quantize_model(model, method, b, group_size, calib)))
    print(tables.table(["method", "bits", "val loss (nats/byte)", "perplexity"],
                       [[r["method"], r["bits"], f"{r['val_loss']:.4f}", f"{r['perplexity']:.3f}"] for r in rows]))
    base = rows[0]["perplexity"]
    for b in bits:
        sel = {r["method"]: r["perplexity"] for r in rows if r["bits"] == b}
        best = min(sel, key=sel.get)
        parts = ", ".join(f"{m.upper()} {sel[m]:.3f} ({100 * (sel[m] / base - 1):+.2f}%)" for m in METHODS)
        below = [m.upper() for m in METHODS if sel[m] < base]
        tail = ""
        if below:
            drop = 100 * (1 - min(sel.values()) / base)
            tail = (f". {' and '.join(below)} came out below fp32 (by at most {drop:.2f}%): rounding noise moves "
                    f"the loss either way, and a drop{' this small' if drop < 1 else ''} on {batches} batches of "
                    f"windows is no evidence that quantising helps")
        print(f"{b}-bit: perplexity against fp32's {base:.3f}: {parts}; the lowest is {best.upper()}{tail}.")
    return rows
