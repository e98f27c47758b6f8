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


# ---------------------------------------------------------------- emulated formats and the copy sweep

from helpers.measure import ceilings  # noqa: E402
from helpers.measure.bench import Timing  # noqa: E402

MIB = 2 ** 20


def _timing(seconds, spread=0.02):
    lo, hi = seconds * (1 - spread), seconds * (1 + spread)
    return Timing(seconds, lo, hi, [lo, seconds, hi], 0, "cpu", 0.0, "thread", [])


def test_an_emulated_format_gets_no_ceiling_and_no_ratio_but_its_sentence(monkeypatch, capsys):
    ranges = {"fp32": [(0.05, 0.049, 0.051), (0.08, 0.079, 0.081)],
              "fp16": [(0.004, 0.0039, 0.0041), (0.002, 0.0019, 0.0021)],
              "bf16": [(0.1, 0.09, 0.11), (0.3, 0.29, 0.31)]}
    why = "fp16 is emulated on this CPU (a fp16 matmul ran 40x slower than fp32's, so it has no fp16 units)"
    monkeypatch.setattr(hardware, "emulated", lambda d, device="cpu": why if d == "fp16" else None)
    emulated = hardware_lab.emulated_formats(["fp32", "fp16", "bf16"], "cpu")
    assert emulated == {"fp16": why}
    best = hardware_lab.best_sizes([256, 512], ranges, emulated)
    assert set(best) == {"fp32", "bf16"} and best["bf16"] == (0.3, 0.29, 0.31, 512)
    assert set(hardware_lab.best_sizes([256, 512], ranges)) == {"fp32", "fp16", "bf16"}  # without it, fp16 gets one
    ridge = {d: b[0] * 1e3 / 30.0 for d, b in best.items()}
    lines = hardware_lab.half_precision_findings({d: b[0] for d, b in best.items()}, ridge, "cpu", ["avx512_bf16"],
                                                 spread={d: b[1:3] for d, b in best.items()}, emulated=emulated)
    assert lines[0].startswith(why) and "kept out of the ceilings" in lines[0] and "ridge point to" not in lines[0]
    assert lines[1] == "bf16 matmuls reached 3.8x fp32's best throughput."
    assert "none of them for fp16" in lines[2]
    hardware_lab.matmul_panel("fp16", 16, device="cpu", reps=3)
    out = capsys.readouterr().out
    assert why in out and "no measured ceiling" in out
    plt.close("all")


def test_formats_whose_iqrs_overlap_are_not_ranked():
    best, ridge = {"fp32": 0.08, "bf16": 0.085}, {"fp32": 3.0, "bf16": 3.2}
    lines = hardware_lab.half_precision_findings(best, ridge, "cpu", ["avx512_bf16"],
                                                 spread={"fp32": (0.07, 0.09), "bf16": (0.08, 0.09)})
    assert lines[0].startswith("bf16 and fp32 matmuls cannot be ranked in this run")


def test_peak_findings_do_not_rank_sizes_whose_iqrs_overlap():
    sweep = {"fp32": [0.04, 0.087, 0.086]}
    ranges = {"fp32": [(0.04, 0.039, 0.041), (0.087, 0.085, 0.089), (0.086, 0.084, 0.088)]}
    line = hardware_lab.peak_findings([64, 256, 512], sweep, ranges)[0]
    assert line.startswith("fp32 reached its best at n=256, 512 alike (their IQRs overlap)")
    assert "n=64, reached 46% of its best" in line
    apart = {"fp32": [(0.04, 0.039, 0.041), (0.087, 0.086, 0.088), (0.06, 0.059, 0.061)]}
    assert "peaked at n=256, not at the largest size" in hardware_lab.peak_findings([64, 256, 512], sweep, apart)[0]


