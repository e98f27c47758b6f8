"""helpers.fusion.compiler_lab: compiled equals eager, the kernels counted, the parameter checks, the
sentences, the softmax sweep and the panel. Each workload is compiled once (module-scoped)
at the notebook's smoke size, so that notebook 09 finds these graphs in Inductor's on-disk cache. No test
asserts a speed."""
import pytest
import torch

from helpers.fusion import compiler_lab, compiler, triton_softmax
from helpers.measure import bench, protocol

ROWS, COLS = 256, 1024  # notebook 09's smoke size
DEV = "cuda" if torch.cuda.is_available() else "cpu"  # the Triton softmax runs where Triton compiles (or interprets)


@pytest.fixture(scope="module")
def measured():
    """Each workload compiled once and measured (2 reps: the numbers are not asserted, only produced)."""
    return {name: compiler_lab.measure_workload(name, ROWS, COLS, reps=2) for name in compiler.WORKLOADS}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(compiler.WORKLOADS))
def test_compiled_equals_eager_and_fuses_into_one_kernel(measured, name):
    r = measured[name]  # measure_workload asserted compiled == eager within tolerance(fp32) = 1e-5
    assert r["max_error"] <= 1e-5
    eager_kernels = {"pointwise": 3, "layernorm": 9, "softmax": 5}[name]
    assert r["kernels"] == {"eager": eager_kernels, "compiled": 1}  # one fused C++ kernel on a CPU
    assert set(r["timings"]) == ({"eager", "compiled"} | ({"library"} if name != "pointwise" else set()))
    assert r["bytes_eager"] > 2 * r["bytes_fused"] and all(g > 0 for g in r["gbps"].values())


def test_importing_leaves_inductor_config_alone_and_counting_still_sees_the_cpp_kernel(measured):
    """compile_counted's option stays on its own compiled function: the process's setting keeps its default
    (changing it would change Inductor's cache keys and code for every compile of every notebook)."""
    import os

    import torch._inductor.config as inductor_config

    default = os.environ.get("TORCHINDUCTOR_CPP_ENABLE_KERNEL_PROFILE", "0") == "1"
    assert inductor_config.cpp.enable_kernel_profile is default  # after importing both modules and compiling
    args = compiler.make_inputs("pointwise", ROWS, COLS)
    n, names = compiler.kernel_launches(compiler_lab.compiled("pointwise"), *args)
    if DEV == "cpu":
        assert n == 1 and len(names) == 1 and "cpp_fused" in next(iter(names))  # the C++ kernel, by name
    assert inductor_config.cpp.enable_kernel_profile is default


def test_where_triton_cannot_run_only_the_triton_softmax_is_left_out(monkeypatch):
    """The degraded path (e.g. Triton 3.6's interpreter under NumPy 2.5): the kernel refuses with the one
    sentence, the sweep still measures the others, and no note claims the kernel ran or was timed."""
    reason = "Triton 3.6.0 with NumPy 2.5.5 cannot run the course's kernels in the interpreter (a planted probe failure)"
    monkeypatch.setattr(triton_softmax, "BROKEN", reason)
    with pytest.raises(RuntimeError, match="planted probe failure"):
        triton_softmax.softmax(torch.zeros(2, 4, device=DEV))
    for device in ("cpu", "cuda"):
        note = compiler_lab.triton_note(device)
        assert "did not run" in note and "timed" not in note and "interpreter runs" not in note
    monkeypatch.setitem(compiler_lab.COMPILED, "softmax, static 64", compiler.softmax_ops)  # eager: no compile cost
    sweep = compiler_lab.softmax_sweep([64], 8, device=DEV, reps=2)
    assert sweep["triton"] == [None] and all(sweep[k][0] > 0 for k in ("eager", "compiled", "library"))
    monkeypatch.setattr(triton_softmax, "BROKEN", None)
    assert "did not run" not in compiler_lab.triton_note("cpu") and "timed" in compiler_lab.triton_note("cuda")


