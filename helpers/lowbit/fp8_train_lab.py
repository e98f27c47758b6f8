"""Notebook 07's training and speed measurements: the GPT trained with every FP8 recipe (ours and torchao's)
against its fp32 / bf16 baseline, what torch._scaled_mm costs against the emulation, and, on GPUs with FP8
tensor cores, matmul, linear and GPT-step speed with the profile of one FP8 linear.

- Training: `train_variants` (TRAIN_VARIANTS with the baseline first), `make_variant`, `train`, `evaluate`,
  `training_sentences`, `reference_kernel_cost`.
- Speed: `matmul_tflops`, `matmul_speedup`, `linear_tflops`, `speed_sweep`, `gpt_steps`, and the verdict on the
  source text's "about 2x" (`speed_claim`); profiles: `linear_profile`, `cast_share`, `profile_sentences`.

The recipes are `helpers.lowbit.fp8`, the layer `helpers.lowbit.fp8_linear`; the notebook's parameters and
numerics are `helpers.lowbit.fp8_lab`.
"""
from __future__ import annotations

import contextlib
import copy
from typing import Callable

import torch

from helpers.lowbit import fp8, fp8_linear
from helpers.measure import bench, claims, memory, profiling, protocol

TRAIN_VARIANTS = ("fp32", "ours tensorwise", "ours delayed", "ours rowwise", "ours blockwise",
                  "torchao tensorwise", "torchao rowwise")  # the first is the baseline: "bf16" where it runs


# ---------------------------------------------------------------- the training variants

def train_variants(baseline: str) -> tuple[str, ...]:
    """TRAIN_VARIANTS with the baseline first: "bf16" (autocast, on a GPU that has bf16) or "fp32".

    Raises ValueError for another baseline."""
    if baseline not in ("fp32", "bf16"):
        raise ValueError(f"baseline={baseline!r}; choose 'fp32' or 'bf16'")
    return (baseline, *TRAIN_VARIANTS[1:])


# ---------------------------------------------------------------- training

def _convert(model: torch.nn.Module, variant: str, emulate: bool = False) -> dict | None:
    """Convert `model` in place for a variant "ours <recipe>" or "torchao <recipe>"; "fp32"/"bf16" leave it.
    emulate=True sets torchao's emulate option (ours follows `fp8_linear.emulated()` where it runs).

    Returns our `convert_to_float8` report for "ours", else None."""
    if variant in ("fp32", "bf16"):
        return None
    who, recipe = variant.split()
    if who == "ours":
        return fp8_linear.convert_to_float8(model, recipe)
    fp8_linear.torchao_convert(model, recipe, emulate=emulate)
    return None


def _bf16_linear(n: int, variant: str, device: str):
    """A bias-free bf16 linear n→n converted for `variant`, an input (n, n) needing grad, and an output gradient."""
    lin = torch.nn.Sequential(torch.nn.Linear(n, n, bias=False, device=device, dtype=torch.bfloat16))
    _convert(lin, variant)
    x = torch.randn(n, n, device=device, dtype=torch.bfloat16, requires_grad=True)
    return lin, x, torch.randn(n, n, device=device, dtype=torch.bfloat16)


def make_variant(base: torch.nn.Module, variant: str, emulate: bool = False) -> tuple[torch.nn.Module, str]:
    """A deep copy of `base` converted for `variant` (one of TRAIN_VARIANTS); and what was converted.
    emulate=True: torchao's products run as fp32 matmuls of the fp8 values (train with emulate=True too)."""
    model = copy.deepcopy(base)
    if variant in ("fp32", "bf16"):
        return model, "nothing (the baseline)"
    rep = _convert(model, variant, emulate)
    if rep is not None:
        return model, f"{len(rep['converted'])} linears; skipped {', '.join(rep['skipped']) or 'none'}"
    n = sum(type(m).__name__ == "Float8Linear" for m in model.modules())
    return model, f"{n} linears (torchao); skipped lm_head"


@torch.no_grad()
def evaluate(model: torch.nn.Module, batches, autocast: torch.dtype | None = None) -> float:
    """Mean loss over fixed batches (under torch.autocast in `autocast`, if given)."""
    model.eval()
    with torch.autocast(batches[0][0].device.type, dtype=autocast or torch.float32, enabled=autocast is not None):
        loss = sum(model(x, y)[1].float().item() for x, y in batches) / len(batches)
    model.train()
    return loss


