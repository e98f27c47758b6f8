"""Notebook 03's measurements, figures, panel and generated sentences.

* the parameters: `resolve_parameters` validates all of them at once and fills in the profile's defaults;
* the formats: `bit_layout_figure`, and `range_panel` (what of a set of values survives in a format
  at a loss scale), with `visible_span` to draw only the bands that overlap the data;
* the gradients: `gradient_samples` (|g| of parameters and of linear layers' outputs, thinned by
  `thin`), `underflow_rows` and `gradient_sentences` (where fp16 and bf16 put them);
* loss scaling: `static_scaling_sweep` (fp16 gradients of S·L against fp32's for each S), its
  `scaling_window`, `scaling_sweep_sentence` and `scaling_sweep_figure`; `compare_scalers` (ours and
  GradScaler on identical scaled gradients with inf/NaN injected);
* `check_log2_scales` validates the notebook's sweep parameter.

The six training variants of `mixed_precision` (memory, loss, speed) are measured in `mixed_precision_lab`.
"""
from __future__ import annotations

import math
from typing import Any, Iterable

import torch

from helpers.gpt import footprint
from helpers.gpt.model import PRESETS, GPTConfig
from helpers.measure import params
from helpers.show import plots
from helpers.training.precision import FORMATS, DynamicLossScaler, classify, facts


# ---------------------------------------------------------------- the parameters

FP32_MAX = torch.finfo(torch.float32).max  # GradScaler keeps its scale in fp32: a larger one is inf


def _loss_scale(name: str, value: Any) -> float:
    """A first loss scale: a positive number that fp32, where the scalers keep it, holds as a finite value."""
    value = params.positive_number(name, value)
    if value > FP32_MAX:
        raise ValueError(f"{name}={value!r} would be inf in fp32, where the loss scalers keep the scale; choose at "
                         f"most fp32's largest value, {FP32_MAX:.8g} (2.0**127 is the largest power of two below it)")
    return value


def resolve_parameters(S: params.Setup, *, MODEL, BATCH, SEQ_LEN, STEPS, LR, INIT_SCALE, GROWTH_INTERVAL, LOG2_SCALES, REPS,
                       CPU_THREADS) -> dict:
    """Notebook 03's parameters, validated at once and with the profile's
    defaults filled in: {name: value}. Raises ValueError naming the first bad parameter: LR must be finite,
    INIT_SCALE finite in fp32 (at most its largest value, about 2**128), LOG2_SCALES ints in 0..100."""
    R = S.resolve
    out = {"MODEL": R("MODEL", MODEL, smoke="tiny", full="gpt2", check=lambda n, v: params.choose(n, v, PRESETS)),
           "BATCH": R("BATCH", BATCH, smoke=4, full=16, check=params.positive),
           "SEQ_LEN": R("SEQ_LEN", SEQ_LEN, smoke=32, full=512, check=params.positive),
           "STEPS": R("STEPS", STEPS, smoke=12, full=120, check=params.positive)}
    out["LR"] = R("LR", LR, smoke=1e-3, full=3e-4, check=params.positive_number)
    out["INIT_SCALE"] = R("INIT_SCALE", INIT_SCALE, smoke=2.0**12, full=2.0**16, check=_loss_scale)
    out["GROWTH_INTERVAL"] = R("GROWTH_INTERVAL", GROWTH_INTERVAL, smoke=out["STEPS"], full=50, check=params.positive)
    out["LOG2_SCALES"] = R("LOG2_SCALES", LOG2_SCALES, smoke=list(range(0, 25, 4)), full=list(range(0, 33, 4)),
                           check=check_log2_scales)
    out["REPS"] = R("REPS", REPS, smoke=5, full=10, check=params.positive)
    out["CPU_THREADS"] = R("CPU_THREADS", CPU_THREADS, smoke=1, full=1, check=params.positive)
    cfg = GPTConfig.preset(out["MODEL"], seq_len=out["SEQ_LEN"])
    params.fits("SEQ_LEN", out["SEQ_LEN"], footprint.training_floor_bytes(cfg, out["BATCH"]), S.device,
                f"a training step of {out['MODEL']} at BATCH={out['BATCH']}")
    return out