def test_regional_parameters_are_checked_and_defaulted(tmp_path):
    from helpers.measure import params

    S = params.Setup(profile="smoke", device="cpu", seed=0, interactive=False, results_dir=tmp_path)
    base = dict(ROWS=None, COLS=None, DTYPE=None, REPS=None, SOFTMAX_COLS=None, MODEL=None, N_LAYER=None, BATCH=None,
                SEQ_LEN=None, MODES=None, REGIONAL_LAYERS=None, REGIONAL_BACKEND=None)
    P = compiler_lab.resolve_parameters(S, **base)
    assert (P["REGIONAL_LAYERS"], P["REGIONAL_BACKEND"], P["REPS"]) == (4, "aot_eager", 30)
    with pytest.raises(ValueError, match="REGIONAL_BACKEND"):
        compiler_lab.resolve_parameters(S, **(base | {"REGIONAL_BACKEND": "tvm"}))
    with pytest.raises(ValueError, match="REGIONAL_LAYERS"):
        compiler_lab.resolve_parameters(S, **(base | {"REGIONAL_LAYERS": 0}))


def test_full_profile_on_cuda_times_two_modes_and_traces_regions(tmp_path, monkeypatch):
    from helpers.measure import params

    base = dict(ROWS=None, COLS=None, DTYPE=None, REPS=None, SOFTMAX_COLS=None, MODEL=None, N_LAYER=None, BATCH=None,
                SEQ_LEN=None, MODES=None, REGIONAL_LAYERS=None, REGIONAL_BACKEND=None)
    full = lambda device: params.Setup(profile="full", device=device, seed=0, interactive=False, results_dir=tmp_path)  # noqa: E731
    P = compiler_lab.resolve_parameters(full("cuda"), **base)  # resolving needs no GPU
    assert P["MODES"] == ["default", "reduce-overhead"] and P["REGIONAL_BACKEND"] == "aot_eager"
    assert P["SOFTMAX_COLS"] == [256, 4096, 16384] and P["COLS"] in P["SOFTMAX_COLS"]  # 4096: the workloads' own
    assert (P["MODEL"], P["N_LAYER"], P["REGIONAL_LAYERS"]) == ("small10m", 3, 6)  # whole-model compiles at half depth
    assert compiler_lab.resolve_parameters(full("cuda"), **(base | {"MODEL": "tiny"}))["N_LAYER"] == 2  # the preset's
    assert compiler_lab.resolve_parameters(full("cuda"), **(base | {"MODES": list(compiler_lab.ALL_MODES)}))["MODES"] == \
        list(compiler_lab.ALL_MODES)  # max-autotune stays one parameter away
    assert compiler_lab.resolve_parameters(full("cpu"), **base)["MODES"] == ["default"]


def test_parameter_checks_name_the_parameter():
    assert compiler_lab.check_modes("MODES", []) == [] and compiler_lab.check_modes("MODES", ("default",)) == ["default"]
    with pytest.raises(ValueError, match="MODES"):
        compiler_lab.check_modes("MODES", ["fast"])
    with pytest.raises(ValueError, match="MODES"):
        compiler_lab.check_modes("MODES", "default")
    compiler_lab.check_for_device("cuda", MODES=["reduce-overhead"], DTYPE="bf16")
    with pytest.raises(ValueError, match="MODES"):
        compiler_lab.check_for_device("cpu", MODES=["max-autotune"], DTYPE="fp32")
    with pytest.raises(ValueError, match="DTYPE"):
        compiler_lab.check_for_device("cpu", MODES=[], DTYPE="bf16")


def test_the_panel_callback_runs_without_a_kernel(measured, capsys):
    import matplotlib.pyplot as plt

    r = compiler_lab.panel_figure("pointwise", COLS, ROWS, reps=2)  # the size compiled above: no recompile
    assert r["kernels"] == {"eager": 3, "compiled": 1} and "pointwise (256 x 1024)" in capsys.readouterr().out
    plt.close("all")


def test_low_precision_is_checked_against_fp32_with_twice_eagers_error():
    with pytest.raises(ValueError, match="tolerance"):
        compiler_lab.tolerance(torch.int32)
    for name, w in compiler.WORKLOADS.items():
        args = compiler.make_inputs(name, 16, 300, dtype=torch.bfloat16)
        fused_like = w.fn(*(a.float() for a in args)).bfloat16()  # what a fused kernel gives: fp32 inside, one rounding
        assert compiler_lab.verify_output(w.fn, fused_like, args) < 0.05
        with pytest.raises(AssertionError, match="twice eager"):
            compiler_lab.verify_output(w.fn, fused_like + 0.1, args)


