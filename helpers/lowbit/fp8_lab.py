"""Notebook 07's parameters and its numerics: formats side by side, quantisation error on the course GPT's tensors
(with a planted outlier channel, and the instructor panel), delayed vs current scaling, and our Float8Linear
against torchao's, on one linear and on the whole GPT.

- `resolve_parameters`: the notebook's parameters validated at once.
- Formats: `format_rows`, `grid_figure`.
- Real tensors: `capture` (a layer's input, weight and output gradient), `plant_outlier`, `error_rows`,
  `outlier_sweep`, `outlier_histogram`, `mx_clipped_blocks`, `quant_panel` (the panel's callback).
- `delayed_vs_current`: overflow and underflow per step of current and delayed scaling.
- Parity: `linear_parity`, `gpt_parity`.

The formats and recipes are `helpers.lowbit.fp8`, the layer `helpers.lowbit.fp8_linear`; training with FP8 and
its speed are measured by `helpers.lowbit.fp8_train_lab`.
"""
from __future__ import annotations

import copy
import math

import torch

from helpers.gpt.model import GPT, PRESETS, GPTConfig
from helpers.lowbit import fp8, fp8_linear
from helpers.measure import params
from helpers.measure.params import positive, positive_number
from helpers.show import plots
from helpers.training import precision
from helpers.gpt import footprint


# ---------------------------------------------------------------- the parameters

MAX_OUTLIER = 2.0**64  # OUTLIER x the activations' amax must stay finite in fp32 (max ~2**128)


def _outlier(name: str, value) -> float:
    """The planted outlier, in multiples of the amax: a positive number up to MAX_OUTLIER."""
    value = positive_number(name, value)
    if value > MAX_OUTLIER:
        raise ValueError(f"{name}={value!r} is too large: the planted value, {name} x the activations' amax, must stay "
                         f"finite in fp32 (largest {torch.finfo(torch.float32).max:.3g}); choose at most 2.0**64 "
                         "(tensorwise scaling already loses every ordinary entry from about 2.0**18)")
    return value


def resolve_parameters(S: params.Setup, *, MODEL, BATCH, SEQ_LEN, STEPS, LR, LAYER, OUTLIER, BLOCK, HISTORY_LEN,
                       MATMUL_SIZES, REPS, COMPILE_LINEAR) -> dict:
    """Notebook 07's parameters, validated at once and with the profile's defaults filled in: {name: value},
    plus "CFG" (the GPTConfig trained) and "LINEARS" (its linears but the LM head, LAYER's choices).

    Raises ValueError naming the first bad parameter, and where a later cell could not use a value:
    STEPS below 2 (the noise of the last training losses is their standard deviation, which needs two),
    a non-finite LR, an OUTLIER above 2**64 (planted into fp32 activations it would be inf, and every
    error measured with it NaN). Builds the GPT once (on the CPU) to list its linears. COMPILE_LINEAR (a bool,
    False by default) compiles each layer of the speed sweep.
    """
    R = S.resolve
    out = {"MODEL": R("MODEL", MODEL, smoke="tiny", full="small10m", check=lambda n, v: params.choose(n, v, PRESETS)),
           # full: a step's eager kernels cost host time, not FLOPs, at this size: twice the batch for half the
           # steps trains on as many tokens in about half the time
           "BATCH": R("BATCH", BATCH, smoke=4, full=32, check=params.positive),
           "SEQ_LEN": R("SEQ_LEN", SEQ_LEN, smoke=64, full=256, check=params.positive),
           "STEPS": R("STEPS", STEPS, smoke=12, full=100, check=params.positive)}
    if out["STEPS"] < 2:
        raise ValueError(f"STEPS={out['STEPS']} is too few: the training comparison measures the noise of the last "
                         "losses as their standard deviation, which needs at least 2 steps")
    out["LR"] = R("LR", LR, smoke=1e-3, full=1e-3, check=positive_number)
    cfg = GPTConfig.preset(out["MODEL"], seq_len=out["SEQ_LEN"])
    params.fits("SEQ_LEN", out["SEQ_LEN"], footprint.training_floor_bytes(cfg, out["BATCH"]), S.device,
                f"a training step of {out['MODEL']} at BATCH={out['BATCH']}")
    linears = [n for n, m in GPT(cfg).named_modules() if isinstance(m, torch.nn.Linear) and n != "lm_head"]
    out["LAYER"] = R("LAYER", LAYER, smoke="blocks.0.mlp.down", full="blocks.0.mlp.down",
                     check=lambda n, v: params.choose(n, v, linears))
    out["OUTLIER"] = R("OUTLIER", OUTLIER, smoke=2.0**12, full=2.0**12, check=_outlier)
    out["BLOCK"] = R("BLOCK", BLOCK, smoke=128, full=128, check=params.positive)
    out["HISTORY_LEN"] = R("HISTORY_LEN", HISTORY_LEN, smoke=8, full=8, check=params.positive)
    out["MATMUL_SIZES"] = R("MATMUL_SIZES", MATMUL_SIZES, smoke=[256, 512], full=[1024, 2048, 4096, 8192],
                            check=params.positives)
    out["REPS"] = R("REPS", REPS, smoke=3, full=20, check=params.positive)
    out["COMPILE_LINEAR"] = R("COMPILE_LINEAR", COMPILE_LINEAR, smoke=False, full=False, check=params.boolean)
    return {**out, "CFG": cfg, "LINEARS": linears}


