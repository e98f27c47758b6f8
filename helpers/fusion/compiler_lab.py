"""Notebook 09's parameters (`resolve_parameters`) and its measurements of the three workloads: each eager,
compiled and library (time, GB/s, kernels; the GB/s set against `helpers.measure.ceilings.bandwidth_ceiling`),
the softmax sweep with the Triton kernel, the sentences each generated from the run's numbers, and the panel.

Every timing is `helpers.measure.protocol`'s (warm-up until steady, interleaved rounds until the variants
separate or the budget runs out), made by `timed`, and each quantity is measured once: the softmax at the
workloads' size is the workload table's measurement, reused by the sweep and the panel.

The workloads and Inductor's kernels are `helpers.fusion.compiler`; the Triton softmax, `triton_softmax`; the cost
of compiling and the course GPT compiled, `compiler_model_lab`; the profile of a compiled call, read,
`compiler_profile_lab`. Compiled functions are kept in `COMPILED`, one per
workload, so a notebook (or a test) compiles each once and every later call reuses it, compiled with
`compiler.compile_counted` (their C++ kernels visible to the profiler, so they can be counted).
"""
from __future__ import annotations

import os
from typing import Any, Callable

import torch

from helpers.fusion import compiler, dynamo, triton_softmax
from helpers.gpt import footprint
from helpers.gpt.model import PRESETS, GPTConfig
from helpers.measure import bench, hardware, params, protocol
from helpers.measure.params import choices, positive
from helpers.show import plots, units

COMPILED: dict[str, Callable] = {}
# Eager rounds every intermediate to the dtype, a fused kernel keeps them in fp32: about two rounding
# steps of the dtype apart (eps: fp16 9.8e-4, bf16 7.8e-3); fp32 differs only in the order of sums.
TOLERANCES = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}

MODES = ("default", "reduce-overhead", "max-autotune")  # torch.compile's modes (compiler_model_lab.one_token_forward)
BACKENDS = ("eager", "aot_eager", "inductor")  # torch.compile backends regional compilation is timed with
ALL_MODES = MODES  # the same, under a name that `resolve_parameters`' MODES argument does not hide
FULL_MODES = ("default", "reduce-overhead")  # the full profile's on CUDA


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


def full_layers(preset: str) -> int:
    """The layers of `preset` that notebook 09's full profile (and its goals) compile whole: 3, at most the
    preset's own. A whole-model compile's time grows with the layers it traces, while every layer is the same
    block, so what compiling buys per step is the blocks' and stays about the whole preset's."""
    return min(3, PRESETS[preset]["n_layer"])


