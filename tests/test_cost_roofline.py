import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from helpers.cost import roofline


@pytest.mark.parametrize("name", roofline.OPS)
def test_counts_match_tensors_and_flop_counter(name):
    op = roofline.build(name, 48, torch.float32, "cpu")
    with FlopCounterMode(display=False) as counter:
        out = op.run()
    assert op.bytes == sum(t.nbytes for t in op.inputs) + out.nbytes
    counted = counter.get_total_flops()
    if name in ("matmul", "gemv", "skinny_matmul", "attn_scores"):
        assert counted == op.flops
    else:
        assert counted == 0  # FlopCounterMode ignores elementwise ops and reductions


def test_count_scales_with_itemsize_and_formulas():
    _, f, b = roofline.count("matmul", 10, 2)
    assert f == 2000 and b == 600
    _, f, b = roofline.count("add", 10, 4)
    assert (f, b) == (100, 1200)
    with pytest.raises(ValueError, match="op="):
        roofline.count("conv", 10, 4)


def test_roofline_bound_and_attainable():
    assert roofline.bound(1.0, peak_tflops=100, bandwidth_gbs=1000) == "memory"   # ridge 100 FLOP/B
    assert roofline.bound(500.0, peak_tflops=100, bandwidth_gbs=1000) == "compute"
    assert roofline.attainable_tflops(1.0, 100, 1000) == 1.0
    assert roofline.attainable_tflops(1e6, 100, 1000) == 100


def test_measure_returns_consistent_rates():
    m = roofline.measure(roofline.build("add", 32), reps=2, warmup=1)
    assert m["tflops"] == pytest.approx(m["flops"] / m["seconds"] / 1e12)
    assert m["gbps"] == pytest.approx(m["bytes"] / m["seconds"] / 1e9)


# ---------------------------------------------------------------- sentences generated from the numbers

def test_peak_findings_name_the_size_that_peaked_not_the_largest():
    # notebook 00's CPU smoke run: fp32 peaked at n=256, fp16 at n=64 ("reached only by large ones" was false)
    sweep = {"fp32": [4.3e-5, 2.8e-4, 2.1e-3, 1.1e-3], "fp16": [1.1e-3, 3.5e-4, 3.3e-4, 3.8e-4], "tf32": [None] * 4}
    lines = roofline.peak_findings([64, 128, 256, 512], sweep)
    assert len(lines) == 2  # a format that never ran says nothing
    assert lines[0].startswith("fp32 peaked at n=256, not at the largest size (n=512 reached 52% of that)")
    assert "n=64, reached 2% of its best" in lines[0]
    assert lines[1].startswith("fp16 peaked at n=64") and "the smallest size was the fastest" in lines[1]
    assert "peaked at the largest size, n=512" in roofline.peak_findings([64, 512], {"bf16": [1.0, 2.0]})[0]


def test_half_precision_findings_explain_slow_formats_and_their_ridge():
    best = {"fp32": 0.011, "fp16": 0.00045, "bf16": 0.0003}
    ridge = {"fp32": 5.0, "fp16": 0.21, "bf16": 0.14}
    lines = roofline.half_precision_findings(best, ridge, "cpu", [])
    assert lines[0].startswith("fp16 matmuls ran 24x slower than fp32") and "0.21 FLOP/B" in lines[0]
    assert lines[1].startswith("bf16 matmuls ran 37x slower") and "0.14 FLOP/B" in lines[1]
    assert "7 of notebook 01's 8 ops" in lines[0]  # only the add (1/6 FLOP/B in 2-byte formats) stays left
    assert "none of the half-precision matrix instructions" in lines[2]
    assert "did not use those units" in roofline.half_precision_findings(best, ridge, "cpu", ["amx_bf16"])[-1]
    fast = roofline.half_precision_findings({"fp32": 1.0, "bf16": 4.0}, {"fp32": 5.0, "bf16": 20.0}, "cpu", ["amx_bf16"])
    assert fast[0] == "bf16 matmuls reached 4x fp32's best throughput." and "amx_bf16" in fast[1]
    assert roofline.half_precision_findings(best, ridge, "cuda", []) == []


def test_cpu_flags_are_read_from_cpuinfo_text():
    assert roofline.cpu_half_precision_flags("flags : fpu avx512f avx512_bf16 amx_tile amx_bf16") == \
        ["avx512_bf16", "amx_bf16"]
    assert roofline.cpu_half_precision_flags("flags : fpu avx2") == []


def _m(op, bound, fraction):
    return {"op": op, "bound": bound, "fraction_of_ceiling": fraction}


def test_findings_call_out_points_above_either_roof():
    # notebook 01's CPU smoke run: QKᵀ at 110% of the compute ceiling, the ops in cache above the memory roof
    measured = [_m("add", "memory", 0.03), _m("layernorm", "memory", 1.46), _m("matmul", "compute", 0.95),
                _m("attn_scores", "compute", 1.10)]
    lines = roofline.findings(measured, peak_tflops=0.0112, bandwidth_gbs=2.55)
    assert lines[0].startswith("at this ridge point (4.39 FLOP/B) the count puts 2 ops left of it")
    assert any(s.startswith("above the memory roof: layernorm 146%") and "cache" in s for s in lines)
    assert any(s.startswith("above the compute roof: attn_scores 110%") and "ceiling problem" in s for s in lines)
    assert any(s.startswith("below 20% of their roof: add 3%") for s in lines)
    assert lines[-1] == "between 20% and 100% of their roof: matmul 95%."
    assert not any("above" in s for s in roofline.findings([_m("add", "memory", 0.5)], 1.0, 1.0))


# ---------------------------------------------------------------- notebooks 00 and 01 validate parameters at once

def _run_setup_cells(stem, tmp_path, **overrides):
    """Execute a notebook's parameters cell and the validation cell after it, with `overrides` injected."""
    import json
    from pathlib import Path

    cells = json.loads((Path(__file__).resolve().parent.parent / "notebooks" / f"{stem}.ipynb").read_text())["cells"]
    i = next(k for k, c in enumerate(cells) if "parameters" in c["metadata"].get("tags", []))
    scope = {}
    exec("".join(cells[i]["source"]), scope)
    scope.update(PROFILE="smoke", INTERACTIVE=False, RESULTS_DIR=str(tmp_path), **overrides)
    exec("".join(cells[i + 1]["source"]), scope)
    return scope


@pytest.mark.parametrize("stem, name, value", [
    ("00_hardware", "REPS", 0), ("00_hardware", "REPS", -2), ("00_hardware", "MATMUL_SIZES", []),
    ("00_hardware", "COPY_SIZES_MB", [1, 0]), ("00_hardware", "DTYPES", ["fp64"]),
    ("01_roofline", "REPS", 0), ("01_roofline", "N", 0), ("01_roofline", "DTYPE", "auto"),
])
def test_a_bad_parameter_fails_in_the_cell_after_the_parameters_naming_it(tmp_path, stem, name, value):
    with pytest.raises(ValueError, match=name):
        _run_setup_cells(stem, tmp_path, **{name: value})


def test_none_means_the_profile_default_and_given_values_are_kept(tmp_path):
    s = _run_setup_cells("00_hardware", tmp_path, COPY_SIZES_MB=[1, 0.5])
    assert s["REPS"] == 5 and s["MATMUL_SIZES"] == [64, 128, 256, 512] and s["COPY_SIZES_MB"] == [1.0, 0.5]
    s = _run_setup_cells("01_roofline", tmp_path, REPS=2)
    assert s["REPS"] == 2 and s["N"] == 512 and s["DTYPE"] == "fp32"
