"""Notebook 07's exercises: torchao's rowwise scale-and-cast, the delayed-scaling history update, an MX scale.

References are `helpers.lowbit.fp8`'s own recipes, so a learner who passes has written what the notebook's
Float8Linear runs.
"""
from __future__ import annotations

import math

import torch

from helpers.lowbit import fp8
from helpers.course.check import Case, register

# ---------------------------------------------------------------- 07.rowwise (code)


def _rowwise_reference(x: torch.Tensor):
    """torchao's rowwise cast: (fp8 e4m3fn tensor like x, fp32 scales of shape x.shape[:-1] + (1,))."""
    return fp8.rowwise(x, -1, fp8.E4M3, power_of_2=True)


def _rows(seed: int, shape, spread: float = 3.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g)
    return x * torch.exp2(torch.randn(*shape[:-1], 1, generator=g) * spread)  # rows of very different size


def _rowwise_cases() -> list[Case]:
    zero_row = _rows(3, (4, 16))
    zero_row[2] = 0.0
    tiny = _rows(4, (3, 24))
    tiny[1] *= 1e-6
    return [
        Case("rows of different magnitude", (_rows(1, (6, 32)),)),
        Case("odd sizes: one row of 7", (_rows(2, (1, 7)),)),
        Case("a row of zeros (amax floored at 1e-12)", (zero_row,)),
        Case("a row of tiny values (a large scale)", (tiny,)),
        Case("3-D input: rows along the last dim", (_rows(5, (2, 3, 20)),)),
        Case("an outlier in one row", (torch.cat([_rows(6, (5, 33)), torch.full((1, 33), 3e3)]),)),
    ]


def _no_power_of_2(x):
    """Planted wrong: the exact scale 448/amax, not floored to a power of two."""
    return fp8.rowwise(x, -1, fp8.E4M3, power_of_2=False)


def _tensorwise_shape(x):
    """Planted wrong: one scale for the whole tensor, broadcast to every row."""
    s2 = fp8.amax_to_scale(x.abs().max(), fp8.E4M3, power_of_2=True).expand(*x.shape[:-1], 1)
    return fp8.cast(x.float() * s2), s2


def _rounded_up(x):
    """Planted wrong: the scale rounded UP to a power of two (the row's amax then saturates)."""
    s = torch.exp2(torch.ceil(torch.log2(448.0 / x.abs().amax(-1, keepdim=True).double().clamp(min=1e-12)))).float()
    return fp8.cast(x.float() * s), s


register(
    "07.rowwise", "code",
    prompt="write torchao's rowwise scale-and-cast: per-row amax, power-of-two scale, clamp, cast to e4m3fn; "
           "return (q, scale) with scale in fp32",
    hint="amax over the last dim with keepdim; scale = max / amax with amax floored at 1e-12 (compute it in "
         "fp64, return fp32); take the power of two at or BELOW that scale; multiply, clamp to ±max, then cast",
    solution=_rowwise_reference,
    wrong=(_no_power_of_2, _tensorwise_shape, _rounded_up),
    cases=_rowwise_cases,
    rtol=0.0, atol=0.0,
    tolerance="exact: the fp8 values and the power-of-two scales must be identical",
    outputs=("q", "scale"),
)


# ---------------------------------------------------------------- 07.delayed (code)

def _replay(fn, case: Case):
    """Feed a scripted amax sequence through fn, starting from an empty history and scale 1."""
    amaxes, history_len, margin, algo, fp8_max = case.args
    history, scale, scales = [], 1.0, []
    for amax in amaxes:
        out = fn(list(history), amax, scale, history_len, margin, algo, fp8_max)
        if out is None:
            raise NotImplementedError("the function returns None")
        history, scale = out
        scales.append(float(scale))
    return scales


def _delayed_cases() -> list[Case]:
    seq = [1.0, 4.0, 2.0, 0.5, 0.5, 0.5, 8.0, 0.25]
    return [
        Case("'max' over 3 steps, margin 0, e4m3", (seq, 3, 0, "max", 448.0)),
        Case("'most_recent', e5m2", (seq, 3, 0, "most_recent", 57344.0)),
        Case("margin 2", (seq, 4, 2, "max", 448.0)),
        Case("history of 1", (seq, 1, 0, "max", 448.0)),
        Case("a step with amax 0 and one with inf keep the scale", ([2.0, 0.0, math.inf, 1.0], 1, 0, "max", 448.0)),
        Case("a long history (never full)", (seq, 64, 1, "max", 448.0)),
    ]


def _unbounded(history, amax, scale, history_len, margin, algo, fp8_max):
    """Planted wrong: the history never forgets old steps."""
    return fp8.delayed_update(history, amax, scale, 10 ** 9, margin, algo, fp8_max)


def _margin_times(history, amax, scale, history_len, margin, algo, fp8_max):
    """Planted wrong: the margin multiplies the scale instead of dividing it."""
    history, new = fp8.delayed_update(history, amax, scale, history_len, 0, algo, fp8_max)
    return history, new * 2.0 ** margin if new != scale else new


def _no_guard(history, amax, scale, history_len, margin, algo, fp8_max):
    """Planted wrong: a zero or infinite amax is divided by anyway."""
    history = (list(history) + [float(amax)])[-history_len:]
    ref = max(history) if algo == "max" else history[-1]
    return history, (math.inf if ref == 0 else fp8_max / ref / 2.0 ** margin)


register(
    "07.delayed", "code",
    prompt="write delayed scaling's update: push the amax, keep the last history_len, scale from 'max' or "
           "'most_recent' with the margin",
    hint="append, then keep only the newest history_len entries; pick the reference amax by algo; the new "
         "scale is fp8_max / reference / 2**margin, unless the reference is 0 or not finite",
    solution=fp8.delayed_update,
    wrong=(_unbounded, _margin_times, _no_guard),
    cases=_delayed_cases,
    run=_replay,
    rtol=1e-9, atol=0.0,
    tolerance="the scale after every step, relative 1e-9",
    outputs=tuple(f"the scale after step {k}" for k in range(1, 257)),
)


# ---------------------------------------------------------------- 07.mx_scale (value)

register(
    "07.mx_scale", "value",
    prompt="MX block scaling with e4m3 elements: a 32-element block has amax 5.0; by what power of two are its "
           "values multiplied before the cast?",
    hint="the OCP MX spec's shared exponent is floor(log2(amax)) minus the largest exponent of the element "
         "format; the values are divided by 2 to that power",
    solution=lambda: 2.0 ** (8 - math.floor(math.log2(5.0))),
    wrong=(448 / 5.0, 128.0, 32.0),
    rtol=1e-9,
)
