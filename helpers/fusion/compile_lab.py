"""Notebook 09's parameters (`resolve_parameters`) and measurements: each workload eager vs compiled (time,
GB/s, kernels), the cost of compiling (cold and warm, and the calls it takes to pay back), the softmax sweep
with the Triton kernel, the course GPT's training step and one-token forward compiled, the sentences and
the panel.

The compiler machinery and the workloads themselves are `helpers.fusion.compiler`; the Triton softmax is
`helpers.fusion.triton_softmax`. Compiled functions are kept in `COMPILED`, one per workload, so a notebook
(or a test) compiles each workload once and every later call reuses it. The workloads are compiled with
`compiler.compile_counted` (their C++ kernels visible to the profiler, so they can be counted); the GPT's
training step and one-token forward with plain torch.compile.
"""
from __future__ import annotations

import copy
import os
import tempfile
import time
from typing import Any, Callable

import torch

from helpers.cost.flops import transformer_flops
from helpers.fusion import compiler, triton_softmax
from helpers.gpt.model import GPT, PRESETS
from helpers.measure import bench, params, profiling
from helpers.measure.params import choices, positive
from helpers.show import plots

COMPILED: dict[str, Callable] = {}
# Eager rounds every intermediate to the dtype, a fused kernel keeps them in fp32: about two rounding
# steps of the dtype apart (eps: fp16 9.8e-4, bf16 7.8e-3); fp32 differs only in the order of sums.
TOLERANCES = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}


MODES = ("default", "reduce-overhead", "max-autotune")
ALL_MODES = MODES  # the same, under a name that `resolve_parameters`' MODES argument does not hide


def check_modes(name: str, value) -> list[str]:
    """A parameter check: a list of torch.compile modes from MODES, possibly empty (time no mode)."""
    if isinstance(value, (list, tuple)) and not value:
        return []
    return choices(name, value, MODES)


def check_for_device(device: str, *, MODES: list[str], DTYPE: str) -> None:
    """Refuse parameters this device cannot run: modes other than 'default' and fp16/bf16 without CUDA
    (a CPU's half-precision ops are emulated, so they would time the emulation). Raises ValueError naming them."""
    if device != "cuda" and any(m != "default" for m in MODES):
        raise ValueError(f"MODES={MODES!r}: 'reduce-overhead' and 'max-autotune' need CUDA; use ['default'] or []")
    if device != "cuda" and DTYPE != "fp32":
        raise ValueError(f"DTYPE={DTYPE!r}: fp16 and bf16 are for a GPU here; use 'fp32' on a CPU")


def resolve_parameters(S: params.Setup, *, ROWS, COLS, DTYPE, REPS, SOFTMAX_COLS, MODEL, N_LAYER, BATCH, SEQ_LEN,
                       MODES) -> dict:
    """Notebook 09's parameters, validated at once and with the profile's defaults filled in: {name: value}.

    Raises ValueError naming the first bad parameter, and for what this device cannot run (`check_for_device`).
    """
    R = S.resolve
    cuda, every = S.device == "cuda", list(ALL_MODES)  # the parameter MODES hides the module's constant here
    out = {"ROWS": R("ROWS", ROWS, smoke=256, full=8192, check=params.positive),
           "COLS": R("COLS", COLS, smoke=1024, full=4096, check=params.positive),
           "DTYPE": R("DTYPE", DTYPE, smoke="fp32", full="bf16" if cuda else "fp32",
                      check=lambda n, v: params.choose(n, v, ("fp32", "fp16", "bf16"))),
           "REPS": R("REPS", REPS, smoke=10, full=50, check=params.positive)}
    out["SOFTMAX_COLS"] = R("SOFTMAX_COLS", SOFTMAX_COLS, smoke=[out["COLS"]], full=[256, 1024, 4096, 16384],
                            check=params.positives)
    out["MODEL"] = R("MODEL", MODEL, smoke="tiny", full="small10m", check=lambda n, v: params.choose(n, v, PRESETS))
    out["N_LAYER"] = R("N_LAYER", N_LAYER, smoke=1, full=PRESETS[out["MODEL"]]["n_layer"], check=params.positive)
    out["BATCH"] = R("BATCH", BATCH, smoke=4, full=16, check=params.positive)
    out["SEQ_LEN"] = R("SEQ_LEN", SEQ_LEN, smoke=32, full=256, check=params.positive)
    out["MODES"] = R("MODES", MODES, smoke=every if cuda else [], full=every if cuda else ["default"], check=check_modes)
    check_for_device(S.device, MODES=out["MODES"], DTYPE=out["DTYPE"])  # CUDA graphs, autotuning, fp16/bf16: a GPU
    return out


