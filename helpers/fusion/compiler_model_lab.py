"""Notebook 09's measurements of what compiling costs and what it buys on a model: the compile seconds of a
function cold and warm and the calls it takes to pay back, the course GPT's training step and one-token
forward compiled (each torch.compile mode), regional compilation (whole model vs each block), the sentences
built from those numbers and the PyTorch 2 training claim judged against them.

The timings are `helpers.fusion.compiler_lab.timed`'s (the protocol's warm-up and interleaved rounds, on one
thread on a CPU); the GPT's training step and one-token forward are compiled with plain torch.compile,
regional compilation with `helpers.fusion.compiler.compile_blocks`.
"""
from __future__ import annotations

import copy
import os
import tempfile
import time
from typing import Any, Callable

import torch

from helpers.cost.flops import transformer_flops
from helpers.fusion import compiler_lab, compiler, dynamo
from helpers.gpt.model import GPT
from helpers.measure import bench, claims, profiling, protocol
from helpers.measure.params import choices, positive
from helpers.show import units

# ------------------------------------------------------------------------------------------ compile cost

def compile_seconds(fn: Callable, *args, cache_dir: str | None = None) -> tuple[float, Callable]:
    """(seconds of the first call of torch.compile(fresh copy of fn), the compiled function).

    cache_dir: Inductor's on-disk cache folder for this compile (TORCHINDUCTOR_CACHE_DIR), restored after;
    an empty folder makes the compile cold, the same folder again makes it warm. None: the current one.
    """
    compiled = torch.compile(dynamo.fresh_copy(fn))
    old = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if cache_dir is not None:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir)
    try:
        start = time.perf_counter()
        with torch.no_grad():
            compiled(*args)
        seconds = time.perf_counter() - start
    finally:
        if cache_dir is not None:
            if old is None:
                os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
            else:
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = old
    return seconds, compiled


def cold_and_warm(fn: Callable, *args) -> dict[str, float]:
    """Compile seconds of `fn` with an empty Inductor cache (cold), then again with that filled cache (warm).

    Dynamo traces afresh both times (a fresh copy of the function); only Inductor's caches differ. Pass
    arguments this process has not compiled `fn` for (e.g. a new Python constant): kernels already built
    in this process stay in memory, and a cold compile would find them there.
    """
    with tempfile.TemporaryDirectory(prefix="inductor-cold-") as folder:
        cold, _ = compile_seconds(fn, *args, cache_dir=folder)
        warm, _ = compile_seconds(fn, *args, cache_dir=folder)
    return {"cold_s": cold, "warm_s": warm}


def break_even_steps(compile_s: float, eager_s: float, compiled_s: float) -> float | None:
    """Steps after which compiling has paid for itself: compile_s / (eager_s - compiled_s); None when the
    compiled step is not faster (it never pays back). Raises ValueError for negative or zero times."""
    if compile_s < 0:
        raise ValueError(f"compile_s={compile_s!r} must be >= 0")
    positive("eager_s", eager_s, float)
    positive("compiled_s", compiled_s, float)
    saved = eager_s - compiled_s
    return compile_s / saved if saved > 0 else None


def break_even_sentence(compile_s: float, eager: bench.Timing, speedup: protocol.Ratio, what: str = "calls") -> str:
    """When a compile of `compile_s` seconds pays for itself, from eager's timing and the eager/compiled
    `speedup` (a protocol Ratio): a count (with the range its IQR bounds give) only when the ratio is
    separated from 1; "never" when compiled is separated and slower; else that this run cannot tell."""
    if not speedup.separated:
        return (f"this run cannot tell whether it pays back: eager/compiled {speedup} straddles 1 (the IQRs overlap), "
                f"so any break-even count would be noise")
    if speedup.value <= 1:
        return f"it never pays back at this size: compiled was slower (eager/compiled {speedup})"
    n = break_even_from_ratio(compile_s, eager.median, speedup.value)
    lo = break_even_from_ratio(compile_s, eager.median, speedup.hi)
    hi = break_even_from_ratio(compile_s, eager.median, speedup.lo) if speedup.lo > 1 else None
    span = f" (between {lo:,.0f} and {hi:,.0f} from the IQR bounds)" if lo and hi else ""
    return f"it pays back after about {n:,.0f} {what}{span}, saving {units.fmt_seconds(saved_per_call(eager.median, speedup.value))} per call"