# ---------------------------------------------------------------- the formats: figures and the panel

def bit_layout_figure(names: Iterable[str] = FORMATS):
    """One horizontal bar per format: sign, exponent and mantissa bits, to scale."""
    names = list(names)
    fig, ax = plots.figure(figsize=(7.0, 0.45 * len(names) + 0.8))
    for row, name in enumerate(reversed(names)):
        f = facts(name)
        start = 0
        for width, color, label in ((1, plots.COLORS[1], "sign"), (f.exponent_bits, plots.COLORS[0], "exponent"),
                                    (f.mantissa_bits, plots.COLORS[2], "mantissa")):
            ax.barh(row, width, left=start, color=color, edgecolor="white", label=label if row == 0 else None)
            if width > 1:
                ax.text(start + width / 2, row, str(width), ha="center", va="center", color="white", fontsize=8)
            start += width
    ax.set_yticks(range(len(names)), list(reversed(names)))
    ax.set_xlabel("bits")
    ax.set_title("bit layout: sign | exponent | mantissa")
    ax.grid(False)
    ax.legend(ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.25))
    fig.tight_layout()
    return fig


def visible_span(lo: float, hi: float, view: tuple[float, float]) -> tuple[float, float] | None:
    """The part of the interval [lo, hi] inside `view` = (left, right), or None when they do not overlap.

    Bands whose bounds mix a format's constants with the data's extent (everything below the
    underflow threshold, down to the smallest value in the data) are empty or reversed whenever the
    data lies entirely on one side; clipping to the view and dropping empty spans draws only what exists.
    """
    a, b = max(lo, view[0]), min(hi, view[1])
    return (a, b) if a < b else None


def range_panel(fmt: str, distribution: str, log2_scale: int = 0, *, samples: dict[str, torch.Tensor]):
    """Notebook 03: values of `distribution` × 2**log2_scale rounded to `fmt`: what survives, underflows, overflows.

    The scaling is done in fp64, so a value scaled past fp32's range is counted as overflow (or
    underflow) of `fmt` instead of being lost as an fp32 inf (or 0) before it is classified.
    Shaded bands (rounds to 0, subnormal, overflows) are drawn only where they overlap the data's range;
    the printed line names the bands that lie outside it. Returns the figure.
    """
    if distribution not in samples:
        raise ValueError(f"distribution={distribution!r} is unknown; choose one of {list(samples)}")
    if isinstance(log2_scale, bool) or not isinstance(log2_scale, int) or abs(log2_scale) > 512:
        raise ValueError(f"log2_scale={log2_scale!r} must be an int in -512..512")
    f = facts(fmt)
    x = samples[distribution].flatten().double()
    x = x[torch.isfinite(x) & (x != 0)] * 2.0**log2_scale  # fp64: no intermediate overflow or underflow
    c = classify(x, fmt)
    fig, ax = plots.figure()
    logs = x.abs().log2()
    view = (logs.min().item() - 1, logs.max().item() + 1) if logs.numel() else (-1.0, 1.0)
    ax.hist(logs.numpy(), bins=120, color=plots.COLORS[0], alpha=0.8)
    lo, sub, top = math.log2(f.smallest_subnormal), math.log2(f.smallest_normal), math.log2(f.max)
    outside = []
    for (a, b), color, alpha, label in (((-math.inf, lo - 1), 1, 0.15, "rounds to 0"),
                                        ((lo - 1, sub), 3, 0.2, "subnormal (fewer bits)"),
                                        ((top, math.inf), 4, 0.15, "overflows")):
        span = visible_span(a, b, view)
        if span:
            ax.axvspan(*span, color=plots.COLORS[color], alpha=alpha, label=label)
        else:
            outside.append(label.split(" (")[0])
    ax.set_xlim(*view)
    print(f"{distribution} × 2^{log2_scale} in {fmt}: {c['underflow']:.2%} underflow to 0, "
          f"{c['subnormal']:.2%} subnormal, {c['normal']:.2%} normal, {c['overflow']:.2%} overflow (n={c['n']})"
          + (f"; outside these values' range, not drawn: {', '.join(outside)}" if outside else ""))
    ax.set_xlabel("log2 |value|")
    ax.set_ylabel("count")
    ax.set_title(f"{distribution} × 2^{log2_scale} in {fmt}")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------- gradients against the formats