def compiled(name: str) -> Callable:
    """torch.compile(workload `name`'s function), made once per process and reused; compiled with
    `compiler.compile_counted`, so that `compiler.kernel_launches` and torch.profiler see its C++ kernels."""
    if name not in COMPILED:
        compiler.make_inputs(name, 2, 2)  # validates the name
        COMPILED[name] = compiler.compile_counted(compiler.WORKLOADS[name].fn)
    return COMPILED[name]


def tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """(rtol, atol) for compiled vs eager in `dtype` (see TOLERANCES). Raises ValueError for other dtypes."""
    if dtype not in TOLERANCES:
        raise ValueError(f"dtype {dtype} has no stated tolerance; use one of {list(TOLERANCES)}")
    return TOLERANCES[dtype]


def verify_output(fn: Callable, got: torch.Tensor, args: tuple, name: str = "compiled") -> float:
    """Check `got` (an output for `fn(*args)`) and return its largest absolute error against the reference.

    fp32 inputs: against eager `fn(*args)` with TOLERANCES[fp32]. fp16/bf16: against `fn` run in fp32, allowed
    twice the error of eager in the low precision plus 1e-6 (flash-attn's test rule), because eager rounds every
    intermediate to the dtype while a fused kernel keeps them in fp32. Raises AssertionError when outside.
    """
    dtype = args[0].dtype
    if dtype == torch.float32:
        want = fn(*args)
        rtol, atol = tolerance(dtype)
        torch.testing.assert_close(got, want, rtol=rtol, atol=atol)
        return float((got - want).abs().max())
    ref = fn(*(a.float() for a in args))
    naive = float((fn(*args).float() - ref).abs().max())
    err = float((got.float() - ref).abs().max())
    if err > 2 * naive + 1e-6:
        raise AssertionError(f"{name} differs from the fp32 reference by {err:.3g}, more than twice eager "
                             f"{str(dtype).replace('torch.', '')}'s {naive:.3g}")
    return err


# ------------------------------------------------------------------------------------------ compile cost

def compile_seconds(fn: Callable, *args, cache_dir: str | None = None) -> tuple[float, Callable]:
    """(seconds of the first call of torch.compile(fresh copy of fn), the compiled function).

    cache_dir: Inductor's on-disk cache folder for this compile (TORCHINDUCTOR_CACHE_DIR), restored after;
    an empty folder makes the compile cold, the same folder again makes it warm. None: the current one.
    """
    compiled = torch.compile(compiler.fresh_copy(fn))
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


# ------------------------------------------------------------------------------------------ measuring

def ratio_quartiles(slow: bench.Timing, fast: bench.Timing) -> tuple[float, float, float]:
    """(median, q25, q75) of the per-round ratios slow/fast of two interleaved timings."""
    return bench.quartiles([a / b for a, b in zip(slow.samples, fast.samples)])


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


def fmt_seconds(s: float) -> str:
    """A duration for a sentence: '12.3 µs' below 1 ms, '13.43 ms' below 1 s, else '1.23 s'."""
    a = abs(s)
    return f"{s * 1e6:.1f} µs" if a < 1e-3 else f"{s * 1e3:.2f} ms" if a < 1 else f"{s:.2f} s"


def busy_warning(cores: int | None = None, load: float | None = None) -> bool:
    """Print one warning line and return True when the 1-minute load average >= the core count (other
    processes then hold the cores, and a parallel loop waits for its slowest thread, so timings and
    ratios are unreliable). cores/load default to os.cpu_count() and os.getloadavg()[0] (0 where absent)."""
    cores = cores or os.cpu_count() or 1
    if load is None:
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    if load >= cores:
        print(f"Warning: the load average ({load:.1f}) is at least the number of cores ({cores}): other work "
              "shares this CPU, so the timings below are unreliable (each parallel loop waits for its slowest thread).")
        return True
    return False