def resolve_parameters(S: params.Setup, *, ROWS, COLS, DTYPE, REPS, SOFTMAX_COLS, MODEL, N_LAYER, BATCH, SEQ_LEN,
                       MODES, REGIONAL_LAYERS, REGIONAL_BACKEND) -> dict:
    """Notebook 09's parameters, validated at once and with the profile's defaults filled in: {name: value}.
    Raises ValueError naming the first bad parameter, and for what this device cannot run (`check_for_device`)."""
    R = S.resolve
    cuda, every = S.device == "cuda", list(ALL_MODES)  # the parameter MODES hides the module's constant here
    out = {"ROWS": R("ROWS", ROWS, smoke=256, full=8192, check=params.positive),
           "COLS": R("COLS", COLS, smoke=1024, full=4096, check=params.positive),
           "DTYPE": R("DTYPE", DTYPE, smoke=hardware.default_dtype(S.device), full=hardware.default_dtype(S.device),
                      check=lambda n, v: params.choose(n, v, ("fp32", "fp16", "bf16"))),
           "REPS": R("REPS", REPS, smoke=30, full=50, check=params.positive)}
    # full: short rows, the workloads' own (timed once, reused) and rows past one Triton block; each new length
    # is a static compile. Smoke on CUDA adds rows of 8192, so that the Triton kernel's widest block (8 warps) and
    # Inductor's looped reduction run there too
    out["SOFTMAX_COLS"] = R("SOFTMAX_COLS", SOFTMAX_COLS, smoke=[out["COLS"], 8192] if cuda else [out["COLS"]],
                            full=[256, 4096, 16384], check=params.positives)
    out["MODEL"] = R("MODEL", MODEL, smoke="tiny", full="small10m", check=lambda n, v: params.choose(n, v, PRESETS))
    out["N_LAYER"] = R("N_LAYER", N_LAYER, smoke=1, full=full_layers(out["MODEL"]), check=params.positive)
    out["BATCH"] = R("BATCH", BATCH, smoke=4, full=16, check=params.positive)
    out["SEQ_LEN"] = R("SEQ_LEN", SEQ_LEN, smoke=32, full=256, check=params.positive)
    # full on CUDA: no max-autotune (`compiler_model_lab.modes_note` says why; MODES=ALL_MODES adds it); smoke walks every mode
    out["MODES"] = R("MODES", MODES, smoke=every if cuda else [], full=list(FULL_MODES) if cuda else ["default"],
                     check=check_modes)
    out["REGIONAL_LAYERS"] = R("REGIONAL_LAYERS", REGIONAL_LAYERS, smoke=4, full=PRESETS[out["MODEL"]]["n_layer"],
                               check=params.positive)
    # aot_eager in both: the whole step's Inductor compile is timed once already (compiler_model_lab.train_step_compare)
    out["REGIONAL_BACKEND"] = R("REGIONAL_BACKEND", REGIONAL_BACKEND, smoke="aot_eager", full="aot_eager",
                                check=lambda n, v: params.choose(n, v, BACKENDS))
    check_for_device(S.device, MODES=out["MODES"], DTYPE=out["DTYPE"])  # CUDA graphs, autotuning, fp16/bf16: a GPU
    cfg = GPTConfig.preset(out["MODEL"], seq_len=out["SEQ_LEN"], n_layer=out["N_LAYER"])
    params.fits("SEQ_LEN", out["SEQ_LEN"], footprint.training_floor_bytes(cfg, out["BATCH"]), S.device,
                f"a training step of {out['MODEL']} at BATCH={out['BATCH']}")
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
    intermediate to the dtype while a fused kernel keeps them in fp32. Raises AssertionError when outside."""
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


# ------------------------------------------------------------------------------------------ measuring

def ratio_triple(r: protocol.Ratio) -> tuple[float, float, float]:
    """(ratio of medians, lo, hi) of a protocol Ratio: the form the records and tables keep."""
    return (r.value, r.lo, r.hi)


TIMING_THREADS = 1  # torch threads while timing on a CPU (see `timing_threads`)


def timing_threads(device: str):
    """`bench.cpu_threads(device, TIMING_THREADS)`: the notebook's timings on a CPU run on one thread. At its smoke sizes
    a call takes well under a ms, so 2 threads on a shared CPU would count the parallel loops' stalls, not the work."""
    return bench.cpu_threads(device, TIMING_THREADS)


def compile_on_one_thread(device: str) -> str:
    """On a CPU, make Inductor compile on this process's thread for the rest of the process
    (`torch._inductor.config.compile_threads = 1`) and return the sentence that says so; "" on CUDA (left as is).
    With more compile threads Inductor starts a pool of worker processes on its first compile (seconds of start-up
    on a small machine) that outlive every compile, so no clock of this process sees their work. On one thread the
    C++ compiler still runs as a child process, but one this process waits for, so `clock.Stopwatch(children=True)`
    counts its CPU time: a compile is then timed on the CPU clock like everything else, whatever else the machine runs."""
    if device == "cuda":
        return ""
    import torch._inductor.config as inductor_config  # heavy: only where the notebook compiles

    inductor_config.compile_threads = 1
    return ("Inductor compiles on this process's thread (compile_threads = 1): each compile is timed as this thread's "
            "CPU time plus that of the C++ compiler it runs and waits for, with the wall time beside it.")


def timed(fns: dict[str, Callable[[], Any]], *, device: str, reps: int, budget_s: float | None = None
          ) -> protocol.Comparison:
    """The notebook's one way to time variants: `protocol.compare` (warm-up until steady, then interleaved
    rounds) under `timing_threads(device)`, with exactly `reps` rounds: min_reps = max_reps, so the rounds do
    not stop at the first one whose IQRs happen to separate (stopping on a look at the data would favour
    separation). `budget_s` is passed on (default: 3 s on a CPU, 10 s on CUDA; with min_reps = max_reps it
    does not cut the rounds short)."""
    positive("reps", reps)
    budget = budget_s if budget_s is not None else (10.0 if device == "cuda" else 3.0)
    with timing_threads(device):
        return protocol.compare(fns, device=device, min_reps=reps, max_reps=reps, budget_s=budget)


