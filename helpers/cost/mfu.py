"""Model FLOPs utilisation: FLOPs of a block's parts, 6N's error, byte models, and training-time arithmetic.

`helpers.cost.flops` counts FLOPs; this module groups that count the ways notebook 02 compares it
(a blog post's three formulas, one block's attention and MLP halves, 6N against the exact count)
turns 6·N·D into GPU-hours and back into MFU, and says when a measured MFU may be given at all (never for a
format this device emulates) and at which shape a universal claim about the halves' efficiency is judged. FLOPs are always the `transformer_flops`
convention (FlopCounterMode's): matmuls only, attention scores for the full T x T square even when a
causal kernel skips half of them.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import replace
from typing import Sequence

import torch

from helpers.cost.flops import COMPONENTS, SECONDS_PER_DAY, matmul_params, six_nd, transformer_flops
from helpers.gpt.model import GPT, GPTConfig
from helpers.measure import hardware
from helpers.measure.claims import judge_interval
from helpers.measure.params import positive, positive_number

SECONDS_PER_HOUR = 3_600
ATTENTION_PARTS = ("qkv", "attn_scores", "attn_values", "attn_out")
CORE_PARTS = ("attn_scores", "attn_values")
MLP_PARTS = ("mlp_up", "mlp_down")
SUBLAYERS = ("attention", "attention_core", "mlp")
GAP_CLAIM, GAP_BAND = 1.7, 1.25  # the blog post's MLP/attention efficiency gap, read as 1.7x within ±25%


# ---------------------------------------------------------------- counting

def source_formula_flops(config: GPTConfig, n_tokens: int) -> dict[str, int]:
    """The per-component formulas of a blog post on LLM scaling laws, taken literally.

    Source: "LLM【スケール則：実装と検証B-4】", section B-4 on measuring compute efficiency.

    h = d_model, D = tokens:
    attention 2·L·D·h², FFN 2·L·D·4h², 'embedding' 2·D·V·h (forward only, one h x h matrix for
    attention, one of the two FFN matrices, and no T-dependent attention term: see notebook 02).
    """
    L, h, V = config.n_layer, config.d_model, config.vocab_size
    return {"attention": 2 * L * n_tokens * h**2, "ffn": 2 * L * n_tokens * 4 * h**2,
            "embedding": 2 * n_tokens * V * h}


def grouped_flops(config: GPTConfig, batch_size: int, seq_len: int, *, key: str = "forward") -> dict[str, int]:
    """`transformer_flops` summed into the source's three groups: attention, ffn, embedding (= LM head)."""
    f = transformer_flops(config, batch_size, seq_len)
    return {"attention": sum(f[c][key] for c in ATTENTION_PARTS), "ffn": sum(f[c][key] for c in MLP_PARTS),
            "embedding": f["embedding"][key] + f["lm_head"][key]}


def sublayer_flops(config: GPTConfig, batch_size: int, seq_len: int, *, backward: bool = False,
                   is_causal: bool = False) -> dict[str, int]:
    """FLOPs of ONE block's attention sub-block, its attention core (scores + values) and its MLP sub-block."""
    one = replace(config, n_layer=1, seq_len=max(seq_len, config.seq_len))
    f = transformer_flops(one, batch_size, seq_len, backward=backward, is_causal=is_causal)
    return {"attention": sum(f[c]["total"] for c in ATTENTION_PARTS),
            "attention_core": sum(f[c]["total"] for c in CORE_PARTS),
            "mlp": sum(f[c]["total"] for c in MLP_PARTS)}


def per_token_breakdown(config: GPTConfig, seq_len: int | None = None) -> dict[str, float]:
    """Training FLOPs per token of each component (forward + backward), at seq_len (default: the config's).

    Every component of `transformer_flops` except the free embedding lookup; the values sum to PaLM's
    6N + 12·L·H·Q·T per token (`flops.palm_flops_per_token` with N = `flops.matmul_params`).
    """
    T = seq_len or config.seq_len
    f = transformer_flops(config, 1, T)
    return {c: f[c]["total"] / T for c in COMPONENTS if c != "embedding"}