def test_busy_warning(capsys):
    assert compiler_lab.busy_warning(cores=2, load=2.5) and "leaves out the time it waited" in capsys.readouterr().out
    assert not compiler_lab.busy_warning(cores=2, load=0.5) and capsys.readouterr().out == ""


def T(median, spread=0.1):
    """A planted Timing: the median with quartiles spread/2 either side."""
    return bench.Timing(median, median * (1 - spread / 2), median * (1 + spread / 2), [median] * 5)


def _planted(name, eager, compiled, library=None, nbytes=2**20):
    timings = {"eager": eager, "compiled": compiled} | ({"library": library} if library else {})
    return {"name": name, "timings": timings, "bytes_eager": 4 * nbytes, "bytes_fused": nbytes,
            "speedup": protocol.ratio(eager, compiled)}


def test_workload_sentence_says_what_the_numbers_show_and_when_the_data_is_cache_resident():
    r = _planted("layernorm", T(0.30), T(0.12), library=T(0.05))
    cached = compiler_lab.workload_sentence(r, llc=480 * 2**20, llc_name="L3")
    assert "fit in the 480 MiB L3 cache" in cached and "does not apply" in cached
    assert "compiled was 2.50x" in cached and "faster than eager" in cached
    assert "library kernel moved the same bytes 2.40x" in cached and "fixed costs" not in cached
    streams = compiler_lab.workload_sentence(r, llc=2**19)
    assert "exceed the 512 KiB" in streams and "does not apply" not in streams
    unknown = compiler_lab.workload_sentence(r, llc=None)
    assert "1 MiB" in unknown and "unknown" in unknown
    noisy = compiler_lab.workload_sentence(_planted("softmax", T(0.10, 0.6), T(0.09, 0.6), library=T(0.09, 0.6)), 2**30)
    assert "cannot rank" in noisy and "within the noise" in noisy and "faster" not in noisy
    slower = compiler_lab.workload_sentence(_planted("pointwise", T(0.05), T(0.10)), 2**30)
    assert "slower than eager" in slower


def test_the_workload_figure_has_a_title_naming_the_workloads_without_a_library_bar():
    import matplotlib.pyplot as plt

    def row(name, library):
        r = _planted(name, T(0.3), T(0.1), library=T(0.05) if library else None)
        return r | {"gbps": {k: 1.0 for k in r["timings"]}}
    fig = compiler_lab.plot_workloads([row("pointwise", False), row("softmax", True)], copy_gbps=10.0)
    title = fig._suptitle.get_text()
    assert title.startswith("eager vs compiled vs library kernel") and "(pointwise: no library kernel" in title
    both = compiler_lab.plot_workloads([row("softmax", True)], copy_gbps=10.0)._suptitle.get_text()
    assert "no library kernel" not in both
    fig.canvas.draw()  # the GB/s panel's legend, copy-bandwidth line's label included, sits right of the axes
    ax2 = fig.axes[1]
    renderer = fig.canvas.get_renderer()
    legend = ax2.get_legend()
    assert any(t.get_text().startswith("copy bandwidth") for t in legend.get_texts())
    assert legend.get_window_extent(renderer).x0 >= ax2.get_window_extent(renderer).x1  # not across the dashed line
    plt.close("all")


def test_the_sweep_and_the_panel_reuse_the_tables_measurement(measured, monkeypatch, capsys):
    import matplotlib.pyplot as plt

    known = list(measured.values())

    def refuse(*a, **k):
        raise AssertionError("measured again")
    monkeypatch.setattr(compiler_lab, "measure_workload", refuse)
    sweep = compiler_lab.softmax_sweep([COLS], ROWS, reps=2, known=known)
    assert sweep["reused"] == [COLS] and sweep["compiled"] == [measured["softmax"]["gbps"]["compiled"]]
    r = compiler_lab.panel_figure("softmax", COLS, ROWS, reps=2, known=known)
    out = capsys.readouterr().out
    assert r is measured["softmax"] and "reused" in out
    assert "1 kernels" not in out and f"{r['kernels']['compiled']} kernel" in out  # "1 kernel", "5 kernels"
    plt.close("all")