# ---------------------------------------------------------------- formats

def format_rows(names=("fp8-e4m3fn", "fp8-e5m2", "bf16")) -> list[list]:
    """One row per format: bits, max, smallest normal and subnormal, eps, dynamic range in binades."""
    rows = []
    for name in names:
        f = precision.facts(name)
        binades = math.log2(f.max / f.smallest_subnormal)
        rows.append([name, f"1/{f.exponent_bits}/{f.mantissa_bits}", f.max, f.smallest_normal, f.smallest_subnormal,
                     f.eps, f"{binades:.1f}"])
    return rows


def grid_figure(ax=None):
    """The positive values of e4m3fn and e5m2 on a log2 axis, bf16's range drawn behind them."""
    fig, ax = plots.axes(ax, "every positive fp8 value, on a log2 axis")
    bf = precision.facts("bf16")
    for i, dtype in enumerate((fp8.E4M3, fp8.E5M2)):
        g = fp8.grid(dtype)[1:]
        ax.plot(g.log2().numpy(), [i] * len(g), "|", ms=14, color=plots.COLORS[i],
                label=f"{fp8.FORMAT_NAMES[dtype]}: {len(g)} values")
    ax.axvspan(math.log2(bf.smallest_normal), 20, color=plots.COLORS[3], alpha=0.12,
               label="bf16 normals reach 2^-126 … 2^127 (cut at 2^20)")
    ax.set_yticks([0, 1], ["e4m3fn", "e5m2"])
    ax.set_ylim(-0.8, 1.8)
    ax.set_xlim(-18, 20)
    ax.set_xlabel("log2 |value|")
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------- real tensors

