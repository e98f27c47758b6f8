"""Number formats and mixed precision's two repairs, written from scratch (notebook 03).

A binary floating-point format with e exponent bits and m mantissa bits stores
x = (-1)^s · 2^(E - bias) · 1.f (normal) or (-1)^s · 2^(1 - bias) · 0.f (subnormal, E = 0), with
bias = 2^(e-1) - 1: the exponent sets the range, the mantissa the precision eps = 2^-m.

* `FORMATS` / `facts(name)`: sign, exponent and mantissa bits, largest finite value, smallest normal
  and subnormal, machine epsilon, and the thresholds where a value rounds to 0 or overflows; derived
  from `torch.finfo` wherever torch has the dtype (tf32 has none: fp32's exponent, 10 mantissa bits).
* `round_to(x, name)`: an fp32 tensor rounded to a format (round to nearest, ties to even) and
  returned in fp32; overflow is ±inf in every format, so it is visible even for e4m3fn, which has no
  inf encoding (real conversions saturate to ±448 or give NaN, depending on the kernel).
  `classify` counts where a tensor's values land: 0, subnormal, normal, overflow.
* `DynamicLossScaler`: the state machine of `torch.amp.GradScaler` (Micikevicius et al., 2018,
  *Mixed Precision Training*), with the same method names, so the two can be swapped: backpropagate
  S·L, unscale by 1/S in fp32, skip the step and shrink S after an inf/NaN, grow S after a run of
  clean steps.
* `MasterWeights`: fp32 copies of a low-precision model's parameters for the optimizer to update, so
  that updates below half a 16-bit gap (|Δw| < eps/2 · |w|) accumulate instead of vanishing.

The training variants built on these are in `mixed_precision`; notebook 03's measurements, figures
and panel are in `precision_lab`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import torch

from helpers.measure.params import positive


# ---------------------------------------------------------------- formats

FORMATS = ("fp32", "tf32", "fp16", "bf16", "fp8-e4m3fn", "fp8-e5m2")
TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16,
                "fp8-e4m3fn": torch.float8_e4m3fn, "fp8-e5m2": torch.float8_e5m2}
TF32_MANTISSA_BITS = 10  # NVIDIA's TensorFloat-32: fp32's 8 exponent bits, 10 mantissa bits (A100 whitepaper, 2020)


@dataclass(frozen=True)
class FormatFacts:
    """Range and precision of one floating-point format (values as Python floats)."""

    name: str
    bits: int
    exponent_bits: int
    mantissa_bits: int  # stored fraction bits; precision is mantissa_bits + 1 with the implicit leading 1
    max: float  # largest finite value
    smallest_normal: float
    smallest_subnormal: float
    eps: float  # distance from 1.0 to the next larger value, 2**-mantissa_bits
    has_inf: bool

    @property
    def sign_bits(self) -> int:
        """Always 1."""
        return 1

    @property
    def underflow_threshold(self) -> float:
        """|x| at or below this rounds to 0 (half the smallest subnormal; the tie goes to even, i.e. 0)."""
        return self.smallest_subnormal / 2

    @property
    def overflow_threshold(self) -> float:
        """|x| from here (or above it, see `overflow_at_threshold`) rounds past `max`: max + half a top ulp."""
        return self.max + math.ldexp(1.0, math.frexp(self.max)[1] - 1 - self.mantissa_bits) / 2

    @property
    def overflow_at_threshold(self) -> bool:
        """True when a value exactly at `overflow_threshold` overflows: max's last mantissa bit is odd."""
        ulp = math.ldexp(1.0, math.frexp(self.max)[1] - 1 - self.mantissa_bits)
        return round(self.max / ulp) % 2 == 1


def facts(name: str) -> FormatFacts:
    """The facts of one format in FORMATS, computed from torch.finfo (tf32 from fp32's finfo)."""
    if name not in FORMATS:
        raise ValueError(f"format {name!r} is unknown; choose one of {', '.join(map(repr, FORMATS))}")
    if name == "tf32":
        f32 = torch.finfo(torch.float32)
        m = TF32_MANTISSA_BITS
        e = _exponent_bits(f32.smallest_normal)
        top = math.frexp(f32.max)[1] - 1  # fp32's largest exponent, 127
        return FormatFacts("tf32", 1 + e + m, e, m, (2 - 2.0 ** -m) * 2.0 ** top, f32.smallest_normal,
                           f32.smallest_normal * 2.0 ** -m, 2.0 ** -m, True)
    fi = torch.finfo(TORCH_DTYPES[name])
    m = round(-math.log2(fi.eps))
    e = _exponent_bits(fi.smallest_normal)
    if 1 + e + m != fi.bits:
        raise AssertionError(f"{name}: 1 + {e} + {m} bits != finfo.bits {fi.bits}")
    return FormatFacts(name, fi.bits, e, m, fi.max, fi.smallest_normal, fi.smallest_normal * fi.eps, fi.eps,
                       name != "fp8-e4m3fn")