def test_timing_threads_sets_one_thread_on_a_cpu_and_restores_the_count():
    before = torch.get_num_threads()
    with compiler_lab.timing_threads("cpu"):
        assert torch.get_num_threads() == compiler_lab.TIMING_THREADS
    assert torch.get_num_threads() == before
    with compiler_lab.timing_threads("cuda"):
        assert torch.get_num_threads() == before
    seen = []
    compiler_lab.timed({"a": lambda: seen.append(torch.get_num_threads())}, device="cpu", reps=2, budget_s=1.0)
    assert set(seen) == {compiler_lab.TIMING_THREADS} and torch.get_num_threads() == before
    c = compiler_lab.timed({"a": lambda: None, "b": lambda: sum(range(10_000))}, device="cpu", reps=12)
    assert c.rounds == 12  # a fixed number of rounds: no stop at the first separated one


def test_smoke_on_cuda_runs_bf16_and_a_softmax_row_past_one_block(tmp_path, monkeypatch):
    from helpers.measure import hardware, params

    monkeypatch.setattr(hardware, "emulated", lambda dtype, device="cpu": None)  # a GPU with bf16 units

    base = dict(ROWS=None, COLS=None, DTYPE=None, REPS=None, SOFTMAX_COLS=None, MODEL=None, N_LAYER=None, BATCH=None,
                SEQ_LEN=None, MODES=None, REGIONAL_LAYERS=None, REGIONAL_BACKEND=None)
    smoke = lambda device: params.Setup(profile="smoke", device=device, seed=0, interactive=False, results_dir=tmp_path)  # noqa: E731
    P = compiler_lab.resolve_parameters(smoke("cuda"), **base)
    assert (P["DTYPE"], P["SOFTMAX_COLS"], P["MODES"]) == ("bf16", [1024, 8192], list(compiler_lab.ALL_MODES))
    P = compiler_lab.resolve_parameters(smoke("cpu"), **base)
    assert (P["DTYPE"], P["SOFTMAX_COLS"], P["MODES"]) == ("fp32", [1024], [])
    monkeypatch.setattr(hardware, "emulated", lambda dtype, device="cpu": "no bf16 units" if dtype == "bf16" else None)
    assert compiler_lab.resolve_parameters(smoke("cuda"), **base)["DTYPE"] == "fp16"   # a T4: fp16, not emulated bf16


def test_compile_on_one_thread_sets_inductor_to_compile_here_only_on_a_cpu():
    import torch._inductor.config as inductor_config

    with inductor_config.patch(compile_threads=2):  # Inductor's own patch: restored on exit, whatever is set inside
        assert compiler_lab.compile_on_one_thread("cuda") == "" and inductor_config.compile_threads == 2
        assert "compile_threads = 1" in compiler_lab.compile_on_one_thread("cpu")
        assert inductor_config.compile_threads == 1


def test_workload_ratios_are_paired_round_by_round():
    # eager and compiled timed in the same rounds; rounds 2 to 4 were slowed by other work, both sides alike:
    # their IQRs overlap (2-4 ms against 1-2 ms), yet every round ran compiled twice as fast
    eager = bench.Timing(*bench.quartiles([2.0, 4.0, 8.0, 4.0, 2.0]), [2.0, 4.0, 8.0, 4.0, 2.0])
    compiled = bench.Timing(*bench.quartiles([1.0, 2.0, 4.0, 2.0, 1.0]), [1.0, 2.0, 4.0, 2.0, 1.0])
    assert not protocol.ratio(eager, compiled).separated
    r = _planted("pointwise", eager, compiled) | {"speedup": protocol.paired_ratio(eager, compiled)}
    text = compiler_lab.workload_sentence(r, llc=None)
    assert "compiled was 2.00x (IQR-bounded 2.00-2.00x) faster than eager" in text