def test_copy_sweep_sentences_separate_the_per_call_cost_from_the_bytes(monkeypatch):
    monkeypatch.setattr(hardware, "last_level_cache", lambda device: (32 * MIB, "L3"))
    monkeypatch.setattr(ceilings, "last_level_cache", lambda device: (32 * MIB, "L3"))
    sizes = [MIB // 64, MIB, 8 * MIB, 64 * MIB, 128 * MIB]
    gbps = {MIB // 64: 100.0, MIB: 100.0, 8 * MIB: 21.0, 64 * MIB: 20.0, 128 * MIB: 20.0}
    per_call = _timing(5e-6)
    times = [_timing(5e-6 + ceilings.copy_moved(n) / (gbps[n] * 1e9), 0.03) for n in sizes]
    fit = ceilings.fitted_copy_ceiling(sizes, times, per_call, "cpu")
    rows = hardware_lab.copy_rows(sizes, times, fit.fixed_s, "cpu")
    assert float(rows[1][3].split()[0]) == pytest.approx(100, rel=0.02)  # per-call cost out: the cache's 100 GB/s
    assert rows[0][2] < 50 and rows[-1][-1] == "memory" and rows[0][-1] == "cache"  # the whole call reads less
    lines = hardware_lab.copy_findings(sizes, times, per_call, fit, "cpu")
    assert lines[0].startswith("per-call cost: a one-element copy took 5 µs") and "puts it at 5 µs" in lines[0]
    assert lines[1].startswith("memory's copy bandwidth: 20 GB/s") and "64, 128 MiB" in lines[1]
    assert any(s.startswith("at 0.015625, 1 MiB the per-call cost was 10% or more") for s in lines)
    assert any("1 MiB at 100 GB/s (5x memory's)" in s and "cache bandwidth" in s for s in lines)
    assert any(s.startswith("at 8 MiB, inside the 32 MiB L3 cache, the bandwidth's IQR overlaps") for s in lines)
    fig = hardware_lab.copy_figure(sizes, times, per_call, fit)
    assert len(fig.axes) == 2
    plt.close(fig)


def test_the_default_copy_sizes_reach_past_the_last_level_cache(monkeypatch):
    monkeypatch.setattr(ceilings, "last_level_cache", lambda device: (32 * MIB, "L3"))
    assert hardware_lab.default_copy_sizes_mb("cpu") == [0.25, 1.0, 4.0, 16.0, 64.0, 128.0, 256.0]
    monkeypatch.setattr(ceilings, "last_level_cache", lambda device: (700 * MIB, "L3"))
    assert hardware_lab.default_copy_sizes_mb("cpu") == [0.25, 1.0, 4.0, 16.0, 1024.0]


def test_copy_sweep_adds_a_copy_past_the_cache_when_none_was_asked_for(monkeypatch, capsys):
    monkeypatch.setattr(ceilings, "copy_size", lambda device=None: 2 * MIB)
    with ceilings.cpu_threads("cpu", 1):
        per_call = ceilings.copy_timing(4, "cpu", reps=5)
        sizes, timings, fit = hardware_lab.copy_sweep([0.25], "cpu", 3, per_call)
    assert sizes == [MIB // 4, 2 * MIB] and fit is not None and fit.sizes == (2 * MIB,) and fit.clock == "thread"
    assert "is added to the sweep" in capsys.readouterr().out


# ---------------------------------------------------------------- the map of the course along the three axes

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


def test_course_map_names_every_notebook_and_each_technique_its_own():
    stems = {p.name[:2]: p for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")}
    named = [row[4] for row in hardware_lab.COURSE_MAP]
    assert {f"{k:02d}" for k in range(1, 15)} <= set(named)  # every notebook 01-14 is on the map
    for axis, seen, measure, technique, nb, key in hardware_lab.COURSE_MAP:
        assert axis in (*hardware_lab.AXES, "all three") and seen and measure and technique
        assert nb in stems, f"{technique} names notebook {nb}, which does not exist"
        assert key in (None, "matmul", "ridge", "copy", "per_call")
    assert {row[0] for row in hardware_lab.COURSE_MAP} >= set(hardware_lab.AXES)  # every axis has a notebook


def test_course_map_rows_fill_this_runs_numbers_where_they_apply():
    rows = hardware_lab.course_map_rows({"ridge": (5.0, 4.5, 5.5, "FLOP/B"), "copy": (10.0, 9.0, 11.0, "GB/s")})
    assert len(rows) == len(hardware_lab.COURSE_MAP) and all(len(r) == len(hardware_lab.MAP_COLUMNS) for r in rows)
    by_nb = {r[4]: r[-1] for r in rows}
    assert by_nb["01"] == "5 (4.5-5.5) FLOP/B" and by_nb["06"] == by_nb["10"] == "10 (9-11) GB/s"
    assert by_nb["02"] == "measured there" and by_nb["00"] == "-"  # 00's matmul not passed in: nothing invented


def test_the_efficiency_gap_claim_is_not_testable_beside_the_h200_record():
    ref = hardware_lab.reference_ceilings(NOTEBOOKS.parent / "results" / "nvidia-h200")
    assert ref is not None and ref["date"].startswith("20")
    rows = hardware_lab.beside_reference({"fp32": 0.05, "fp8": 1.0}, 12.0, ref)
    assert [r[0] for r in rows] == ["fp32 matmul TFLOP/s", "fp8 matmul TFLOP/s", "copy GB/s"]
    assert rows[0][3] == "80%" and rows[-1][3] == "89%"  # 53.7 of 67 TFLOP/s, 4274 of 4800 GB/s
    kw = hardware_lab.efficiency_gap_claim(rows, ref, "cpu", has_datasheet=False)
    assert kw["verdict"] == "not testable" and kw["claimed"] == (0.8, 1.25)
    assert "no datasheet peak" in kw["reason"] and ref["date"][:10] in kw["reason"]
    assert hardware_lab.reference_ceilings(NOTEBOOKS) is None
