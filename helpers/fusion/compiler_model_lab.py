"""Notebook 09's measurements of what compiling costs and what it buys on a model: the compile seconds of a
function cold and warm and the calls it takes to pay back, the course GPT's training step compiled (its
one-token forward under each mode, and CUDA graphs, are `compiler_modes_lab`), regional compilation (whole model
vs each block), the sentences built from those numbers and the PyTorch 2 training claim judged against them.

The timings are `helpers.fusion.compiler_lab.timed`'s (the protocol's warm-up and interleaved rounds, on one
thread on a CPU), their ratios paired round by round; a compile is timed by `first_call` on the CPU clock, this
thread's time plus that of the compiler processes it waited for (`clock.Stopwatch(children=True)`), with the wall
time beside it. The GPT's training step is compiled with plain torch.compile, regional
compilation with `helpers.fusion.compiler.compile_blocks`.
"""
from __future__ import annotations

import copy
import os
import tempfile
from typing import Any, Callable

import torch

from helpers.cost.flops import transformer_flops
from helpers.fusion import compiler_lab, compiler_modes_lab, compiler, dynamo
from helpers.gpt.model import GPT
from helpers.measure import bench, clock, profiling, protocol
from helpers.measure.params import choices, positive
from helpers.show import units

# ------------------------------------------------------------------------------------------ compile cost

COMPILE_CLOCK = "this thread's CPU time plus the C++ compiler's it ran and waited for"  # what compile seconds count


def first_call(fn: Callable, *args, device: str = "cpu") -> clock.Reading:
    """The first call of `fn` (a compile, when fn is a fresh torch.compile'd function), on both clocks: the CPU
    seconds of this thread plus those of the child processes it waited for (the C++ compiler with
    `compile_threads` = 1; `compiler_lab.compile_on_one_thread`), and the wall seconds."""
    with clock.Stopwatch(children=True) as sw:
        fn(*args)
        bench.sync(device)
    return sw.reading


def counted_seconds(reading: clock.Reading) -> float:
    """The seconds a compile is quoted in: its CPU seconds (`first_call`'s) when Inductor compiles on this thread
    (`compile_threads` = 1, so the compiler processes were waited for and counted), else its wall seconds: a
    pool of compile workers outlives the compile, and only the wall clock saw what they did."""
    import torch._inductor.config as inductor_config

    return reading.cpu if inductor_config.compile_threads == 1 else reading.wall


def compile_seconds(fn: Callable, *args, cache_dir: str | None = None) -> tuple[clock.Reading, Callable]:
    """(the first call of torch.compile(fresh copy of fn) on both clocks, the compiled function).

    The compile runs with Inductor's `compile_threads` = 1, so that the C++ (or Triton) compiler runs as a child
    process this one waits for: `clock.Reading.cpu` counts it (`first_call`), whatever else shares the machine.
    cache_dir: Inductor's on-disk cache folder for this compile (TORCHINDUCTOR_CACHE_DIR), restored after;
    an empty folder makes the compile cold, the same folder again makes it warm. None: the current one.
    """
    import torch._inductor.config as inductor_config

    compiled = torch.compile(dynamo.fresh_copy(fn))
    old = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if cache_dir is not None:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir)
    try:
        with torch.no_grad(), inductor_config.patch(compile_threads=1):
            reading = first_call(compiled, *args, device=args[0].device.type if args and hasattr(args[0], "device") else "cpu")
    finally:
        if cache_dir is not None:
            if old is None:
                os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
            else:
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = old
    return reading, compiled


