"""Notebook 08's parameters and quantisation measurements: error on a trained GPT's real weights and activations,
GPTQ and AWQ against RTN layer by layer and in held-out perplexity, a grid of RTN / NF4 formats, decode
speed of weight-only linears on a GPU, and 8-bit optimizer state.

The quantisers are `helpers.lowbit.quant`, `helpers.lowbit.quant_linear` and `helpers.lowbit.gptq`;
this module applies them to the course GPT. Every linear inside the blocks (attention q/kv/out, MLP
up/down) is quantised; the embeddings and the output head stay in full precision (bitsandbytes' and
torchao's defaults skip lm_head too).

- `resolve_parameters`: the notebook's parameters validated at once (the group and block sizes against
  the GPT's layer widths, the LLM.int8 threshold against the planted test input).
- Weights and activations: `weight_error_rows` (each scheme, width and granularity on every block
  weight), `block_inputs`, `outlier_profile` and `activation_error_rows` (LLM.int8 on the real inputs).
- GPTQ and AWQ: `layer_error_rows` / `layer_error_section`, the output error ||WX − ŴX|| / ||WX|| of
  RTN, GPTQ and AWQ on every linear, as rows and as a printed table with a sentence per bit width;
  `perplexity_section`, held-out perplexity of RTN, GPTQ and AWQ copies at each bit width.
- `grid(model, specs, evaluate)`: every (method, bits, group) quantised in place, evaluated, restored;
  `weight_bits`, the storage bits per parameter of a format.
- Decode on a GPU: `decode_speed`, tokens/s and achieved bandwidth of one decode step with bf16, our int8
  / int4 weight-only linears (`weight_only_copy`) and torchao's configs (`row_timing` turns a row back into
  a Timing); each prefill that fills a timed step's cache runs `uncompiled`, so the compiled int8 linear
  compiles one graph per batch size (the timed decode step's shape), not two.
- Decode on a CPU: `cpu_decode`, batch-1 decode of fp32 against int8 weight-only (PyTorch's fused int8 kernel,
  and dequantize-then-matmul) timed by `helpers.measure.protocol`, as bytes read per token / time per token;
  `cpu_decode_table` and `cpu_decode_sentences` set it against the copy ceiling (`copy_size`: a copy larger
  than `hardware.last_level_cache`); `decode_claim`, the ledger's verdict from a measured ratio.
- Noise in held-out losses: `window_losses` (one loss per window of `validation_loss`), `loss_gap`,
  `gap_separated`, `yardstick`, `compare_losses` and `highest_loss`: a gap between two models is ranked only
  when it exceeds `NOISE_K` standard errors of the paired per-window difference.
- Sentences from the tables: `zero_point_bits_note` (what the fp32 zero of a zero-point format costs, and
  the alternatives), `awq_explanation` (AWQ's result read against the outlier table).
- 8-bit optimizers (Dettmers et al., 2022, "8-bit Optimizers via Block-wise Quantization"):
  bitsandbytes `AdamW8bit` keeps both Adam moments as uint8 codes with one fp32 absmax per block of
  256 values, except for tensors with fewer than `min_8bit_size` (default 4096) elements, whose
  state stays fp32 (bitsandbytes' Optimizer8bit.init_state: `if p.numel() < config["min_8bit_size"]`).
  `optimizer_section(model, steps=...)` measures state bytes per parameter of torch AdamW vs AdamW8bit
  tensor by tensor (`threshold_probe` finds where the 32-bit threshold falls, `update_gap` how far the
  8-bit state moves an update) and the losses of a few steps of each on the same batches.
"""
from __future__ import annotations

import copy
import math
from contextlib import contextmanager

import torch
from torch import nn

from helpers.gpt import data
from helpers.gpt.generation import KVCache, prefill, rewound_step
from helpers.gpt.model import GPT, PRESETS, GPTConfig
from helpers.gpt.pretrained import validation_loss
from helpers.lowbit import quant, quant_linear
from helpers.lowbit.gptq import (METHODS, awq_quantize, block_linears, check_bits, collect_inputs,
                                 gptq_quantize, hessian, output_error, quantize_model, rtn_quantize)
