"""Notebook 03's measurements of the six training variants of `mixed_precision`, and their sentences.

* `memory_breakdown`: the bytes of one variant by part (`MEMORY_PARTS`: weights, fp32 master copy, gradients,
  optimizer state, weight copies, saved activations), counted from the tensors themselves;
* `summarize`: each variant's final loss, zeroed gradients, skipped steps, step time, its speed against fp32
  from the paired rounds, whether its format is emulated here, and bytes in one row;
* the sentences on training, memory and speed (`training_sentences`, `bytes_per_parameter`,
  `memory_sentences`, `speed_sentence`), each built from the summary's numbers;
* the two claims (`speed_variant`, `claim_rows`): memory and speed, as `claims.verdict` judges them, and the
  third, `accuracy_claim`: the final loss's gap to fp32's against a stated tolerance;
* `takeaway_sentences`: the notebook's closing bullets, from the numbers above.

A format this device emulates (`hardware.emulated`: fp16 on a CPU without fp16 units, bf16 on one without
bf16 units or on a GPU older than Ampere) still trains, since its losses and lost gradients are the lesson, but
its step time measures the emulation: it is shown, never ranked, and no speed headline or claim is made from it.

The formats, the gradients against them and loss scaling are measured in `precision_lab`.
"""
from __future__ import annotations

from typing import Any

import math

import torch

from helpers.measure import claims, hardware, protocol
from helpers.measure.memory import peak_cuda_memory, saved_breakdown
from helpers.training.mixed_precision import Run, variant_format
from helpers.training.precision import classify


MEMORY_PARTS = ("weights", "master", "grads", "optimizer", "weight_copies", "activations")
SCALED = ("fp16 + our scaler", "fp16 + GradScaler")


def memory_breakdown(run: Run, x: torch.Tensor, y: torch.Tensor, step: bool = True) -> dict[str, int]:
    """Bytes of weights, fp32 master copies, gradients, optimizer state and saved activations after a step.

    With step=False the caller promises a step just ran (gradients and optimizer state exist).
    """
    if step:
        run.step(x, y)
    weights = sum(p.nbytes for p in run.model.parameters())
    grads = sum(p.grad.nbytes for p in run.model.parameters() if p.grad is not None)
    if run.master:
        grads += sum(m.grad.nbytes for m in run.master.params if m.grad is not None)
    opt_state = sum(v.nbytes for st in run.optimizer.state.values() for v in st.values() if torch.is_tensor(v))
    saved = saved_breakdown(lambda: run.loss(x, y), list(run.model.parameters()))
    return {"weights": weights, "master": run.master.nbytes() if run.master else 0, "grads": grads,
            "optimizer": opt_state, "activations": saved["activations"], "weight_copies": saved["weight_copies"]}


def emulated_formats(device: str) -> dict[str, str | None]:
    """{"fp16": sentence or None, "bf16": sentence or None}: whether `device` emulates each 16-bit format
    (`hardware.emulated`, measured once per process on a CPU)."""
    return {f: hardware.emulated(f, device) for f in ("fp16", "bf16")}


def summarize(runs: dict[str, Run], logs: dict[str, list[dict]], timings: dict[str, Any], x: torch.Tensor,
              y: torch.Tensor, emulated: dict[str, str | None] | None = None) -> dict[str, dict[str, Any]]:
    """One row per variant: mean loss of the last 5 steps, mean zero-gradient share, skipped steps,
    last scale, step time (ms, with its inter-quartile spread), "speed": fp32's step time over its own
    (`protocol.paired_ratio` of the interleaved rounds, so what a round's load does to both cancels),
    "emulated": the sentence saying its format is emulated here (from `emulated`, `emulated_formats`' dict) or
    None, bytes by part and the CUDA peak rise."""
    out = {}
    for name, run in runs.items():
        log, t = logs[name], timings[name]
        mem = memory_breakdown(run, x, y, step=False)  # the timed steps left gradients and optimizer state
        fmt = variant_format(name)
        out[name] = {"final_loss": sum(r["loss"] for r in log[-5:]) / len(log[-5:]),
                     "zero_grad_fraction": sum(r["zero_fraction"] for r in log) / len(log),
                     "skipped_steps": sum(r["skipped"] for r in log), "final_scale": log[-1]["scale"],
                     "step_ms": t.ms, "step_iqr": t.spread, "speed": protocol.paired_ratio(timings["fp32"], t),
                     "format": fmt, "emulated": (emulated or {}).get(fmt), "memory": mem,
                     "cuda_peak_increment": peak_cuda_memory(lambda: run.step(x, y))}
    return out