# ---------------------------------------------------------------- 6N against the exact count

def all_params(config: GPTConfig) -> int:
    """Every parameter of the course GPT of this shape (a tied LM head counted once), without allocating it."""
    with torch.device("meta"):
        return sum(p.numel() for p in GPT(config).parameters())


def six_n_error(config: GPTConfig, seq_len: int | None = None, n_params: int | None = None) -> dict[str, float]:
    """Why 6 x (all parameters) per token misses the exact training count, as shares of the exact count.

    Returns {"six_n_all": 6N_all / exact - 1 (negative = too low), "attention": the scores-and-values
    term 12·L·T·d it leaves out, "unmultiplied": what the parameters no token is multiplied by (position
    table, biases, LayerNorm) add back}. six_n_all == unmultiplied - attention exactly. `n_params`:
    every parameter of the model when already known (else counted on the meta device).
    """
    T = seq_len or config.seq_len
    n_all = all_params(config) if n_params is None else n_params
    f = transformer_flops(config, 1, T)
    exact = f["total"]["total"] / T
    attention = (f["attn_scores"]["total"] + f["attn_values"]["total"]) / T
    unmultiplied = 6 * (n_all - matmul_params(config))
    return {"six_n_all": 6 * n_all / exact - 1, "attention": attention / exact,
            "unmultiplied": unmultiplied / exact}


# ---------------------------------------------------------------- bytes: arithmetic intensity of a block's parts

def intensity_bounds(config: GPTConfig, batch_size: int, seq_len: int, bytes_per_element: int) -> dict:
    """Forward arithmetic intensity (FLOP/B) of a block's parts, from two byte models.

    "attention_core": (low, high) per head: low if every intermediate goes to memory as the course's naive
    kernel does (q, k, v read, output written; q scaled first, one read and one write of T x hd; then 6
    passes over the T x T scores: write, mask read+write, softmax read+write, read for x V), high with
    compulsory traffic only (q, k, v read, output written: a fused kernel).
    "mlp_up" and "q_proj": the GEMM (B·T x d) @ (d x n), reading both operands and writing the result once.
    """
    T, hd, s = seq_len, config.head_dim, bytes_per_element
    core_flops = 4 * T * T * hd
    core = (core_flops / (s * (6 * T * hd + 6 * T * T)), core_flops / (s * 4 * T * hd))

    def gemm(m, k, n):
        return 2 * m * k * n / (s * (m * k + k * n + m * n))
    m = batch_size * seq_len
    return {"attention_core": core, "q_proj": gemm(m, config.d_model, config.n_head * hd),
            "mlp_up": gemm(m, config.d_model, config.d_ff)}


# ---------------------------------------------------------------- estimates from 6ND

def gpu_hours(n_params: float, n_tokens: float, peak_flops_per_s: float, mfu: float) -> float:
    """GPU-hours to train on 6·N·D FLOPs at the given MFU: 6·N·D / (peak · MFU) / 3600 s.

    Independent of how many GPUs share them. `peak_flops_per_s` in FLOP/s per GPU. Raises ValueError
    unless the peak is positive and `mfu` is in (0, 1].
    """
    positive("peak_flops_per_s", peak_flops_per_s, numbers.Real)
    if positive("mfu", mfu, numbers.Real) > 1:
        raise ValueError(f"mfu={mfu!r} must be in (0, 1]")
    return six_nd(n_params, n_tokens) / (peak_flops_per_s * mfu) / SECONDS_PER_HOUR