from helpers.lowbit.lora import finetune_split, make_optimizer, optimizer_state_bytes, prepare, train_steps, trainable
from helpers.measure import bench, claims, hardware, params, protocol
from helpers.measure.ceilings import measure_copy_bandwidth
from helpers.measure.params import positive
from helpers.show import tables

GB = 1e9


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
                       FT_STEPS) -> dict:
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
            "FT_STEPS": R("FT_STEPS", FT_STEPS, smoke=10, full=100, check=params.positive)}


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
            bpp = quant.nf4_quantize(first, g, double=scheme == "nf4-dq").bits_per_param()
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


def perplexity_section(model: nn.Module, calib: torch.Tensor, bits=(4, 3), group_size: int | None = 64,
                       val_tokens: torch.Tensor | None = None, *, batches: int = 4) -> list[dict]:
    """Held-out validation loss and perplexity of the fp32 model and of RTN / GPTQ / AWQ copies at each
    bit width (`quantize_model`), on `batches` fixed windows of `val_tokens` (default: the held-out split).

    Prints a table and one sentence per bit width from the numbers. Returns
    [{"method", "bits", "val_loss", "perplexity"}], the fp32 row first (bits 32)."""
    def row(method, b, m):
        loss = validation_loss(m, val_tokens, batches=batches)
        return {"method": method, "bits": b, "val_loss": loss, "perplexity": math.exp(loss)}

    with bench.cpu_threads(next(model.parameters()).device):
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


# ---------------------------------------------------------------- a grid of RTN and NF4 formats on the whole model

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
            state = quant.nf4_quantize(w, group, double=method == "nf4-dq")
        else:
            state = quant.quantize(w, bits, method, group)
        total += (state.bits_per_param() if method.startswith("nf4") else state.packed_bits_per_param()) * w.numel()
        n += w.numel()
    return total / n


@torch.no_grad()
def grid(model: nn.Module, specs, evaluate) -> dict[tuple, dict]:
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
                    state = quant.nf4_quantize(wf.cpu(), group, double=method == "nf4-dq")
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


# ---------------------------------------------------------------- decode speed (GPU)

@contextmanager
def uncompiled(model: nn.Module):
    """Within the block, every `quant_linear.WeightOnlyLinear` of `model` on the "compile" backend computes the
    same product uncompiled (the "torch" backend); the backends are restored after. Each new input shape is
    one more graph for the compiled int8 linear to compile (a prefill of B x T tokens is a shape of its own), and
    a prefill that only fills a timed step's cache need not add one."""
    mods = [m for m in model.modules() if isinstance(m, quant_linear.WeightOnlyLinear) and m.backend == "compile"]
    for m in mods:
        m.backend = "torch"
    try:
        yield model
    finally:
        for m in mods:
            m.backend = "compile"


def _decode_step(model, batch: int, prompt: int, device: str, dtype: torch.dtype = torch.bfloat16):
    """A callable running one decode step from a `dtype` cache filled with `prompt` tokens (rewound before each
    call, so every timed step sees the same length). The prefill runs `uncompiled`: only the timed step's shape
    is compiled."""
    cfg = model.config
    cache = KVCache(cfg, batch, prompt + 1, dtype=dtype, device=device)
    with uncompiled(model):
        prefill(model, torch.randint(0, cfg.vocab_size, (batch, prompt), device=device), cache)
    return rewound_step(model, cache, torch.randint(0, cfg.vocab_size, (batch,), device=device))


def weight_only_copy(base: torch.nn.Module, bits: int, backend: str, group_size: int = 64) -> torch.nn.Module:
    """A deep copy of `base` whose block linears are our weight-only int8 / int4 linears (bits 8 or 4) running
    `backend` ("torch", "compile" for int8, "triton" for int4: see quant_linear.WeightOnlyLinear)."""
    model = copy.deepcopy(base)
    quant_linear.swap_linears(model, lambda lin: quant_linear.WeightOnlyLinear.from_linear(lin, bits, group_size))
    for m in model.modules():
        if isinstance(m, quant_linear.WeightOnlyLinear):
            m.backend = backend
    return model


