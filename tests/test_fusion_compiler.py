"""helpers.fusion.compiler, helpers.fusion.compile_lab and helpers.fusion.triton_softmax: compiled equals eager, the bytes and
kernels counted, the generated code, graph breaks, recompilations and the Triton softmax (interpreter on
a CPU). Each workload is compiled once (module-scoped) at the notebook's smoke size, so that notebook 09
finds these graphs in Inductor's on-disk cache. No test asserts a speed."""
import math

import pytest
import torch

from helpers.fusion import compile_lab, compiler
from helpers.fusion import triton_softmax as ts

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


@pytest.mark.parametrize("name", ["layernorm", "softmax"])
def test_the_hand_written_ops_equal_the_library(name):
    args = compiler.make_inputs(name, 5, 33)
    w = compiler.WORKLOADS[name]
    torch.testing.assert_close(w.fn(*args), w.library(*args), rtol=1e-5, atol=1e-5)


def test_bytes_counted_as_the_ops_run():
    x, b = compiler.make_inputs("pointwise", 8, 48)
    n, bias = 8 * 48 * 4, 48 * 4
    counted = compiler.eager_bytes(compiler.pointwise_chain, x, b)
    assert counted["ops"] == ["add.Tensor", "gelu.default", "mul.Tensor"]
    assert counted["total"] == 6 * n + bias == compiler.chain_bytes(8, 48, 3, 4, fused=False) + bias
    assert compiler.fused_bytes(compiler.pointwise_chain, x, b) == 2 * n + bias == compiler.chain_bytes(8, 48, 3, 4, True) + bias
    with pytest.raises(ValueError, match="rows"):
        compiler.make_inputs("softmax", 0, 4)
    with pytest.raises(ValueError, match="unknown"):
        compiler.make_inputs("gemm", 4, 4)


def test_generated_code_is_captured_with_the_fused_kernel(measured):
    args = compiler.make_inputs("pointwise", ROWS, COLS)
    out, codes = compiler.generated_code(torch.compile(compiler.fresh_copy(compiler.pointwise_chain)), *args)
    torch.testing.assert_close(out, compiler.pointwise_chain(*args), rtol=1e-5, atol=1e-5)
    kernels = {name: body for code in codes for name, body in compiler.fused_kernels(code).items()}
    (name,) = kernels  # one fused kernel for the whole chain
    assert "fused" in name and "gelu" in name and "add" in name and "mul" in name
    body = kernels[name]
    assert "erf" in body and "#pragma omp" in body  # CPU inputs: C++ with OpenMP, on any machine
    assert "#include" not in compiler.kernel_excerpt(body) and len(compiler.kernel_excerpt(body, 5).splitlines()) <= 6


def test_dropout_option_keeps_the_chain_and_drops_about_p():
    x, b = compiler.make_inputs("pointwise", ROWS, COLS)
    p = 0.25
    fn = torch.compile(compiler.fresh_copy(compiler.pointwise_chain))
    with torch.no_grad():
        y, clean = fn(x, b, 0.5, p), compiler.pointwise_chain(x, b)
    kept = y != 0
    assert abs((~kept).float().mean().item() - p) < 0.01  # 262144 draws: 5 sigma is about 0.004
    torch.testing.assert_close(y[kept], clean[kept] / (1 - p), rtol=1e-5, atol=1e-5)


def test_gpt_training_step_compiled_equals_eager(results_tmp):
    from helpers.gpt.model import GPTConfig

    cfg = GPTConfig.preset("tiny", n_layer=1, seq_len=32)  # notebook 09's smoke model, so its graphs are cached for it
    r = compile_lab.train_step_compare(cfg, 4, reps=1, check_steps=2)  # asserts rtol 1e-4, atol 1e-5 itself
    assert len(r["losses"]) == 2 and all(abs(a - b) <= 1e-4 * abs(a) + 1e-5 for a, b in r["losses"])
    assert r["tokens"] == 4 * 32 and r["flops"] > 0 and r["first_step_s"] > 0
    assert 0 < compile_lab.matmul_share(r["eager_step"], name="test_gpt_step") < 1  # the step is not only matmuls


@pytest.mark.parametrize("which", list(compiler.BREAKS))
def test_explain_finds_each_planted_break_and_none_after_the_fix(which):
    broken, fixed = compiler.BREAKS[which]
    x = torch.randn(4, 6)
    before, after = compiler.explain(broken, x), compiler.explain(fixed, x)
    assert (before["graphs"], before["breaks"], len(before["reasons"])) == (2, 1, 1)
    assert (after["graphs"], after["breaks"], after["reasons"]) == (1, 0, [])
    word = {"print": "builtin", "item": "item()", "branch": "jump"}[which]
    assert word in before["reasons"][0]
    torch.testing.assert_close(fixed(x), broken(x))  # the fix computes the same thing


def test_recompile_counts_for_a_scripted_shape_sequence():
    sizes = [8, 8, 16, 32, 5]
    auto = compiler.count_compiles(sizes)
    assert auto["after_each"] == [1, 1, 2, 2, 2]  # static for 8, then one dynamic graph for every other size
    assert compiler.count_compiles(sizes, dynamic=False)["after_each"] == [1, 1, 2, 3, 4]  # one per new size
    assert compiler.count_compiles(sizes, mark_dynamic=True)["compiles"] == 1
    limited = compiler.count_compiles([8, 16, 32, 5, 6, 7], dynamic=False, limit=2)
    assert limited["compiles"] == 2  # past the limit Dynamo stops compiling and runs the function eagerly
    with pytest.raises(ValueError, match="sizes"):
        compiler.count_compiles([1, 8])


