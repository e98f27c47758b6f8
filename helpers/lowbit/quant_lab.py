"""Notebook 08's parameters and quantisation measurements: error on a trained GPT's real weights and activations,
and a sweep of RTN / NF4 formats on the whole model.

The quantisers are `helpers.lowbit.quant` and `helpers.lowbit.quant_linear`; this module applies them to the
course GPT. Every linear inside the blocks (attention q/kv/out, MLP up/down) is quantised; the embeddings and
the output head stay in full precision (bitsandbytes' and torchao's defaults skip lm_head too). GPTQ and AWQ
are measured by `helpers.lowbit.gptq_lab`, decode speed by `helpers.lowbit.quant_decode_lab`, 8-bit optimizer
state by `helpers.lowbit.optim8bit_lab`.

- `resolve_parameters`: the notebook's parameters validated at once (the group and block sizes against
  the GPT's layer widths, the LLM.int8 threshold against the planted test input).
- Weights and activations: `weight_error_rows` (each scheme, width and granularity on every block
  weight), `block_inputs`, `outlier_profile` and `activation_error_rows` (LLM.int8 on the real inputs).
- `spec_sweep(model, specs, evaluate)`: every (method, bits, group) quantised in place, evaluated, restored;
  `weight_bits`, the storage bits per parameter of a format.
- `highest_loss`: which of several models' held-out losses is highest, named only when its gap to the
  runner-up exceeds `heldout.NOISE_K` standard errors of the paired per-window difference (`helpers.gpt.heldout`).
- `zero_point_bits_note`: what the fp32 zero of a zero-point format costs, and the alternatives.
- `takeaways`: the notebook's takeaway bullets on quality, generated from the run's numbers.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from helpers.gpt.heldout import NOISE_K, compare_losses, gap_separated, yardstick
from helpers.gpt.model import GPT, PRESETS, GPTConfig
from helpers.lowbit import quant, quant_linear
from helpers.lowbit.gptq import block_linears
from helpers.measure import params
from helpers.measure.params import positive


# ---------------------------------------------------------------- the parameters

NF4_BLOCKS = (32, 64, 128, 256, 512, 1024, 2048, 4096)  # bitsandbytes' NF4 block sizes (quant.nf4_quantize's)
PLANTED = dict(tokens=64, features=256, columns=3, size=20.0)  # notebook 08's LLM.int8 test input (planted_outliers)


def layer_width(preset: str) -> int:
    """The largest group size that divides the input width of every block linear of `preset`'s GPT (the gcd
    of those widths): quantisation groups run along a weight's input dimension and must tile it."""
    with torch.device("meta"):  # shapes only: nothing is allocated and no random numbers are drawn
        model = GPT(GPTConfig.preset(preset))
    return math.gcd(*(lin.in_features for lin in block_linears(model).values()))


def int8_threshold_floor(seed: int) -> float:
    """The smallest column max |x| of the planted LLM.int8 test input (`PLANTED`, drawn with `seed`): a
    threshold at or below it sends every column to the full-precision path, leaving no int8 product."""
    return float(quant_linear.planted_outliers(**PLANTED, seed=seed).abs().amax(0).min())


def _groups(preset: str):
    """GROUPS: a non-empty list of "tensor", "channel" or group sizes that tile every block linear of `preset`
    (and, from 32 on, are NF4 block sizes too), whose last entry is not "tensor" (the grid panel starts there)."""
    width = layer_width(preset)

    def check(name: str, values) -> list:
        if isinstance(values, (str, bytes)) or not isinstance(values, (list, tuple)) or not values or any(
                not (v in ("tensor", "channel") or (isinstance(v, int) and not isinstance(v, bool) and v > 0))
                for v in values):
            raise ValueError(f"{name}={values!r} must be a non-empty list of 'tensor', 'channel' or positive group sizes")
        for g in values:
            if isinstance(g, int) and width % g:
                raise ValueError(f"{name}={values!r}: group size {g} does not divide {width}, the input width every block "
                                 f"linear of the {preset} GPT is a multiple of; choose divisors of {width}, e.g. 32 or 64")
            if isinstance(g, int) and g >= 32 and g not in NF4_BLOCKS:
                raise ValueError(f"{name}={values!r}: group size {g} is also measured as an NF4 block, and NF4 blocks "
                                 f"are powers of two from 32 to 4096; choose {max(b for b in NF4_BLOCKS if b <= g)} "
                                 "or a size below 32")
        if values[-1] == "tensor":
            raise ValueError(f"{name}={values!r}: the last entry is where the grid panel starts, and the grid has no "
                             "'tensor' rows; end the list with 'channel' or a group size")
        return list(values)
    return check