# ------------------------------------------------------------------------------------------ sentences

def cache_note(nbytes: int, llc: int | None, llc_name: str = "last-level") -> str:
    """A clause on where a workload's data lives: in cache when `nbytes` (its inputs and output) fit in the
    last-level cache `llc` (bytes), so the memory-bound prediction does not apply; else that it streams."""
    if llc is None:
        return f"its inputs and output total {units.fmt_bytes(nbytes)} (this device's cache size is unknown)"
    if nbytes <= llc:
        return (f"its inputs and output ({units.fmt_bytes(nbytes)}) fit in the {units.fmt_bytes(llc)} {llc_name} cache, so its "
                "intermediates are read back from cache, not memory, and the memory-bound prediction does not apply "
                "at this size")
    return f"its inputs and output ({units.fmt_bytes(nbytes)}) exceed the {units.fmt_bytes(llc)} {llc_name} cache: it streams from memory"


def workload_sentence(r: dict, llc: int | None, llc_name: str = "last-level") -> str:
    """One sentence per workload, built from its measurement `r` (`measure_workload`'s dict): the bytes'
    prediction, where the data lives (`cache_note`), compiled against eager and, where there is one,
    the library kernel against compiled, each ranked only when the quartiles of their per-round ratios exclude 1
    (`r["speedup"]` and the library's ratio are paired: `protocol.paired_ratio`)."""
    t = r["timings"]
    pred = r["bytes_eager"] / r["bytes_fused"]
    sp = r["speedup"]
    if not sp.separated:
        vs_eager = f"compiled and eager are within the noise (eager/compiled {sp}): this run cannot rank them"
    elif sp.value > 1:
        vs_eager = f"compiled was {sp} faster than eager"
    else:
        slow = protocol.paired_ratio(t["compiled"], t["eager"])
        vs_eager = f"compiled was {slow} slower than eager"
    text = f"{r['name']}: the bytes predict up to {pred:.1f}x if memory-bound; {cache_note(r['bytes_fused'], llc, llc_name)}; {vs_eager}"
    if "library" in t:
        lib = protocol.paired_ratio(t["compiled"], t["library"])
        if lib.separated and lib.value > 1:
            text += (f"; the library kernel moved the same bytes {lib} faster than the compiled one, so the compiled "
                     "kernel is not at a limit of this device: a faster kernel for the same work exists")
        elif lib.separated:
            text += f"; the compiled kernel beat the library one ({protocol.paired_ratio(t['library'], t['compiled'])})"
        else:
            text += f"; the library kernel and the compiled one are within the noise ({t['library']} vs {t['compiled']})"
    return text + "."


def busy_warning(cores: int | None = None, load: float | None = None) -> bool:
    """Print one line and return True when the 1-minute load average >= the core count (other processes then
    share the cores: the thread's clock leaves out their turns, not their cache and memory traffic). cores/load default to os.cpu_count() and os.getloadavg()[0] (0 where absent)."""
    cores = cores or os.cpu_count() or 1
    if load is None:
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    if load >= cores:
        print(f"Note: the load average ({load:.1f}) is at least the number of cores ({cores}): other work shares this "
              "CPU. The timings below run on one thread and read its own CPU clock, which leaves out the time it waited "
              "for a core; other work's cache and memory traffic can still slow them, and the spreads show how much.")
        return True
    return False



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
                     reps: int = 10, seed: int = 0, kernels: bool = True, comp: Callable | None = None,
                     budget_s: float | None = None) -> dict[str, Any]:
    """Workload `name` on a (rows, cols) input: compiled checked against eager (`verify_output`), then eager,
    compiled and library (and the Triton softmax on CUDA) timed by the protocol (`timed`: at most `reps`
    rounds). `comp`: the compiled function to use (default `compiled(name)`). The ratios are paired: the median
    of the per-round ratios, their quartiles as bounds (`protocol.paired_ratio`), since the rounds are interleaved.

    Returns {"name", "shape", "bytes_eager", "bytes_fused", "timings" {impl: Timing}, "gbps" {impl: GB/s
    of the fused bytes, i.e. the useful traffic}, "speedup" (the protocol Ratio eager/compiled), "ratio"
    (its value, lo, hi), "note" (how the timings were made), "kernels" {"eager": n, "compiled": n} (None
    without `kernels`), "max_error"}."""
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
        comparison = timed(impls, device=device, reps=reps, budget_s=budget_s)
    timings = comparison.timings
    fused = compiler.fused_bytes(fn, *args)
    counts = None
    if kernels:
        counts = {"eager": compiler.kernel_launches(fn, *args)[0], "compiled": compiler.kernel_launches(comp, *args)[0]}
    return {"name": name, "shape": (rows, cols), "dtype": str(dtype).replace("torch.", ""),
            "bytes_eager": compiler.eager_bytes(fn, *args)["total"], "bytes_fused": fused, "timings": timings,
            "gbps": {k: fused / t.median / 1e9 for k, t in timings.items()},
            "speedup": protocol.paired_ratio(timings["eager"], timings["compiled"]),
            "ratio": ratio_triple(protocol.paired_ratio(timings["eager"], timings["compiled"])), "note": comparison.note(),
            "kernels": counts,
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
                   "library ms", "eager/compiled [IQR bounds]", "compiled GB/s", "x copy bw"]


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
    ax1.legend(), ax2.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))  # outside: clear of the line
    none = ", ".join(r["name"] for r in results if "library" not in r["timings"])  # no torch op computes it whole
    fig.suptitle("eager vs compiled vs library kernel" + (f" ({none}: no library kernel, so no bar)" if none else ""))
    fig.tight_layout()
    return fig