def _exponent_bits(smallest_normal: float) -> int:
    """Exponent width from the bias: smallest normal = 2**(1 - bias), bias = 2**(e - 1) - 1."""
    bias = 1 - round(math.log2(smallest_normal))
    return round(math.log2(bias + 1)) + 1


def round_mantissa(x: torch.Tensor, mantissa_bits: int) -> torch.Tensor:
    """fp32 `x` rounded (to nearest, ties to even) to `mantissa_bits` fraction bits, fp32's exponent range.

    Works on the bit pattern: add half of the dropped part (plus one if the kept part is odd) and
    clear the dropped bits; a carry out of the mantissa moves to the next binade or to inf, which is
    what rounding should do. inf and NaN pass through unchanged.
    """
    if x.dtype != torch.float32:
        raise TypeError(f"round_mantissa needs an fp32 tensor, got {x.dtype}")
    if not 0 <= mantissa_bits <= 23:
        raise ValueError(f"mantissa_bits={mantissa_bits} must be in 0..23")
    drop = 23 - mantissa_bits
    if drop == 0:
        return x.clone()
    bits = x.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF  # unsigned view of the pattern
    half = 1 << (drop - 1)
    odd = (bits >> drop) & 1
    rounded = ((bits + half - 1 + odd) >> drop) << drop
    rounded = torch.where(rounded >= 2**31, rounded - 2**32, rounded).to(torch.int32).view(torch.float32)
    return torch.where(torch.isfinite(x), rounded, x).view_as(x)


def round_to(x: torch.Tensor, name: str) -> torch.Tensor:
    """fp32 `x` rounded to format `name` and returned as fp32 (overflow gives ±inf in every format)."""
    if x.dtype != torch.float32:
        raise TypeError(f"round_to needs an fp32 tensor, got {x.dtype}")
    f = facts(name)
    if name == "fp32":
        return x.clone()
    if name == "tf32":
        return round_mantissa(x, TF32_MANTISSA_BITS)
    mag = x.abs()
    over = (mag > f.overflow_threshold) | ((mag == f.overflow_threshold) & f.overflow_at_threshold)
    inside = torch.where(over, torch.zeros_like(x), x)  # keep the cast away from values it may saturate
    r = inside.to(TORCH_DTYPES[name]).to(torch.float32)
    return torch.where(over, torch.sign(x) * math.inf, r)


def classify(x: torch.Tensor, name: str) -> dict[str, float]:
    """Fractions of the non-zero finite values of `x` that round to 0, to a subnormal, to a normal, or overflow."""
    x = x[torch.isfinite(x) & (x != 0)].float()
    if x.numel() == 0:
        return {"underflow": 0.0, "subnormal": 0.0, "normal": 0.0, "overflow": 0.0, "n": 0}
    f, r = facts(name), round_to(x, name)
    mag = r.abs()
    n = x.numel()
    return {"underflow": (mag == 0).sum().item() / n,
            "subnormal": ((mag > 0) & (mag < f.smallest_normal)).sum().item() / n,
            "normal": ((mag >= f.smallest_normal) & torch.isfinite(mag)).sum().item() / n,
            "overflow": torch.isinf(mag).sum().item() / n, "n": n}


# ---------------------------------------------------------------- dynamic loss scaling

def to_fp32(value: float) -> float:
    """`value` rounded to the nearest fp32 (GradScaler keeps its scale in an fp32 tensor)."""
    return torch.tensor(value, dtype=torch.float64).to(torch.float32).item()