def decode_speed(preset: str = "1.3b", batches=(1, 32), prompt: int = 64, reps: int = 20,
                 variants=("bf16", "int8", "int4-triton", "torchao-int8", "torchao-int4"), group_size: int = 64) -> list[dict]:
    """Tokens/s of one decode step of a randomly initialised `preset` GPT in bf16 on CUDA, its block
    linears as bf16, our int8 / int4 weight-only linears, or torchao's configs; and the achieved
    bandwidth = (bytes of all weights read once + KV cache read) / step time. A variant that cannot run
    gives a row with its reason. Raises RuntimeError without CUDA."""
    if not torch.cuda.is_available():
        raise RuntimeError("decode speed is measured on a GPU only")
    torch.manual_seed(0)
    with torch.device("cuda"):  # initialise on the GPU: a 1.3B model's init on a CPU takes longer than the timing
        base = GPT(GPTConfig.preset(preset)).to(torch.bfloat16).eval()
    rows, stored = [], {}
    for name in variants:
        model = None
        why = None
        try:
            if name == "int8":
                model = weight_only_copy(base, 8, "compile", group_size)
            elif name == "int4-triton":
                model = weight_only_copy(base, 4, "triton", group_size)
            else:
                model = copy.deepcopy(base)
            if name.startswith("torchao"):
                from torchao.quantization import (  # heavy: only the GPU comparison needs torchao
                    Int4WeightOnlyConfig, Int8WeightOnlyConfig, quantize_)
                cfg = Int8WeightOnlyConfig() if name.endswith("int8") else Int4WeightOnlyConfig(group_size=group_size)
                for blk in model.blocks:
                    quantize_(blk, cfg)
            if name.startswith("torchao"):  # its tensor subclasses hide their packed size: count ours at that width
                wbytes = stored.get(name.split("-")[1].replace("int4", "int4-triton"))
            else:
                wbytes = sum(t.numel() * t.element_size() for t in list(model.parameters()) + list(model.buffers()))
                stored[name] = wbytes
            for b in batches:
                step = _decode_step(model, b, prompt, "cuda")
                t = bench.benchmark(step, warmup=5, reps=reps, device="cuda")
                mc = model.config  # K and V of every layer, bf16, n_kv_head heads (d_model wide without GQA)
                kv = 2 * mc.n_layer * b * (prompt + 1) * mc.n_kv_head * mc.head_dim * 2
                rows.append({"variant": name, "batch": b, "ms": 1e3 * t.median, "iqr_ms": 1e3 * (t.q75 - t.q25),
                             "q25_ms": 1e3 * t.q25, "q75_ms": 1e3 * t.q75,
                             "tokens_per_s": b / t.median,
                             "gbps": None if wbytes is None else (wbytes + kv) / t.median / GB})
        except Exception as err:  # noqa: BLE001 - a kernel missing for this GPU or library: a row that says so
            why = f"{type(err).__name__}: {str(err)[:120]}"
        if why:
            rows.append({"variant": name, "batch": None, "ms": None, "tokens_per_s": None, "gbps": None, "why": why})
        del model
        torch.cuda.empty_cache()
    return rows


# ---------------------------------------------------------------- 8-bit optimizer state

MIN_8BIT_SIZE = 4096  # bitsandbytes' default min_8bit_size: smaller tensors keep fp32 optimizer state
BNB_STATE_BLOCK = 256  # bitsandbytes' blockwise 8-bit optimizer state: one fp32 absmax per 256 values


def threshold_probe(sizes=(MIN_8BIT_SIZE - 1, MIN_8BIT_SIZE), device: str = "cpu") -> dict[int, str]:
    """The dtype of bitsandbytes AdamW8bit's first moment after one step on a 1-D tensor of each size:
    {numel: "float32" or "uint8"}; finds where the 32-bit threshold (min_8bit_size) falls."""
    import bitsandbytes as bnb  # heavy: it imports triton, and only this section needs it

    out = {}
    for n in sizes:
        p = nn.Parameter(torch.zeros(positive("size", n), device=device))
        opt = bnb.optim.AdamW8bit([p])
        p.grad = torch.ones_like(p)
        opt.step()
        out[n] = str(opt.state[p]["state1"].dtype).replace("torch.", "")
    return out