def saved_per_call(eager_s: float, ratio: float) -> float:
    """Seconds saved per call by the compiled version, from eager's median time (s) and the median per-round
    eager/compiled ratio: eager_s * (1 - 1/ratio); negative when compiled is slower. Raises ValueError for
    a non-positive time or ratio."""
    positive("eager_s", eager_s, float)
    positive("ratio", ratio, float)
    return eager_s * (1 - 1 / ratio)


def break_even_from_ratio(compile_s: float, eager_s: float, ratio: float) -> float | None:
    """Calls after which compile_s (s) has paid for itself, from the same statistic the notebook reports
    (the median per-round eager/compiled ratio): None when ratio <= 1 (compiled is not faster: it never pays
    back). Raises ValueError for a negative compile time or a non-positive time or ratio."""
    saved = saved_per_call(eager_s, ratio)
    return break_even_steps(compile_s, eager_s, eager_s - saved) if saved > 0 else None


# ------------------------------------------------------------------------------------------ the course GPT compiled

def _train_pair(config, batch_size: int, device: str, lr: float, seed: int):
    torch.manual_seed(seed)
    eager = GPT(config).to(device)
    twin = copy.deepcopy(eager)
    opts = [torch.optim.AdamW(m.parameters(), lr=lr) for m in (eager, twin)]
    g = torch.Generator().manual_seed(seed)
    x, y = (torch.randint(0, config.vocab_size, (batch_size, config.seq_len), generator=g).to(device) for _ in "xy")
    return eager, torch.compile(twin), opts, x, y