def implied_mfu(n_params: float, n_tokens: float, peak_flops_per_s: float, reported_gpu_hours: float) -> float:
    """The MFU that 6·N·D FLOPs in `reported_gpu_hours` GPU-hours at `peak_flops_per_s` amounts to.

    MFU = 6·N·D / (peak · hours · 3600 s), the inverse of `gpu_hours`. Raises ValueError unless the
    peak (FLOP/s per GPU) and the hours are positive numbers.
    """
    positive("peak_flops_per_s", peak_flops_per_s, numbers.Real)
    positive("reported_gpu_hours", reported_gpu_hours, numbers.Real)
    return six_nd(n_params, n_tokens) / (peak_flops_per_s * reported_gpu_hours * SECONDS_PER_HOUR)


def days_from_gpu_hours(hours: float, n_gpus: int) -> float:
    """Wall-clock days when `n_gpus` share `hours` GPU-hours perfectly: hours · 3600 / n_gpus / 86 400."""
    return hours * SECONDS_PER_HOUR / n_gpus / SECONDS_PER_DAY


# ---------------------------------------------------------------- measured MFU, when it is withheld, and sentences on 6N

def withheld(dtype: str, device: str) -> str | None:
    """Why MFU is not computed for steps in `dtype` on `device` (`hardware.emulated`'s sentence: a format this
    device emulates is timed as an emulation, so a fraction of a ceiling means nothing), or None (fp32, or a
    16-bit format the device runs natively)."""
    return hardware.emulated(dtype, device) if dtype in ("bf16", "fp16") else None


def step_fractions(row: dict, ceiling: float, peak: float | None = None, why_not: str | None = None) -> dict:
    """MFU of one timed training step (a `measure_train_step` row: flops, seconds, q25, q75) against the measured
    `ceiling` and the datasheet `peak` (TFLOP/s; None: no datasheet row): mfu_ceiling (from the median step),
    mfu_ceiling_lo / _hi (from the slow and the fast quartile) and mfu_datasheet. Every one is None when `why_not`
    (see `withheld`) says the format is emulated here."""
    if why_not:
        return {"mfu_ceiling": None, "mfu_ceiling_lo": None, "mfu_ceiling_hi": None, "mfu_datasheet": None}
    rate = lambda s: row["flops"] / s / 1e12  # noqa: E731
    return {"mfu_ceiling": rate(row["seconds"]) / ceiling, "mfu_ceiling_lo": rate(row["q75"]) / ceiling,
            "mfu_ceiling_hi": rate(row["q25"]) / ceiling, "mfu_datasheet": rate(row["seconds"]) / peak if peak else None}


def gap_claimed(claim: float = GAP_CLAIM, band: float = GAP_BAND) -> tuple[float, float]:
    """The claimed range of the MLP/attention efficiency gap: claim / band to claim * band."""
    return claim / band, claim * band


def judged_point(points: list[dict], claimed: tuple[float, float] | None = None) -> tuple[dict, dict[str, int]]:
    """The shape at which a claim of one universal gap is judged, and the rule's verdict at every shape.

    points: rows with "ratio" (the median of the per-repetition MLP/attention ratios) and "ratio_q25", "ratio_q75".
    Each is judged by `claims.judge_interval` against `claimed` (above it counts as against a universal constant
    too). One shape precisely outside the range is enough against "universal", so the point returned is the one
    farthest from the claim (in ratio) among those judged "contradicted", else the farthest of all; a point too
    noisy to judge never hides a precise one. Returns (point, {verdict: number of shapes})."""
    if not points:
        raise ValueError("no points to judge")
    lo, hi = claimed or gap_claimed()
    verdicts = [judge_interval(p["ratio"], p["ratio_q25"], p["ratio_q75"], lo, hi, above="contradicted")[0]
                for p in points]
    against = [p for p, v in zip(points, verdicts) if v == "contradicted"]
    middle = (lo * hi) ** 0.5
    far = max(against or points, key=lambda p: abs(math.log(p["ratio"] / middle)))
    return far, {v: verdicts.count(v) for v in dict.fromkeys(verdicts)}