def train(model: torch.nn.Module, batches, val_batches, lr: float, progress: Callable = iter,
          autocast: torch.dtype | None = None, emulate: bool = False) -> dict:
    """AdamW over the given batches; training losses per step and the final validation loss.

    `autocast` (e.g. torch.bfloat16) runs each forward under torch.autocast on the batches' device,
    fp32 master weights kept: the GPU baseline, and its FP8 variants (Float8Linear follows autocast).
    emulate=True runs our fp8 products (forward and backward) inside `fp8_linear.emulated()`.
    """
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    with fp8_linear.emulated() if emulate else contextlib.nullcontext():
        for x, y in progress(batches):
            with torch.autocast(x.device.type, dtype=autocast or torch.float32, enabled=autocast is not None):
                loss = model(x, y)[1]
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return {"losses": losses, "val_loss": evaluate(model, val_batches, autocast)}


def reference_kernel_cost(m: int, k: int, n: int, device: str = "cpu", reps: int = 3) -> dict | None:
    """One fp8 product (M, K) @ (K, N) with per-tensor scales, timed through torch._scaled_mm and through
    the fp32 emulation of the same fp8 values (`bench.benchmark_interleaved`, one warm-up call each):
    {"scaled_mm": Timing, "emulated": Timing, "ratio": `protocol.Ratio`, scaled_mm over emulated}, or None where
    torch._scaled_mm refuses the product on `device`.

    On a device without FP8 tensor cores torch._scaled_mm, where it runs at all (as on a CPU), is a
    reference kernel; this is what it would cost a training run against the emulation."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(m, k, generator=g).to(device=device, dtype=fp8.E4M3)
    b = torch.randn(k, n, generator=g).to(device=device, dtype=fp8.E4M3)
    one = torch.ones((), device=device)

    def emulated():
        with fp8_linear.emulated():
            return fp8_linear.scaled_mm(a, b, one, one)

    fp8_linear.scaled_mm(a, b, one, one)  # records a refusal, if any
    if fp8_linear.scaled_mm_refusal(device, rowwise=False, aligned=fp8_linear.mm_aligned(a.shape, b.shape)):
        return None
    t = bench.benchmark_interleaved({"scaled_mm": lambda: fp8_linear.scaled_mm(a, b, one, one), "emulated": emulated},
                                    reps=reps, warmup=1, device=device)
    return {**t, "ratio": protocol.ratio(t["scaled_mm"], t["emulated"])}


def reference_cost_sentence(cost: dict | None, layer: str) -> str:
    """What `reference_kernel_cost` found, in one sentence: the reason the training runs use the emulation. Both
    timings are of fp8 products this device emulates (neither is FP8 speed), so their ratio is quoted only as the
    cost of a choice, and only when their IQRs are separated; otherwise the sentence says the run cannot tell."""
    if cost is None:
        return f"torch._scaled_mm refuses the {layer} product here, so the training runs use the emulation."
    r = cost["ratio"]
    if not r.separated:
        return (f"One {layer} product: torch._scaled_mm {cost['scaled_mm']}, the emulation {cost['emulated']}: their IQRs "
                "overlap, so this run cannot tell which costs a training run less.")
    which = "the emulation" if r.value > 1 else "torch._scaled_mm"
    return (f"Neither is FP8 speed (this device has no FP8 units), but for the training runs the choice matters: one "
            f"{layer} product took {cost['scaled_mm']} through torch._scaled_mm, a reference kernel here, and "
            f"{cost['emulated']} as the fp32 emulation; {which} costs less (scaled_mm / emulation {r}).")


def training_sentences(results: dict[str, dict], last: int) -> list[str]:
    """Each FP8 variant's final losses against the baseline (the first entry: fp32 or bf16), as measured
    (mean of the last `last` training losses)."""
    tail = lambda r: sum(r["losses"][-last:]) / len(r["losses"][-last:])  # noqa: E731
    base_name = next(iter(results))
    base = results[base_name]
    out = []
    for name, r in results.items():
        if name == base_name:
            continue
        d_train, d_val = tail(r) - tail(base), r["val_loss"] - base["val_loss"]
        out.append(f"{name}: training loss (mean of last {last}) {tail(r):.4f}, {d_train:+.4f} vs {base_name}; "
                   f"validation {r['val_loss']:.4f}, {d_val:+.4f} ({100 * d_val / base['val_loss']:+.2f}%)")
    return out


# ---------------------------------------------------------------- speed (GPUs with FP8 tensor cores)

def _matmul_fn(n: int, kind: str, device: str) -> Callable[[], torch.Tensor]:
    """An n×n×n matmul as a zero-argument callable: "bf16", or fp8 "tensorwise" / "rowwise" through
    torch._scaled_mm (use_fast_accum=True, bf16 out)."""
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    if kind == "bf16":
        a16, b16 = a.bfloat16(), b.bfloat16()
        return lambda: a16 @ b16
    (qa, sa), (qb, sb) = ((fp8.tensorwise(a), fp8.tensorwise(b)) if kind == "tensorwise"
                          else (fp8.rowwise(a, -1), fp8.rowwise(b, 0)))
    qb = qb.t().contiguous().t()
    ia, ib = sa.reciprocal(), sb.reciprocal()
    return lambda: torch._scaled_mm(qa, qb, scale_a=ia, scale_b=ib, out_dtype=torch.bfloat16, use_fast_accum=True)


def matmul_tflops(n: int, kind: str, reps: int, device: str = "cuda") -> float:
    """TFLOP/s of an n×n×n matmul: "bf16", or fp8 "tensorwise" / "rowwise" through torch._scaled_mm."""
    return bench.tflops(2 * n ** 3, bench.benchmark(_matmul_fn(n, kind, device), reps=reps, device=device))


def matmul_speedup(n: int, kind: str = "tensorwise", reps: int = 20, device: str = "cuda"):
    """The fp8 `kind` matmul's speed over bf16's at n×n×n, by the measurement protocol (warm-up until
    steady, interleaved rounds, `reps` to 3 x `reps` of them): a `protocol.Ratio` (bf16 time / fp8 time,
    with IQR bounds and whether the two are separated) and the `protocol.Comparison` it came from."""
    c = protocol.compare({"bf16": _matmul_fn(n, "bf16", device), kind: _matmul_fn(n, kind, device)}, device=device,
                         min_reps=reps, max_reps=3 * reps, budget_s=30.0)
    return c.ratio("bf16", kind), c


def linear_tflops(n: int, variant: str, reps: int, compile: bool = False, device: str = "cuda") -> float:
    """TFLOP/s of a bf16 linear n→n on n tokens, forward + backward (6 n³ FLOPs), casts included:
    variant "bf16", "ours tensorwise", "ours rowwise", "torchao tensorwise" or "torchao rowwise"."""
    return bench.tflops(6 * n ** 3, linear_timing(n, variant, reps, compile, device))


def linear_timing(n: int, variant: str, reps: int, compile: bool = False, device: str = "cuda") -> bench.Timing:
    """The `bench.Timing` of one forward + backward of `linear_tflops`'s layer."""
    lin, x, g = _bf16_linear(n, variant, device)
    if compile:  # every compiled module's graph counts against one recompile limit (Dynamo wraps them all in the
        torch._dynamo.reset()  # same function): past torch._dynamo.config.recompile_limit the rest would run eagerly
    model = torch.compile(lin) if compile else lin

    def step():
        model(x).backward(g)
    return bench.benchmark(step, reps=reps, warmup=3, device=device)