def _step(model, opt, x, y, autocast_dtype=None) -> torch.Tensor:
    with torch.autocast(x.device.type, dtype=autocast_dtype or torch.bfloat16, enabled=autocast_dtype is not None):
        _, loss = model(x, y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()


def train_step_compare(config, batch_size: int, *, device: str = "cpu", reps: int = 5, check_steps: int = 2,
                       lr: float = 1e-3, seed: int = 0, autocast_dtype: torch.dtype | None = None,
                       budget_s: float | None = None) -> dict[str, Any]:
    """The course GPT's training step (forward, backward, AdamW) eager vs torch.compile'd, from equal weights.

    The first compiled step's time is reported as "first_step_s" (it compiles the forward and backward
    graphs); `check_steps` steps of both must give losses within rtol=1e-4, atol=1e-5 in fp32 (the
    compiled kernels sum in another order, and the difference grows slowly over steps), rtol=2e-2 under
    bf16 autocast (`autocast_dtype`; eager rounds each op's output to bf16, fused kernels do not); then both
    are timed by the protocol (`compiler_lab.timed`, at most `reps` rounds). Returns times, tokens/s, TFLOP/s (counted as
    in notebook 02), "speedup" (the protocol Ratio eager/compiled), "ratio" (its value, lo, hi) and "note".
    """
    eager, comp, (opt_e, opt_c), x, y = _train_pair(config, batch_size, device, lr, seed)
    ac = autocast_dtype
    _step(eager, opt_e, x, y, ac)
    start = time.perf_counter()
    _step(comp, opt_c, x, y, ac)
    bench.sync(device)
    first = time.perf_counter() - start
    losses = [(float(_step(eager, opt_e, x, y, ac)), float(_step(comp, opt_c, x, y, ac))) for _ in range(check_steps)]
    for a, b in losses:
        torch.testing.assert_close(b, a, rtol=1e-4 if ac is None else 2e-2, atol=1e-5)
    comparison = compiler_lab.timed({"eager": lambda: _step(eager, opt_e, x, y, ac),
                                    "compiled": lambda: _step(comp, opt_c, x, y, ac)},
                                   device=device, reps=reps, budget_s=budget_s)
    timings = comparison.timings
    tokens = batch_size * config.seq_len
    flops = transformer_flops(config, batch_size, config.seq_len)["total"]["total"]
    return {"first_step_s": first, "losses": losses, "timings": timings, "tokens": tokens, "flops": flops,
            "eager_step": lambda: _step(eager, opt_e, x, y, ac),
            "tokens_per_s": {k: tokens / t.median for k, t in timings.items()},
            "tflops": {k: flops / t.median / 1e12 for k, t in timings.items()},
            "speedup": comparison.ratio("eager", "compiled"), "note": comparison.note(),
            "ratio": compiler_lab.ratio_triple(comparison.ratio("eager", "compiled"))}


def matmul_share(step: Callable[[], Any], name: str = "09_gpt_step_eager") -> float:
    """Share of `step`'s profiled self time spent in matrix multiplies (`profiling.is_matmul`), 0..1.

    torch.compile hands matmuls to the same library kernels eager uses, so only the rest can shrink: with a
    share m the whole step can be at most 1/m times faster (Amdahl's law)."""
    with compiler_lab.timing_threads("cuda" if torch.cuda.is_available() else "cpu"):  # as the step was timed
        prof = profiling.profile(step, steps=2, top=10_000, name=name)
    return sum(share for op, _, _, share in prof.rows if profiling.is_matmul(op))


PT2_CLAIM = {"claimed": 1.41, "source": "Ansel et al., 2024 (the PyTorch 2 paper, ASPLOS), on an NVIDIA A100",
             "claim": "torch.compile speeds up training by 1.41x (geometric mean over the paper's benchmark suites; "
                      "2.27x for inference)"}


def training_claim(speedup: protocol.Ratio, device: str, first_step_s: float) -> dict[str, Any]:
    """The keyword arguments of `claims.verdict` for PyTorch 2's 1.41x training geomean, judged from the
    measured eager/compiled training step (`speedup`): "supported" when 1.41 lies within its IQR bounds,
    else `claims.judge` of the median against 1.41 ("exceeded" above, "contradicted" below). "not testable"
    without CUDA: the paper's figure is for GPU kernels (Triton code, fewer launches) over real models, and a
    CPU step of a small model measures C++/OpenMP code on another kind of hardware."""
    claimed = PT2_CLAIM["claimed"]
    measured = (f"eager/compiled training step {speedup} on this {device} (first compiled step "
                f"{first_step_s:.1f} s, not counted)")
    if device != "cuda":
        return {"verdict": "not testable", "measured": measured, "value": speedup.value,
                "reason": "the claim is a GPU result (Triton kernels, fewer kernel launches, an A100); this run has "
                          "only a CPU, where Inductor writes C++ for a different machine"}
    if speedup.lo <= claimed <= speedup.hi:
        verdict, why = "supported", f"{claimed}x lies within the measured IQR bounds"
    else:
        verdict = claims.judge(speedup.value, claimed, claimed)
        why = f"the measured IQR bounds lie {'above' if speedup.lo > claimed else 'below'} {claimed}x"
    return {"verdict": verdict, "measured": measured, "value": speedup.value,
            "reason": why + "; one model on this GPU, against a geomean over the paper's suites on an A100"}


def modes_note(modes: list[str], device: str) -> str:
    """The sentence saying which of `compiler_lab.ALL_MODES` a CUDA run does not time on the one-token forward,
    why the full profile leaves max-autotune out, and how to time them all; "" when every mode runs, or off CUDA
    (where only "default" can run)."""
    left = [m for m in compiler_lab.ALL_MODES if m not in modes]
    if device != "cuda" or not left:
        return ""
    text = f"Not timed in this run: {', '.join(left)}."
    if "max-autotune" in left:
        text += (" The full profile, sized for a few minutes of one GPU, leaves max-autotune out: its compile also "
                 "benchmarks Triton matmul templates for every matrix shape of the model (torch.compile's documentation: "
                 "it \"leverages Triton or template based matrix multiplications\").")
    return text + f" MODES={list(compiler_lab.ALL_MODES)!r} times all {len(compiler_lab.ALL_MODES)}."


def one_token_forward(config, modes: list[str], *, device: str = "cpu", reps: int = 20,
                      seed: int = 0) -> dict[str, dict]:
    """A batch-1, one-token forward of the course GPT (the shape of a decode step; no KV cache here),
    eager and under each torch.compile mode: {mode: {"compile_s", "timing"}} with "eager" first.

    "reduce-overhead" (CUDA graphs) and "max-autotune" need CUDA: asked for on a CPU they raise ValueError.
    """
    for mode in modes:
        if mode not in ("default", "reduce-overhead", "max-autotune"):
            raise ValueError(f"mode {mode!r}; choose 'default', 'reduce-overhead' or 'max-autotune'")
        if mode != "default" and device != "cuda":
            raise ValueError(f"mode {mode!r} needs CUDA (CUDA graphs / GPU autotuning)")
    torch.manual_seed(seed)
    model = GPT(config).to(device).eval()
    idx = torch.zeros(1, 1, dtype=torch.long, device=device)  # (B=1, T=1)
    fns: dict[str, Callable] = {"eager": model}
    out: dict[str, dict] = {"eager": {"compile_s": 0.0}}
    with torch.no_grad():
        want = model(idx)[0]
        for mode in modes:
            fn = torch.compile(model, mode=mode, dynamic=False)  # one shape: no symbolic sizes in the graph
            start = time.perf_counter()
            for _ in range(3):  # CUDA graphs record on a later call than the first
                got = fn(idx)[0]
            bench.sync(device)
            out[mode] = {"compile_s": time.perf_counter() - start}
            torch.testing.assert_close(got.float(), want.float(), rtol=1e-4, atol=1e-4)
            fns[mode] = fn
        timings = compiler_lab.timed({k: (lambda f=f: f(idx)) for k, f in fns.items()}, device=device, reps=reps).timings
    for k, t in timings.items():
        out[k]["timing"] = t
    return out


# ------------------------------------------------------------------------------------------ regional compilation

def counting_backend(backend: str = "inductor") -> tuple[Callable, list[int]]:
    """(a torch.compile backend that hands each graph Dynamo captures to `backend`, the list it appends each
    graph's FX node count to): how many graphs a compile made, and how large."""
    from torch._dynamo import lookup_backend  # heavy: Dynamo's backend registry, only for this count

    inner, graphs = lookup_backend(backend), []

    def count(gm, example_inputs):
        graphs.append(len(gm.graph.nodes))
        return inner(gm, example_inputs)
    return count, graphs


def regional_compare(config, batch_size: int, *, backend: str = "inductor", device: str = "cpu", lr: float = 1e-3,
                     seed: int = 0) -> dict[str, dict]:
    """The first training step (forward, backward, AdamW) of the course GPT compiled whole (torch.compile(model))
    and compiled by region (`compiler.compile_blocks`: each block, one compiled code for all), from the same
    weights and batch. Each variant's loss must equal eager's within rtol 1e-4, atol 1e-5 (fp32).

    Returns {"eager": {"loss"}, "whole model" | "each block": {"first_step_s", "graphs" (graphs Dynamo handed
    to the backend), "nodes" (their FX node counts), "loss"}}. backend: one of `compiler_lab.BACKENDS`
    ("aot_eager" traces forward and backward without generating code: cheap; "inductor" is the real compile).
    Raises ValueError for another backend.
    """
    choices("backend", [backend], compiler_lab.BACKENDS)
    g = torch.Generator().manual_seed(seed)
    x, y = (torch.randint(0, config.vocab_size, (batch_size, config.seq_len), generator=g).to(device) for _ in "xy")
    torch.manual_seed(seed)
    base = GPT(config).to(device)
    with torch.no_grad():
        out: dict[str, dict] = {"eager": {"loss": float(base(x, y)[1])}}
    for name in ("whole model", "each block"):
        model = copy.deepcopy(base)
        be, graphs = counting_backend(backend)
        if name == "whole model":
            run = torch.compile(model, backend=be)
        else:
            compiler.compile_blocks(model, backend=be)
            run = model
        opt = torch.optim.AdamW(model.parameters(), lr=lr)
        start = time.perf_counter()
        loss = float(_step(run, opt, x, y))
        bench.sync(device)
        out[name] = {"first_step_s": time.perf_counter() - start, "graphs": len(graphs), "nodes": list(graphs),
                     "loss": loss}
        torch.testing.assert_close(loss, out["eager"]["loss"], rtol=1e-4, atol=1e-5)
    return out


def regional_sentence(reg: dict[str, dict], n_blocks: int, backend: str, full_first_step_s: float | None = None) -> str:
    """What regional compilation measured (`regional_compare`'s dict): graphs and first-step seconds of each
    variant and which was faster (each first step is timed once, so a difference within 20% is not called),
    with the notebook's whole-model Inductor first step (`full_first_step_s`) beside it."""
    w, b = reg["whole model"], reg["each block"]
    ratio = w["first_step_s"] / b["first_step_s"] if b["first_step_s"] > 0 else float("inf")
    verdict = (f"compiling by block made the first step {ratio:.2g}x faster" if ratio > 1.2 else
               f"compiling the whole model made the first step {1 / ratio:.2g}x faster" if ratio < 1 / 1.2 else
               "the two first steps took about as long (within 20%, one timing each)")
    reuse = (f"one graph of {b['nodes'][0]} nodes served all {n_blocks} blocks" if b["graphs"] == 1 and n_blocks > 1
             else f"{b['graphs']} graph(s) for {n_blocks} block(s)")
    text = (f"Backend {backend}: the whole model gave {w['graphs']} graph(s) ({sum(w['nodes'])} nodes) and a first step "
            f"of {w['first_step_s']:.2f} s; by block, {reuse}, first step {b['first_step_s']:.2f} s: {verdict}.")
    if full_first_step_s is not None:
        text += (f" For scale: the whole-model Inductor compile of the training step above took {full_first_step_s:.1f} s "
                 "for its first step.")
    return text