def _blocksize(preset: str):
    """BLOCKSIZE: an NF4 block size that is also a group size of every block linear of `preset` (the table
    quantises int4 RTN, GPTQ and AWQ in groups of BLOCKSIZE)."""
    width = layer_width(preset)

    def check(name: str, value) -> int:
        params.choose(name, value, NF4_BLOCKS)
        if width % value:
            raise ValueError(f"{name}={value!r} does not divide {width}, the input width every block linear of the "
                             f"{preset} GPT is a multiple of, and int4 RTN, GPTQ and AWQ are grouped by it; choose one "
                             f"of {', '.join(str(b) for b in NF4_BLOCKS if width % b == 0)}")
        return value
    return check


def _threshold(seed: int):
    """THRESHOLD: a finite positive number above `int8_threshold_floor(seed)` once rounded to fp32 (the input's
    dtype, in which llm_int8_matmul compares |x| with it)."""
    def check(name: str, value) -> float:
        value = positive(name, float(value) if type(value) is int else value, float)
        floor = int8_threshold_floor(seed)
        if not math.isfinite(value) or float(torch.tensor(value, dtype=torch.float32)) <= floor:  # compared in fp32
            raise ValueError(f"{name}={value!r}: the planted LLM.int8 example needs a finite threshold above "
                             f"{floor:.4g}, its smallest column max |x| (at or below it every column is an outlier, "
                             "no int8 product is left and the error reduction divides by zero); 6.0 is the paper's")
        return value
    return check


def resolve_parameters(S: params.Setup, *, MODEL, GROUPS, BLOCKSIZE, THRESHOLD, EVAL_BATCHES, DECODE_BATCHES, REPS,
                       FT_STEPS, QAT_STEPS) -> dict:
    """Notebook 08's parameters, validated at once and with the profile's defaults filled in: {name: value}.

    Raises ValueError naming the first bad parameter, and where a later cell could not use a value: a
    group size or BLOCKSIZE that does not divide the input width of every block linear of MODEL's GPT
    (`layer_width`: 128 for tiny, 384 for small10m), a group size from 32 up that is not an NF4 block size,
    GROUPS ending in "tensor", a THRESHOLD at or below `int8_threshold_floor(S.seed)`.
    """
    R = S.resolve
    model = R("MODEL", MODEL, smoke="tiny", full="small10m", check=lambda n, v: params.choose(n, v, PRESETS))
    return {"MODEL": model,
            "GROUPS": R("GROUPS", GROUPS, smoke=["tensor", "channel", 64], full=["tensor", "channel", 128, 64, 32],
                        check=_groups(model)),
            "BLOCKSIZE": R("BLOCKSIZE", BLOCKSIZE, smoke=64, full=64, check=_blocksize(model)),
            "THRESHOLD": R("THRESHOLD", THRESHOLD, smoke=6.0, full=6.0, check=_threshold(S.seed)),
            "EVAL_BATCHES": R("EVAL_BATCHES", EVAL_BATCHES, smoke=2, full=8, check=params.positive),
            "DECODE_BATCHES": R("DECODE_BATCHES", DECODE_BATCHES, smoke=[1, 32], full=[1, 64], check=params.positives),
            "REPS": R("REPS", REPS, smoke=5, full=30, check=params.positive),
            "FT_STEPS": R("FT_STEPS", FT_STEPS, smoke=10, full=100, check=params.positive),
            "QAT_STEPS": R("QAT_STEPS", QAT_STEPS, smoke=30, full=200, check=params.positive)}


# ---------------------------------------------------------------- weights and activations