def cold_and_warm(fn: Callable, args_for: Callable[[int], tuple], *, repeats: int = 3, warmup: int = 1) -> dict[str, Any]:
    """Compile seconds of `fn`, cold (an empty Inductor cache folder) then warm (that folder again), `repeats` times,
    each time with `args_for(i)`: arguments this process has not compiled `fn` for (e.g. a new Python constant,
    which Inductor bakes into the kernel): kernels built earlier in this process stay in memory, and a cold compile
    would find them there. Dynamo traces afresh every time (a fresh copy of the function); only Inductor's caches
    differ. First `warmup` untimed cold compiles (with `args_for(-1)`, `args_for(-2)`...), to keep what only a
    process's first compile pays (Inductor's modules loaded, say) out of the samples; `first_sample_sentence` says
    whether the first timed sample still stands apart from the others.

    Returns {"cold_s", "warm_s": medians; "cold", "warm": (median, q25, q75); "cold_samples", "warm_samples":
    seconds on COMPILE_CLOCK; "cold_wall", "warm_wall": the same compiles' wall seconds; "clock": COMPILE_CLOCK;
    "warmup": the untimed compiles before them}.
    Raises ValueError for repeats < 1 or warmup < 0.
    """
    positive("repeats", repeats)
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup={warmup!r} must be a non-negative int")
    for j in range(warmup):
        with tempfile.TemporaryDirectory(prefix="inductor-cold-") as folder:
            compile_seconds(fn, *args_for(-1 - j), cache_dir=folder)
    samples: dict[str, list[clock.Reading]] = {"cold": [], "warm": []}
    for i in range(repeats):
        args = args_for(i)
        with tempfile.TemporaryDirectory(prefix="inductor-cold-") as folder:
            samples["cold"].append(compile_seconds(fn, *args, cache_dir=folder)[0])
            samples["warm"].append(compile_seconds(fn, *args, cache_dir=folder)[0])
    out: dict[str, Any] = {"clock": COMPILE_CLOCK, "warmup": warmup}
    for k, readings in samples.items():
        cpu = [r.cpu for r in readings]
        out[k] = bench.quartiles(cpu)
        out[f"{k}_s"] = out[k][0]
        out[f"{k}_samples"] = cpu
        out[f"{k}_wall"] = [r.wall for r in readings]
    return out


def break_even_steps(compile_s: float, eager_s: float, compiled_s: float) -> float | None:
    """Steps after which compiling has paid for itself: compile_s / (eager_s - compiled_s); None when the
    compiled step is not faster (it never pays back). Raises ValueError for negative or zero times."""
    if compile_s < 0:
        raise ValueError(f"compile_s={compile_s!r} must be >= 0")
    positive("eager_s", eager_s, float)
    positive("compiled_s", compiled_s, float)
    saved = eager_s - compiled_s
    return compile_s / saved if saved > 0 else None


def break_even_sentence(compile_s: float, eager: bench.Timing, speedup: protocol.Ratio, what: str = "calls",
                        saving: bool = True) -> str:
    """When a compile of `compile_s` seconds pays for itself, from eager's timing and the eager/compiled
    `speedup` (a protocol Ratio): a count (with the range its IQR bounds give, and with `saving` the time saved
    per call) only when the ratio is separated from 1; "never" when compiled is separated and slower; else that
    this run cannot tell."""
    if not speedup.separated:
        return (f"this run cannot tell whether it pays back: eager/compiled {speedup} straddles 1 (the IQRs overlap), "
                f"so any break-even count would be noise")
    if speedup.value <= 1:
        return f"it never pays back at this size: compiled was slower (eager/compiled {speedup})"
    n = break_even_from_ratio(compile_s, eager.median, speedup.value)
    lo = break_even_from_ratio(compile_s, eager.median, speedup.hi)
    hi = break_even_from_ratio(compile_s, eager.median, speedup.lo) if speedup.lo > 1 else None
    span = f" (between {lo:,.0f} and {hi:,.0f} from the IQR bounds)" if lo and hi else ""
    saved = f", saving {units.fmt_seconds(saved_per_call(eager.median, speedup.value))} per call" if saving else ""
    return f"it pays back after about {n:,.0f} {what}{span}{saved}"


