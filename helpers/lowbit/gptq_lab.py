"""Notebook 08's GPTQ and AWQ measurements: each against round-to-nearest (RTN) layer by layer, in held-out
perplexity of the whole GPT, and AWQ's result read against the activations' outliers.

The quantisers are `helpers.lowbit.gptq`; every linear inside the blocks is quantised, the embeddings and the
output head stay in full precision.

- `layer_error_rows`: the output error ||WX − ŴX|| / ||WX|| of RTN, GPTQ and AWQ on every linear, as rows;
  `layer_error_sentences`: a sentence per bit width from them (the notebook prints both).
- `perplexity_rows` / `perplexity_sentences`: held-out perplexity of RTN, GPTQ and AWQ copies at each bit width.
- `awq_explanation`: AWQ's result read against the outlier table (`quant_lab.outlier_profile` rows).
"""
from __future__ import annotations

import math

import torch
from torch import nn

from helpers.gpt.pretrained import validation_loss
from helpers.lowbit.gptq import (METHODS, awq_quantize, block_linears, check_bits, collect_inputs, gptq_quantize,
                                 hessian, output_error, quantize_model, rtn_quantize)
from helpers.measure import bench


# ---------------------------------------------------------------- GPTQ and AWQ against RTN

@torch.no_grad()
def layer_error_rows(model: nn.Module, calib: torch.Tensor, bits=(4, 3), group_size: int | None = 64,
                     act_order: bool = False, test: torch.Tensor | None = None) -> list[dict]:
    """Per linear and bit width: the relative output error ||X(W − Ŵ)ᵀ|| / ||XWᵀ|| of RTN, GPTQ and AWQ,
    each layer quantised alone from the full-precision model's inputs on `calib` (B, T) token ids.

    The error is measured on the inputs of `test` token ids (windows the fit did not see) when given,
    else on the calibration inputs themselves. Returns [{"layer", "bits", "rtn", "gptq", "awq", "alpha"}]
    in execution order."""
    bits = [check_bits(b) for b in bits]
    rows = []
    with bench.cpu_threads(next(model.parameters()).device):
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


def layer_error_sentences(rows: list[dict], group_size: int | None = 64) -> list[str]:
    """One sentence per bit width of `layer_error_rows`' rows (widest first), from the numbers: in how many layers
    GPTQ and AWQ beat RTN, the geometric mean of their error ratios, and in how many AWQ chose α = 0."""
    gs = "one group per row" if group_size is None else f"groups of {group_size}"
    out = []
    for b in sorted({r["bits"] for r in rows}, reverse=True):
        sel = [r for r in rows if r["bits"] == b]
        n = len(sel)
        g_win = sum(r["gptq"] < r["rtn"] for r in sel)
        a_win = sum(r["awq"] < r["rtn"] for r in sel)
        g_ratio = _geomean(r["gptq"] / r["rtn"] for r in sel)
        a_ratio = _geomean(r["awq"] / r["rtn"] for r in sel)
        zero = sum(r["alpha"] == 0 for r in sel)
        out.append(f"{b}-bit, {gs}: GPTQ's output error is below RTN's in {g_win} of {n} layers "
                   f"(geometric mean {g_ratio:.2f}× RTN's), AWQ's in {a_win} of {n} ({a_ratio:.2f}× RTN's)"
                   + (f"; in {zero} layer{'s' if zero != 1 else ''} AWQ's search chose α = 0, which is RTN itself"
                      if zero else "") + ".")
    return out


def perplexity_rows(model: nn.Module, calib: torch.Tensor, bits=(4, 3), group_size: int | None = 64,
                    val_tokens: torch.Tensor | None = None, *, batches: int = 4) -> list[dict]:
    """Held-out validation loss and perplexity of the fp32 model and of RTN / GPTQ / AWQ copies at each
    bit width (`quantize_model`), on `batches` fixed windows of `val_tokens` (default: the held-out split).

    Returns [{"method", "bits", "val_loss", "perplexity"}], the fp32 row first (bits 32)."""
    def row(method, b, m):
        loss = validation_loss(m, val_tokens, batches=batches)
        return {"method": method, "bits": b, "val_loss": loss, "perplexity": math.exp(loss)}

    with bench.cpu_threads(next(model.parameters()).device):
        rows = [row("fp32", 32, model)]
        for b in bits:
            for method in METHODS:
                rows.append(row(method, b, quantize_model(model, method, b, group_size, calib)))
    return rows


def perplexity_sentences(rows: list[dict], batches: int) -> list[str]:
    """One sentence per bit width of `perplexity_rows`' rows: each method's perplexity against fp32's, the lowest,
    and, where a method came out below fp32, why that is no evidence that quantising helps."""
    base = rows[0]["perplexity"]
    out = []
    for b in dict.fromkeys(r["bits"] for r in rows[1:]):
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
        out.append(f"{b}-bit: perplexity against fp32's {base:.3f}: {parts}; the lowest is {best.upper()}{tail}.")
    return out


# ---------------------------------------------------------------- what the tables say

def awq_explanation(outliers: list[dict], layer_rows: list[dict], bits: int, threshold: float) -> str:
    """Why AWQ did or did not help, from the outlier table (`outlier_profile` rows) and AWQ's chosen α per layer
    (`layer_error_rows` rows): AWQ scales up the salient input channels, those with activations far above the
    rest; with no column at or above `threshold` in any layer there are none to protect."""
    top = max(outliers, key=lambda r: r["max_abs"])
    over = sum(r["cols_over"] > 0 for r in outliers)
    sel = [r for r in layer_rows if r["bits"] == bits]
    zero = sum(r["alpha"] == 0 for r in sel)
    alphas = f"; its search chose α = 0 (RTN itself) in {zero} of {len(sel)} layers" if sel else ""
    if over == 0:
        return (f"AWQ protects salient input channels, those whose activations are far larger than the rest; the "
                f"outlier table above has no column at or above {threshold:g} in any of its {len(outliers)} layer "
                f"inputs (the largest |x| is {top['max_abs']:.2f}, in {top['layer']}): this model has no salient "
                f"channels to protect, so AWQ has little to gain over RTN{alphas}.")
    return (f"AWQ protects salient input channels; the outlier table above has columns at or above {threshold:g} in "
            f"{over} of {len(outliers)} layer inputs (largest |x| {top['max_abs']:.2f}, in {top['layer']}), so there "
            f"were channels to protect{alphas}: a lower layer error on the calibration windows did not carry over to "
            "the held-out loss here.")
