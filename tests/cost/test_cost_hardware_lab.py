"""helpers.cost.hardware_lab: notebook 00's matmul panel and findings, and notebooks 00 and 01's parameter cells."""
import json
from pathlib import Path

import matplotlib.pyplot as plt
import pytest

from helpers.cost import hardware_lab
from helpers.measure import hardware


def test_matmul_panel_draws_measured_ceiling_and_datasheet(capsys):
    fig = hardware_lab.matmul_panel("fp32", 32, ceiling_tflops={"fp32": 0.5}, peak=hardware.PEAKS["h100"], reps=1)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["fp32 n=32", "measured ceiling", "datasheet"]
    assert ax.patches[1].get_height() == 0.5 and ax.patches[2].get_height() == 67.0
    assert "fp32, n=32:" in capsys.readouterr().out
    plt.close(fig)


def test_matmul_panel_explains_a_format_the_device_lacks(capsys):
    assert hardware_lab.matmul_panel("fp8", 32, device="cpu") is None
    assert "fp8" in capsys.readouterr().out


# ---------------------------------------------------------------- sentences generated from the numbers

def test_peak_findings_name_the_size_that_peaked_not_the_largest():
    # fp32 peaks in the middle of the sweep (n=256), fp16 at its smallest size: neither at the largest
    sweep = {"fp32": [4.3e-5, 2.8e-4, 2.1e-3, 1.1e-3], "fp16": [1.1e-3, 3.5e-4, 3.3e-4, 3.8e-4], "tf32": [None] * 4}
    lines = hardware_lab.peak_findings([64, 128, 256, 512], sweep)
    assert len(lines) == 2  # a format that never ran says nothing
    assert lines[0].startswith("fp32 peaked at n=256, not at the largest size (n=512 reached 52% of that)")
    assert "n=64, reached 2% of its best" in lines[0]
    assert lines[1].startswith("fp16 peaked at n=64") and "the smallest size was the fastest" in lines[1]
    assert "peaked at the largest size, n=512" in hardware_lab.peak_findings([64, 512], {"bf16": [1.0, 2.0]})[0]


def test_half_precision_findings_explain_slow_formats_and_their_ridge():
    best = {"fp32": 0.011, "fp16": 0.00045, "bf16": 0.0003}
    ridge = {"fp32": 5.0, "fp16": 0.21, "bf16": 0.14}
    lines = hardware_lab.half_precision_findings(best, ridge, "cpu", [])
    assert lines[0].startswith("fp16 matmuls ran 24x slower than fp32") and "0.21 FLOP/B" in lines[0]
    assert lines[1].startswith("bf16 matmuls ran 37x slower") and "0.14 FLOP/B" in lines[1]
    assert "7 of notebook 01's 8 ops" in lines[0]  # only the add (1/6 FLOP/B in 2-byte formats) stays left
    assert "none of the half-precision matrix instructions" in lines[2]
    assert "did not use those units" in hardware_lab.half_precision_findings(best, ridge, "cpu", ["amx_bf16"])[-1]
    fast = hardware_lab.half_precision_findings({"fp32": 1.0, "bf16": 4.0}, {"fp32": 5.0, "bf16": 20.0}, "cpu", ["amx_bf16"])
    assert fast[0] == "bf16 matmuls reached 4x fp32's best throughput." and "amx_bf16" in fast[1]
    assert hardware_lab.half_precision_findings(best, ridge, "cuda", []) == []


def test_cpu_flags_are_read_from_cpuinfo_text():
    assert hardware_lab.cpu_half_precision_flags("flags : fpu avx512f avx512_bf16 amx_tile amx_bf16") == \
        ["avx512_bf16", "amx_bf16"]
    assert hardware_lab.cpu_half_precision_flags("flags : fpu avx2") == []


# ---------------------------------------------------------------- notebooks 00 and 01 validate parameters at once

def _run_setup_cells(stem, tmp_path, **overrides):
    """Execute a notebook's parameters cell and the validation cell after it, with `overrides` injected."""
    cells = json.loads((Path(__file__).resolve().parents[2] / "notebooks" / f"{stem}.ipynb").read_text())["cells"]
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
    s = _run_setup_cells("00_hardware", tmp_path, COPY_SIZES_MB="[1, 0.5]", MATMUL_SIZES="[64]")  # papermill -p text
    assert s["COPY_SIZES_MB"] == [1.0, 0.5] and s["MATMUL_SIZES"] == [64]
    s = _run_setup_cells("01_roofline", tmp_path, REPS=2)
    assert s["REPS"] == 2 and s["N"] == 512 and s["DTYPE"] == "fp32"