def training_sentences(summary: dict[str, dict[str, Any]], steps: int) -> list[str]:
    """What the six-variant comparison showed about lost gradients, the loss and skipped steps, in words."""
    s32, s16 = summary["fp32"], summary["fp16 no scaling"]
    scaled = [summary[n] for n in SCALED if n in summary]
    z32, z16 = s32["zero_grad_fraction"], s16["zero_grad_fraction"]
    zs = max(s["zero_grad_fraction"] for s in scaled)
    out = [f"fp16 without loss scaling zeroed {z16:.3%} of the gradient entries per step on average, "
           + (f"{z16 / z32:.0f}× fp32's {z32:.3%}" if z32 > 0 and z16 > z32 else f"against fp32's {z32:.3%}")
           + f"; with loss scaling at most {zs:.3%}"
           + (": scaling recovered the gradients that underflow flushed." if z16 > z32 and zs <= max(z32, 0.1 * z16)
              else ".")]
    ls, l16, l32 = scaled[0]["final_loss"], s16["final_loss"], s32["final_loss"]
    # rounding alone: bf16 autocast rounds more coarsely than fp16 but flushes nothing and skips nothing
    ref = "bf16 autocast" if "bf16 autocast" in summary else None
    moved = abs(summary[ref]["final_loss"] - l32) if ref else 0.0
    noise = max(moved, 1e-3)
    why = (f"the larger of 0.001 and the {moved:.4f} by which bf16 autocast's coarser rounding alone moved the loss"
           if ref else "a tolerance of 0.001")
    lost = l16 - l32
    if abs(lost) <= noise:
        out.append(f"The loss does not show the lost gradients at this size: over its last 5 of {steps} steps "
                   f"unscaled fp16 averaged {l16:.4f} against fp32's {l32:.4f}, a gap of {lost:+.4f}, within "
                   f"{why}.")
    else:
        out.append(f"Over its last 5 of {steps} steps unscaled fp16 averaged {l16:.4f} against fp32's {l32:.4f}, "
                   f"a gap of {lost:+.4f}, beyond {why}: "
                   + ("the lost gradients (with fp16's rounding) slowed training." if lost > 0 else
                      "unscaled fp16 did better here, which lost gradients cannot explain."))
    skipped = scaled[0]["skipped_steps"]
    if skipped:
        gap = ls - l32
        out.append(f"The scalers skipped {skipped} of {steps} steps (an overflow, after which the scale was "
                   f"halved): {skipped / steps:.0%} of the updates not made. Scaled fp16 averaged {ls:.4f}, "
                   f"{gap:+.4f} from fp32, "
                   + (f"beyond {why}: the skipped updates cost it more than rounding did."
                      if abs(gap) > noise else f"within {why}."))
    return out


def bytes_per_parameter(summary: dict[str, dict[str, Any]], n_params: int) -> dict[str, float]:
    """Bytes per parameter of weights + fp32 master + gradients + optimizer state, per variant."""
    return {n: sum(s["memory"][k] for k in ("weights", "master", "grads", "optimizer")) / n_params
            for n, s in summary.items()}


def memory_sentences(summary: dict[str, dict[str, Any]], n_params: int, fast: str) -> list[str]:
    """Which bytes mixed precision saved in this run, generated from the byte counts."""
    total = {n: sum(s["memory"][k] for k in MEMORY_PARTS) for n, s in summary.items()}
    bpp = bytes_per_parameter(summary, n_params)
    act = summary[fast]["memory"]["activations"] / summary["fp32"]["memory"]["activations"]
    share = summary["fp32"]["memory"]["activations"] / total["fp32"]
    out = [f"{fast} kept {bpp[fast]:.1f} bytes per parameter of weights, gradients and optimizer state "
           f"(fp32: {bpp['fp32']:.1f}), added {summary[fast]['memory']['weight_copies'] / 2**20:.2f} MiB of 16-bit "
           f"weight copies, and cut the activations to ×{act:.2f} of fp32's: total ×{total[fast] / total['fp32']:.2f}. "
           f"Activations were {share:.0%} of fp32's total here, so "
           + ("they dominate and the saving approaches the claimed half only as far as they shrink."
              if share > 0.5 else "no activation saving could halve the total at this size.")]
    master = "bf16 weights + fp32 master"
    if master in summary:
        out.append(f"bf16 weights with fp32 master weights held {bpp[master]:.1f} bytes per parameter "
                   f"(fp32: {bpp['fp32']:.1f}) and activations ×"
                   f"{summary[master]['memory']['activations'] / summary['fp32']['memory']['activations']:.2f}: "
                   f"total ×{total[master] / total['fp32']:.2f}.")
    return out