def thin(values: list[torch.Tensor], max_values: int) -> torch.Tensor:
    """Every k-th entry of each flattened tensor, on the CPU: about max_values (at most one more per tensor)."""
    total = sum(v.numel() for v in values)
    stride = max(1, math.ceil(total / max_values))
    return torch.cat([v.detach().flatten()[::stride].float().cpu() for v in values])


def gradient_samples(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor,
                     max_values: int = 4_000_000) -> dict[str, torch.Tensor]:
    """|gradient| values of one fp32 backward: every parameter, and every Linear layer's output.

    Large models are thinned to at most `max_values` per kind by keeping every k-th value, which keeps
    each tensor's share of the sample proportional to its size.
    """
    outputs: list[torch.Tensor] = []
    hooks = [m.register_full_backward_hook(lambda mod, gin, gout: outputs.append(gout[0].detach()))
             for m in model.modules() if isinstance(m, torch.nn.Linear)]
    try:
        model.zero_grad(set_to_none=True)
        model(x, y)[1].backward()
    finally:
        for h in hooks:
            h.remove()
    weights = thin([p.grad for p in model.parameters() if p.grad is not None], max_values).abs()
    model.zero_grad(set_to_none=True)
    return {"weight gradients": weights, "activation gradients": thin(outputs, max_values).abs()}


def underflow_rows(grad_samples: dict[int, dict[str, torch.Tensor]], scale: float) -> list[list]:
    """Rows of notebook 03's gradient table: per step and kind, median |g| and where fp16/bf16 put the values.

    grad_samples: {step: {kind: |gradient| values}} from `gradient_samples`; scale: a loss scale.
    The product with `scale` is taken in fp64, so a scale that pushes values past fp32's range shows
    as overflow instead of an fp32 inf that `classify` would leave out.
    """
    rows = []
    for step, samples in grad_samples.items():
        for kind, v in samples.items():
            c16, cbf = classify(v, "fp16"), classify(v, "bf16")
            scaled = classify(v.double() * scale, "fp16")
            rows.append([step, kind, f"{v[v > 0].median().item():.2e}", f"{c16['underflow']:.2%}",
                         f"{c16['subnormal']:.2%}", f"{cbf['underflow']:.2%}", f"{scaled['underflow']:.2%}",
                         f"{scaled['overflow']:.2%}"])
    return rows


def gradient_sentences(grad_samples: dict[int, dict[str, torch.Tensor]]) -> list[str]:
    """What notebook 03's gradient table shows, as sentences generated from its numbers."""
    first, last = min(grad_samples), max(grad_samples)
    med = {(s, k): v[v > 0].median().item() for s, d in grad_samples.items() for k, v in d.items()}
    w, a = med[(last, "weight gradients")], med[(last, "activation gradients")]
    c = {k: classify(v, "fp16") for k, v in grad_samples[last].items()}
    cbf = max(classify(v, "bf16")["underflow"] for v in grad_samples[last].values())
    out = [f"At step {last} the median gradient flowing into a linear layer's output was {a:.2e}, "
           f"{'smaller' if a < w else 'larger'} than the median parameter gradient ({w:.2e}) by a factor of "
           f"{max(a, w) / min(a, w):.1f}; fp16 would flush {c['activation gradients']['underflow']:.2%} of the "
           f"former and {c['weight gradients']['underflow']:.2%} of the latter to 0, and keep "
           f"{c['activation gradients']['subnormal']:.2%} of the former only as subnormals (fewer bits)."]
    a0 = med[(first, "activation gradients")]
    if last != first:
        out.append(f"Between step {first} and step {last} that median went from {a0:.2e} to {a:.2e}: "
                   + ("training made these gradients smaller." if a < a0 else "it did not shrink in this run."))
    out.append(f"bf16 has fp32's exponent range: at most {cbf:.2%} of either kind would round to 0 in bf16.")
    return out


