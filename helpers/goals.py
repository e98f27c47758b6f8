"""Every open GPU performance goal of issues 14-20, measured by one short command.

The issues' "## Performance" sections set goals that only a GPU (or, for issue 20, the H200's 16-core
host) can measure. Running the notebooks in full profile measures them too, but only two or three
notebooks fit one lent-GPU session; this module measures just the goals, each through the same
`helpers` functions the notebooks call in their full profile (never a second implementation), so one
call returns every ratio::

    python -m helpers.goals plan [--profile full|smoke] [ISSUE ...]        # what would run, H200 estimates
    python -m helpers.goals run --out DIR [--budget-s 360] [--profile full|smoke] [ISSUE ...]

`run` takes the goals in `ORDER` (cheap and most informative first), starts one only if its estimate
fits in what is left of the budget, runs each in its own process (forked from a server that has
imported torch once) with a time limit, so a hung compile or a CUDA out-of-memory error loses only
that goal, and rewrites `DIR/goals.json` atomically after every goal. A goal records: its issue, what
was measured (`measured`), the headline `ratio`, the issue's `target`, `met` (True, False, or None
when a part could not be measured), the `checks` behind it and the `sizes` used; or status "not
measurable" with a one-sentence reason (no CUDA, no FP8 tensor cores, torchao unusable), "failed"
with the error's first line, "stopped" (over its time limit) or "skipped" (budget).

Trained models (goals 16 and 18) are trained once per run, at the notebooks' full-profile schedule
(`helpers.pretrained`), into `DIR/cache/` and shared between goals.

`--profile smoke` (the default without CUDA) uses tiny sizes, so the plumbing runs on a 2-core CPU in
about a minute; the CUDA-only goals then say "not measurable". `full` uses the issues' sizes.

`scripts/gpu_capture.sh` runs this first on a lent GPU (`GOALS_BUDGET_S`, default 360 s), with the model
cache outside `$OUT` so that only `goals.json` comes back, then the notebooks with what is left of its budget;
`python -m helpers.capture import` copies `goals.json` to `results/<gpu>/goals.json`.

**How the H200 estimates were made** (`Goal.estimate_s`, seconds, none measured yet): from each
goal's sizes against the H200's datasheet rates (989 TFLOP/s dense bf16, 4.8 TB/s: NVIDIA H200
datasheet), which make the timed work itself small (an 8192^3 bf16 matmul is ~1.1 ms, a 1 GiB copy
~0.4 ms); what dominates is fixed cost: ~3 s per goal process (CUDA context, imports), ~8-15 s per
torch.compile of a small graph and ~30-45 s for a whole GPT forward+backward or a 24-layer decode
step (the cold compiles seen in notebook 06's capture on the same host: Triton compilation of forward
and backward took 1-2 minutes for several kernels), about 15 s to train small10m's 2000 steps
(launch-bound steps of ~5-7 ms) and ~8 s for its one-layer draft, and ~1 s per gloo process group
or DataLoader worker start on the 16-core host. Sizes are the issues' own; where an issue leaves a
size free, repeats were cut (and said so in `sizes`) to keep the full run near 360 s.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import multiprocessing as mp
import os
import signal
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .results import write_atomic

DEFAULT_BUDGET_S = 360.0
MARGIN_S = 5.0          # kept back to write goals.json after the last goal


class NotMeasurable(Exception):
    """Raised by a goal that cannot be measured on this machine; its message is the one-sentence reason."""


@dataclass
class Ctx:
    """What a goal function gets: the profile, the device, and where trained models are cached."""

    profile: str            # "smoke" | "full"
    cache_dir: Path         # shared by the goals of one run (trained models)
    device: str = "cpu"

    @property
    def full(self) -> bool:
        return self.profile == "full"

    def pick(self, *, smoke, full):
        return full if self.full else smoke


@dataclass
class Goal:
    """One performance goal: its issue, a key, what it claims, its function and an H200 estimate."""

    issue: int
    key: str                # e.g. "14.scaled_mm"
    title: str              # the goal in words, as the issue states it
    fn: Callable[[Ctx], dict]
    estimate_s: float       # full profile on one H200, seconds (an estimate, see the module docstring)
    basis: str              # how that estimate was made
    smoke_s: float = 10.0   # smoke profile on a 2-core CPU

    def estimate(self, profile: str) -> float:
        return self.estimate_s if profile == "full" else self.smoke_s


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


def _need_cuda(why: str = "") -> None:
    import torch

    if not torch.cuda.is_available():
        raise NotMeasurable("this machine has no CUDA GPU" + (f": {why}" if why else
                                                              ", and the goal is stated for an H100/H200"))


def _need_fp8() -> None:
    from . import hardware

    _need_cuda()
    if not hardware.capabilities()["fp8"]:
        raise NotMeasurable("this GPU has no FP8 tensor cores (compute capability 8.9 or newer is needed)")


def _copy_gbps(ctx: Ctx) -> float:
    """The measured device copy bandwidth (GB/s, bytes read + written), as notebooks 08-10 measure it."""
    from . import hardware

    return hardware.measure_copy_bandwidth(ctx.pick(smoke=2 ** 25, full=2 ** 30), ctx.device, reps=5)


def _trained(ctx: Ctx, preset: str, **overrides):
    """A trained course GPT (helpers.pretrained, its default full-profile schedule), cached in ctx.cache_dir."""
    from .pretrained import pretrained

    return pretrained(preset, seed=0, device=ctx.device, cache_dir=ctx.cache_dir, quiet=True, progress=False,
                      **overrides)


def _err(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0][:200] if lines else ''}"


# ---------------------------------------------------------------- issue 14: FP8 (notebook 07, helpers.fp8_lab)

def g14_scaled_mm(ctx: Ctx) -> dict:
    """Raw tensorwise torch._scaled_mm against the bf16 matmul, TFLOP/s at n^3 (fp8_lab.matmul_tflops)."""
    _need_fp8()
    from . import fp8_lab

    n, reps = ctx.pick(smoke=512, full=8192), ctx.pick(smoke=3, full=20)
    bf16 = fp8_lab.matmul_tflops(n, "bf16", reps)
    tw = fp8_lab.matmul_tflops(n, "tensorwise", reps)
    return result([check("tensorwise _scaled_mm / bf16 matmul TFLOP/s", tw / bf16, ">=", 1.6)],
                  {"bf16_tflops": bf16, "tensorwise_tflops": tw}, {"n": n, "reps": reps})


def g14_float8_linear(ctx: Ctx) -> dict:
    """The course rowwise Float8Linear, forward+backward, compiled, against the bf16 linear and torchao's
    rowwise (fp8_lab.linear_tflops, as notebook 07's speed sweep)."""
    _need_fp8()
    from . import fp8, fp8_lab

    n, reps = ctx.pick(smoke=512, full=8192), ctx.pick(smoke=3, full=20)
    compile_ = ctx.full  # notebook 07 compiles in its full profile only
    bf16 = fp8_lab.linear_tflops(n, "bf16", reps, compile=compile_)
    ours = fp8_lab.linear_tflops(n, "ours rowwise", reps, compile=compile_)
    measured = {"bf16_tflops": bf16, "ours_rowwise_tflops": ours}
    refused = fp8.scaled_mm_refusal("cuda", rowwise=True)  # then fp8.scaled_mm fell back to its fp32 emulation
    ours_why = f"torch._scaled_mm refused rowwise scales here, so ours ran its fp32 emulation: {refused}" if refused else ""
    if refused:
        measured["ours_rowwise_emulated"] = refused
    why = fp8.torchao_problem("rowwise", "cuda")  # as notebook 07: torchao unusable here, in one sentence
    ratio_ao, reason = None, why or ""
    if why is None:
        try:
            measured["torchao_rowwise_tflops"] = fp8_lab.linear_tflops(n, "torchao rowwise", reps, compile=compile_)
            ratio_ao = ours / measured["torchao_rowwise_tflops"]
        except Exception as err:  # noqa: BLE001: torchao refusing this torch or shape is a finding, not a crash
            reason = f"torchao's rowwise linear did not run: {_err(err)}"
    if refused:
        ratio_ao, reason = None, ours_why
    return result([check("ours rowwise / bf16 linear fwd+bwd TFLOP/s", None if refused else ours / bf16, ">=", 1.25,
                         ours_why),
                   check("ours rowwise / torchao rowwise TFLOP/s (within 5%: >= 0.95)", ratio_ao, ">=", 0.95, reason)],
                  measured, {"n": n, "reps": reps, "compiled": compile_})


# ---------------------------------------------------------------- issue 15: torch.compile (notebook 09)

def g15_fused_bandwidth(ctx: Ctx) -> dict:
    """Compiled pointwise chain and LayerNorm against the copy bandwidth (compile_lab.measure_workload)."""
    _need_cuda("bf16 kernels Inductor writes in Triton")
    import torch

    from . import compile_lab

    rows, cols = ctx.pick(smoke=(256, 1024), full=(8192, 4096))
    reps = ctx.pick(smoke=5, full=30)
    copy = _copy_gbps(ctx)
    checks, measured = [], {"copy_gbps": copy}
    for name in ("pointwise", "layernorm"):
        r = compile_lab.measure_workload(name, rows, cols, dtype=torch.bfloat16, device="cuda", reps=reps, kernels=False)
        measured[f"{name}_compiled_gbps"] = r["gbps"]["compiled"]
        checks.append(check(f"compiled {name} GB/s / copy GB/s", r["gbps"]["compiled"] / copy, ">=", 0.8))
    return result(checks, measured, {"rows": rows, "cols": cols, "dtype": "bf16", "reps": reps})


def g15_triton_softmax(ctx: Ctx) -> dict:
    """The course Triton softmax against the compiled and the eager softmax, per row length
    (compile_lab.softmax_sweep, as notebook 09)."""
    _need_cuda("the Triton softmax runs only in Triton's interpreter without one, untimed")
    import torch

    from . import compile_lab, triton_softmax

    if triton_softmax.BROKEN:
        raise NotMeasurable(f"the Triton softmax is unavailable here ({triton_softmax.BROKEN})")
    cols_list = ctx.pick(smoke=[256, 1024], full=[256, 1024, 4096, 16384])
    rows, reps = ctx.pick(smoke=256, full=8192), ctx.pick(smoke=5, full=20)
    sw = compile_lab.softmax_sweep(cols_list, rows, dtype=torch.bfloat16, device="cuda", reps=reps)
    checks = []
    for i, cols in enumerate(sw["cols"]):
        t, c, e = sw["triton"][i], sw["compiled"][i], sw["eager"][i]
        checks.append(check(f"Triton / compiled GB/s, row length {cols}", t / c if t and c else None, ">=", 0.9))
        checks.append(check(f"Triton / eager GB/s, row length {cols}", t / e if t and e else None, ">=", 1.5))
    return result(checks, {k: sw[k] for k in ("cols", "eager", "compiled", "library", "triton")},
                  {"rows": rows, "row_lengths": cols_list, "dtype": "bf16", "reps": reps})


def _gpt_config(ctx: Ctx):
    from .model import PRESETS, GPTConfig

    preset = ctx.pick(smoke="tiny", full="small10m")
    return preset, GPTConfig.preset(preset, n_layer=ctx.pick(smoke=1, full=PRESETS[preset]["n_layer"]),
                                    seq_len=ctx.pick(smoke=32, full=256))


def g15_reduce_overhead(ctx: Ctx) -> dict:
    """reduce-overhead (CUDA graphs) against default compile on a batch-1 one-token forward
    (compile_lab.one_token_forward, as notebook 09)."""
    _need_cuda("CUDA graphs need CUDA")
    from . import compile_lab

    preset, cfg = _gpt_config(ctx)
    reps = ctx.pick(smoke=20, full=100)
    d = compile_lab.one_token_forward(cfg, ["default", "reduce-overhead"], device="cuda", reps=reps)
    ms = {k: v["timing"].median * 1e3 for k, v in d.items()}
    return result([check("default / reduce-overhead time per one-token forward", ms["default"] / ms["reduce-overhead"],
                         ">=", 2.0)],
                  {"ms": ms, "compile_s": {k: v["compile_s"] for k, v in d.items()}},
                  {"preset": preset, "n_layer": cfg.n_layer, "batch": 1, "tokens": 1, "reps": reps,
                   "dtype": "fp32 (one_token_forward builds the model in fp32; the issue says bf16)"})


def g15_train_step(ctx: Ctx) -> dict:
    """The course GPT's training step, compiled against eager (compile_lab.train_step_compare, bf16 autocast)."""
    _need_cuda("the goal is a bf16 training step on a GPU")
    import torch

    from . import compile_lab

    preset, cfg = _gpt_config(ctx)
    batch, reps = ctx.pick(smoke=4, full=16), ctx.pick(smoke=5, full=20)
    g = compile_lab.train_step_compare(cfg, batch, device="cuda", reps=reps, autocast_dtype=torch.bfloat16)
    med, lo, hi = g["ratio"]
    return result([check("eager / compiled step time (median per round)", med, ">=", 1.3)],
                  {"eager_ms": g["timings"]["eager"].median * 1e3, "compiled_ms": g["timings"]["compiled"].median * 1e3,
                   "ratio_iqr": [lo, hi], "first_step_s": g["first_step_s"]},
                  {"preset": preset, "n_layer": cfg.n_layer, "batch": batch, "seq_len": cfg.seq_len, "reps": reps,
                   "dtype": "bf16 autocast"})


# ---------------------------------------------------------------- issue 16: KV cache and serving (notebook 10)

def g16_decode_bandwidth(ctx: Ctx) -> dict:
    """Batch-1 bf16 decode of the largest preset, static cache, compiled: bandwidth against copy
    (kv_lab.compiled_decode on kv_lab.random_model, as notebook 10)."""
    _need_cuda("compiled decode with CUDA graphs needs CUDA")
    import torch

    from . import kv_lab

    preset, reps = ctx.pick(smoke="small10m", full="1.3b"), ctx.pick(smoke=5, full=20)
    copy = _copy_gbps(ctx)
    model = kv_lab.random_model(preset, torch.bfloat16, "cuda")
    context = min(ctx.pick(smoke=64, full=512), model.config.seq_len - 2)
    c = kv_lab.compiled_decode(model, context, reps)
    return result([check("compiled decode GB/s / copy GB/s", c["compiled_gbps"] / copy, ">=", 0.7)],
                  {"copy_gbps": copy, "compiled_gbps": c["compiled_gbps"], "eager_gbps": c["eager_gbps"],
                   "compiled_ms": 1e3 * c["compiled_s"], "eager_ms": 1e3 * c["eager_s"]},
                  {"preset": preset, "context": context, "batch": 1, "dtype": "bf16", "reps": reps})


def g16_paged_decode(ctx: Ctx) -> dict:
    """Paged decode attention (the Triton kernel, best block size) against contiguous SDPA at 4k tokens
    (serving_lab.paged_section, as notebook 10; its timing depends on the model's shape, not its weights)."""
    _need_cuda("the Triton paged kernel is only checked, not timed, without one")
    from . import data, serving_lab
    from .model import GPT, GPTConfig

    import torch

    torch.manual_seed(0)
    model = GPT(GPTConfig.preset(ctx.pick(smoke="tiny", full="small10m"))).to("cuda").float().eval()
    context, batch = ctx.pick(smoke=256, full=4096), ctx.pick(smoke=8, full=32)
    blocks, reps = ctx.pick(smoke=[16], full=[16, 64, 128]), ctx.pick(smoke=5, full=20)
    p = serving_lab.paged_section(model, block_sizes=blocks, n_requests=ctx.pick(smoke=24, full=200),
                                  context=context, batch=batch, reps=reps, corpus=data.load_corpus("val"), seed=0,
                                  show=False)
    rows = [r for r in p["speed"] if r.get("paged triton us")]
    best = min(rows, key=lambda r: r["paged triton us"] / r["contiguous us"]) if rows else None
    ratio = best["paged triton us"] / best["contiguous us"] if best else None
    return result([check("paged Triton / contiguous decode attention time (best block size)", ratio, "<=", 1.10,
                         "the Triton paged kernel did not run")],
                  {"rows": p["speed"], "best_block_size": best and best["block size"]},
                  {"context": context, "batch": batch, "block_sizes": blocks, "reps": reps, "dtype": "fp32"})


def g16_continuous_batching(ctx: Ctx) -> dict:
    """Continuous against static batching, same request mix and KV memory (serving_lab.batching_section on
    the trained model notebook 10 serves; 128 requests instead of its 200, one run per policy instead of
    its three, and without its tight-pool and served-alone checks, which do not enter the ratio)."""
    from . import data, serving_lab

    tm = _trained(ctx, ctx.pick(smoke="tiny", full="small10m"))
    model = tm.model.float().eval()
    n_req, max_batch = ctx.pick(smoke=6, full=128), ctx.pick(smoke=4, full=32)
    b = serving_lab.batching_section(model, n_requests=n_req, max_batch=max_batch,
                                     max_new_tokens=ctx.pick(smoke=8, full=None), repeats=1,
                                     corpus=data.load_corpus("val"), seed=0, tight_pool=False, check_solo=False,
                                     show=False)
    rec = b["record"]
    return result([check("continuous / static tokens/s", b["speedup"], ">=", 2.0)],
                  {"static_tokens_per_s": rec["static_tokens_per_s"],
                   "continuous_tokens_per_s": rec["continuous_tokens_per_s"], "same_tokens": rec["same_tokens"]},
                  {"preset": ctx.pick(smoke="tiny", full="small10m"), "n_requests": n_req,
                   "max_batch": max_batch, "num_blocks": rec["num_blocks"], "block_size": rec["block_size"],
                   "repeats": 1, "device": ctx.device})


# ---------------------------------------------------------------- issue 17: quantized decode (notebook 08)

def g17_quantized_decode(ctx: Ctx) -> dict:
    """Batch-1 decode tokens/s of int8 and int4 weight-only against bf16, and each one's bandwidth against
    copy (quant_lab.decode_speed, as notebook 08)."""
    _need_cuda("decode speed is measured on a GPU only")
    from . import quant_lab

    preset, reps = ctx.pick(smoke="tiny", full="1.3b"), ctx.pick(smoke=5, full=20)
    copy = _copy_gbps(ctx)
    rows = quant_lab.decode_speed(preset, batches=(1,), reps=reps, variants=("bf16", "int8", "int4-triton"),
                                  group_size=64)
    by = {r["variant"]: r for r in rows}
    tps = {k: by[k]["tokens_per_s"] if k in by else None for k in ("bf16", "int8", "int4-triton")}
    why = {k: by[k].get("why", "") for k in by}

    def ratio(k):
        return tps[k] / tps["bf16"] if tps[k] and tps["bf16"] else None

    def bw(k):
        return by[k]["gbps"] / copy if k in by and by[k].get("gbps") else None
    return result([check("int8 / bf16 tokens/s", ratio("int8"), ">=", 1.4, why.get("int8", "")),
                   check("int4 / bf16 tokens/s", ratio("int4-triton"), ">=", 1.8, why.get("int4-triton", "")),
                   check("int8 GB/s / copy GB/s", bw("int8"), ">=", 0.6, why.get("int8", "")),
                   check("int4 GB/s / copy GB/s", bw("int4-triton"), ">=", 0.6, why.get("int4-triton", ""))],
                  {"copy_gbps": copy, "rows": rows}, {"preset": preset, "batch": 1, "prompt": 64, "reps": reps,
                                                      "group_size": 64})


def g17_compiled_decode(ctx: Ctx) -> dict:
    """The same comparison with the whole decode step compiled (kv_lab.compiled_decode: static cache and CUDA
    graphs, as gpt-fast measures its 104.9 -> 155.6 -> 196.8 tok/s): `17.quantized_decode` times eager steps,
    where Python's kernel launches are paid by every variant alike and can hide what the weights' bytes save.
    int4 runs the course's Triton kernel inside the compiled step, or, if that cannot be compiled, the
    unpack-and-matmul that Inductor fuses (the backend used is recorded)."""
    _need_cuda("CUDA graphs need CUDA")
    import copy as _copy

    import torch

    from . import kv_lab, quant_lab
    from . import quant_linear as ql
    from .model import GPT, GPTConfig

    preset, reps, context = ctx.pick(smoke="tiny", full="1.3b"), ctx.pick(smoke=5, full=20), 64
    copy = _copy_gbps(ctx)
    torch.manual_seed(0)
    with torch.device("cuda"):
        base = GPT(GPTConfig.preset(preset)).to(torch.bfloat16).eval()
    rows, why = {}, {}
    for name, bits, backends in (("bf16", None, (None,)), ("int8", 8, ("torch",)), ("int4", 4, ("triton", "torch"))):
        for backend in backends:
            model = None
            try:
                model = quant_lab.weight_only_copy(base, bits, backend, 64) if bits else _copy.deepcopy(base)
                # the int codes and scales are buffers, which kv_lab.weight_bytes leaves out
                qbytes = sum(m.weight_bytes() for m in model.modules() if isinstance(m, ql.WeightOnlyLinear))
                c = kv_lab.compiled_decode(model, context, reps)
                rows[name] = {"backend": backend, "ms": 1e3 * c["compiled_s"], "tokens_per_s": 1 / c["compiled_s"],
                              "gbps": (c["bytes"] + qbytes) / c["compiled_s"] / 1e9, "eager_gbps": c["eager_gbps"]}
                why.pop(name, None)
                break
            except Exception as err:  # noqa: BLE001 - a variant that cannot be compiled: its reason, the others go on
                why[name] = f"{backend or 'bf16'}: {_err(err)}"
            finally:
                del model
                torch.cuda.empty_cache()

    def ratio(k):
        return rows[k]["tokens_per_s"] / rows["bf16"]["tokens_per_s"] if k in rows and "bf16" in rows else None

    def bw(k):
        return rows[k]["gbps"] / copy if k in rows else None
    return result([check("compiled int8 / bf16 tokens/s", ratio("int8"), ">=", 1.4, why.get("int8", why.get("bf16", ""))),
                   check("compiled int4 / bf16 tokens/s", ratio("int4"), ">=", 1.8, why.get("int4", why.get("bf16", ""))),
                   check("compiled int8 GB/s / copy GB/s", bw("int8"), ">=", 0.6, why.get("int8", "")),
                   check("compiled int4 GB/s / copy GB/s", bw("int4"), ">=", 0.6, why.get("int4", ""))],
                  {"copy_gbps": copy, "rows": rows, "why": why},
                  {"preset": preset, "batch": 1, "context": context, "reps": reps, "group_size": 64,
                   "mode": "reduce-overhead"})


# ---------------------------------------------------------------- issue 18: speculative decoding (notebook 11)

def g18_speculative(ctx: Ctx) -> dict:
    """Measured speedup against the formula for each γ at temperature 0, and the best γ's speedup with the
    draft's cost (spec_lab.decode_costs and speed_grid on the trained target and draft of notebook 11)."""
    import torch

    from . import data, spec_lab

    if ctx.device == "cpu":
        torch.set_num_threads(1)  # as notebook 11: the small models' ops only contend across threads
    preset, width = ctx.pick(smoke="tiny", full="small10m"), ctx.pick(smoke=64, full=128)
    target = _trained(ctx, preset).model.float().eval()
    draft = _trained(ctx, preset, n_layer=1, d_model=width, n_head=2, d_ff=4 * width).model.float().eval()
    gammas = ctx.pick(smoke=[1, 2], full=list(range(1, 9)))
    rounds, n = ctx.pick(smoke=1, full=3), ctx.pick(smoke=16, full=128)
    prompt_len, reps = ctx.pick(smoke=32, full=64), ctx.pick(smoke=5, full=30)
    prompts = spec_lab.prompts(data.load_corpus("val"), rounds, prompt_len, seed=0)
    costs = spec_lab.decode_costs(target, draft, prompts[0], gammas, reps=reps, device=ctx.device)
    name = f"gpt-1L{width}d"
    grid = spec_lab.speed_grid(target, {name: draft}, prompts, n, gammas, [0.0], costs, device=ctx.device, seed=0)
    checks = [check(f"measured / formula speedup, γ={r['gamma']} (within 15%: >= 0.85)", r["speedup"] / r["predicted"],
                    ">=", 0.85) for r in grid]
    checks += [check(f"measured / formula speedup, γ={r['gamma']} (within 15%: <= 1.15)", r["speedup"] / r["predicted"],
                     "<=", 1.15) for r in grid]
    best = max(grid, key=lambda r: r["speedup"])
    checks.append(check(f"best speedup over plain decoding (γ={best['gamma']})", best["speedup"], ">=", 1.5))
    checks.append(check("draft cost c (draft / target decoding time; 10x cheaper: <= 0.1)", best["c"], "<=", 0.1))
    keep = ("gamma", "alpha", "tokens_per_pass", "expected", "speedup", "speedup_q25", "speedup_q75", "c", "predicted",
            "predicted_verify", "noise")
    return result(checks, {"rows": [{k: r[k] for k in keep} for r in grid], "target_ms": costs["target_ms"],
                           "draft_ms": costs["draft_ms"]},
                  {"target": preset, "draft": name, "gammas": gammas, "temperature": 0.0, "rounds": rounds,
                   "new_tokens": n, "prompt_len": prompt_len, "reps": reps, "device": ctx.device},
                  headline=len(checks) - 2)


# ---------------------------------------------------------------- issue 19: data loading (notebook 12)

def _documents(ctx: Ctx):
    """Notebook 12's document store and model config for this profile (smoke: one layer of tiny)."""
    from . import data, loading
    from .model import PRESETS, GPTConfig

    row_len = ctx.pick(smoke=64, full=256)
    lengths = loading.document_lengths(ctx.pick(smoke=3000, full=40000), median=ctx.pick(smoke=24, full=80),
                                       sigma=1.0, min_len=8, max_len=row_len, seed=0)
    store = loading.DocumentStore(data.load_corpus("train"), lengths, "numpy")
    preset = ctx.pick(smoke="tiny", full="small10m")
    cfg = GPTConfig.preset(preset, seq_len=row_len, n_layer=ctx.pick(smoke=1, full=PRESETS[preset]["n_layer"]))
    return store, cfg, row_len


def _maker(cfg, device: str):
    import torch

    from .model import GPT

    def make():
        torch.manual_seed(0)
        return GPT(cfg).to(device)
    return make


def g19_data_wait(ctx: Ctx) -> dict:
    """Data wait as a share of step time after tuning the loader: notebook 12's sweep (loading.sweep_rounds)
    over workers and prefetch, the fastest loader's idle share (fewer configurations than the notebook's)."""
    from . import loading

    store, cfg, row_len = _documents(ctx)
    workers = ctx.pick(smoke=2, full=8)
    batch, steps = ctx.pick(smoke=8, full=64), ctx.pick(smoke=2, full=30)
    ds = loading.DocumentDataset(store, latency_ms=ctx.pick(smoke=10.0, full=0.5))
    configs = [{"num_workers": 0}, {"num_workers": workers}] + ctx.pick(smoke=[], full=[{"num_workers": workers,
                                                                                      "prefetch_factor": 4}])
    rounds = ctx.pick(smoke=1, full=2)
    sweep = loading.sweep_rounds(_maker(cfg, ctx.device), ds, configs, steps=steps, rounds=rounds, device=ctx.device,
                                 batch_size=batch, row_len=row_len, seed=0, kind="pad", pin_memory=ctx.device == "cuda")
    best = max(sweep, key=lambda r: r["tokens_per_s"])  # the tuned loader, as notebook 12 picks it
    return result([check("data wait / step time, fastest loader", best["wait_ms"] / best["step_ms"], "<=", 0.02)],
                  {"rows": [{k: r[k] for k in ("num_workers", "wait_ms", "copy_ms", "compute_ms", "step_ms", "idle",
                                               "tokens_per_s")
                             if k in r} | {"prefetch_factor": r.get("prefetch_factor", 2)} for r in sweep],
                   "best": {k: best.get(k) for k in ("num_workers", "prefetch_factor", "wait_ms", "step_ms", "idle",
                                                      "tokens_per_s")}},
                  {"preset": ctx.pick(smoke="tiny", full="small10m"), "row_len": row_len, "batch": batch,
                   "steps": steps, "rounds": rounds, "workers": [0, workers], "device": ctx.device})


def g19_pinned(ctx: Ctx) -> dict:
    """Pinned against pageable host-to-device copies of >= 64 MB (loading.h2d_bandwidth, as notebook 12)."""
    _need_cuda("pinned memory only speeds up copies to an accelerator")
    from . import loading

    sizes, reps = ctx.pick(smoke=[2 ** 26], full=[2 ** 26, 2 ** 28]), ctx.pick(smoke=5, full=20)
    rows = loading.h2d_bandwidth(sizes, reps=reps)
    return result([check(f"pinned / pageable GB/s at {r['bytes'] // 2 ** 20} MB", r["pinned"] / r["pageable"], ">=", 2.0)
                   for r in rows], {"rows": rows}, {"bytes": sizes, "reps": reps})


def g19_packing(ctx: Ctx) -> dict:
    """Packed against padded tokens/s on the heavy-tailed mix: notebook 12's packing cell, step for step
    (packing.pad_batch / pack_batch, loading.train_step, bench.benchmark_interleaved)."""
    import torch

    from . import bench, loading, packing

    store, cfg, row_len = _documents(ctx)
    batch, reps = ctx.pick(smoke=8, full=64), ctx.pick(smoke=3, full=20)
    docs = [loading.DocumentDataset(store)[i] for i in range(4 * batch)]
    variants = {"padded": (packing.pad_batch(docs, row_len), False), "packed": (packing.pack_batch(docs, row_len), True)}
    make = _maker(cfg, ctx.device)
    models = {k: make() for k in variants}
    opts = {k: torch.optim.AdamW(models[k].parameters(), lr=1e-3) for k in variants}
    dev = {k: b.to(ctx.device) for k, (b, _) in variants.items()}
    steps = {k: (lambda k=k: loading.train_step(models[k], dev[k], opts[k], variants[k][1])) for k in variants}
    t = bench.benchmark_interleaved(steps, reps=reps, warmup=1, device=ctx.device)
    tps = {k: b.tokens / t[k].median for k, (b, _) in variants.items()}
    return result([check("packed / padded tokens/s", tps["packed"] / tps["padded"], ">=", 1.5)],
                  {"tokens_per_s": tps, "rows": {k: len(b.x) for k, (b, _) in variants.items()},
                   "padding": {k: b.padding for k, (b, _) in variants.items()}},
                  {"preset": ctx.pick(smoke="tiny", full="small10m"), "documents": len(docs), "row_len": row_len,
                   "reps": reps, "device": ctx.device})


# ---------------------------------------------------------------- issue 20: distributed (notebook 13; CPU ranks)

def _world(ctx: Ctx) -> tuple[int, int, str]:
    """Ranks for the goal (8 on >= 16 cores), the cores, and a note when fewer ranks than the goal's 8 run."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    world = ctx.pick(smoke=2, full=8 if cores >= 16 else max(2, min(8, cores // 2)))
    note = "" if world == 8 else f"{world} gloo ranks on {cores} cores (the goal asks for 8 on a 16-core host)"
    return world, cores, note


def g20_ring(ctx: Ctx) -> dict:
    """The course ring all-reduce against dist.all_reduce for messages >= 16 MB
    (dist_lab.section_collectives on gloo ranks, as notebook 13)."""
    from . import dist_lab
    from . import distributed as D

    world, cores, note = _world(ctx)
    sizes, reps = ctx.pick(smoke=[2 ** 14, 2 ** 18], full=[2 ** 24, 2 ** 26]), ctx.pick(smoke=1, full=5)
    coll = D.run_on_ranks(dist_lab.section_collectives, world, sizes, 3 * reps)[0]
    sw = coll["sweep"]
    size = lambda n: f"{n / 2 ** 20:g} MiB" if n >= 2 ** 20 else f"{n / 2 ** 10:g} KiB"  # noqa: E731
    checks = [check(f"ring / dist.all_reduce time at {size(n)}", r / t, "<=", 1.5)
              for n, r, t in zip(sw["sizes"], sw["ring"], sw["torch"])]
    return result(checks, {"sizes": sw["sizes"], "ring_s": sw["ring"], "torch_s": sw["torch"],
                           "int_exact": coll["check"]["int exact"]},
                  {"world": world, "cores": cores, "bytes": sizes, "reps": 3 * reps}, note=note)


def g20_bucketed_ddp(ctx: Ctx) -> dict:
    """Overlapped, bucketed DDP against synchronising after backward, at the batch whose compute is closest to
    the communication (dist_lab.measure_ddp, as notebook 13)."""
    from . import dist_lab
    from . import distributed as D

    world, cores, note = _world(ctx)
    rows, reps = ctx.pick(smoke=[8], full=[16, 64, 256]), ctx.pick(smoke=2, full=8)
    depth = ctx.pick(smoke=2, full=8)
    m = D.run_on_ranks(dist_lab.measure_ddp, world, 1024, depth, rows, reps, 1.0)[0]
    near = min(rows, key=lambda r: abs(math.log(m[r]["compute only"] / m["comm"])))
    t = m[near]
    return result([check("after-backward / bucketed step time (>= 1.2: 20% faster)", t["after backward"] / t["bucketed"],
                         ">=", 1.2)],
                  {"comm_s": m["comm"], "rows": {r: {k: m[r][k] for k in ("compute only", "after backward", "overlapped",
                                                                          "bucketed", "iqr")} for r in rows},
                   "near_row": near, "compute_over_comm": t["compute only"] / m["comm"]},
                  {"world": world, "cores": cores, "width": 1024, "depth": depth, "rows": rows, "reps": reps,
                   "bucket_mb": 1.0}, note=note)


def g20_zero_memory(ctx: Ctx) -> dict:
    """Memory per rank against the ZeRO formulas, stages 0-3 (dist_lab.measure_memory, parallel.zero_formula)."""
    from . import dist_lab, parallel
    from . import distributed as D
    from .model import PRESETS

    _, cores, _ = _world(ctx)
    preset = ctx.pick(smoke="tiny", full="small10m")
    cfg = {**PRESETS[preset], "seq_len": 32}
    ranks = ctx.pick(smoke=[2], full=[2, 4])
    worst, rows = 0.0, []
    for n in ranks:
        got = D.run_on_ranks(dist_lab.measure_memory, n, cfg)
        psi = got[0][0]["n_params"]
        for stage in range(4):
            have = max(r[stage]["total"] for r in got)
            want = parallel.zero_formula(stage, psi, n)["total"]
            rows.append({"ranks": n, "stage": stage, "bytes": have, "formula": want, "deviation": have / want - 1})
            worst = max(worst, abs(have / want - 1))
    return result([check("largest |memory / ZeRO formula - 1| over stages 0-3", worst, "<=", 0.05)], {"rows": rows},
                  {"preset": preset, "ranks": ranks, "cores": cores})


# ---------------------------------------------------------------- the registry

def _g(issue, key, title, fn, est, basis, smoke=10.0) -> Goal:
    return Goal(issue, f"{issue}.{key}", title, fn, est, basis, smoke)


GOALS: list[Goal] = [
    _g(14, "scaled_mm", "tensorwise _scaled_mm >= 1.6x bf16 TFLOP/s at 8192^3", g14_scaled_mm, 10,
       "two 8192^3 matmuls x 23 calls (~1-2 ms each), casts; the goal process and CUDA start-up dominate"),
    _g(14, "float8_linear", "rowwise Float8Linear fwd+bwd compiled >= 1.25x bf16 at 8192, within 5% of torchao",
       g14_float8_linear, 30, "three torch.compile'd linears fwd+bwd (~10 s each cold; torchao may refuse at once), "
       "6 n^3 = 3.3e12 FLOPs per step x 23 steps"),
    _g(15, "fused_bandwidth", "compiled pointwise chain and LayerNorm >= 80% of copy bandwidth (bf16)",
       g15_fused_bandwidth, 20, "two small compiles (~8 s each), 8192x4096 bf16 (64 MiB) x 32 calls x 3 impls"),
    _g(15, "triton_softmax", "Triton softmax >= 0.9x compiled and >= 1.5x eager, rows 256..16384",
       g15_triton_softmax, 28, "four static compiles of the softmax (~6 s each), the Triton kernel's compile, "
       "up to 256 MiB per call x 22 calls x 4 impls"),
    _g(15, "reduce_overhead", "reduce-overhead >= 2x default compile on the batch-1 decode step",
       g15_reduce_overhead, 25, "two compiles of small10m's forward (~15 s each), 100 one-token calls"),
    _g(15, "train_step", "GPT training step compiled >= 1.3x eager", g15_train_step, 35,
       "compile of small10m's forward and backward (~30 s), 20 steps of 16x256 tokens each way"),
    _g(16, "decode_bandwidth", "compiled batch-1 decode of the largest preset >= 70% of copy bandwidth",
       g16_decode_bandwidth, 50, "1.3B init on the GPU, compile of the 24-layer static-cache step with CUDA graphs "
       "(~40 s), 2.6 GB read per token (~0.6 ms) x 23"),
    _g(16, "paged_decode", "paged decode attention within 10% of contiguous at 4k context", g16_paged_decode, 12,
       "the Triton paged kernel's compile per block size (3 x ~1 s), 32 x 4096 tokens x 20 calls"),
    _g(16, "continuous_batching", "continuous batching >= 2x static tokens/s, same mix and memory",
       g16_continuous_batching, 30, "training small10m (2000 launch-bound steps of ~5-7 ms, ~15 s, shared with issue "
       "18), then 128 requests served once per policy (~3 s each, Python-bound iterations)"),
    _g(17, "quantized_decode", "int8 >= 1.4x and int4 >= 1.8x bf16 decode tok/s, each >= 60% copy BW",
       g17_quantized_decode, 40, "1.3B init, the int8 path's compile (~20 s), the Triton int4 kernels' compile "
       "(~10 s), 3 variants x 25 decode steps"),
    _g(17, "compiled_decode", "the same with the whole decode step compiled (CUDA graphs), as gpt-fast measures",
       g17_compiled_decode, 150, "three (or four, if the Triton int4 kernel cannot be compiled) compiles of the "
       "24-layer 1.3B static-cache step with CUDA graphs (~40 s each, as 16.decode_bandwidth's), 23 steps each"),
    _g(18, "speculative", "speedup within 15% of formula for γ 1..8 at T=0; best γ >= 1.5x, draft >= 10x cheaper",
       g18_speculative, 25, "the one-layer draft's training (~8 s; small10m comes from issue 16's run, or ~15 s "
       "more), 3 rounds x (2 plain + 1 draft + 8 speculative) generations of 128 tokens at ~1.5 ms a token"),
    _g(19, "data_wait", "data wait <= 2% of step time after tuning", g19_data_wait, 15,
       "3 loader settings x 2 rounds x 31 small10m steps (~25 ms each), ~1 s per worker start-up"),
    _g(19, "pinned", "pinned >= 2x pageable host-to-device for >= 64 MB", g19_pinned, 5,
       "64 and 256 MiB copies x 22 x 3 kinds at ~25-50 GB/s"),
    _g(19, "packing", "packed >= 1.5x padded tokens/s on the heavy-tailed mix", g19_packing, 6,
       "two small10m models, 21 steps each of 64-256 rows x 256 tokens"),
    _g(20, "ring", "ring all-reduce within 1.5x of dist.all_reduce for >= 16 MB (8 gloo ranks)", g20_ring, 15,
       "8 ranks' start-up (~3 s), 16 and 64 MiB x 17 calls x (ping, ring, all_reduce) at ~1-2 GB/s of gloo"),
    _g(20, "bucketed_ddp", "bucketed DDP >= 20% faster than syncing after backward", g20_bucketed_ddp, 25,
       "8 ranks of 2 threads, an 8-layer 1024-wide tower (8.4M params, 34 MB of gradients): fwd+bwd at 256 rows "
       "~13 GFLOP (~0.2 s), x 3 batch sizes x 4 modes x 9 steps, plus the all-reduces (~50-100 ms each)"),
    _g(20, "zero_memory", "memory per rank within 5% of the ZeRO formulas", g20_zero_memory, 12,
       "small10m, one step per stage on 2 and 4 ranks, rank start-up"),
]
BY_KEY = {g.key: g for g in GOALS}

# cheap and most informative first: the single-ratio GPU checks, the CPU-side goals, then the compiles and
# the training (16's batching trains small10m, which 18 then loads), the 1.3B decode compile last
ORDER = ["14.scaled_mm", "19.pinned", "19.packing", "15.fused_bandwidth", "16.paged_decode", "19.data_wait",
         "20.ring", "20.zero_memory", "20.bucketed_ddp", "14.float8_linear", "15.triton_softmax",
         "15.reduce_overhead", "15.train_step", "17.quantized_decode", "16.continuous_batching",
         "18.speculative", "16.decode_bandwidth", "17.compiled_decode"]
assert sorted(ORDER) == sorted(BY_KEY), "ORDER must name every goal once"


def select(wanted: list[str] | None = None) -> list[Goal]:
    """Goals in ORDER, restricted to `wanted` issue numbers ("14") or keys ("14.scaled_mm").
    Raises ValueError naming what matched nothing."""
    wanted = [str(w) for w in (wanted or [])]
    bad = [w for w in wanted if w not in BY_KEY and not any(k.split(".")[0] == w for k in BY_KEY)]
    if bad:
        raise ValueError(f"no goal matches {bad}; issues: {sorted({g.issue for g in GOALS})}, keys: {', '.join(ORDER)}")
    return [BY_KEY[k] for k in ORDER
            if not wanted or k in wanted or k.split(".")[0] in wanted]


# ---------------------------------------------------------------- running goals, each in its own process

def _child(fn: Callable[[Ctx], dict], ctx: Ctx, path: str) -> None:
    """In the goal's process: a new session (so the whole group can be stopped), run, write the outcome."""
    try:
        os.setsid()
    except OSError:
        pass
    out: dict[str, Any]
    try:
        import torch

        ctx.device = "cuda" if torch.cuda.is_available() else "cpu"
        out = {"status": "measured", "device": torch.cuda.get_device_name(0) if ctx.device == "cuda" else "cpu",
               **fn(ctx)}
    except NotMeasurable as err:
        out = {"status": "not measurable", "reason": str(err)}
    except BaseException as err:  # noqa: BLE001: any failure is this goal's, reported in one line
        out = {"status": "failed", "error": _err(err), "traceback": traceback.format_exc()[-2000:]}
    Path(path).write_text(json.dumps(out, default=_jsonable))


def _jsonable(x):
    if hasattr(x, "item"):
        return x.item()
    if isinstance(x, (set, tuple)):
        return list(x)
    return str(x)


_CTX = None


def _context():
    """A forkserver that imported torch once: each goal forks from it, fresh, cheap and CUDA-clean."""
    global _CTX
    if _CTX is None:
        _CTX = mp.get_context("forkserver")
        _CTX.set_forkserver_preload(["torch", "helpers.results"])
    return _CTX


def _stop(proc) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)  # the goal's whole session: ranks, loader workers, compile workers
        except (ProcessLookupError, PermissionError):
            proc.kill() if sig == signal.SIGKILL else proc.terminate()
        proc.join(timeout=10)
        if not proc.is_alive():
            return