def six_n_takeaway(errors: dict[str, dict[str, float]]) -> str:
    """One sentence on 6N's error over several presets ({preset: six_n_error(...)}), naming the main cause."""
    def span(key, sign=1):
        vals = [sign * e[key] for e in errors.values()]
        return f"{min(vals):.0%}–{max(vals):.0%}" if f"{min(vals):.0%}" != f"{max(vals):.0%}" else f"{min(vals):.0%}"
    low = all(e["six_n_all"] < 0 for e in errors.values())
    main = "attention" if all(e["attention"] > e["unmultiplied"] for e in errors.values()) else "mixed"
    text = (f"6 x (all parameters) came out {span('six_n_all', -1)} {'low' if low else 'off'} for "
            f"{', '.join(errors)}; ")
    if main == "attention":
        return text + (f"the main cause is the attention scores-and-values term it leaves out "
                       f"({span('attention')} of the exact count at each preset's context), while the parameters "
                       f"no token is multiplied by (position table, biases, LayerNorm) add back only "
                       f"{span('unmultiplied')}.")
    return text + (f"the attention term it leaves out is {span('attention')} of the exact count and the parameters "
                   f"no token is multiplied by add back {span('unmultiplied')}: neither dominates at every preset.")


def step_headline(steps: Sequence[dict]) -> tuple[str, dict]:
    """The summary's training-step headlines, from one fixed point (the last row: the largest model and batch that
    ran, never the best of the sweep): (that point's name, {label: (value, unit, (lo, hi))}), MFU left out when it
    was withheld (None)."""
    r = steps[-1]
    rate = lambda s: r["flops"] / s / 1e12  # noqa: E731
    out = {"training step throughput, largest model and batch": (rate(r["seconds"]), "TFLOP/s", (rate(r["q75"]), rate(r["q25"])))}
    if r.get("mfu_ceiling") is not None:
        out["MFU vs measured ceiling, largest model and batch"] = (
            100 * r["mfu_ceiling"], "%", (100 * r["mfu_ceiling_lo"], 100 * r["mfu_ceiling_hi"]))
    return f"{r['model']} B={r['batch_size']} T={r['seq_len']}", out


# ---------------------------------------------------------------- a throughput "measurement" that measures nothing

A100_PEAK_TFLOPS = 312.0  # the A100's dense bf16 datasheet figure, the one such recipes hard-code
FIXED_RATES = {"ideal": 1.0, "with overhead": 0.70, "realistic": 0.50}  # chosen, never timed
UTILIZATION_CLAIMED = (0.50, 0.75)  # the second source text, section 2: GPU utilisation, of the theoretical peak


def fixed_rate_estimate(n_params: int, batch_size: int, seq_len: int, *, peak_tflops: float = A100_PEAK_TFLOPS,
                        rates: dict[str, float] = FIXED_RATES) -> dict[str, dict[str, float]]:
    """What a "throughput measurement" returns when it never runs the model: {scenario: numbers}.

    Each scenario's TFLOP/s is a chosen rate times a hard-coded peak, so it is the same for every model, batch
    and device. The step time is 6 * n_params * batch_size * seq_len over that rate (6N per token, with the
    parameter count standing in for FLOPs), the one number that depends on the model, and it is still an
    assumption: nothing here is timed. Raises ValueError for a non-positive size, peak or rate.
    """
    for name, v in (("n_params", n_params), ("batch_size", batch_size), ("seq_len", seq_len)):
        positive(name, v)
    for name, v in (("peak_tflops", peak_tflops), *rates.items()):
        positive_number(name, v)
    step_flops = 6 * n_params * batch_size * seq_len  # FLOPs the recipe assumes one step does
    return {name: {"rate": rate, "tflops": peak_tflops * rate,  # an assumption written as a result
                   "step_seconds": step_flops / (peak_tflops * rate * 1e12)}  # what the recipe computes, then drops
            for name, rate in rates.items()}