# ---------------------------------------------------------------- loss scaling

def check_log2_scales(name: str, values: Any) -> list[int]:
    """`values` as a list if it is a non-empty list of ints in 0..100 (log2 of loss scales), else ValueError naming `name`."""
    if isinstance(values, (str, bytes)) or not isinstance(values, (list, tuple)) or not values:
        raise ValueError(f"{name}={values!r} must be a non-empty list of ints in 0..100")
    for k in values:
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= 100:
            raise ValueError(f"{name}={values!r}: entry {k!r} must be an int in 0..100")
    return list(values)


def static_scaling_sweep(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, log2_scales: list[int],
                         device: str) -> list[dict[str, Any]]:
    """Backward of S·L under fp16 autocast for each S = 2**k in `log2_scales`, compared with fp32 gradients.

    Returns one dict per scale: log2_scale, zero_fraction (share of the fp32 gradient's nonzero entries
    that came out 0), finite (no inf/NaN anywhere), rel_error (‖g/S − g32‖ / ‖g32‖; inf when not finite).
    Raises ValueError unless `log2_scales` is a non-empty list of ints in 0..100 (`check_log2_scales`).
    """
    log2_scales = check_log2_scales("log2 scales", log2_scales)
    model.zero_grad(set_to_none=True)
    model(x, y)[1].backward()
    ref = torch.cat([p.grad.flatten() for p in model.parameters()])
    rows = []
    for k in log2_scales:
        model.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=torch.float16):
            loss = model(x, y)[1]  # autocast computes the loss in fp32, so S·L cannot overflow before backward
        (loss * 2.0**k).backward()
        got = torch.cat([p.grad.flatten() for p in model.parameters()]) / 2.0**k
        finite = bool(torch.isfinite(got).all())
        lost = ((got == 0) & (ref != 0)).sum().item() / max(1, (ref != 0).sum().item())
        err = ((got - ref).norm() / ref.norm()).item() if finite else math.inf
        rows.append({"log2_scale": k, "zero_fraction": lost, "finite": finite, "rel_error": err})
    model.zero_grad(set_to_none=True)
    return rows