def run_one(goal: Goal, ctx: Ctx, limit_s: float, work: Path) -> dict:
    """Run one goal in its own process, stopped after `limit_s`; its record (without timing fields)."""
    path = Path(work) / f"{goal.key}.json"
    path.unlink(missing_ok=True)
    proc = _context().Process(target=_child, args=(goal.fn, ctx, str(path)), daemon=False)
    proc.start()
    proc.join(timeout=max(1.0, limit_s))
    if proc.is_alive():
        _stop(proc)
        return {"status": "stopped", "reason": f"stopped after its time limit of {limit_s:.0f} s"}
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {"status": "failed", "error": f"the goal's process ended with exit code {proc.exitcode} and no result "
                                             "(killed: out of memory, or a crash in native code)"}


def _limit(goal: Goal, profile: str) -> float:
    est = goal.estimate(profile)
    return max(3 * est, est + 60)


def run(goals: list[Goal], out: Path, *, profile: str, budget_s: float = DEFAULT_BUDGET_S,
        limit: Callable[[Goal, str], float] = _limit, log: Callable[[str], None] = print,
        clock: Callable[[], float] = time.monotonic, cache_dir: Path | None = None) -> dict:
    """Run `goals` in order within `budget_s` seconds; rewrite `out/goals.json` after each. Returns its content.

    `cache_dir` (default `out/cache`) holds the trained models the goals share."""
    start = clock()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="goals-"))
    cache = Path(cache_dir) if cache_dir is not None else out / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    doc = {"started": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "profile": profile,
           "budget_s": budget_s, "machine": _facts(), "planned": [g.key for g in goals], "goals": [], "finished": False}
    write_atomic(out / "goals.json", json.dumps(doc, indent=1, default=_jsonable) + "\n")  # there even if cut at once
    for goal in goals:
        est = goal.estimate(profile)
        left = budget_s - MARGIN_S - (clock() - start)
        rec = {"issue": goal.issue, "goal": goal.key, "title": goal.title, "estimate_s": est}
        if est > left:
            rec |= {"status": "skipped", "reason": f"estimated {est:.0f} s > {max(left, 0):.0f} s left of the budget",
                    "seconds": 0.0}
        else:
            log(f"{goal.key}: running (estimate {est:.0f} s, {left:.0f} s left)")
            t0 = clock()
            rec |= run_one(goal, Ctx(profile, cache), min(limit(goal, profile), left), work)
            rec["seconds"] = round(clock() - t0, 1)
        rec.setdefault("met", None)
        doc["goals"].append(rec)
        write_atomic(out / "goals.json", json.dumps(doc, indent=1, default=_jsonable) + "\n")
        log(f"{goal.key}: {rec['status']} in {rec['seconds']:.1f} s" + _short(rec))
    doc["finished"] = True
    doc["seconds"] = round(clock() - start, 1)
    write_atomic(out / "goals.json", json.dumps(doc, indent=1, default=_jsonable) + "\n")
    return doc