def sweep_agreement(sweep: dict, results: list[dict], cols: int, tol: float = 0.25) -> str:
    """One sentence comparing the softmax sweep's eager/compiled ratio at row length `cols` (GB/s compiled /
    eager) with the softmax workload's median per-round ratio in `results` (the same input size): they
    agree when within `tol` (relative) and on the same side of 1. '' when the sweep lacks that length."""
    if cols not in sweep["cols"]:
        return ""
    i = sweep["cols"].index(cols)
    e, c = sweep["eager"][i], sweep["compiled"][i]
    r = next((r["ratio"][0] for r in results if r["name"] == "softmax"), None)
    if not e or not c or r is None:
        return ""
    s = c / e
    same = abs(s - r) <= tol * r and (s > 1) == (r > 1)
    return (f"At row length {cols} the sweep measured eager/compiled {s:.2f}x, the workload table above {r:.2f}x: "
            + ("they agree." if same else "they disagree: two timing runs of the same input, so at least one was "
               "distorted (by other work on the CPU, or by a different compiled kernel); read either ratio with care."))

def triton_note(device: str) -> str:
    """One sentence on the Triton softmax in this process, for the cells after its check: timed beside the
    others (CUDA), run in Triton's interpreter for correctness only (a CPU), or not run at all when
    `triton_softmax.BROKEN` says it cannot run here (then the sentence refers back to the check, which printed
    that reason once). device: "cuda" or "cpu". Raises nothing."""
    if triton_softmax.BROKEN:
        return ("The Triton softmax did not run in this process (the reason is printed once, where it is checked), "
                "so it is absent here.")
    if device == "cuda":
        return "The Triton softmax is compiled for this GPU and timed beside the others."
    return "The Triton kernel is not timed on a CPU: the interpreter runs it in numpy, for correctness only."


def measure_workload(name: str, rows: int, cols: int, *, dtype: torch.dtype = torch.float32, device: str = "cpu",
                     reps: int = 10, seed: int = 0, kernels: bool = True, comp: Callable | None = None) -> dict[str, Any]:
    """Workload `name` on a (rows, cols) input: compiled checked against eager (`verify_output`), then eager,
    compiled and library (and the Triton softmax on CUDA) timed interleaved. `comp`: the compiled function
    to use (default `compiled(name)`).

    Returns {"name", "shape", "bytes_eager", "bytes_fused", "timings" {impl: Timing}, "gbps" {impl: GB/s
    of the fused bytes, i.e. the useful traffic}, "ratio" (median, q25, q75 of eager/compiled per round),
    "kernels" {"eager": n, "compiled": n} (None without `kernels`), "max_error"}.
    """
    w = compiler.WORKLOADS[name] if name in compiler.WORKLOADS else None
    args = compiler.make_inputs(name, rows, cols, dtype=dtype, device=device, seed=seed)
    fn, comp = w.fn, comp or compiled(name)
    with torch.no_grad():
        error = verify_output(fn, comp(*args), args)
        impls = {"eager": lambda: fn(*args), "compiled": lambda: comp(*args)}
        if w.library is not None:
            impls["library"] = lambda: w.library(*args)
        if name == "softmax" and device == "cuda" and not triton_softmax.BROKEN:
            verify_output(fn, triton_softmax.softmax(args[0]), args, "the Triton softmax")
            impls["triton"] = lambda: triton_softmax.softmax(args[0])
        timings = bench.benchmark_interleaved(impls, reps=reps, warmup=2, device=device)
    fused = compiler.fused_bytes(fn, *args)
    counts = None
    if kernels:
        counts = {"eager": compiler.kernel_launches(fn, *args)[0], "compiled": compiler.kernel_launches(comp, *args)[0]}
    return {"name": name, "shape": (rows, cols), "dtype": str(dtype).replace("torch.", ""),
            "bytes_eager": compiler.eager_bytes(fn, *args)["total"], "bytes_fused": fused, "timings": timings,
            "gbps": {k: fused / t.median / 1e9 for k, t in timings.items()},
            "ratio": ratio_quartiles(timings["eager"], timings["compiled"]), "kernels": counts,
            "max_error": error}