def update_gap(steps: int = 5, shape=(64, 128), lr: float = 1e-3, seed: int = 0, device: str = "cpu") -> float:
    """||Δp(AdamW8bit) − Δp(AdamW)|| / ||Δp(AdamW)|| after `steps` steps of both optimizers on one
    tensor of `shape` with the same random gradients (no weight decay): how far 8-bit state moves the
    update."""
    import bitsandbytes as bnb  # heavy: it imports triton, and only this section needs it

    g = torch.Generator().manual_seed(seed)
    p0 = torch.randn(shape, generator=g)
    grads = [torch.randn(shape, generator=g) for _ in range(positive("steps", steps))]
    moved = {}
    for name, cls in (("adamw", torch.optim.AdamW), ("adamw8bit", bnb.optim.AdamW8bit)):
        p = nn.Parameter(p0.clone().to(device))
        opt = cls([p], lr=lr, weight_decay=0.0)
        for grad in grads:
            p.grad = grad.to(device)
            opt.step()
        moved[name] = (p.detach() - p0.to(device)).float()
    return float((moved["adamw8bit"] - moved["adamw"]).norm() / moved["adamw"].norm())


def optimizer_section(model: nn.Module, steps: int = 5, *, lr: float = 1e-3, batch: int = 8, seq_len: int = 64,
                      seed: int = 0) -> dict:
    """Full fine-tuning of two copies of `model` on the same batches, one with torch.optim.AdamW and
    one with bitsandbytes AdamW8bit: state bytes per parameter measured tensor by tensor (tensors
    below bitsandbytes' min_8bit_size = 4096 elements keep fp32 state), and the training loss of
    each step. Prints a table per tensor size class and sentences from the numbers. Returns
    {"losses": {"adamw": [...], "adamw8bit": [...]}, "bytes_per_param": {name: float},
    "tensors": [{"name", "numel", "adamw", "adamw8bit", "dtypes8"}], "state_bytes": {name: int},
    "threshold": `threshold_probe()`, "update_gap": `update_gap()`}."""
    positive("steps", steps)
    tune, _ = finetune_split()
    res = {"losses": {}, "state_bytes": {}, "bytes_per_param": {}}
    per = {}
    with bench.cpu_threads(next(model.parameters()).device):
        for name in ("adamw", "adamw8bit"):
            m = prepare(model, "full")
            params = trainable(m)
            opt = make_optimizer(name, params, lr)
            res["losses"][name] = train_steps(m, opt, steps, tune, batch, seq_len, seed)
            total, per_tensor = optimizer_state_bytes(opt)
            res["state_bytes"][name] = total
            res["bytes_per_param"][name] = total / sum(p.numel() for p in params)
            names = {id(p): n for n, p in m.named_parameters()}
            per[name] = {names[id(p)]: v for p, v in per_tensor.items()}
        res["threshold"] = threshold_probe(device=str(next(model.parameters()).device))
        res["update_gap"] = update_gap(device=str(next(model.parameters()).device))
    res["tensors"] = [{"name": n, "numel": v["numel"], "adamw": v["bytes"] / v["numel"],
                       "adamw8bit": per["adamw8bit"][n]["bytes"] / v["numel"],
                       "dtypes8": "/".join(per["adamw8bit"][n]["dtypes"])} for n, v in per["adamw"].items()]
    _print_optimizer(res)
    return res