MATMUL_KINDS = ("bf16", "tensorwise", "rowwise")
LINEAR_VARIANTS = ("bf16", "ours tensorwise", "ours rowwise", "torchao tensorwise", "torchao rowwise")


def _torchao_skips(variants, with_torchao: bool, device: str) -> dict[str, str]:
    """{variant: why} for the "torchao <recipe>" variants that are not run: all of them without torchao,
    else those whose recipe `fp8_linear.torchao_problem` finds unable to run on `device`."""
    skips = {}
    for v in variants:
        if v.startswith("torchao"):
            why = fp8_linear.torchao_problem(v.split()[1], device) if with_torchao else "torchao is not used"
            if why:
                skips[v] = why
    return skips


def speed_sweep(sizes, reps: int, with_torchao: bool, compile: bool) -> dict:
    """On a CUDA GPU with FP8 tensor cores: matmul and linear fwd+bwd TFLOP/s for every size.

    Returns {"matmul": {kind: [tflops or None]}, "linear": {variant: [...]}, "linear_iqr": {variant: [[q25, q75]
    seconds or None]}, "failed": [messages], "skipped": {variant: one sentence}}; a point that raises is recorded as None with its message
    (kernels this course did not write may refuse a shape), never a traceback. A torchao recipe that
    `fp8_linear.torchao_problem` finds unable to run on this GPU is left out of "linear" and named in "skipped"."""
    skipped = _torchao_skips(LINEAR_VARIANTS, with_torchao, "cuda")
    out = {"matmul": {k: [] for k in MATMUL_KINDS}, "failed": [],
           "skipped": {v: why for v, why in skipped.items() if with_torchao},
           "linear": {v: [] for v in LINEAR_VARIANTS if v not in skipped}}
    out["linear_iqr"] = {v: [] for v in out["linear"]}
    for n in sizes:
        for group in ("matmul", "linear"):
            for name in out[group]:
                try:
                    if group == "matmul":
                        out[group][name].append(matmul_tflops(n, name, reps))
                    else:
                        t = linear_timing(n, name, reps, compile)
                        out[group][name].append(bench.tflops(6 * n ** 3, t))
                        out["linear_iqr"][name].append([t.q25, t.q75])
                except Exception as err:  # noqa: BLE001: one refused point must not end the sweep
                    out[group][name].append(None)
                    if group == "linear":
                        out["linear_iqr"][name].append(None)
                    out["failed"].append(f"{group} {name} n={n}: {type(err).__name__}: {str(err).splitlines()[0][:150]}")
                memory.release_memory()
    return out