def workload_rows(results: list[dict], copy_gbps: float) -> list[list]:
    """Table rows: workload, predicted bytes eager/fused, kernels, times, measured ratio, GB/s vs copy."""
    rows = []
    for r in results:
        t, k = r["timings"], r["kernels"] or {}
        med, lo, hi = r["ratio"]
        rows.append([r["name"], f"{r['bytes_eager'] / r['bytes_fused']:.1f}x",
                     f"{k.get('eager', '-')} -> {k.get('compiled', '-')}", f"{t['eager'].ms:.3f}",
                     f"{t['compiled'].ms:.3f}", f"{t['library'].ms:.3f}" if "library" in t else "-",
                     f"{med:.2f}x [{lo:.2f}-{hi:.2f}]", f"{r['gbps']['compiled']:.3g}",
                     f"{r['gbps']['compiled'] / copy_gbps:.2g}x"])
    return rows


WORKLOAD_HEADER = ["workload", "bytes eager/fused", "kernels eager->compiled", "eager ms", "compiled ms",
                   "library ms", "eager/compiled [IQR]", "compiled GB/s", "x copy bw"]


def plot_workloads(results: list[dict], copy_gbps: float):
    """Two panels: time per implementation and workload (grouped bars); useful GB/s against copy bandwidth."""
    fig, (ax1, ax2) = plots.figure(ncols=2, figsize=(11, 3.6))
    impls = ["eager", "compiled", "library", "triton"]
    width = 0.8 / len(impls)
    for i, impl in enumerate(impls):
        xs = [j + i * width for j, r in enumerate(results) if impl in r["timings"]]
        if xs:
            ax1.bar(xs, [r["timings"][impl].ms for r in results if impl in r["timings"]], width, label=impl,
                    color=plots.COLORS[i % len(plots.COLORS)])
            ax2.bar(xs, [r["gbps"][impl] for r in results if impl in r["timings"]], width, label=impl,
                    color=plots.COLORS[i % len(plots.COLORS)])
    for ax, label in ((ax1, "ms per call (median)"), (ax2, "GB/s of the fused bytes")):
        ax.set_xticks([j + 0.3 for j in range(len(results))], [r["name"] for r in results])
        ax.set_ylabel(label)
    ax2.axhline(copy_gbps, ls="--", color="gray", label=f"copy bandwidth {copy_gbps:.3g} GB/s")
    ax1.legend()
    ax2.legend(fontsize=8)
    fig.tight_layout()
    return fig