def speed_sentence(summary: dict[str, dict[str, Any]], device: str) -> str:
    """The measured speed of each variant against fp32 in words: ranked only when the paired rounds' ratios lie
    wholly on one side of 1, and never for a format emulated here (its time measures the emulation)."""
    parts, slow = [], []
    for name, s in summary.items():
        if name == "fp32":
            continue
        r = s["speed"]
        if s.get("emulated"):
            slow.append(name)
            parts.append(f"{name} ×{r.value:.2f} ({s['format']} is emulated here: not a speed comparison)")
            continue
        said = ("faster" if r.lo > 1 else "slower" if r.hi < 1 else "cannot tell: the rounds' ratios straddle 1")
        parts.append(f"{name} ×{r.value:.2f} ({r.lo:.2f}-{r.hi:.2f}, {said})")
    where = ("A CPU has no tensor cores: these ratios say nothing about a GPU. " if device == "cpu" else "")
    emul = (f" {len(slow)} variant(s) ran in a format this device emulates; their times measure the conversion "
            "in software." if slow else "")
    return where + "Speed against fp32 in this run (median of the paired rounds, their quartiles): " + \
        "; ".join(parts) + "." + emul


SPEED_CANDIDATES = ("bf16 autocast", "fp16 + GradScaler")  # the 16-bit variants a practitioner would train with


def speed_variant(summary: dict[str, dict[str, Any]]) -> str | None:
    """The variant whose speed is the notebook's headline and the claim's measurement: the first of
    SPEED_CANDIDATES that ran in a format this device does not emulate; None when none did."""
    return next((n for n in SPEED_CANDIDATES if n in summary and not summary[n].get("emulated")), None)


MEMORY_CLAIM = (None, 0.6)  # "memory: about halved": total bytes at most 0.6x fp32's


def claim_rows(summary: dict[str, dict[str, Any]], mem_variant: str, device: str) -> list[dict[str, Any]]:
    """`claims.verdict`'s keyword arguments for the two claims of the first source text: memory (the total
    counted bytes of `mem_variant` over fp32's, judged against MEMORY_CLAIM: a count, no spread) and speed
    (the `speed_variant`'s paired ratio against 1.5-2x; "not testable" on a CPU, which has no tensor cores, and
    where every candidate format is emulated)."""
    cols = MEMORY_PARTS
    total = {n: sum(s["memory"][c] for c in cols) for n, s in summary.items()}
    ratio = total[mem_variant] / total["fp32"]
    act = summary[mem_variant]["memory"]["activations"] / summary["fp32"]["memory"]["activations"]
    memory = dict(claim_id="mixed-precision-memory", notebook="03",
                  claim="mixed precision roughly halves memory (FP32 → FP16/BF16)",
                  source="the first source text, section 2.4",
                  measured=f"{mem_variant}: total memory ×{ratio:.2f} of fp32's", value=ratio, unit="x",
                  claimed=MEMORY_CLAIM, above="contradicted",
                  reason=f"activations ×{act:.2f}; weights, gradients and AdamW state unchanged")
    fast = speed_variant(summary)
    speed = dict(claim_id="mixed-precision-speed", notebook="03", claim="mixed precision gives 1.5–2× speed through "
                 "tensor cores", source="the first source text, section 2.4", claimed=(1.5, 2.0), unit="x")
    if fast is None:
        why = "; ".join(dict.fromkeys(s["emulated"] for s in summary.values() if s.get("emulated")))
        speed.update(measured="no 16-bit variant ran in a format this device runs natively", verdict="not testable",
                     reason=why or "no 16-bit variant ran")
        return [memory, speed]
    r = summary[fast]["speed"]
    speed.update(measured=f"{fast}: step ×{r.value:.2f} the speed of fp32 ({r.lo:.2f}-{r.hi:.2f} over the paired "
                          "rounds)", value=r.value, spread=(r.lo, r.hi))
    if device == "cpu":
        speed.update(verdict="not testable", reason="a CPU has no tensor cores")
    elif claims.judge_interval(r.value, r.lo, r.hi, 1.5, 2.0)[0] == "exceeded":
        speed["reason"] = ("fp32 matmuls here run without tensor cores (TF32 off, torch's default), 16-bit ones on "
                           "them")
    return [memory, speed]


ACCURACY_TOLERANCE_PCT = 1.0  # "nearly kept": a final loss within 1% of fp32's (a stated reading; the text gives none)
RECIPES = ("fp16 + GradScaler", "bf16 autocast", "bf16 weights + fp32 master")  # mixed precision as it is used