def scaling_window(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The usable window of a static sweep: finite scales, the first that overflowed, the best error."""
    finite = [r for r in rows if r["finite"]]
    over = [r["log2_scale"] for r in rows if not r["finite"]]
    best = min(finite, key=lambda r: r["rel_error"]) if finite else None
    return {"finite": [r["log2_scale"] for r in finite], "first_overflow": min(over) if over else None,
            "best": best, "unscaled": next((r for r in rows if r["log2_scale"] == 0), None)}


def scaling_sweep_sentence(rows: list[dict[str, Any]]) -> str:
    """The static sweep's result in words, generated from its rows."""
    w = scaling_window(rows)
    if not w["finite"]:
        return "Every scale in this sweep overflowed: the window lies below the smallest scale tried."
    below = [k for k in w["finite"] if w["first_overflow"] is None or k < w["first_overflow"]]
    if not below:
        return (f"The smallest scale tried, 2^{min(r['log2_scale'] for r in rows)}, already overflowed: "
                f"the window lies below this sweep.")
    lo, hi = min(below), max(below)
    first = {r["log2_scale"]: r for r in rows}[lo]
    least = min((r for r in rows if r["finite"]), key=lambda r: r["zero_fraction"])
    text = (f"At S = 2^{lo} fp16 lost {first['zero_fraction']:.3%} of the gradient entries to 0 with a relative "
            f"error of {first['rel_error']:.2e}; the fewest were lost at S = 2^{least['log2_scale']} "
            f"({least['zero_fraction']:.3%}), and the smallest error was {w['best']['rel_error']:.2e} at "
            f"S = 2^{w['best']['log2_scale']}. ")
    if w["first_overflow"] is None:
        text += f"No scale up to 2^{hi} overflowed: the window's upper edge lies beyond this sweep."
    else:
        over = ", ".join(f"2^{r['log2_scale']}" for r in rows if not r["finite"])
        text += (f"At S = {over} the gradients held inf or NaN, so such a step is useless: "
                 f"the gradients stayed finite from 2^{lo} to 2^{hi}, and the window's upper edge lies between "
                 f"2^{hi} and 2^{w['first_overflow']} (red crosses in the figure mark the overflows).")
    if first["rel_error"] < 1.5 * w["best"]["rel_error"]:
        text += (f" At 2^{lo} the error was already within 1.5× of the best: here fp16's rounding, not underflow, "
                 f"dominates the error in the gradient's norm; what underflow costs is the entries lost to 0.")
    return text


def scaling_sweep_figure(rows: list[dict[str, Any]]):
    """Lost share and relative error against log2 S; overflowing scales and 0% losses marked, not dropped."""
    xs = [r["log2_scale"] for r in rows]
    fig = plots.sweep(xs, {"gradients lost to 0 (%)": [100 * r["zero_fraction"] if r["finite"] and r["zero_fraction"]
                                                       else None for r in rows],
                           "relative error vs fp32 (%)": [100 * r["rel_error"] if r["finite"] else None for r in rows]},
                      xlabel="log2 of the loss scale S", ylabel="percent (log scale)", logx=False, logy=True,
                      title="static loss scaling, fp16 autocast")
    ax = fig.axes[0]
    edge = ax.get_xaxis_transform()  # x in data, y in axes fraction: markers at the top and bottom edges
    over = [r["log2_scale"] for r in rows if not r["finite"]]
    if over:
        ax.scatter(over, [0.95] * len(over), transform=edge, marker="x", s=60, color="red", clip_on=False,
                   label="overflow: inf/NaN in the gradients")
    nothing_lost = [r["log2_scale"] for r in rows if r["finite"] and r["zero_fraction"] == 0]
    if nothing_lost:
        ax.scatter(nothing_lost, [0.05] * len(nothing_lost), transform=edge, marker="v", s=50,
                   color=plots.COLORS[0], label="0% lost (cannot sit on a log axis)")
    ax.set_xlim(min(xs) - 1, max(xs) + 1)
    ax.legend(fontsize=8)
    return fig


def compare_scalers(model: torch.nn.Module, batches: list, *, init_scale: float, growth_interval: int,
                    steps: int, inject: dict[int, float], device: str,
                    scaler_class: type = DynamicLossScaler) -> dict[str, Any]:
    """Drive our scaler (`scaler_class`, DynamicLossScaler or a class built from notebook 03's cells) and
    torch.amp.GradScaler with the same scaled gradients, inf/NaN injected.

    Each step computes the gradients of scale·loss once and hands copies to both scalers, each with its
    own SGD copy of the parameters; `inject` maps a step to a value written into one gradient. Returns
    {"ours": [(scale, skipped)], "torch": [...], "params": (ours, torch)} for the caller to compare.
    """
    ours = scaler_class(init_scale, growth_interval=growth_interval)
    theirs = torch.amp.GradScaler(device, init_scale=init_scale, growth_interval=growth_interval)
    copies = {k: [torch.nn.Parameter(p.detach().clone()) for p in model.parameters()] for k in ("ours", "torch")}
    opts = {k: torch.optim.SGD(v, lr=1e-3) for k, v in copies.items()}
    trajectory: dict[str, list] = {"ours": [], "torch": []}
    for i in range(steps):
        x, y = batches[i % len(batches)]
        loss = model(x, y)[1]
        scaled = ours.scale(loss)
        if scaled.item() != theirs.scale(loss).item():
            raise AssertionError(f"step {i}: the scaled losses differ going in")
        grads = torch.autograd.grad(scaled, list(model.parameters()))
        for key, scaler in (("ours", ours), ("torch", theirs)):
            before = scaler.get_scale()
            for p, g in zip(copies[key], grads):
                p.grad = g.clone()
            if i in inject:
                copies[key][i % 4].grad.view(-1)[0] = inject[i]
            scaler.step(opts[key])
            scaler.update()
            trajectory[key].append((scaler.get_scale(), scaler.get_scale() < before))
    return {**trajectory, "params": (copies["ours"], copies["torch"])}