def softmax_sweep(cols_list: list[int], rows: int, *, dtype: torch.dtype = torch.float32, device: str = "cpu",
                  reps: int = 5) -> dict[str, list]:
    """GB/s (useful bytes: read once, write once) of the softmax implementations against row length.

    {"cols": [...], "eager": [...], "compiled": [...], "library": [...], "triton": [...]}; "triton" holds
    None on a CPU, where the kernel runs only in Triton's (untimed) interpreter. Each row length gets a
    graph of its own (dynamic=False), as a benchmark should: a shape-generic kernel would be slower. Compiled
    like the workloads (`compiler.compile_counted`), so that its ratio at the workloads' size compares like
    with like.
    """
    out: dict[str, list] = {"cols": list(cols_list), "eager": [], "compiled": [], "library": [], "triton": []}
    for cols in cols_list:
        key = f"softmax, static {cols}"
        if key not in COMPILED:
            COMPILED[key] = compiler.compile_counted(compiler.fresh_copy(compiler.softmax_ops), dynamic=False)
        r = measure_workload("softmax", rows, cols, dtype=dtype, device=device, reps=reps, kernels=False,
                             comp=COMPILED[key])
        for impl in ("eager", "compiled", "library", "triton"):
            out[impl].append(r["gbps"].get(impl))
    return out


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
                       lr: float = 1e-3, seed: int = 0, autocast_dtype: torch.dtype | None = None) -> dict[str, Any]:
    """The course GPT's training step (forward, backward, AdamW) eager vs torch.compile'd, from equal weights.

    The first compiled step's time is reported as "first_step_s" (it compiles the forward and backward
    graphs); `check_steps` steps of both must give losses within rtol=1e-4, atol=1e-5 in fp32 (the
    compiled kernels sum in another order, and the difference grows slowly over steps), rtol=2e-2 under
    bf16 autocast (`autocast_dtype`; eager rounds each op's output to bf16, fused kernels do not); then `reps`
    steps of each are timed interleaved. Returns times, tokens/s, TFLOP/s (counted as in notebook 02)
    and the per-round ratio quartiles.
    """
    eager, comp, (opt_e, opt_c), x, y = _train_pair(config, batch_size, device, lr, seed)
    ac = autocast_dtype
    _step(eager, opt_e, x, y, ac)
    start = time.perf_counter()
    _step(comp, opt_c, x, y, ac)
    if device == "cuda":
        torch.cuda.synchronize()
    first = time.perf_counter() - start
    losses = [(float(_step(eager, opt_e, x, y, ac)), float(_step(comp, opt_c, x, y, ac))) for _ in range(check_steps)]
    for a, b in losses:
        torch.testing.assert_close(b, a, rtol=1e-4 if ac is None else 2e-2, atol=1e-5)
    timings = bench.benchmark_interleaved({"eager": lambda: _step(eager, opt_e, x, y, ac),
                                           "compiled": lambda: _step(comp, opt_c, x, y, ac)},
                                          reps=reps, warmup=1, device=device)
    tokens = batch_size * config.seq_len
    flops = transformer_flops(config, batch_size, config.seq_len)["total"]["total"]
    return {"first_step_s": first, "losses": losses, "timings": timings, "tokens": tokens, "flops": flops,
            "eager_step": lambda: _step(eager, opt_e, x, y, ac),
            "tokens_per_s": {k: tokens / t.median for k, t in timings.items()},
            "tflops": {k: flops / t.median / 1e12 for k, t in timings.items()},
            "ratio": ratio_quartiles(timings["eager"], timings["compiled"])}


def matmul_share(step: Callable[[], Any], name: str = "09_gpt_step_eager") -> float:
    """Share of `step`'s profiled self time spent in matrix multiplies (`profiling.is_matmul`), 0..1.

    torch.compile hands matmuls to the same library kernels eager uses, so only the rest can shrink: with a
    share m the whole step can be at most 1/m times faster (Amdahl's law)."""
    prof = profiling.profile(step, steps=2, top=10_000, name=name)
    return sum(share for op, _, _, share in prof.rows if profiling.is_matmul(op))


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
            if device == "cuda":
                torch.cuda.synchronize()
            out[mode] = {"compile_s": time.perf_counter() - start}
            torch.testing.assert_close(got.float(), want.float(), rtol=1e-4, atol=1e-4)
            fns[mode] = fn
        timings = bench.benchmark_interleaved({k: (lambda f=f: f(idx)) for k, f in fns.items()},
                                              reps=reps, warmup=2, device=device)
    for k, t in timings.items():
        out[k]["timing"] = t
    return out


def panel_figure(workload: str, cols: int, rows: int, *, device: str = "cpu", reps: int = 5) -> dict[str, Any]:
    """The instructor panel's callback: measure one workload at (rows, cols), print one line, draw bars."""
    r = measure_workload(workload, rows, cols, device=device, reps=reps)
    k = r["kernels"]
    print(f"{workload} ({rows} x {cols}): eager {r['timings']['eager'].ms:.3f} ms, {k['eager']} kernels; compiled "
          f"{r['timings']['compiled'].ms:.3f} ms, {k['compiled']} kernels; eager/compiled {r['ratio'][0]:.2f}x; "
          f"compiled {r['gbps']['compiled']:.3g} GB/s of the fused bytes")
    plots.bars({impl: t.ms for impl, t in r["timings"].items()}, ylabel="ms per call", title=f"{workload}, {rows}x{cols}")
    return r