def softmax_sweep(cols_list: list[int], rows: int, *, dtype: torch.dtype = torch.float32, device: str = "cpu",
                  reps: int = 5, known: list[dict] | None = None) -> dict[str, list]:
    """GB/s (useful bytes: read once, write once) of the softmax implementations against row length.

    {"cols": [...], "eager": [...], "compiled": [...], "library": [...], "triton": [...]}; "triton" holds
    None on a CPU, where the kernel runs only in Triton's (untimed) interpreter. Each row length gets a
    graph of its own (dynamic=False), as a benchmark should: a shape-generic kernel would be slower. Compiled
    like the workloads (`compiler.compile_counted`), so that its ratio at the workloads' size compares like with like.

    known: measurements already made (`measure_workload` dicts): a row length whose softmax of this many rows
    and dtype is among them is reused, not timed again (one quantity, measured once per run); "reused" lists them."""
    out: dict[str, list] = {"cols": list(cols_list), "eager": [], "compiled": [], "library": [], "triton": [],
                            "reused": []}
    dname = str(dtype).replace("torch.", "")
    for cols in cols_list:
        r = next((k for k in known or () if k["name"] == "softmax" and tuple(k["shape"]) == (rows, cols)
                  and k["dtype"] == dname), None)
        if r is not None:
            out["reused"].append(cols)
        else:
            key = f"softmax, static {cols}"
            if key not in COMPILED:
                COMPILED[key] = compiler.compile_counted(dynamo.fresh_copy(compiler.softmax_ops), dynamic=False)
            r = measure_workload("softmax", rows, cols, dtype=dtype, device=device, reps=reps, kernels=False,
                                 comp=COMPILED[key])
        for impl in ("eager", "compiled", "library", "triton"):
            out[impl].append(r["gbps"].get(impl))
    return out


def panel_figure(workload: str, cols: int, rows: int, *, device: str = "cpu", reps: int = 5,
                 known: list[dict] | None = None) -> dict[str, Any]:
    """The instructor panel's callback: measure one workload at (rows, cols) (or reuse its measurement from
    `known`, `measure_workload` dicts, when it was already made in fp32), print one line, draw bars."""
    r = next((k for k in known or () if k["name"] == workload and tuple(k["shape"]) == (rows, cols)
              and k["dtype"] == "float32" and k["kernels"]), None)
    reused = r is not None
    r = r or measure_workload(workload, rows, cols, device=device, reps=reps)
    k = r["kernels"]
    n = {v: f"{k[v]} kernel" + "s" * (k[v] != 1) for v in ("eager", "compiled")}
    print(f"{workload} ({rows} x {cols}){' (measured above, reused)' if reused else ''}: eager {r['timings']['eager']}, "
          f"{n['eager']}; compiled {r['timings']['compiled']}, {n['compiled']}; eager/compiled "
          f"{r['speedup']}; compiled {r['gbps']['compiled']:.3g} GB/s of the fused bytes")
    plots.bars({impl: t.ms for impl, t in r["timings"].items()}, ylabel="ms per call", title=f"{workload}, {rows}x{cols}")
    return r