def _print_optimizer(res: dict) -> None:
    rows = res["tensors"]
    small = [t for t in rows if t["numel"] < MIN_8BIT_SIZE]
    large = [t for t in rows if t["numel"] >= MIN_8BIT_SIZE]
    show = sorted(large, key=lambda t: -t["numel"])[:4] + sorted(small, key=lambda t: -t["numel"])[:3]
    print(tables.table(["tensor", "elements", "AdamW bytes/param", "AdamW8bit bytes/param", "8-bit state dtypes"],
                       [[t["name"], t["numel"], f"{t['adamw']:.3f}", f"{t['adamw8bit']:.3f}", t["dtypes8"]]
                        for t in show]))
    eight = [t for t in rows if "uint8" in t["dtypes8"]]
    smallest8 = min((t["numel"] for t in eight), default=None)
    largest32 = max((t["numel"] for t in rows if "uint8" not in t["dtypes8"]), default=None)
    print(f"{len(eight)} of {len(rows)} tensors got uint8 state (the smallest of them has {smallest8} elements); "
          f"the largest tensor left in fp32 state has {largest32} elements, consistent with bitsandbytes' "
          f"min_8bit_size of {MIN_8BIT_SIZE}." if smallest8 and largest32 and largest32 < MIN_8BIT_SIZE <= smallest8
          else f"{len(eight)} of {len(rows)} tensors got uint8 state; the threshold {MIN_8BIT_SIZE} is not "
               f"bracketed by this model's tensor sizes (smallest uint8: {smallest8}, largest fp32: {largest32}).")
    probe = ", ".join(f"{n} elements → {d}" for n, d in res["threshold"].items())
    print(f"Probing one-tensor optimizers directly: {probe}. The update after 5 steps on one 64×128 tensor with "
          f"the same gradients differs from AdamW's by {res['update_gap'] * 100:.2f}% (relative norm).")
    bpp = res["bytes_per_param"]
    la, lb = res["losses"]["adamw"], res["losses"]["adamw8bit"]
    gap = max(abs(a - b) for a, b in zip(la, lb))
    print(f"Optimizer state over the whole model: AdamW {bpp['adamw']:.2f} bytes/param, AdamW8bit "
          f"{bpp['adamw8bit']:.2f} ({bpp['adamw'] / bpp['adamw8bit']:.1f}× less"
          + (f"; above the 2 bytes of two uint8 moments because of the fp32 small tensors and one fp32 absmax "
             f"per {BNB_STATE_BLOCK} values" if bpp["adamw8bit"] > 2 else "") +
          f"). Training loss at each of {len(la)} steps (the loss before that step's update): the last is AdamW "
          f"{la[-1]:.5f}, AdamW8bit {lb[-1]:.5f}; the largest per-step gap is {gap:.1e} nats/byte.")


# ---------------------------------------------------------------- decode speed on a CPU, as bandwidth

CPU_DECODE_VARIANTS = ("fp32", "int8 weight-only, fused kernel", "int8 weight-only, dequantize then matmul", "bf16")
CPU_DECODE_DEFAULT = CPU_DECODE_VARIANTS[:3]  # bf16 left out by default: CPUs without bf16 dot products emulate it


def _cache_bytes(cfg, batch: int, length: int, dtype: torch.dtype) -> int:
    """Bytes of K and V a decode step reads from a cache of `length` tokens in `dtype`."""
    return 2 * cfg.n_layer * batch * length * cfg.n_kv_head * cfg.head_dim * torch.empty((), dtype=dtype).element_size()


def copy_size(device: str) -> int:
    """Bytes of the source of a copy-bandwidth measurement whose traffic (source + destination) is larger than the
    last-level cache: on a CPU the next power of two at or above that cache (64 MiB when it cannot be read, at most
    1 GiB); on a GPU 1 GiB."""
    if torch.device(device).type != "cpu":
        return 2 ** 30
    llc = hardware.last_level_cache("cpu")[0] or 2 ** 26
    return min(2 ** 30, 1 << max(26, (llc - 1).bit_length()))


def model_bytes(model: nn.Module) -> int:
    """Bytes of every parameter and buffer of `model` (a decode step reads each once)."""
    return sum(t.numel() * t.element_size() for t in list(model.parameters()) + list(model.buffers()))