def fixed_rate_rows(row: dict, est: dict[str, dict[str, float]], *, peak: float | None, ceiling: float,
                    device_name: str) -> list[list[str]]:
    """The recipe's numbers `est` (`fixed_rate_estimate` for the shape of `row`, a timed `measure_train_step` row)
    beside what that step measured: rows of [quantity, what the recipe reports, what this run measured].
    peak: this device's datasheet TFLOP/s (None when it has no row); ceiling: its measured matmul ceiling (TFLOP/s)."""
    rate = lambda s: row["flops"] / s / 1e12  # noqa: E731
    got = f"{rate(row['seconds']):.3g} TFLOP/s (IQR {rate(row['q75']):.3g}-{rate(row['q25']):.3g}), timed"
    out = [["'model FLOPs'", f"{row['params']:,} (the parameter count)",
            f"{row['flops']:.4g} FLOPs counted per step ({row['flops'] / row['params']:.3g}x the parameter count)"],
           ["peak", f"{A100_PEAK_TFLOPS:g} TFLOP/s (an A100, whatever runs)",
            f"{device_name}: " + (f"datasheet {peak:g} TFLOP/s, " if peak else "no datasheet row, ")
            + f"measured matmul ceiling {ceiling:.3g} TFLOP/s"]]
    for name, e in est.items():
        out.append([f"'{name}' throughput", f"{e['tflops']:.3g} TFLOP/s ({e['rate']:.0%} of the peak, chosen)", got])
    slowest = max(est.values(), key=lambda e: e["step_seconds"])
    out.append(["iteration time", f"{slowest['step_seconds'] * 1e3:.3g} ms at {slowest['rate']:.0%} (computed, never "
                "returned)", f"{row['seconds'] * 1e3:.4g} ms (IQR {row['q25'] * 1e3:.4g}-{row['q75'] * 1e3:.4g}), timed"])
    return out


def utilization_claim(row: dict, *, peak: float | None, why_withheld: str | None, device_kind: str) -> dict:
    """`claims.verdict`'s keyword arguments for "GPU utilisation is 50-75% of the theoretical peak" (the second
    source text, section 2), judged at one fixed point (a `measure_train_step` row with step_fractions' numbers:
    the largest model and batch that ran, never the best of a sweep) against the datasheet peak. Not testable on a
    device that is not a GPU, on a GPU without a datasheet row, or where the format is emulated; the claimed
    range is recorded either way."""
    lo, hi = UTILIZATION_CLAIMED
    where = f"{row['model']} B={row['batch_size']} T={row['seq_len']}"
    kw = {"notebook": "02", "claim": "GPU utilisation runs at 50-75% of the theoretical peak",
          "source": "the second source text, section 2", "claimed": (100 * lo, 100 * hi), "unit": "%"}
    if device_kind != "cuda" or not peak or why_withheld:
        why = ("the claim is about a GPU's datasheet peak and this run is on a CPU, which has no datasheet row and "
               "whose fp32 step is not what a GPU's 16-bit tensor cores run" if device_kind != "cuda" else
               why_withheld or "this GPU has no datasheet row to take the theoretical peak from")
        return kw | {"claim_id": "gpu-utilization-range", "verdict": "not testable", "reason": why,
                     "measured": f"training step {where}: {row['tflops']:.3g} TFLOP/s, no datasheet peak to divide by"}
    rate = lambda s: row["flops"] / s / 1e12 / peak * 100  # noqa: E731
    return kw | {"claim_id": "gpu-utilization-range", "value": rate(row["seconds"]),
                 "spread": (rate(row["q75"]), rate(row["q25"])), "above": "exceeded",
                 "measured": f"MFU vs the {peak:g} TFLOP/s datasheet peak at {where}: {rate(row['seconds']):.1f}% "
                             f"(IQR {rate(row['q75']):.1f}-{rate(row['q25']):.1f}%)"}
