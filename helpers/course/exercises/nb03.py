"""Notebook 03's exercises: where fp16 keeps a gradient whole, where bf16 drops an update, and the
dynamic loss scaler's update rule written by the learner and checked against torch.amp.GradScaler.
"""
from __future__ import annotations

import math

import torch

from helpers.course import check
from helpers.training import precision

GRADIENT = 3e-9  # the gradient magnitude exercise "03.scale_for_normal" asks about
ADAMW_UPDATE = 1e-3  # the update size exercise "03.bf16_vanish" asks about


def _scale_for_normal() -> int:
    """log2 of the smallest power-of-two S with S * GRADIENT >= fp16's smallest normal."""
    return math.ceil(math.log2(precision.facts("fp16").smallest_normal / GRADIENT))


def _bf16_vanish() -> float:
    """The smallest power of two |w| from which w + ADAMW_UPDATE rounds back to w in bf16 (torch's rounding)."""
    for e in range(-30, 30):
        w = torch.tensor(2.0**e, dtype=torch.bfloat16)
        if (w.float() + ADAMW_UPDATE).to(torch.bfloat16) == w:  # the gap only grows with |w| from here on
            return 2.0**e
    raise AssertionError("no such power of two in 2^-30..2^29")


check.register(
    "03.scale_for_normal", "value",
    prompt=f"log2 of the smallest power-of-two loss scale that makes a {GRADIENT:g} gradient a normal fp16 number",
    hint="compare with fp16's smallest *normal* number (set by its exponent bits), not with the threshold "
         "where values round to 0; the scale is a whole power of two, so round log2 up",
    solution=_scale_for_normal, wrong=(_scale_for_normal() - 1, 4), rtol=1e-9)

check.register(
    "03.bf16_vanish", "value",
    prompt=f"the smallest power of two |w| at which an update of {ADAMW_UPDATE:g} to a bf16 weight vanishes",
    hint="the gap between neighbouring bf16 values is eps times the power of two at or below |w|; "
         "an update survives while it is more than half that gap",
    solution=_bf16_vanish, wrong=(1.0, _bf16_vanish() / 2, _bf16_vanish() * 4), rtol=1e-9)


# ---------------------------------------------------------------- the code exercise: GradScaler's update rule

class _Probe(torch.optim.SGD):
    """An optimizer that only notes whether GradScaler let it step."""

    stepped = False

    def step(self, closure=None):  # noqa: D102 - GradScaler calls this only when no gradient was inf/NaN
        self.stepped = True


def gradscaler_update(grads, scale, tracker, growth_factor, backoff_factor, growth_interval):
    """torch.amp.GradScaler's decision for one step, as (take_step, new_scale, new_tracker).

    grads: list of tensors (gradients of the scaled loss); scale: the loss scale going in (float);
    tracker: clean steps counted since the scale last changed (int). A GradScaler is loaded with
    that state, steps a probe optimizer holding `grads` and updates; only public API is used.
    """
    scaler = torch.amp.GradScaler("cpu", init_scale=scale, growth_factor=growth_factor,
                                  backoff_factor=backoff_factor, growth_interval=growth_interval)
    scaler.load_state_dict({"scale": scale, "growth_factor": growth_factor, "backoff_factor": backoff_factor,
                            "growth_interval": growth_interval, "_growth_tracker": tracker})
    params = [torch.nn.Parameter(torch.zeros_like(g, dtype=torch.float32)) for g in grads]
    for p, g in zip(params, grads):
        p.grad = g.detach().clone().float()
    opt = _Probe(params, lr=1.0)
    scaler.scale(torch.ones(()))  # GradScaler creates its scale and tracker tensors on first use
    scaler.step(opt)
    scaler.update()
    return opt.stepped, scaler.get_scale(), scaler.state_dict()["_growth_tracker"]


def reference_update(grads, scale, tracker, growth_factor, backoff_factor, growth_interval):
    """The course's solution (shown in the notebook's collapsed Solutions block)."""
    found_inf = any(not bool(torch.isfinite(g).all()) for g in grads)
    if found_inf:
        return False, scale * backoff_factor, 0
    if tracker + 1 == growth_interval:
        return True, scale * growth_factor, 0
    return True, scale, tracker + 1