def accuracy_claim(summary: dict[str, dict[str, Any]], fp32_losses: list[float],
                   tolerance_pct: float = ACCURACY_TOLERANCE_PCT) -> dict[str, Any]:
    """`claims.verdict`'s keyword arguments for "accuracy is nearly kept" (the first source text, section 2.4): the
    largest |final loss - fp32's| / fp32's, in %, over the RECIPES that ran (fp16 without a scaler is not one),
    against at most `tolerance_pct`. The runs see the same weights and batches, so the gap is a count of this
    run (no spread), not a timing; fp32_losses (fp32's loss per step) says how far one step of fp32's own
    training moved the loss over the same last steps, for scale. Raises ValueError when no recipe ran."""
    ran = [n for n in RECIPES if n in summary]
    if not ran:
        raise ValueError(f"none of {RECIPES} is in the summary")
    l32 = summary["fp32"]["final_loss"]
    gaps = {n: 100 * (summary[n]["final_loss"] - l32) / l32 for n in ran}
    worst = max(ran, key=lambda n: abs(gaps[n]))
    tail = fp32_losses[-6:]
    per_step = 100 * (tail[0] - tail[-1]) / (len(tail) - 1) / l32 if len(tail) > 1 else float("nan")
    return dict(claim_id="mixed-precision-accuracy", notebook="03", claim="mixed precision keeps accuracy nearly "
                "unchanged", source="the first source text, section 2.4", value=abs(gaps[worst]), unit="%",
                claimed=(None, tolerance_pct), above="contradicted",
                measured=f"final loss (mean of the last 5 steps) against fp32's {l32:.4f}: "
                         + ", ".join(f"{n} {gaps[n]:+.2f}%" for n in ran) + f"; the largest, {worst}, is judged",
                reason=f"'nearly' read as within {tolerance_pct:g}% of fp32's loss; fp32's own loss fell "
                       f"{per_step:.2f}% of its value per step over its last steps; same weights and batches, so the "
                       "gap is exact for this run, while another seed could move it")

def takeaway_sentences(*, last: dict[str, torch.Tensor], underflow: dict[str, float],
                       scaled_underflow: dict[str, dict[str, float]], init_scale: float,
                       summary: dict[str, dict[str, Any]], steps: int, check_steps: int, injected: int,
                       vanished: float | None, fast: str, verdicts: dict[str, dict[str, Any]], device_name: str,
                       emulated: dict[str, str | None]) -> list[str]:
    """Notebook 03's closing bullets, generated from its numbers: fp16's range against the last step's gradients
    (`last`, with their fp16 `underflow` and `scaled_underflow` at `init_scale`), training, the scaler check
    (`check_steps` steps, `injected` infs and NaNs), the bf16 update that `vanished`, memory and speed of `fast`
    with the claims' `verdicts`, and one bullet per emulated format."""
    act = underflow["activation gradients"]
    total = {n: sum(s["memory"][c] for c in MEMORY_PARTS) for n, s in summary.items()}
    mem_ratio = total[fast] / total["fp32"]
    act_ratio = summary[fast]["memory"]["activations"] / summary["fp32"]["memory"]["activations"]
    speed_name = speed_variant(summary)
    speed = summary[speed_name]["speed"] if speed_name else None
    out = [f"fp16's range: at the last step fp16 would flush {act:.2%} of the gradients flowing into linear layers "
           f"to 0 (parameter gradients: {underflow['weight gradients']:.2%}); scaled by 2^{math.log2(init_scale):g}, "
           f"{scaled_underflow['activation gradients']['underflow']:.2%} would, and "
           f"{max(c['overflow'] for c in scaled_underflow.values()):.2%} would overflow; in bf16 "
           f"{max(classify(v, 'bf16')['underflow'] for v in last.values()):.2%} would round to 0.",
           f"In training: {training_sentences(summary, steps)[0]}",
           f"Dynamic loss scaling is a few lines of state; ours matched GradScaler's scale, skipped steps and "
           f"parameters exactly over {check_steps} steps with {injected} injected infs and NaNs."]
    if vanished is not None:
        out.append(f"16-bit weights lose updates below half a gap: {vanished:.1%} of one real AdamW update would "
                   f"have vanished in bf16 weights; the fp32 master copy kept them.")
    said = verdicts["mixed-precision-speed"]
    out.append(f"Memory: {fast} total ×{mem_ratio:.2f} of fp32 (activations ×{act_ratio:.2f}): "
               f"{claims.shown(verdicts['mixed-precision-memory'])}. Speed: "
               + (f"{speed_name} ×{speed.value:.2f} of fp32's ({speed.lo:.2f}-{speed.hi:.2f} over the paired rounds) "
                  f"on {device_name}" if speed else
                  "every 16-bit variant ran in a format this device emulates (below), so no speed is quoted")
               + f": {claims.shown(said)}" + (f" ({said['reason']})." if speed and said["reason"] else "."))
    out += [f"{sentence}." for sentence in emulated.values() if sentence]
    return out