def cpu_decode(preset: str = "small10m", prompt: int = 64, *, variants=CPU_DECODE_DEFAULT, budget_s: float = 8.0,
               max_reps: int = 30, max_warmup: int = 10, threads: int = 1, seed: int = 0, timer=None) -> dict:
    """Batch-1 decode steps of a randomly initialised `preset` GPT on the CPU, its block linears in each of
    `variants` (fp32; bf16; int8 weight-only with one scale per output row, run by PyTorch's fused kernel
    `quant_linear.int8_fused_linear` or by converting the whole weight to fp32 before the matmul), timed by
    `helpers.measure.protocol.compare` (warm-up until steady, interleaved rounds, medians with IQR).

    Bytes read per token = every parameter and buffer once (`model_bytes`) + the K/V cache of `prompt` + 1
    tokens; bandwidth = bytes / seconds per token (GB/s = 1e9 B/s), with IQR bounds bytes / q75 .. bytes /
    q25. Timed on `threads` intra-op threads (`bench.cpu_threads`): one by default, because on a CPU shared with
    other work two threads wait on each other at every operation and the step time measures the scheduler.
    Returns {"rows": [{variant, bytes, timing (bench.Timing), tokens_per_s, gbps, gbps_lo, gbps_hi}],
    "comparison": protocol.Comparison, "preset", "prompt", "threads"}. `timer` is passed to `compare` (tests
    plant one). Raises ValueError for an unknown variant."""
    bad = [v for v in variants if v not in CPU_DECODE_VARIANTS]
    if bad or not variants:
        raise ValueError(f"variants={variants!r}: choose from {CPU_DECODE_VARIANTS}")
    torch.manual_seed(seed)
    base = GPT(GPTConfig.preset(preset)).eval()
    fns, nbytes = {}, {}
    for name in variants:
        if name == "fp32":
            model, dtype = base, torch.float32
        elif name == "bf16":
            model, dtype = copy.deepcopy(base).to(torch.bfloat16), torch.bfloat16
        else:
            model, dtype = weight_only_copy(base, 8, "fused" if "fused" in name else "torch"), torch.float32
        fns[name] = _decode_step(model, 1, prompt, "cpu", dtype)
        nbytes[name] = model_bytes(model) + _cache_bytes(model.config, 1, prompt + 1, dtype)
    with bench.cpu_threads("cpu", positive("threads", threads)):
        comp = protocol.compare(fns, device="cpu", timer=timer, min_reps=5, max_reps=max_reps, budget_s=budget_s,
                                max_warmup=max_warmup)
    rows = []
    for name in variants:
        t = comp[name]
        rows.append({"variant": name, "bytes": nbytes[name], "timing": t, "tokens_per_s": 1 / t.median,
                     "gbps": nbytes[name] / t.median / GB, "gbps_lo": nbytes[name] / t.q75 / GB,
                     "gbps_hi": nbytes[name] / t.q25 / GB})
    return {"rows": rows, "comparison": comp, "preset": preset, "prompt": prompt, "threads": threads}


def copy_gbps_on(threads: int, copy_bytes: int) -> float:
    """The copy bandwidth (GB/s, read + write) of a `copy_bytes` copy on `threads` intra-op threads of this CPU:
    the ceiling for a decode step timed on as many threads (`cpu_decode`)."""
    with bench.cpu_threads("cpu", positive("threads", threads)):
        return measure_copy_bandwidth(copy_bytes, "cpu", reps=5)


def cpu_decode_table(result: dict, copy_gbps: float) -> str:
    """`cpu_decode`'s rows as a table beside the copy ceiling `copy_gbps` (GB/s, on as many threads)."""
    return tables.table(["variant", "MB read / token", "time / token (median, IQR)", "tokens/s", "GB/s (IQR)",
                         "of copy GB/s"],
                        [[r["variant"], r["bytes"] / 1e6, str(r["timing"]), r["tokens_per_s"],
                          f'{r["gbps"]:.3g} ({r["gbps_lo"]:.3g}-{r["gbps_hi"]:.3g})', f'{r["gbps"] / copy_gbps:.0%}']
                         for r in result["rows"]])


BANDWIDTH_BOUND = 0.5  # a step reaching under half the copy ceiling is not treated as bandwidth-bound


