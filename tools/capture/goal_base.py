"""What every goal function of `tools.capture.goals` shares: its context, the shape of its answer, and its guards.

A goal function takes a `Ctx` (profile, device, model cache) and returns `result(checks, measured, sizes)`,
or raises `NotMeasurable` with a one-sentence reason (no CUDA, no FP8 tensor cores, torchao unusable).
Each `check` is one comparison of a measured ratio with the goal's bound, `value >= bound` or
`value <= bound`, with three outcomes: met (True), missed (False), or not measured (None, with its reason).
A goal's `met` combines its checks as a three-valued AND: False if any check missed, else None if any was
not measured, else True; so a goal is never reported met on the strength of the parts that happened to run.

Trained models (goals `10.continuous_batching` and `11.speculative`) come from `trained`:
`helpers.gpt.pretrained` at the notebooks' full-profile schedule, cached in `Ctx.cache_dir`, so that they
are trained once per run and shared between goals.

The measurements themselves live in `tools.capture.goals_train` (notebooks 07, 09, 12, 13) and
`tools.capture.goals_decode` (notebooks 08, 10, 11); the registry and the runner in `tools.capture.goals`.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from helpers.gpt.pretrained import pretrained
from helpers.measure import ceilings, hardware


class NotMeasurable(Exception):
    """Raised by a goal that cannot be measured on this machine; its message is the one-sentence reason."""


@dataclass
class Ctx:
    """What a goal function gets: the profile, the device, and where trained models are cached."""

    profile: str            # "smoke" | "full"
    cache_dir: Path         # shared by the goals of one run (trained models)
    device: str = "cpu"
    partial_path: str | None = None  # set by the runner: where `partial` keeps what is measured so far

    @property
    def full(self) -> bool:
        """Whether this is the full profile (the goals' stated sizes on a GPU)."""
        return self.profile == "full"

    def pick(self, *, smoke, full):
        """The value for this profile: `full` in the full profile, else `smoke`."""
        return full if self.full else smoke

    def partial(self, **measured) -> None:
        """Keep numbers measured so far (merged with earlier calls; JSON-able values), so that a goal stopped
        at its time limit, or killed, still reports them: the runner attaches them to its record as
        "partial". A goal with several slow parts (a compile per variant) calls this after each part."""
        if self.partial_path is None:
            return
        path = Path(self.partial_path)
        try:
            kept = json.loads(path.read_text())
        except (OSError, ValueError):
            kept = {}
        kept.update(measured)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(kept, default=str))
        tmp.replace(path)


# ---------------------------------------------------------------- building a goal's result

def check(what: str, value: float | None, op: str, bound: float, reason: str = "") -> dict:
    """One comparison: `value op bound` with op ">=" or "<="; a None value is "not measured" (met None)."""
    if op not in (">=", "<="):
        raise ValueError(f"op={op!r}; choose '>=' or '<='")
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return {"what": what, "value": None, "target": f"{op} {bound:g}", "met": None,
                "reason": reason or "not measured"}
    met = value >= bound if op == ">=" else value <= bound
    return {"what": what, "value": float(value), "target": f"{op} {bound:g}", "met": bool(met)}


def result(checks: list[dict], measured: dict, sizes: dict, headline: int | None = None, note: str = "") -> dict:
    """A goal's answer: `met` is False if any check failed, None if none failed but one was not measured,
    else True; `ratio` and `target` are those of the headline check (default: the first that failed,
    else the first)."""
    if not checks:
        raise ValueError("a goal needs at least one check")
    failed = [i for i, c in enumerate(checks) if c["met"] is False]
    met = False if failed else (None if any(c["met"] is None for c in checks) else True)
    h = checks[headline if headline is not None else (failed[0] if failed else 0)]
    out = {"measured": measured, "checks": checks, "ratio": h["value"], "target": h["target"], "met": met,
           "headline": h["what"], "sizes": sizes}
    if note:
        out["note"] = note
    return out


# ---------------------------------------------------------------- guards and what several goals share

def need_cuda(why: str = "") -> None:
    """Raise NotMeasurable unless torch sees a CUDA GPU; `why` says what the goal needs it for."""
    if not torch.cuda.is_available():
        raise NotMeasurable("this machine has no CUDA GPU" + (f": {why}" if why else
                                                              ", and the goal is stated for an H100/H200"))


def need_fp8() -> None:
    """Raise NotMeasurable unless this is a CUDA GPU with FP8 tensor cores (helpers.measure.hardware.capabilities)."""
    need_cuda()
    if not hardware.capabilities()["fp8"]:
        raise NotMeasurable("this GPU has no FP8 tensor cores (compute capability 8.9 or newer is needed)")


def copy_gbps(ctx: Ctx) -> float:
    """The device copy bandwidth (GB/s, bytes read + written) every GB/s of the course is set against: the one
    rule, `helpers.measure.ceilings.bandwidth_ceiling`, as the notebooks take it."""
    return ceilings.bandwidth_ceiling(ctx.device)[0]


def trained(ctx: Ctx, preset: str, **overrides):
    """A trained course GPT (helpers.gpt.pretrained, its default full-profile schedule), cached in ctx.cache_dir."""
    return pretrained(preset, seed=0, device=ctx.device, cache_dir=ctx.cache_dir, quiet=True, progress=False,
                      **overrides)


def error_line(err: BaseException) -> str:
    """An exception in one line for a goal's record: its type and the first 200 characters of its first line."""
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0][:200] if lines else ''}"