@torch.no_grad()
def block_inputs(model: nn.Module, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    """The input activations of every block linear for one forward pass on `tokens` (B, T): {name: (B*T, in)}
    float32 on the CPU, captured with forward hooks."""
    got, hooks = {}, []
    for name, lin in block_linears(model).items():
        hooks.append(lin.register_forward_hook(
            lambda m, inp, out, name=name: got.__setitem__(name, inp[0].reshape(-1, inp[0].shape[-1]).float().cpu())))
    try:
        model(tokens)
    finally:
        for h in hooks:
            h.remove()
    return got


def weight_error_rows(weights: dict[str, torch.Tensor], groups, bits=(8, 4)) -> list[dict]:
    """Relative error ||W - Q(W)|| / ||W|| of each scheme x bits x granularity, and NF4 (± double quant) at
    every integer group, over all weights: {method, bits, granularity, mean error, worst error, worst layer,
    bits/param (from the first weight's state; RTN codes counted at `bits` each)}. `groups`: list of "tensor" / "channel" / int."""
    first = next(iter(weights.values()))
    rows = []
    specs = [(s, b, g) for s in quant.SCHEMES for b in bits for g in groups]
    specs += [(m, 4, g) for m in ("nf4", "nf4-dq") for g in groups if isinstance(g, int) and g >= 32]
    for scheme, b, g in specs:
        errs = {}
        for name, w in weights.items():
            if scheme.startswith("nf4"):
                w_hat = quant.nf4_fake_quantize(w, g, scheme == "nf4-dq")
            else:
                w_hat = quant.fake_quantize(w, b, scheme, g)
            errs[name] = quant.error(w, w_hat)
        if scheme.startswith("nf4"):
            bpp = quant.nf4_quantize(first, g, compress_statistics=scheme == "nf4-dq").bits_per_param()
        else:
            bpp = quant.quantize(first, b, scheme, g).packed_bits_per_param()
        worst = max(errs, key=errs.get)
        rows.append({"method": scheme, "bits": b, "granularity": str(g), "mean_error": sum(errs.values()) / len(errs),
                     "worst_error": errs[worst], "worst_layer": worst, "bits_per_param": bpp})
    return rows


def outlier_profile(acts: dict[str, torch.Tensor], threshold: float = 6.0) -> list[dict]:
    """Per layer input (acts: {name: (tokens, in)}): largest |x|, median |x|, their ratio, "cols_over" (the
    share of input columns holding any |x| >= `threshold`; 6 is LLM.int8's default), "threshold", and the
    column whose absmax is largest. Raises ValueError for a threshold that is not a positive number."""
    positive("threshold", float(threshold) if type(threshold) is int else threshold, float)
    rows = []
    for name, x in acts.items():
        col = x.abs().amax(0)
        rows.append({"layer": name, "max_abs": float(col.max()), "median_abs": float(x.abs().median()),
                     "ratio": float(col.max() / x.abs().median().clamp(min=1e-12)),
                     "cols_over": float((col >= threshold).float().mean()), "threshold": float(threshold),
                     "top_column": int(col.argmax())})
    return rows


def activation_error_rows(acts: dict[str, torch.Tensor], weights: dict[str, torch.Tensor],
                          thresholds=(0.0, 6.0)) -> list[dict]:
    """Error of each layer's real matmul X W^T in int8: per-tensor absmax X, LLM.int8 vector-wise
    (threshold 0: no decomposition) and with the decomposition at each threshold > 0. Errors relative to
    the fp32 product; also the outlier columns kept in floating point."""
    rows = []
    for name, x in acts.items():
        w = weights[name]
        ref = x @ w.float().T
        xt = quant.fake_quantize(x, 8, "absmax", "tensor")
        wt = quant.fake_quantize(w.float(), 8, "absmax", "channel")
        row = {"layer": name, "per-tensor int8": quant.error(ref, xt @ wt.T)}
        for th in thresholds:
            out, cols = quant_linear.llm_int8_matmul(x, w, th)
            key = "vector-wise int8" if th <= 0 else f"LLM.int8, threshold {th:g}"
            row[key] = quant.error(ref, out)
            if th > 0:
                row[f"outlier cols, threshold {th:g}"] = int(cols.numel())
        rows.append(row)
    return rows


# ---------------------------------------------------------------- a sweep of RTN and NF4 formats on the whole model

def weight_bits(model: nn.Module, method: str, bits: int = 4, group: "str | int" = 64) -> float:
    """Storage bits per parameter of the block linears under `method`, from each weight's quantised state
    (NF4: every tensor as stored; RTN: codes counted at `bits` each, as a packing kernel stores them, plus
    the scales and zeros as stored), averaged over their parameters; 32 or 16 for "fp32" / "bf16"."""
    if method in ("fp32", "bf16"):
        return 32.0 if method == "fp32" else 16.0
    total = n = 0
    for lin in block_linears(model).values():
        w = lin.weight.detach().float().cpu()
        if method.startswith("nf4"):
            state = quant.nf4_quantize(w, group, compress_statistics=method == "nf4-dq")
        else:
            state = quant.quantize(w, bits, method, group)
        total += (state.bits_per_param() if method.startswith("nf4") else state.packed_bits_per_param()) * w.numel()
        n += w.numel()
    return total / n


@torch.no_grad()
def spec_sweep(model: nn.Module, specs, evaluate) -> dict[tuple, dict]:
    """For each (method, bits, group) in `specs`: quantize every block linear's weight in place, measure the
    mean relative weight error, the bits per parameter (as `weight_bits` counts them) and `evaluate(model)`
    (e.g. a validation loss), then restore the weights. Returns {(method, bits, str(group)): {error, bits,
    value}}. Each weight is quantized once per spec (no model copies)."""
    lins = list(block_linears(model).values())
    saved = [l.weight.detach().clone() for l in lins]
    out = {}
    try:
        for method, bits, group in specs:
            errs, total_bits, n = [], 0.0, 0
            for lin, w in zip(lins, saved):
                wf = w.float()
                if method.startswith("nf4"):
                    state = quant.nf4_quantize(wf.cpu(), group, compress_statistics=method == "nf4-dq")
                    w_hat, b = quant.nf4_dequantize(state), state.bits_per_param()
                else:
                    state = quant.quantize(wf.cpu(), bits, method, group)
                    w_hat, b = quant.dequantize(state), state.packed_bits_per_param()
                errs.append(quant.error(wf.cpu(), w_hat))
                total_bits += b * w.numel()
                n += w.numel()
                lin.weight.copy_(w_hat.to(w.device, w.dtype))
            out[(method, bits, str(group))] = {"error": sum(errs) / len(errs), "bits": total_bits / n,
                                               "value": evaluate(model)}
            for lin, w in zip(lins, saved):
                lin.weight.copy_(w)
    finally:
        for lin, w in zip(lins, saved):
            lin.weight.copy_(w)
    return out


# ---------------------------------------------------------------- the noise of held-out losses

def highest_loss(windows: dict[str, torch.Tensor], k: float = NOISE_K) -> str:
    """Which of `windows` ({name: per-window losses}) has the highest held-out loss, named only when it is above
    the runner-up by more than the yardstick; else the names tied with it."""
    order = sorted(windows, key=lambda n: -float(windows[n].mean()))
    top = order[0]
    tied = [n for n in order[1:] if not gap_separated(windows[top], windows[n], k)]
    if not tied:
        return f"the highest loss is {top}'s ({compare_losses(top, windows[top], order[1], windows[order[1]], k)})" \
            if len(order) > 1 else f"the only loss is {top}'s"
    return (f"the highest losses, {', '.join([top] + tied)}, cannot be told apart "
            f"({yardstick(windows[top], windows[tied[0]], k)})")


# ---------------------------------------------------------------- what the bits and the tables say

def zero_point_bits_note(bits: int, group: int, measured: float | None = None) -> str:
    """What a zero-point format's bits per parameter are charged for: codes of `bits` plus one fp32 scale and one
    fp32 zero per `group` weights (bits + 64/group, as the tables count them; `measured` is the table's figure),
    against NF4's bits + 32/group (one fp32 absmax), and what an fp16 scale and zero (bits + 32/group) or an fp16
    scale with a `bits`-wide integer zero (bits + (16 + bits)/group, GPTQ's packed checkpoints) would cost."""
    positive("bits", bits)
    positive("group", group)
    fp32 = bits + 64 / group
    shown = f" ({measured:.2f} in the table)" if measured is not None else ""
    return (f"Zero-point formats (int zero-point RTN, GPTQ and AWQ here) are charged an fp32 scale and an fp32 zero "
            f"per group of {group}: {bits} + 64/{group} = {fp32:.2f} bits per parameter{shown}, against NF4's "
            f"{bits} + 32/{group} = {bits + 32 / group:.2f} (one fp32 absmax). Stored as fp16 scale and zero they would "
            f"cost {bits + 32 / group:.2f}, as an fp16 scale with a {bits}-bit integer zero {bits + (16 + bits) / group:.2f}.")


# ---------------------------------------------------------------- the takeaways

def takeaways(model: str, groups, err_rows: list[dict], nf4_state_bits: dict, blocksize: int, ppl: dict,
              windows: dict, eval_batches: int, layer_err: list[dict], awq_why: str, int8: dict, gain: float,
              outlier_cols: int, threshold: float) -> list[str]:
    """Notebook 08's takeaway bullets on quality, generated from the run's numbers: the error of each granularity
    (`weight_error_rows`' rows), NF4 against int4 at the first block size with NF4 rows, double quantisation
    (`nf4_state_bits`: {double quant: (bits/param, bitsandbytes' bits/param, error)}), held-out perplexity (`ppl`:
    {label: {"bits", "loss", "ppl"}} with "fp32"; `windows`: the per-window losses of each label), the 3-bit rows
    with GPTQ and AWQ (`layer_err`: `gptq_lab.layer_error_rows`; `awq_why`: `gptq_lab.awq_explanation`'s sentence),
    and LLM.int8 on planted outliers (`int8`: {threshold: {"ours": error}}, `gain`, `outlier_cols` of the GPT)."""
    def err_of(method, bits, group):
        return next(r["mean_error"] for r in err_rows
                    if r["method"] == method and r["bits"] == bits and r["granularity"] == str(group))

    def bits_of(method, group):
        return next(r["bits_per_param"] for r in err_rows
                    if r["method"] == method and r["bits"] == 4 and r["granularity"] == str(group))

    scale_name = {"tensor": "with one scale per tensor", "channel": "per channel"}
    lines = [f"- Granularity (4-bit absmax on the {model} GPT's weights): mean error "
             + ", ".join(f"{err_of('absmax', 4, g):.3f} {scale_name.get(g, f'in groups of {g}')}" for g in groups) + "."]
    nf4_group = next((g for g in groups if isinstance(g, int) and g >= 32), None)  # NF4 blocks start at 32
    if nf4_group is not None:
        nf, i4 = err_of("nf4", 4, nf4_group), err_of("absmax", 4, nf4_group)
        lines.append(f"- NF4 vs int4 absmax at the same block of {nf4_group} ({bits_of('nf4', nf4_group):.2f} vs "
                     f"{bits_of('absmax', nf4_group):.2f} bits/param): error {nf:.3f} vs {i4:.3f}, "
                     + (f"NF4 {i4 / nf:.2f}x lower." if nf < i4 else f"NF4 NOT lower here ({nf / i4:.2f}x)."))
    plain, double = nf4_state_bits[False], nf4_state_bits[True]
    lines.append(f"- Double quantization: {plain[0]:.3f} -> {double[0]:.3f} bits/param at block {blocksize}, "
                 f"error {plain[2]:.4f} -> {double[2]:.4f}.")
    base = ppl["fp32"]["loss"]
    worst = max((k for k in ppl if k != "fp32"), key=lambda k: ppl[k]["loss"])
    spread4 = max(abs(v["loss"] - base) for k, v in ppl.items() if "4" in k.split("(")[0])
    lines.append(f"- Perplexity: fp32 {ppl['fp32']['ppl']:.3f}; "
                 + highest_loss({k: w for k, w in windows.items() if k != "fp32"})
                 + f"; the highest median is {worst}'s, {ppl[worst]['ppl']:.3f} ({ppl[worst]['loss'] - base:+.4f} "
                 f"nats/byte); NF4 {ppl[f'NF4 (block {blocksize})']['ppl']:.3f}, int4 absmax "
                 f"{ppl[f'int4 RTN (absmax, g{blocksize})']['ppl']:.3f}; every 4-bit row is within {spread4:.4f} "
                 f"nats/byte of fp32 on these {eval_batches * 16} windows.")
    rtn3 = f"int3 RTN (zero-point, g{blocksize})"
    r3, g3 = ppl.get(rtn3), ppl.get(f"GPTQ int3 (g{blocksize})")
    if r3 and g3:
        below3 = {m: gap_separated(windows[f"{m} int3 (g{blocksize})"], windows[rtn3])
                  and ppl[f"{m} int3 (g{blocksize})"]["loss"] < r3["loss"] for m in ("GPTQ", "AWQ")}
        lines.append(f"- 3-bit, groups of {blocksize}: RTN perplexity {r3['ppl']:.3f}, GPTQ {g3['ppl']:.3f}, AWQ "
                     f"{ppl[f'AWQ int3 (g{blocksize})']['ppl']:.3f} (fp32 {ppl['fp32']['ppl']:.3f}); GPTQ's layer output "
                     f"error was below RTN's in {sum(r['gptq'] < r['rtn'] for r in layer_err)} of {len(layer_err)} "
                     f"layer x bit cases, AWQ's in {sum(r['awq'] < r['rtn'] for r in layer_err)}"
                     + ("; AWQ's loss was not measurably below RTN's (the yardstick: twice the standard error of the "
                        "per-window difference): " + awq_why if not below3["AWQ"] else ".")
                     + (" GPTQ's loss was not measurably below RTN's either." if not below3["GPTQ"] else ""))
    lines.append(f"- LLM.int8 on planted outliers: error {int8[0.0]['ours']:.4f} without the decomposition, "
                 f"{int8[threshold]['ours']:.4f} with it ({gain:.1f}x lower); the trained GPT's inputs had "
                 f"{outlier_cols} column(s) at or above {threshold:g}.")
    return lines