def test_break_even_and_modes_that_need_cuda():
    assert compiler.break_even_steps(10.0, 0.3, 0.1) == pytest.approx(50.0)
    assert compiler.break_even_steps(10.0, 0.1, 0.2) is None  # never pays back
    with pytest.raises(ValueError):
        compiler.break_even_steps(1.0, 0.0, 0.1)
    if not torch.cuda.is_available():
        from helpers.gpt.model import GPTConfig

        with pytest.raises(ValueError, match="needs CUDA"):
            compile_lab.one_token_forward(GPTConfig.preset("tiny"), ["reduce-overhead"])
    with pytest.raises(ValueError, match="tolerance"):
        compile_lab.tolerance(torch.int32)


# ---------------------------------------------------------------------------------------- Triton softmax

# where the kernel cannot run (no triton; or an interpreter that fails here, e.g. Triton 3.6 under NumPy 2.5)
needs_kernel = pytest.mark.skipif(ts.BROKEN is not None, reason=str(ts.BROKEN))


@needs_kernel
@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (5, 100), (2, 3, 33)])
@pytest.mark.parametrize("max_block", [None, 16])  # 16: rows longer than 16 take the online two-pass path
def test_triton_softmax_equals_torch_on_odd_shapes(shape, max_block):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1)) * 5
    torch.testing.assert_close(ts.softmax(x.to(DEV), max_block).cpu(), torch.softmax(x, -1), rtol=1e-5, atol=1e-6)


@needs_kernel
@pytest.mark.parametrize("max_block", [None, 16])
def test_triton_softmax_masked_rows_are_nan_like_torch_and_partly_masked_rows_finite(max_block):
    x = torch.randn(4, 50)
    x[1] = float("-inf")  # fully masked: NaN, as torch.softmax gives
    x[2, :20] = float("-inf")  # the first block (16 wide) entirely -inf: must stay finite
    x[3, 7] = float("-inf")
    y = ts.softmax(x.to(DEV), max_block).cpu()
    assert torch.isnan(y[1]).all() and torch.isfinite(y[[0, 2, 3]]).all()
    torch.testing.assert_close(y, torch.softmax(x, -1), rtol=1e-5, atol=1e-6, equal_nan=True)
    assert (y[2, :20] == 0).all() and y[2].sum().item() == pytest.approx(1.0, abs=1e-5)


@needs_kernel
def test_triton_softmax_large_magnitudes_and_fp16():
    x = torch.randn(6, 70, generator=torch.Generator().manual_seed(2)) * 1e4  # exp would overflow without the max
    for mb in (None, 16):
        torch.testing.assert_close(ts.softmax(x.to(DEV), mb).cpu(), torch.softmax(x, -1), rtol=1e-5, atol=1e-6)
    h = (torch.randn(5, 40) * 300).half().to(DEV)  # near fp16's range
    torch.testing.assert_close(ts.softmax(h, 16), ts.reference(h), rtol=2e-3, atol=1e-3)  # one fp16 rounding
    assert ts.softmax(h).dtype == torch.float16


@needs_kernel
def test_triton_softmax_refuses_what_it_cannot_do():
    assert ts.block_for(100) == (128, False) and ts.block_for(100, 32) == (32, True) and ts.block_for(3) == (16, False)
    for bad in (dict(n_cols=0), dict(n_cols=8, max_block=24), dict(n_cols=8, max_block=8)):
        with pytest.raises(ValueError):
            ts.block_for(**bad)
    with pytest.raises(ValueError, match="dtype"):
        ts.softmax(torch.ones(2, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match="last dimension"):
        ts.softmax(torch.ones(2, 0, device=DEV))
    assert math.isclose(ts.softmax(torch.zeros(1, 4, device=DEV))[0, 0].item(), 0.25)


def test_where_triton_cannot_run_only_the_triton_softmax_is_left_out(monkeypatch):
    """The degraded path (e.g. Triton 3.6's interpreter under NumPy 2.5): the kernel refuses with the one
    sentence, the sweep still measures the others, and no note claims the kernel ran or was timed."""
    reason = "Triton 3.6.0 with NumPy 2.5.5 cannot run the course's kernels in the interpreter (a planted probe failure)"
    monkeypatch.setattr(ts, "BROKEN", reason)
    with pytest.raises(RuntimeError, match="planted probe failure"):
        ts.softmax(torch.zeros(2, 4, device=DEV))
    for device in ("cpu", "cuda"):
        note = compile_lab.triton_note(device)
        assert "did not run" in note and "timed" not in note and "interpreter runs" not in note
    monkeypatch.setitem(compile_lab.COMPILED, "softmax, static 64", compiler.softmax_ops)  # eager: no compile cost
    sweep = compile_lab.softmax_sweep([64], 8, device=DEV, reps=2)
    assert sweep["triton"] == [None] and all(sweep[k][0] > 0 for k in ("eager", "compiled", "library"))
    monkeypatch.setattr(ts, "BROKEN", None)
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