# (growth_interval, growth_factor, backoff_factor, init_scale, script): "." clean, "I" +inf, "M" -inf, "N" NaN
SCRIPTS = (
    (3, 2.0, 0.5, 2.0**16, "..I..N.NI....M."),  # growth, backoff, consecutive NaN then inf
    (1, 2.0, 0.5, 2.0**10, ".I.IIN..M."),  # interval 1: a clean step right after a skip grows at once
    (4, 1.7, 0.3, 1000.0, "....M...I.II....."),  # odd factors: the scale leaves the powers of two
    (2, 4.0, 0.25, 2.0**20, "NN.I...."),  # starts with two NaNs in a row
)
_WHAT = {".": "a clean step", "I": "an inf in the gradients", "M": "a -inf in the gradients",
         "N": "a NaN in the gradients"}


def _cases() -> list[check.Case]:
    """One case per scripted step, with the state GradScaler itself had reached before that step."""
    gen = torch.Generator().manual_seed(3)
    cases = []
    for interval, grow, back, scale, script in SCRIPTS:
        tracker = 0
        for i, mark in enumerate(script):
            grads = [torch.randn(3, 5, generator=gen) * 1e-3 * scale, torch.randn(7, generator=gen) * 1e-3 * scale]
            if mark != ".":
                grads[i % 2].view(-1)[-1] = {"I": math.inf, "M": -math.inf, "N": math.nan}[mark]
            after = "after a skip" if i and script[i - 1] != "." else f"tracker {tracker}"
            label = (f"growth_interval={interval}, factors ×{grow:g}/×{back:g}, step {i + 1} of {len(script)}: "
                     f"{_WHAT[mark]} ({after})")
            cases.append(check.Case(label, (grads, scale, tracker, grow, back, interval)))
            _, scale, tracker = gradscaler_update(grads, scale, tracker, grow, back, interval)
    return cases


def _never_resets(grads, scale, tracker, growth_factor, backoff_factor, growth_interval):
    found_inf = any(not bool(torch.isfinite(g).all()) for g in grads)
    if found_inf:
        return False, scale * backoff_factor, tracker  # the clean-step count survives the overflow
    if tracker + 1 == growth_interval:
        return True, scale * growth_factor, 0
    return True, scale, tracker + 1


def _grows_one_late(grads, scale, tracker, growth_factor, backoff_factor, growth_interval):
    found_inf = any(not bool(torch.isfinite(g).all()) for g in grads)
    if found_inf:
        return False, scale * backoff_factor, 0
    if tracker == growth_interval:  # off by one: grows on the (interval + 1)-th clean step
        return True, scale * growth_factor, 0
    return True, scale, tracker + 1


def _backs_off_but_steps(grads, scale, tracker, growth_factor, backoff_factor, growth_interval):
    _, new_scale, new_tracker = reference_update(grads, scale, tracker, growth_factor, backoff_factor,
                                                 growth_interval)
    return True, new_scale, new_tracker  # applies the inf/NaN update anyway


def _misses_nan(grads, scale, tracker, growth_factor, backoff_factor, growth_interval):
    found_inf = any(g.abs().max().item() == math.inf for g in grads)  # NaN is not inf: it slips through
    if found_inf:
        return False, scale * backoff_factor, 0
    if tracker + 1 == growth_interval:
        return True, scale * growth_factor, 0
    return True, scale, tracker + 1


check.register(
    "03.scaler_update", "code",
    prompt="one step of dynamic loss scaling: (take_step, new_scale, new_tracker), as GradScaler decides",
    hint="inf, -inf and NaN all make a step unusable; the tracker counts clean steps since the scale last "
         "changed, so it restarts whenever the scale changes; the clean step that brings the count to "
         "growth_interval is the one that grows the scale",
    solution=gradscaler_update, cases=_cases, outputs=("take_step", "new_scale", "new_tracker"),
    wrong=(_never_resets, _grows_one_late, _backs_off_but_steps, _misses_nan),
    rtol=1e-6, atol=0.0,
    tolerance="scale to rtol 1e-6 (GradScaler keeps it in fp32, a Python float is fp64), "
              "take_step and tracker exactly")