def _short(rec: dict) -> str:
    if rec["status"] == "measured":
        r = rec.get("ratio")
        return f"; {rec.get('headline')}: {'-' if r is None else f'{r:.3g}'} (target {rec.get('target')}), met {rec.get('met')}"
    return f"; {rec.get('reason') or rec.get('error', '')}"


def _facts() -> dict:
    from .capture import gpu_facts

    facts = gpu_facts()
    facts["cores"] = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return facts


def table(doc: dict) -> str:
    """The goals of a goals.json as a table: issue, goal, measured, target, met, seconds."""
    from .tables import table as _table

    rows = []
    for r in doc["goals"]:
        if r["status"] == "measured":
            val = "-" if r.get("ratio") is None else f"{r['ratio']:.3g}"
            measured = f"{val} ({r.get('headline', '')})"
            missing = [c for c in r.get("checks", []) if c["met"] is None]
            if missing:
                measured += f"; {len(missing)} of {len(r['checks'])} parts not measured: {missing[0].get('reason', '')}"
            if r.get("note"):
                measured += f"; {r['note']}"
        else:
            measured = f"{r['status']}: {r.get('reason') or r.get('error', '')}"
        met = {True: "yes", False: "no", None: "-"}[r.get("met")]
        rows.append([r["issue"], r["goal"], measured[:160], r.get("target", "-") if r["status"] == "measured" else "-",
                     met, f"{r.get('seconds', 0):.1f}"])
    return _table(["issue", "goal", "measured", "target", "met", "seconds"], rows)