def cpu_decode_sentences(result: dict, copy_gbps: float, int8: str = CPU_DECODE_VARIANTS[1],
                         base: str = "fp32") -> list[str]:
    """Sentences from `cpu_decode`'s result: the `int8` variant against `base` in time per token (ranked only
    when their IQRs do not overlap, `protocol.rank_sentence`), each one's bandwidth as a share of the copy
    ceiling, and, where int8 is not faster, what the bandwidths say about why: int8's bandwidth below base's (IQRs
    apart) says its per-weight work, not memory traffic, sets its pace; else `base` under BANDWIDTH_BOUND of the
    ceiling even at the top of its IQR was not bandwidth-bound, so bytes saved could not show."""
    rows = {r["variant"]: r for r in result["rows"]}
    a, b = rows[int8], rows[base]
    r = protocol.ratio(b["timing"], a["timing"])  # > 1: int8 faster
    threads = result.get("threads")
    on = f" on {threads} thread{'s' if threads != 1 else ''}" if threads else ""
    out = [f"Batch-1 decode of the {result['preset']} GPT on this CPU{on}: {base} reads {b['bytes'] / 1e6:.1f} MB per token "
           f"at {b['gbps']:.3g} GB/s ({b['gbps'] / copy_gbps:.0%} of the copy ceiling, {copy_gbps:.3g} GB/s), {int8} "
           f"reads {a['bytes'] / 1e6:.1f} MB ({b['bytes'] / a['bytes']:.1f}x fewer) at {a['gbps']:.3g} GB/s "
           f"({a['gbps'] / copy_gbps:.0%}).",
           protocol.rank_sentence(int8, a["timing"], base, b["timing"], what="time per token") + "."]
    if not (r.separated and r.value > 1):
        if a["gbps_hi"] < b["gbps_lo"]:
            why = (f" Its achieved bandwidth is below {base}'s (IQRs {a['gbps_lo']:.3g}-{a['gbps_hi']:.3g} against "
                   f"{b['gbps_lo']:.3g}-{b['gbps_hi']:.3g} GB/s): it does not stream its fewer bytes as fast, so the "
                   "work per weight (converting each int8 code to a float and scaling it), not memory traffic, sets "
                   "its pace on this CPU.")
        elif b["gbps_hi"] < BANDWIDTH_BOUND * copy_gbps:
            why = (f" {base} itself reached at most {b['gbps_hi'] / copy_gbps:.0%} of the copy ceiling (the top of its "
                   f"IQR), so in this run the step was not bandwidth-bound (per-operation overhead and other work on "
                   "the cores weigh more than memory traffic), and fewer bytes had little to save.")
        else:
            why = (" Their bandwidths' IQRs overlap too, so this run cannot say whether memory traffic or the work "
                   "per weight (converting each int8 code to a float) sets int8's pace.")
        verb = "was slower" if r.separated else "did not measurably speed decode up"
        out.append(f"So on this CPU int8 weight-only {verb}, although it reads {b['bytes'] / a['bytes']:.1f}x fewer "
                   f"bytes.{why}")
    return out


# ---------------------------------------------------------------- held-out loss per window, and its noise

@torch.no_grad()
def window_losses(model: nn.Module, tokens: torch.Tensor, *, batches: int, batch: int, seq_len: int | None = None,
                  seed: int = 1234) -> torch.Tensor:
    """Cross-entropy (nats/byte) of every held-out window `pretrained.validation_loss` averages (the same seeded
    draws): a float64 tensor of batches * batch values whose mean is that validation loss."""
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


NOISE_K = 2.0  # a gap counts when it exceeds NOISE_K standard errors of the per-window difference


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


DECODE_CLAIM = dict(notebook="08", source="the first source text (quantization: 'memory reduction, faster compute'); "
                                          "gpt-fast README (Llama-2-7B, A100: int8 1.48x, int4 1.88x bf16's tokens/s)",
                    claim="INT8/INT4 weights reduce memory and speed up inference")


def row_timing(row: dict) -> "protocol.Timing":
    """A `decode_speed` row's step time as a `bench.Timing` (median and quartiles, seconds; no samples)."""
    return protocol.Timing(row["ms"] / 1e3, row["q25_ms"] / 1e3, row["q75_ms"] / 1e3, [])


def decode_claim(ratio: "protocol.Ratio", what: str) -> dict:
    """The ledger's keyword arguments (`claims.verdict(**...)`) for the decode speed-up claim from a measured
    tokens/s ratio (quantised over 16/32-bit, `protocol.Ratio`: median and IQR bounds): judged by
    `claims.judge(ratio.lo, 1.0)`, so a speed-up counts as "supported" only when even the IQR-bounded low end
    of the ratio is above 1; `what` names the measurement ("batch-1 decode of the small10m GPT on this CPU:
    int8 weight-only over fp32")."""
    return dict(DECODE_CLAIM, measured=f"{what}: {ratio} tokens/s" + ("" if ratio.separated else ", within the noise"),
                value=ratio.value, unit="x", verdict=claims.judge(ratio.lo, 1.0))