def faster(a: list[float] | None, b: list[float] | None) -> bool:
    """Whether a time with IQR `a` ([q25, q75] seconds) is faster than `b` beyond both IQRs (False if either is None)."""
    return bool(a and b) and a[1] < b[0]


GPT_VARIANTS = ("bf16", "ours rowwise", "torchao rowwise")
SPEED_CLAIM = {"claim": "FP8 is about 2x faster than BF16", "source": "the first source text, section 5.3",
               "claimed": (1.7, None), "unit": "x"}  # read as at least 1.7x, as notebook 14's stack reads it


def speed_claim(head: "tuple[protocol.Ratio, protocol.Comparison] | None", n: int, linear_ratio: float | None,
                gpt_ratio: float | None, why_not: str | None, *, quiet: bool = False) -> dict:
    """Record notebook 07's verdict on "FP8 is about 2x faster than BF16" (`claims.verdict`, claim id
    "fp8-2x-bf16") and return it. head: `matmul_speedup`'s (Ratio, Comparison) at n x n x n, or None where
    nothing was timed: then "not testable" with `why_not` (what this device lacks), the claimed range still
    recorded. Otherwise the rule judges the matmul ratio with its IQR bounds as the spread; the layer's and the
    GPT step's ratios (medians, or None) go into the measured text."""
    if head is None:
        return claims.verdict("fp8-2x-bf16", notebook="07", measured="nothing timed", verdict="not testable",
                              reason=why_not or "the largest size of the sweep failed; see the lines above", quiet=quiet,
                              **SPEED_CLAIM)
    r = head[0]
    return claims.verdict("fp8-2x-bf16", notebook="07", value=r.value, spread=(r.lo, r.hi), quiet=quiet,
                          measured=f"n={n}: matmul (torch._scaled_mm, use_fast_accum=True) {r}, linear fwd+bwd "
                                   + (f"{linear_ratio:.2f}x" if linear_ratio else "not measured") + ", GPT step "
                                   + (f"{gpt_ratio:.2f}x" if gpt_ratio else "not measured"),
                          reason="judged on the raw matmul; a layer also pays for its casts", **SPEED_CLAIM)