def capture(model: torch.nn.Module, layer: str, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
    """One forward+backward of `model` on (x, y); the 2-D input, weight and output gradient of `layer`."""
    mod = dict(model.named_modules())[layer]
    got = {}
    h1 = mod.register_forward_hook(lambda m, inp, out: got.__setitem__("activations", inp[0].detach()))
    h2 = mod.register_full_backward_hook(lambda m, gin, gout: got.__setitem__("output gradients", gout[0].detach()))
    try:
        model.zero_grad(set_to_none=True)
        model(x, y)[1].backward()
    finally:
        h1.remove(), h2.remove()
    model.zero_grad(set_to_none=True)
    flat = lambda t: t.reshape(-1, t.shape[-1]).float().clone()  # noqa: E731
    return {"activations": flat(got["activations"]), "weights": mod.weight.detach().float().clone(),
            "output gradients": flat(got["output gradients"])}


def mx_clipped_blocks(x: torch.Tensor, dtype: torch.dtype = fp8.E4M3) -> tuple[int, int]:
    """(blocks whose top value MX's floor rule pushes past `fp8.saturation_threshold`, so the clamp cuts it;
    all nonzero blocks) for x's MX blocks of 32 along the last dim. The spec's shared exponent
    floor(log2 amax) - emax puts amax·scale in [2**emax, 2**(emax+1)): for e4m3 [256, 512), past the threshold
    (464) when amax's mantissa exceeds 1.8125."""
    q, scale = fp8.mx(x, dtype)
    K = x.shape[-1]
    tiles = torch.nn.functional.pad(x.float(), (0, -K % fp8.MX_BLOCK)).view(*x.shape[:-1], -1, fp8.MX_BLOCK)
    top = tiles.abs().amax(dim=-1)
    clipped = (top * scale > fp8.saturation_threshold(dtype)) & (top > 0)
    return int(clipped.sum()), int((top > 0).sum())


def plant_outlier(x: torch.Tensor, magnitude: float, channel: int = 7, every: int = 8) -> torch.Tensor:
    """A copy of x (M, K) whose column `channel` is set to magnitude × x's amax on every `every`-th row
    (an outlier channel carried by some tokens, as in LLM.int8(), Dettmers et al., 2022)."""
    positive("magnitude", float(magnitude) if type(magnitude) is int else magnitude, float)
    out = x.clone()
    out[::every, channel % x.shape[1]] = magnitude * x.abs().max()
    return out


def error_rows(tensors: dict[str, torch.Tensor], recipes=fp8.NUMERIC_RECIPES, block: int = 128,
               masks: dict[str, torch.Tensor] | None = None) -> list[dict]:
    """Quantisation error of every recipe on every tensor: dicts with tensor, recipe and error_stats.

    masks[name], if given, marks entries (the planted outliers) left out of that tensor's error: they
    are quantised with the rest, but the error is measured on the ordinary entries only.
    """
    rows = []
    for name, t in tensors.items():
        keep = ~masks[name] if masks and name in masks else torch.ones_like(t, dtype=torch.bool)
        for r in recipes:
            q = fp8.quantise(t, r, block=block)
            rows.append({"tensor": name, "recipe": r, **fp8.error_stats(t * keep, q * keep)})
    return rows


def outlier_sweep(x: torch.Tensor, log2s, block: int = 128) -> dict[str, list[float]]:
    """Per-row relative error of the ordinary entries of x with an outlier channel of 2**k × amax planted,
    for each k in log2s (k = 0 plants none); {recipe: [error per k]}."""
    out = {r: [] for r in fp8.NUMERIC_RECIPES}
    for k in log2s:
        planted = plant_outlier(x, 2.0 ** k) if k > 0 else x
        mask = planted != x
        for r in out:
            out[r].append(error_rows({"x": planted}, (r,), block, {"x": mask})[0]["row_rel_error"])
    return out


def outlier_histogram(x: torch.Tensor, ax=None, title: str = ""):
    """Histogram of log2(|x| / amax): against the tensor's amax (tensorwise) and each row's (rowwise),
    with the e4m3 limits: below the subnormal line values keep fewer bits, below the zero line they vanish."""
    fig, ax = plots.axes(ax, title or "where the values sit, relative to the amax that scales them")
    a = x.detach().abs().float().cpu()
    f = fp8.facts(fp8.E4M3)
    for i, (label, ref) in enumerate((("|x| / tensor amax (tensorwise)", a.max()),
                                      ("|x| / row amax (rowwise)", a.amax(dim=-1, keepdim=True)))):
        r = (a / ref)[a > 0]
        ax.hist(r.log2().numpy(), bins=100, alpha=0.55, color=plots.COLORS[i], label=label)
    ax.axvline(math.log2(f.smallest_normal / f.max), ls="--", color=plots.COLORS[3], label="e4m3: subnormal below")
    ax.axvline(math.log2(f.underflow_threshold / f.max), ls="--", color=plots.COLORS[4], label="e4m3: rounds to 0 below")
    ax.set_xlabel("log2 (|x| / amax)")
    ax.set_ylabel("entries")
    ax.set_yscale("log")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def quant_panel(recipe: str, block: int, log2_outlier: int, *, x: torch.Tensor):
    """The instructor panel's callback: plant an outlier channel of 2**log2_outlier × amax into x (0: none),
    quantise with `recipe` (blockwise tiles of 1 × block), print the error of the ordinary entries and
    draw (left) where the scaled values |x·scale| land on E4M3's range and (right) each row's error.
    Returns the error stats."""
    planted = plant_outlier(x, 2.0 ** log2_outlier) if log2_outlier > 0 else x
    keep = planted == x
    q, s = fp8.element_scales(planted, recipe, block=block)  # quantised once, for the error and the figure
    deq = (q.float() / s).reshape(planted.shape)
    stats = fp8.error_stats(planted * keep, deq * keep)  # as error_rows measures it, the outliers left out
    used = {"blockwise": f"tiles of 1x{block}", "mx": "MX blocks of 32"}.get(recipe, "one scale per " +
                                                                           ("tensor" if recipe == "tensorwise" else "row"))
    label = f"recipe={recipe}, block={block} ({used}), log2_outlier={log2_outlier}"
    print(f"{label}: ordinary entries' per-row relative error {stats['row_rel_error']:.4f} "
          f"(SNR {stats['row_snr_db']:.1f} dB)")
    fig, (ax1, ax2) = plots.figure(ncols=2, figsize=(11, 3.8))
    y = (planted.abs() * s)[keep & (planted != 0)].cpu()
    ax1.hist(y.log2().numpy(), bins=100, color=plots.COLORS[0], alpha=0.7, label="ordinary entries")
    f = fp8.facts(fp8.E4M3)
    for v, name, c in ((f.max, "e4m3 max", 1), (f.smallest_normal, "subnormal below", 3),
                       (f.underflow_threshold, "rounds to 0 below", 4)):
        ax1.axvline(math.log2(v), ls="--", color=plots.COLORS[c], label=name)
    ax1.set(xlabel="log2 |x · scale| (what is cast)", ylabel="entries", yscale="log")
    ax1.legend(fontsize=8)
    x2, d2 = (planted * keep).reshape(-1, x.shape[-1]), ((planted - deq) * keep).reshape(-1, x.shape[-1])
    row_err = (d2.norm(dim=-1) / x2.norm(dim=-1).clamp(min=1e-30)).cpu()
    ax2.plot(row_err.numpy(), lw=0.8, color=plots.COLORS[2])
    ax2.set(xlabel="row (token)", ylabel="relative error of the row", yscale="log")
    fig.suptitle(label, fontsize=10)
    fig.tight_layout()
    return stats


# ---------------------------------------------------------------- delayed vs current

def delayed_vs_current(x: torch.Tensor, multipliers: list[float], history_len: int, margin: int = 0) -> list[dict]:
    """Cast x × m for each step's multiplier m with current (tensorwise) scaling and with delayed
    scaling ("max" and "most_recent"); per step the overflow and underflow counts of each."""
    scalers = {"delayed max": fp8.DelayedScaler(history_len, margin, "max"),
               "delayed most_recent": fp8.DelayedScaler(history_len, margin, "most_recent")}
    rows = []
    for step, m in enumerate(multipliers):
        t = x * m
        row = {"step": step, "multiplier": m, "current": fp8.cast_counts(t, fp8.tensorwise(t)[1])}
        for name, sc in scalers.items():
            row[name] = fp8.cast_counts(t, sc.scale)
            sc.update(t.abs().max().item())
        rows.append(row)
    return rows


# ---------------------------------------------------------------- parity

def _grads(module: torch.nn.Module) -> list[torch.Tensor]:
    return [p.grad for p in module.parameters()]


def linear_parity(recipe: str, shape=(2, 48, 96), out_features: int = 64, seed: int = 0,
                  matmul: type | None = None) -> dict:
    """Our Float8Linear against torchao's on one linear: forward bitwise equal? max |difference| of the
    output, dX, dW, db; and our _scaled_mm path against our fp32 emulation (max |difference|). `matmul`: the
    autograd Function our layer applies (None: fp8_linear.Float8Matmul; notebook 07 passes its cell's)."""
    torch.manual_seed(seed)
    lin = torch.nn.Linear(shape[-1], out_features)
    ours = fp8_linear.Float8Linear.from_linear(copy.deepcopy(lin), recipe)
    ours.matmul = matmul or ours.matmul
    ref = torch.nn.Sequential(copy.deepcopy(lin))
    fp8_linear.torchao_convert(ref, recipe)
    x = torch.randn(*shape) * 4
    g = torch.randn(*shape[:-1], out_features)
    outs = []
    for mod in (ours, ref):
        xi = x.clone().requires_grad_()
        y = mod(xi)
        y.backward(g)
        outs.append([y.detach(), xi.grad] + _grads(mod))
    with fp8_linear.emulated():
        y_emu = ours(x)
    diff = lambda a, b: (a - b).abs().max().item()  # noqa: E731
    (y1, dx1, dw1, db1), (y2, dx2, dw2, db2) = outs
    return {"recipe": recipe, "forward_bitwise": torch.equal(y1, y2), "y": diff(y1, y2), "dX": diff(dx1, dx2),
            "dW": diff(dw1, dw2), "db": diff(db1, db2), "emulated_vs_scaled_mm": diff(y_emu, y1),
            "y_scale": y1.abs().max().item()}


def gpt_parity(base: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, recipe: str,
               matmul: type | None = None) -> dict:
    """The whole GPT converted by us and by torchao: loss difference and the largest gradient difference
    relative to that gradient's largest entry. `matmul` as in `linear_parity`, for every converted linear."""
    ours, ref = copy.deepcopy(base), copy.deepcopy(base)
    fp8_linear.convert_to_float8(ours, recipe)
    for layer in ours.modules():
        if isinstance(layer, fp8_linear.Float8Linear) and matmul is not None:
            layer.matmul = matmul
    fp8_linear.torchao_convert(ref, recipe)
    losses = []
    for model in (ours, ref):
        model.zero_grad(set_to_none=True)
        loss = model(x, y)[1]
        loss.backward()
        losses.append(loss.item())
    rel = max(((a - b).abs().max() / b.abs().max().clamp(min=1e-30)).item()
              for a, b in zip(_grads(ours), _grads(ref)) if b is not None)
    return {"recipe": recipe, "loss_ours": losses[0], "loss_torchao": losses[1],
            "loss_diff": abs(losses[0] - losses[1]), "grad_rel_diff": rel}


# ---------------------------------------------------------------- the takeaways

def takeaways(*, parity: list, gpt_parity: list, parity_skip: dict, ao_skip: dict, torchao_version: str | None,
              device: str, outlier: float, errors: dict, clean: dict, order_holds: bool, clipped: int, blocks: int,
              worse: list, log2s: list, history_len: int, spike: float, spike_row: dict, fall: dict, steps: int,
              gaps: dict, baseline: str, reorder_gap: float, verdict: dict, no_speed: str | None, largest_n: int,
              head, linear_ratio: float | None, gpt_ratio: float | None, matmul_ratio: float | None) -> list[str]:
    """Notebook 07's takeaway bullets, generated from the run's numbers: parity with torchao (and what was not
    compared, with why; torchao_version None when torchao is absent), the planted outlier's per-row `errors` and
    the `clean` ones by recipe, delayed scaling at the spike (`spike_row`, one step of delayed_vs_current) and
    after the fall (`fall`: entries lost to 0 per scheme), the training gaps, the speed claim's `verdict` and
    the speed ratios at `largest_n` (`head`: matmul_speedup's result or None)."""
    from helpers.measure import claims

    out = []
    if parity:
        loss = max(p["loss_diff"] for p in gpt_parity) if gpt_parity else None
        out.append(f"- Built from scratch, our {' and '.join(p['recipe'] for p in parity)} Float8Linear equal"
                   f"{'s' if len(parity) == 1 else ''} torchao {torchao_version} bit for bit in forward; the "
                   f"largest gradient difference was {max(max(p['dX'], p['dW']) for p in parity):.2g}"
                   + (f", and the whole GPT's loss ({', '.join(p['recipe'] for p in gpt_parity)}) "
                      + ("was identical." if loss == 0 else f"differed by at most {loss:.2g}.") if gpt_parity
                      else "; the whole GPT was not compared."))
    for r in fp8_linear.TORCHAO_RECIPES if torchao_version is not None else ():  # the single linear runs on the CPU
        where = {"single-linear check (CPU)": parity_skip.get(r), f"GPT and training runs ({device})": ao_skip.get(r)}
        where = {w: why for w, why in where.items() if why}
        if where:
            out.append(f"- torchao's {r} recipe was not compared in "
                       + ("any check" if len(where) == 2 else "the " + next(iter(where)))
                       + f": {next(iter(where.values()))}"
                       + ("" if len(set(where.values())) == 1 else f" (on {device}: {ao_skip[r]})"))
    e = errors
    out.append(f"- An outlier is what separates the recipes: with one planted channel at {outlier:g}x amax the ordinary "
               f"entries' per-row error was tensorwise {e['tensorwise']:.4f}, rowwise {e['rowwise']:.4f}, blockwise "
               f"{e['blockwise']:.4f}"
               + (" (tensorwise >= rowwise >= blockwise held)" if order_holds else " (the predicted order did not hold)")
               + f"; without it all recipes were within {max(clean.values()) / min(clean.values()):.2f}x "
               f"({max(clean, key=clean.get)} highest{f'; MX clipped the top of {clipped} of {blocks} blocks' if clipped else ''}), and "
               + (f"tensorwise's error rose by 10% only from an outlier of 2^{worse[0]} x amax on (E4M3 is a float)."
                  if worse else f"tensorwise's error never rose by 10% up to 2^{log2s[-1]} x amax (E4M3 is a float)."))
    out.append(f"- Delayed scaling ('max', {history_len}-step history) saturated {spike_row['delayed max']['overflow']} "
               f"entries at a x{spike:g} amax spike (current scaling: {spike_row['current']['overflow']}) and lost "
               f"{fall['delayed max']} entries to 0 after the amax fell (current scaling: {fall['current']}).")
    out.append(f"- Training {steps} steps: validation-loss gaps to {baseline} from {min(gaps.values()):+.4f} to "
               f"{max(gaps.values()):+.4f}; the same batches in reverse order moved {baseline} itself by {reorder_gap:+.4f}.")
    out.append(f"- The source text's \"about 2x faster than BF16\": {claims.shown(verdict)}"
               + (f" ({verdict['reason']})." if verdict["reason"] and verdict["reason"] != no_speed else "."))
    out.append("- Speed: " + (no_speed + "." if no_speed else
               f"at n={largest_n} the fp8 matmul ran at {head[0] if head else 'n/a'} bf16's speed, our rowwise linear "
               f"fwd+bwd at {linear_ratio or float('nan'):.2f}x, the GPT step at {gpt_ratio or float('nan'):.2f}x (medians)"
               + (": casts and non-matmul work ate part of the matmul's gain." if matmul_ratio and linear_ratio
                  and gpt_ratio and max(linear_ratio, gpt_ratio) < matmul_ratio else ".")))
    return out