class DynamicLossScaler:
    """Dynamic loss scaling with torch.amp.GradScaler's methods and state machine, from scratch.

    Per iteration: `scale(loss).backward()`, optionally `unscale_(opt)` (to clip), `step(opt)`,
    `update()`. `unscale_` multiplies every gradient by 1/scale and notes whether any is inf or NaN;
    `step` skips `opt.step()` if so. `update` then backs off (scale *= backoff_factor, counter reset)
    after an overflow, or counts one more clean step and grows the scale (scale *= growth_factor,
    counter reset) when the counter reaches `growth_interval`; a growth that would overflow fp32 is
    dropped. The scale is held as an fp32 number and 1/scale is taken in fp64 then rounded to fp32,
    as GradScaler does, so both produce the same bits.
    """

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000, enabled: bool = True):
        if growth_factor <= 1.0:
            raise ValueError(f"growth_factor={growth_factor} must be > 1")
        if not 0.0 < backoff_factor < 1.0:
            raise ValueError(f"backoff_factor={backoff_factor} must be in (0, 1)")
        positive("growth_interval", growth_interval)
        self._enabled = enabled
        self._scale = to_fp32(init_scale)
        self._growth_factor, self._backoff_factor = growth_factor, backoff_factor
        self._growth_interval = growth_interval
        self._growth_tracker = 0  # consecutive steps without inf/NaN since the last change of scale
        self._per_optimizer: dict[int, dict[str, Any]] = {}  # id(optimizer) -> {"stage", "found_inf"}

    def _state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        return self._per_optimizer.setdefault(id(optimizer), {"stage": "ready", "found_inf": None})

    def scale(self, outputs):
        """outputs × scale (a tensor, or a list/tuple of them), multiplied by an fp32 scalar tensor.

        As in GradScaler, a 0-dim loss is promoted to fp32 (so a 16-bit loss of 30000 × 4 does not overflow),
        but a 16-bit tensor with dimensions (per-sample losses) is multiplied in its own dtype and can
        overflow to inf there; the step is then skipped like any other overflow. Reduce to a scalar first.
        """
        if not self._enabled:
            return outputs
        if isinstance(outputs, torch.Tensor):
            return outputs * torch.tensor(self._scale, dtype=torch.float32, device=outputs.device)
        if isinstance(outputs, (list, tuple)):
            return type(outputs)(self.scale(o) for o in outputs)
        raise TypeError(f"outputs must be a tensor or a list/tuple of tensors, got {type(outputs).__name__}")

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide the optimizer's gradients by the scale in place and record whether any is inf/NaN."""
        if not self._enabled:
            return
        state = self._state(optimizer)  # read: where this optimizer is in the iteration
        if state["stage"] == "unscaled":
            raise RuntimeError("unscale_() has already been called on this optimizer since the last update().")
        if state["stage"] == "stepped":
            raise RuntimeError("unscale_() is being called after step().")
        inv = to_fp32(1.0 / self._scale)  # 1/S in fp64, rounded to fp32 once: GradScaler's bits
        grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        if any(g.dtype == torch.float16 for g in grads):  # g/S would underflow again in fp16
            raise ValueError("Attempting to unscale FP16 gradients: keep fp32 master params "
                             "(autocast or MasterWeights) so unscaled values do not underflow again.")
        bad = []  # one flag per gradient, read back once (a GPU synchronises once, not per tensor)
        with torch.no_grad():
            for g in grads:
                bad.append((~torch.isfinite(g)).any())  # inf, -inf or NaN anywhere in this gradient
                g.mul_(torch.tensor(inv, dtype=torch.float32, device=g.device))  # written: g / S, in place
        # no gradients at all: nothing was checked (GradScaler then refuses to step this optimizer)
        state["found_inf"] = bool(torch.stack([b.to(bad[0].device) for b in bad]).any()) if bad else None
        state["stage"] = "unscaled"  # written: what step() and update() read

    def step(self, optimizer: torch.optim.Optimizer, *args, **kwargs):
        """Unscale (unless done already) and call optimizer.step() only if no gradient was inf/NaN."""
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not currently supported if the loss scaler is enabled.")
        state = self._state(optimizer)
        if state["stage"] == "stepped":
            raise RuntimeError("step() has already been called since the last update().")
        if state["stage"] == "ready":  # the caller did not unscale to clip: do it now
            self.unscale_(optimizer)
        if state["found_inf"] is None:
            raise RuntimeError("No inf checks were recorded for this optimizer (it has no gradients).")
        # the skip: an inf/NaN gradient would write inf/NaN into the weights, so the optimizer is not called
        result = None if state["found_inf"] else optimizer.step(*args, **kwargs)
        state["stage"] = "stepped"  # update() reads found_inf next and changes the scale
        return result

    def update(self, new_scale: float | None = None) -> None:
        """Back off after an inf/NaN in any optimizer this iteration, else count and maybe grow the scale."""
        if not self._enabled:
            return
        if new_scale is not None:
            self._scale = to_fp32(float(new_scale))
        else:
            checked = [s["found_inf"] for s in self._per_optimizer.values() if s["found_inf"] is not None]
            if not checked:
                raise RuntimeError("No inf checks were recorded prior to update().")
            if any(checked):
                self._scale = to_fp32(self._scale * self._backoff_factor)
                self._growth_tracker = 0
            elif self._growth_tracker + 1 == self._growth_interval:
                grown = to_fp32(self._scale * self._growth_factor)
                if math.isfinite(grown):
                    self._scale = grown
                self._growth_tracker = 0
            else:
                self._growth_tracker += 1
        self._per_optimizer = {}

    def get_scale(self) -> float:
        """The current scale (1.0 when disabled, as GradScaler returns)."""
        return self._scale if self._enabled else 1.0

    def is_enabled(self) -> bool:
        """Whether scaling is on."""
        return self._enabled

    def state_dict(self) -> dict[str, Any]:
        """The same keys GradScaler.state_dict() writes."""
        if not self._enabled:
            return {}
        return {"scale": self._scale, "growth_factor": self._growth_factor, "backoff_factor": self._backoff_factor,
                "growth_interval": self._growth_interval, "_growth_tracker": self._growth_tracker}

    STATE_KEYS = ("scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker")

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from `state_dict()`, ours or GradScaler's, of an enabled or a disabled scaler.

        A disabled scaler's state is {} (GradScaler's too): a disabled scaler loads it as nothing to restore,
        and an enabled one refuses it, as GradScaler does, since it holds no scale to resume from. Any other
        state must hold the five STATE_KEYS (other keys are ignored) with values the constructor accepts.
        Raises ValueError naming what is missing or wrong (TypeError when `state` is not a dict).
        """
        if not isinstance(state, Mapping):
            raise TypeError(f"state must be a dict from state_dict(), got {type(state).__name__}")
        if not state:
            if self._enabled:
                raise ValueError("this state is empty, which is what a disabled scaler saves (DynamicLossScaler or "
                                 "GradScaler with enabled=False): load it into a disabled scaler, or let this "
                                 "enabled one start from its init_scale")
            return
        missing = [k for k in self.STATE_KEYS if k not in state]
        if missing:
            raise ValueError(f"the scaler state lacks {', '.join(map(repr, missing))}: a state_dict() of an enabled "
                             f"scaler holds {', '.join(map(repr, self.STATE_KEYS))}")
        try:
            scale, growth, backoff = (float(state[k]) for k in ("scale", "growth_factor", "backoff_factor"))
        except (TypeError, ValueError, RuntimeError):
            raise ValueError(f"the state's scale, growth_factor and backoff_factor must be numbers, got "
                             f"{state['scale']!r}, {state['growth_factor']!r}, {state['backoff_factor']!r}") from None
        interval, tracker = state["growth_interval"], state["_growth_tracker"]
        if not (math.isfinite(scale) and scale > 0):
            raise ValueError(f"the state's scale={state['scale']!r} must be a positive finite number")
        if growth <= 1.0 or not 0.0 < backoff < 1.0:
            raise ValueError(f"the state's growth_factor={state['growth_factor']!r} must be > 1 and its "
                             f"backoff_factor={state['backoff_factor']!r} in (0, 1)")
        positive("growth_interval", interval)
        if isinstance(tracker, bool) or not isinstance(tracker, int) or tracker < 0:
            raise ValueError(f"the state's _growth_tracker={tracker!r} must be a non-negative int")
        self._scale = to_fp32(scale)
        self._growth_factor, self._backoff_factor = state["growth_factor"], state["backoff_factor"]
        self._growth_interval, self._growth_tracker = interval, tracker


# ---------------------------------------------------------------- master weights

class MasterWeights:
    """fp32 copies of a low-precision model's trainable parameters; hand `params` to the optimizer.

    Each step: backward on the model (low-precision grads), `grads_to_master()` (fp32 copies of the
    grads, inf/NaN kept so a loss scaler still sees them), optimizer step on the fp32 copies,
    `master_to_model()` (round the updated fp32 values back into the model).
    """

    def __init__(self, model: torch.nn.Module):
        self.model_params = [p for p in model.parameters() if p.requires_grad]  # a tied matrix appears once
        # the optimizer's parameters: fp32 leaves of their own, so its state (AdamW's moments) is fp32 too
        self.params = [p.detach().to(torch.float32).clone().requires_grad_(True) for p in self.model_params]

    def grads_to_master(self) -> None:
        """Copy the model's gradients, widened to fp32, onto the master parameters."""
        for p, m in zip(self.model_params, self.params):
            # read: the 16-bit gradient; written: its fp32 copy, where the optimizer looks for it
            m.grad = None if p.grad is None else p.grad.detach().to(torch.float32)

    @torch.no_grad()
    def master_to_model(self) -> None:
        """Write the fp32 master values, rounded to the model's dtype, into the model."""
        for p, m in zip(self.model_params, self.params):
            # the only rounding to 16 bits: the fp32 copy keeps the updates too small to move the 16-bit weight
            p.copy_(m)

    def nbytes(self) -> int:
        """Bytes held by the fp32 copies."""
        return sum(m.nbytes for m in self.params)