def gpt_steps(base: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, reps: int, compile: bool,
              with_torchao: bool) -> dict:
    """Milliseconds per training step (forward, backward, AdamW) of the course GPT in bf16 weights, with
    its block linears in bf16 or FP8 rowwise (ours, torchao's); optionally with every block compiled
    (regional compilation, `nn.Module.compile` per block: the blocks share one compiled graph, so a variant
    costs one block's compile rather than the whole model's, and the casts of its FP8 linears are fused).

    Returns {variant: ms (median) or None, "iqr": {variant: [q25, q75] ms}, "failed": [messages], "skipped":
    {variant: one sentence}}: a variant
    that raises (a compiler or kernel refusing it) is recorded as None with its message; a torchao recipe
    that `fp8_linear.torchao_problem` finds unable to run on x's device is not run and is named in "skipped"
    (without torchao, its variants are simply left out)."""
    skipped = _torchao_skips(GPT_VARIANTS, with_torchao, x.device.type)
    out: dict = {"failed": [], "skipped": {v: why for v, why in skipped.items() if with_torchao}, "iqr": {}}
    for variant in GPT_VARIANTS:
        if variant in skipped:
            continue
        try:
            model = copy.deepcopy(base).to(torch.bfloat16)
            _convert(model, variant)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
            if compile:  # as in linear_tflops: each variant's graph counts against Dynamo's recompile limit
                torch._dynamo.reset()
                for block in model.blocks:
                    block.compile()

            def step():
                loss = model(x, y)[1]
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
            t = bench.benchmark(step, reps=reps, warmup=3, device=x.device.type)
            out[variant], out["iqr"][variant] = t.ms, [1e3 * t.q25, 1e3 * t.q75]
        except Exception as err:  # noqa: BLE001: one refused variant must not end the section
            out[variant] = None
            out["failed"].append(f"GPT step {variant}: {type(err).__name__}: {str(err).splitlines()[0][:150]}")
        memory.release_memory()
    return out


def linear_profile(n: int, recipe: str, device: str, trace_dir=None, top: int = 10):
    """torch.profiler evidence for where an FP8 linear's time goes: our Float8Linear (bf16, n→n, n tokens)
    forward + backward with `recipe`; a `helpers.measure.profiling.Profile` (the `top` ops by self time, trace saved).
    Where torch._scaled_mm refuses the recipe's scales on `device` (see `fp8_linear.scaled_mm_refusal`), the
    profiled products are the fp32 emulation's: aten::mm, not aten::_scaled_mm."""
    lin, x, g = _bf16_linear(n, f"ours {recipe}", device)
    return profiling.profile(lambda: lin(x).backward(g), steps=3, top=top, name=f"fp8-linear-{recipe}-{n}",
                             trace_dir=trace_dir)


def cast_share(prof) -> float:
    """Share of the profiled self time spent outside the matmuls (casts, amax, scaling): the matmuls being
    scaled_mm ops, GEMM kernels and leaf aten GEMMs (`profiling.is_matmul`; where the fp8 product is
    emulated, or torch's CPU _scaled_mm computes it, that is an aten::mm)."""
    mm = sum(share for op, _, _, share in prof.rows
             if "scaled_mm" in op or profiling.is_matmul(op))
    return 1.0 - mm


def profile_sentences(prof, n: int, recipe: str = "rowwise") -> list[str]:
    """What the profile of `linear_profile(n, recipe, ...)` shows, in sentences true to its rows: the share
    outside the matmuls, and, where torch._scaled_mm refused the recipe's scales on the profiled device,
    that the fp8 matmul was emulated (dequantised to fp32, then an ordinary matmul)."""
    refused = fp8_linear.scaled_mm_refusal(prof.device, rowwise=recipe == "rowwise")
    out = [f"At n={n}, {cast_share(prof):.0%} of the profiled {'kernel' if prof.device == 'cuda' else 'CPU'} time "
           f"was spent outside the {'matmuls' if refused else 'fp8 matmuls'} (amax reductions, scaling, casts, "
           "transposes): memory-bound work that FP8 does not speed up."]
    if refused:
        out.append(f"The {recipe} fp8 matmul itself was emulated here, not run in fp8: torch._scaled_mm refused "
                   f"its scales on {prof.device} ({refused.rstrip('.')}), so the operands were dequantised to fp32 "
                   "and multiplied by an ordinary matmul (aten::mm in the table).")
    return out
