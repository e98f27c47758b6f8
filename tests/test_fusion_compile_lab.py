"""helpers.fusion.compile_lab: compiled equals eager, the kernels counted, the course GPT's step compiled, the
compile cost, the parameter checks, the sentences and the panel. Each workload is compiled once (module-scoped)
at the notebook's smoke size, so that notebook 09 finds these graphs in Inductor's on-disk cache. No test
asserts a speed."""
import pytest
import torch

from helpers.fusion import compile_lab, compiler, triton_softmax

ROWS, COLS = 256, 1024  # notebook 09's smoke size
DEV = "cuda" if torch.cuda.is_available() else "cpu"  # the Triton softmax runs where Triton compiles (or interprets)


@pytest.fixture(scope="module")
def measured():
    """Each workload compiled once and measured (2 reps: the numbers are not asserted, only produced)."""
    return {name: compile_lab.measure_workload(name, ROWS, COLS, reps=2) for name in compiler.WORKLOADS}


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
    n, names = compiler.kernel_launches(compile_lab.compiled("pointwise"), *args)
    if DEV == "cpu":
        assert n == 1 and len(names) == 1 and "cpp_fused" in next(iter(names))  # the C++ kernel, by name
    assert inductor_config.cpp.enable_kernel_profile is default


def test_gpt_training_step_compiled_equals_eager(results_tmp):
    from helpers.gpt.model import GPTConfig

    cfg = GPTConfig.preset("tiny", n_layer=1, seq_len=32)  # notebook 09's smoke model, so its graphs are cached for it
    r = compile_lab.train_step_compare(cfg, 4, reps=1, check_steps=2)  # asserts rtol 1e-4, atol 1e-5 itself
    assert len(r["losses"]) == 2 and all(abs(a - b) <= 1e-4 * abs(a) + 1e-5 for a, b in r["losses"])
    assert r["tokens"] == 4 * 32 and r["flops"] > 0 and r["first_step_s"] > 0
    assert 0 < compile_lab.matmul_share(r["eager_step"], name="test_gpt_step") < 1  # the step is not only matmuls


def test_break_even_and_modes_that_need_cuda():
    assert compile_lab.break_even_steps(10.0, 0.3, 0.1) == pytest.approx(50.0)
    assert compile_lab.break_even_steps(10.0, 0.1, 0.2) is None  # never pays back
    with pytest.raises(ValueError):
        compile_lab.break_even_steps(1.0, 0.0, 0.1)
    if not torch.cuda.is_available():
        from helpers.gpt.model import GPTConfig

        with pytest.raises(ValueError, match="needs CUDA"):
            compile_lab.one_token_forward(GPTConfig.preset("tiny"), ["reduce-overhead"])
    with pytest.raises(ValueError, match="tolerance"):
        compile_lab.tolerance(torch.int32)


def test_where_triton_cannot_run_only_the_triton_softmax_is_left_out(monkeypatch):
    """The degraded path (e.g. Triton 3.6's interpreter under NumPy 2.5): the kernel refuses with the one
    sentence, the sweep still measures the others, and no note claims the kernel ran or was timed."""
    reason = "Triton 3.6.0 with NumPy 2.5.5 cannot run the course's kernels in the interpreter (a planted probe failure)"
    monkeypatch.setattr(triton_softmax, "BROKEN", reason)
    with pytest.raises(RuntimeError, match="planted probe failure"):
        triton_softmax.softmax(torch.zeros(2, 4, device=DEV))
    for device in ("cpu", "cuda"):
        note = compile_lab.triton_note(device)
        assert "did not run" in note and "timed" not in note and "interpreter runs" not in note
    monkeypatch.setitem(compile_lab.COMPILED, "softmax, static 64", compiler.softmax_ops)  # eager: no compile cost
    sweep = compile_lab.softmax_sweep([64], 8, device=DEV, reps=2)
    assert sweep["triton"] == [None] and all(sweep[k][0] > 0 for k in ("eager", "compiled", "library"))
    monkeypatch.setattr(triton_softmax, "BROKEN", None)
    assert "did not run" not in compile_lab.triton_note("cpu") and "timed" in compile_lab.triton_note("cuda")


def test_parameter_checks_name_the_parameter():
    assert compile_lab.check_modes("MODES", []) == [] and compile_lab.check_modes("MODES", ("default",)) == ["default"]
    with pytest.raises(ValueError, match="MODES"):
        compile_lab.check_modes("MODES", ["fast"])
    with pytest.raises(ValueError, match="MODES"):
        compile_lab.check_modes("MODES", "default")
    compile_lab.check_for_device("cuda", MODES=["reduce-overhead"], DTYPE="bf16")
    with pytest.raises(ValueError, match="MODES"):
        compile_lab.check_for_device("cpu", MODES=["max-autotune"], DTYPE="fp32")
    with pytest.raises(ValueError, match="DTYPE"):
        compile_lab.check_for_device("cpu", MODES=[], DTYPE="bf16")


def test_the_panel_callback_runs_without_a_kernel(measured, capsys):
    import matplotlib.pyplot as plt

    r = compile_lab.panel_figure("pointwise", COLS, ROWS, reps=2)  # the size compiled above: no recompile
    assert r["kernels"] == {"eager": 3, "compiled": 1} and "pointwise (256 x 1024)" in capsys.readouterr().out
    plt.close("all")


def test_low_precision_is_checked_against_fp32_with_twice_eagers_error():
    for name, w in compiler.WORKLOADS.items():
        args = compiler.make_inputs(name, 16, 300, dtype=torch.bfloat16)
        fused_like = w.fn(*(a.float() for a in args)).bfloat16()  # what a fused kernel gives: fp32 inside, one rounding
        assert compile_lab.verify_output(w.fn, fused_like, args) < 0.05
        with pytest.raises(AssertionError, match="twice eager"):
            compile_lab.verify_output(w.fn, fused_like + 0.1, args)


def test_break_even_comes_from_the_median_ratio_and_never_when_not_faster():
    assert compile_lab.break_even_from_ratio(10.0, 0.02, 2.0) == pytest.approx(1000)  # saves 10 ms per step
    assert compile_lab.break_even_from_ratio(10.0, 0.02, 1.0) is None
    assert compile_lab.break_even_from_ratio(10.0, 0.02, 0.9) is None
    assert compile_lab.saved_per_call(0.02, 0.5) == pytest.approx(-0.02)
    with pytest.raises(ValueError, match="ratio"):
        compile_lab.saved_per_call(0.02, 0.0)
    assert compile_lab.fmt_seconds(13.4345e-3) == "13.43 ms" and compile_lab.fmt_seconds(5e-6) == "5.0 µs"


def test_busy_warning_and_sweep_agreement(capsys):
    assert compile_lab.busy_warning(cores=2, load=2.5) and "unreliable" in capsys.readouterr().out
    assert not compile_lab.busy_warning(cores=2, load=0.5) and capsys.readouterr().out == ""
    sweep = {"cols": [64, 128], "eager": [1.0, 1.0], "compiled": [2.0, 0.8]}
    res = [{"name": "softmax", "ratio": (2.1, 1.9, 2.3)}]
    assert "they agree" in compile_lab.sweep_agreement(sweep, res, 64)
    assert "disagree" in compile_lab.sweep_agreement(sweep, res, 128)
    assert compile_lab.sweep_agreement(sweep, res, 256) == ""