def plan_text(goals: list[Goal], profile: str) -> str:
    from .tables import table as _table

    where = "one H200 (estimates, none measured yet)" if profile == "full" else "a 2-core CPU, smoke sizes"
    rows = [[g.issue, g.key, g.title[:70], f"{g.estimate(profile):.0f}", g.basis[:90] if profile == "full" else ""]
            for g in goals]
    total = sum(g.estimate(profile) for g in goals)
    return (_table(["issue", "goal", "target", "est. s", "basis"], rows)
            + f"\ntotal: {total:.0f} s on {where}")


def _default_profile() -> str:
    import torch

    return "full" if torch.cuda.is_available() else "smoke"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m helpers.goals", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("plan", "run"):
        p = sub.add_parser(name)
        p.add_argument("issues", nargs="*", help="issue numbers (14..20) or goal keys (default: every goal)")
        p.add_argument("--profile", choices=("smoke", "full"), default=None,
                       help="full: the issues' sizes (default with CUDA); smoke: tiny sizes (default without)")
        if name == "run":
            p.add_argument("--out", type=Path, required=True, help="folder for goals.json")
            p.add_argument("--cache-dir", type=Path, default=None,
                           help="where trained models are shared between goals (default: OUT/cache)")
            p.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S, help="wall-clock budget (default 360)")
    args = parser.parse_args(argv)
    try:
        goals = select(args.issues)
    except ValueError as err:
        print(err)
        return 2
    profile = args.profile or ("full" if args.command == "plan" else _default_profile())
    if args.command == "plan":
        print(plan_text(goals, profile))
        return 0
    if args.budget_s <= MARGIN_S:
        print(f"--budget-s must exceed {MARGIN_S:.0f} s")
        return 2
    doc = run(goals, args.out, profile=profile, budget_s=args.budget_s, cache_dir=args.cache_dir)
    print(table(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