def break_even_pair_sentence(cold_s: float, warm_s: float, eager: bench.Timing, speedup: protocol.Ratio,
                             what: str = "calls") -> str:
    """`break_even_sentence` for a cold and a warm compile of the same function, the ratio said once: when the
    ratio gives no count (compiled slower, or not separated from 1) the verdict is the same for both, so one
    sentence covers both; otherwise a count for each, the time saved per call given with the cold one."""
    if not speedup.separated or speedup.value <= 1:
        return f"Cold or warm, {break_even_sentence(cold_s, eager, speedup, what)}."
    return (f"Cold, {break_even_sentence(cold_s, eager, speedup, what)}. "
            f"Warm, {break_even_sentence(warm_s, eager, speedup, what, saving=False)}.")


def first_sample_sentence(samples: list[float], what: str = "cold compile", warmup: int = 1) -> str:
    """What the first of `samples` (seconds, in the order they were taken, after `warmup` untimed ones) shows
    beside the others: above all of them (how many times their median, and the median of all with and without
    it), or within or below their range. It names no cause: the samples do not measure one. Raises ValueError
    for fewer than 2 samples."""
    if len(samples) < 2:
        raise ValueError(f"need at least 2 samples, got {len(samples)}")
    first, rest = samples[0], samples[1:]
    rest_median = bench.quartiles(rest)[0]
    if first > max(rest):
        return (f"The first timed {what} took {first:.2f} s, {first / rest_median:.2g}x the median of the {len(rest)} after "
                f"it ({rest_median:.2f} s) and slower than each of them" + (f", although {warmup} untimed {what}(s) ran before "
                f"it" if warmup else "") + ": these "
                "samples show a cost the first timed one paid and the later ones did not, and do not say what it is. The "
                f"median of all {len(samples)}, {bench.quartiles(samples)[0]:.2f} s, is the number quoted ({rest_median:.2f} s "
                "without the first).")
    return (f"The first timed {what}, {first:.2f} s, is {'within' if first >= min(rest) else 'below'} the range of the "
            f"{len(rest)} after it ({min(rest):.2f}-{max(rest):.2f} s): no cost of coming first shows in these samples.")


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

    The first compiled step is timed once (it compiles the forward and backward graphs): "first_step" on both
    clocks (`first_call`), "first_step_s" its `counted_seconds` (CPU seconds with the compiler's when Inductor
    compiles on this thread, else wall seconds); `check_steps` steps of both must give losses within rtol=1e-4, atol=1e-5 in fp32 (the
    compiled kernels sum in another order, and the difference grows slowly over steps), rtol=2e-2 under
    bf16 autocast (`autocast_dtype`; eager rounds each op's output to bf16, fused kernels do not); then both
    are timed by the protocol (`compiler_lab.timed`, at most `reps` rounds). "first_step_cache": Inductor's FX-graph
    cache {"hit", "miss"} over that first step (`compiler.cache_note` says it in words). Returns times, tokens/s, TFLOP/s (counted as
    in notebook 02), "speedup" (eager/compiled: the median of the per-round ratios of the interleaved rounds, their
    quartiles as bounds, `protocol.paired_ratio`), "ratio" (its value, lo, hi) and "note".
    """
    eager, comp, (opt_e, opt_c), x, y = _train_pair(config, batch_size, device, lr, seed)
    ac = autocast_dtype
    _step(eager, opt_e, x, y, ac)
    before = compiler.fx_cache_counts()
    first = first_call(lambda: _step(comp, opt_c, x, y, ac), device=device)
    after = compiler.fx_cache_counts()  # whether its graphs came from Inductor's disk cache or were compiled
    first_cache = {k: after[k] - before[k] for k in after}
    losses = [(float(_step(eager, opt_e, x, y, ac)), float(_step(comp, opt_c, x, y, ac))) for _ in range(check_steps)]
    for a, b in losses:
        torch.testing.assert_close(b, a, rtol=1e-4 if ac is None else 2e-2, atol=1e-5)
    comparison = compiler_lab.timed({"eager": lambda: _step(eager, opt_e, x, y, ac),
                                    "compiled": lambda: _step(comp, opt_c, x, y, ac)},
                                   device=device, reps=reps, budget_s=budget_s)
    timings = comparison.timings
    tokens = batch_size * config.seq_len
    flops = transformer_flops(config, batch_size, config.seq_len)["total"]["total"]
    ratio = protocol.paired_ratio(timings["eager"], timings["compiled"])
    return {"first_step_s": counted_seconds(first), "first_step": first, "first_step_cache": first_cache, "losses": losses, "timings": timings, "tokens": tokens, "flops": flops,
            "eager_step": lambda: _step(eager, opt_e, x, y, ac),
            "tokens_per_s": {k: tokens / t.median for k, t in timings.items()},
            "tflops": {k: flops / t.median / 1e12 for k, t in timings.items()},
            "speedup": ratio, "note": comparison.note(), "ratio": compiler_lab.ratio_triple(ratio)}


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
    """The keyword arguments of `claims.verdict` for PyTorch 2's 1.41x training geomean: the measured eager/compiled
    training step (`speedup`: its median and bounds) against a claimed 1.41 (`claims.judge_interval` decides:
    "supported" when the bounds come within 10% of it, "exceeded" above, "contradicted" below, "not testable" when
    they are too wide). "not testable" without CUDA, with the reason, the number and the claimed value still
    recorded: the paper's figure is for GPU kernels (Triton code, fewer launches) over real models, and a CPU step
    of a small model measures C++/OpenMP code on another kind of hardware."""
    claimed = PT2_CLAIM["claimed"]
    measured = (f"eager/compiled training step {speedup} on this {device} (first compiled step "
                f"{first_step_s:.1f} s, not counted)")
    kw = {"measured": measured, "value": speedup.value, "spread": (min(speedup.lo, speedup.value), max(speedup.hi, speedup.value)),
          "claimed": (claimed, claimed)}
    if device != "cuda":
        return kw | {"verdict": "not testable",
                     "reason": "the claim is a GPU result (Triton kernels, fewer kernel launches, an A100); this run has "
                               "only a CPU, where Inductor writes C++ for a different machine"}
    return kw | {"reason": "one model on this GPU, against a geomean over the paper's suites on an A100"}


# The one-token forward under each mode and CUDA graphs live in `compiler_modes_lab`; the names stay readable here,
# where the maintainers' goals (tools/capture/goals_train.py) look them up.
one_token_forward = compiler_modes_lab.one_token_forward
modes_note = compiler_modes_lab.modes_note


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


REGIONAL = ("whole model", "each block")


def regional_compare(config, batch_size: int, *, backend: str = "inductor", device: str = "cpu", lr: float = 1e-3,
                     seed: int = 0, repeats: int = 1) -> dict[str, Any]:
    """The first training step (forward, backward, AdamW) of the course GPT compiled whole (torch.compile(model))
    and compiled by region (`compiler.compile_blocks`: each block, one compiled code for all), from the same
    weights and batch, `repeats` times each. Each variant's loss must equal eager's within rtol 1e-4, atol 1e-5 (fp32).

    Every first step is a fresh compile: Dynamo's caches are emptied before each (`torch._dynamo.reset()`, which
    also drops every function this process compiled before; they compile again on their next call), and the two
    variants alternate which goes first, so neither always pays what the process does once.
    Each first step is timed by `first_call` and quoted in `counted_seconds` (this thread's CPU and the compiler
    processes it waited for; the wall time where a pool of compile workers did part of the work).

    Returns {"eager": {"loss"}, "whole model" | "each block": {"first_step_s" (median), "first_steps" (seconds),
    "first_step_wall" (wall seconds), "graphs" (graphs Dynamo handed to the backend), "nodes" (their FX node
    counts), "loss"}, "ratio": the whole model's first step over the block's (a protocol Ratio of the per-repeat
    ratios: median and quartiles; separated when they exclude 1), "repeats"}. backend: one of
    `compiler_lab.BACKENDS` ("aot_eager" traces forward and backward without generating code: cheap; "inductor" is
    the real compile). Raises ValueError for another backend or repeats < 1.
    """
    choices("backend", [backend], compiler_lab.BACKENDS)
    positive("repeats", repeats)
    g = torch.Generator().manual_seed(seed)
    x, y = (torch.randint(0, config.vocab_size, (batch_size, config.seq_len), generator=g).to(device) for _ in "xy")
    torch.manual_seed(seed)
    base = GPT(config).to(device)
    with torch.no_grad():
        out: dict[str, Any] = {"eager": {"loss": float(base(x, y)[1])}}
    readings: dict[str, list[clock.Reading]] = {name: [] for name in REGIONAL}
    for i in range(repeats):
        for name in (REGIONAL if i % 2 == 0 else REGIONAL[::-1]):
            torch._dynamo.reset()
            model = copy.deepcopy(base)
            be, graphs = counting_backend(backend)
            if name == "whole model":
                run = torch.compile(model, backend=be)
            else:
                compiler.compile_blocks(model, backend=be)
                run = model
            opt = torch.optim.AdamW(model.parameters(), lr=lr)
            losses = []
            readings[name].append(first_call(lambda: losses.append(float(_step(run, opt, x, y))), device=device))
            torch.testing.assert_close(losses[0], out["eager"]["loss"], rtol=1e-4, atol=1e-5)
            out[name] = {"graphs": len(graphs), "nodes": list(graphs), "loss": losses[0]}
    for name, rs in readings.items():
        seconds = [counted_seconds(r) for r in rs]
        out[name] |= {"first_step_s": bench.quartiles(seconds)[0], "first_steps": seconds,
                      "first_step_wall": [r.wall for r in rs]}
    per = [w / b for w, b in zip(out["whole model"]["first_steps"], out["each block"]["first_steps"])]
    med, q25, q75 = bench.quartiles(per)
    out["ratio"] = protocol.Ratio(med, q25, q75, not q25 <= 1 <= q75)
    out["repeats"] = repeats
    return out


def regional_sentence(reg: dict[str, Any], n_blocks: int, backend: str, full_first_step_s: float | None = None) -> str:
    """What regional compilation measured (`regional_compare`'s dict): graphs and first-step seconds of each
    variant and which was faster, ranked only from 3 repeats or more whose per-repeat ratios all lie on one side
    of 1 between their quartiles (`reg["ratio"].separated`); fewer repeats are one observation, said as such.
    The notebook's whole-model Inductor first step (`full_first_step_s`) goes beside it."""
    w, b, r, n = reg["whole model"], reg["each block"], reg["ratio"], reg.get("repeats", 1)
    if n < 3:
        verdict = (f"whole / block {r.value:.2g}x from {n} first step(s) each: an observation, not a ranking (a first "
                   "step is one compile; three or more, each fresh, would give a spread)")
    elif not r.separated:
        verdict = f"whole / block {r} over {n} fresh compiles each: within the noise, this run cannot rank them"
    elif r.value > 1:
        verdict = f"compiling by block made the first step {r} faster (median of {n} fresh compiles each)"
    else:
        verdict = (f"compiling the whole model made the first step faster: whole / block {r} (median of {n} fresh "
                   "compiles each)")
    reuse = (f"one graph of {b['nodes'][0]} nodes served all {n_blocks} blocks" if b["graphs"] == 1 and n_blocks > 1
             else f"{b['graphs']} graph(s) for {n_blocks} block(s)")
    text = (f"Backend {backend}: the whole model gave {w['graphs']} graph(s) ({sum(w['nodes'])} nodes) and a first step "
            f"of {w['first_step_s']:.2f} s of CPU time; by block, {reuse}, first step {b['first_step_s']:.2f} s: {verdict}.")
    if full_first_step_s is not None:
        text += (f" For scale: the whole-model Inductor compile of the training step above took {full_first_step_s:.1f} s "
                 "for its first step.")
    return text
