"""helpers.cost.roofline_lab: notebook 01's timing of the ops, its roofline panel and its verdict sentences."""
import matplotlib.pyplot as plt
import pytest

from helpers.cost import roofline, roofline_lab


def test_measure_returns_consistent_rates():
    m = roofline_lab.measure(roofline.build("add", 32), reps=2, warmup=1)
    assert m["tflops"] == pytest.approx(m["flops"] / m["seconds"] / 1e12)
    assert m["gbps"] == pytest.approx(m["bytes"] / m["seconds"] / 1e9)


def test_roofline_panel_moves_the_point_with_the_controls(capsys):
    kw = dict(ceiling_tflops=0.1, bandwidth_gbs=20.0, reps=1)
    small = roofline_lab.roofline_panel("matmul", 16, "fp32", **kw)
    large = roofline_lab.roofline_panel("matmul", 64, "fp32", background=[{"intensity": 1.0, "tflops": 0.01}], **kw)
    (x_small, _), = small.axes[0].collections[0].get_offsets()
    (x_large, _), = large.axes[0].collections[0].get_offsets()
    assert x_large == pytest.approx(4 * x_small)  # a square matmul's intensity grows with n
    assert [t.get_text() for t in large.axes[0].texts] == ["matmul n=64"]
    assert len(large.axes[0].collections) == 2  # the point and the faded background
    assert "compute-bound" in capsys.readouterr().out.splitlines()[-1]
    plt.close("all")


def test_roofline_panel_rejects_unknown_dtype():
    with pytest.raises(ValueError, match="dtype="):
        roofline_lab.roofline_panel("add", 16, "fp64", ceiling_tflops=1.0, bandwidth_gbs=1.0)


# ---------------------------------------------------------------- sentences generated from the numbers

def _m(op, bound, fraction):
    return {"op": op, "bound": bound, "fraction_of_ceiling": fraction}


def test_findings_call_out_points_above_either_roof():
    # QKᵀ above the compute roof, a layernorm above the memory roof, an add far below it
    measured = [_m("add", "memory", 0.03), _m("layernorm", "memory", 1.46), _m("matmul", "compute", 0.95),
                _m("attn_scores", "compute", 1.10)]
    lines = roofline_lab.findings(measured, peak_tflops=0.0112, bandwidth_gbs=2.55)
    assert lines[0].startswith("at this ridge point (4.39 FLOP/B) the count puts 2 ops left of it")
    assert any(s.startswith("above the memory roof: layernorm 146%") and "cache" in s for s in lines)
    assert any(s.startswith("above the compute roof: attn_scores 110%") and "ceiling problem" in s for s in lines)
    assert any(s.startswith("below 20% of their roof: add 3%") for s in lines)
    assert lines[-1] == "between 20% and 100% of their roof: matmul 95%."
    assert not any("above" in s for s in roofline_lab.findings([_m("add", "memory", 0.5)], 1.0, 1.0))


# ---------------------------------------------------------------- medians with their IQR, verdicts the noise cannot make

def test_measure_gives_each_rate_with_its_iqr_on_the_threads_clock():
    from helpers.measure import bench

    with bench.cpu_threads("cpu", 1):
        m = roofline_lab.measure(roofline.build("softmax", 64), reps=5, warmup=1)
    assert m["clock"] == "thread" and m["q25"] <= m["seconds"] <= m["q75"]
    assert m["tflops_lo"] <= m["tflops"] <= m["tflops_hi"] and m["gbps_lo"] <= m["gbps"] <= m["gbps_hi"]
    placed = roofline_lab.place(m, peak_tflops=1.0, bandwidth_gbs=10.0)
    assert placed["bound"] == "memory" and placed["attainable_tflops"] == pytest.approx(10.0 * m["intensity"] / 1e3)
    assert placed["fraction_lo"] <= placed["fraction_of_ceiling"] <= placed["fraction_hi"]


def _p(op, bound, fraction, lo, hi):
    return {"op": op, "bound": bound, "fraction_of_ceiling": fraction, "fraction_lo": lo, "fraction_hi": hi}


def test_a_point_above_its_roof_only_within_the_noise_is_not_called_above_it():
    measured = [_p("matmul", "compute", 1.05, 0.98, 1.10), _p("attn_scores", "compute", 1.2, 1.15, 1.25),
                _p("add", "memory", 0.5, 0.4, 0.6)]
    lines = roofline_lab.findings(measured, peak_tflops=0.08, bandwidth_gbs=30.0)
    assert any(s.startswith("above the compute roof: attn_scores 120% (IQR 115%-125%)") for s in lines)
    assert not any(s.startswith("above") and "matmul" in s for s in lines)
    assert any(s.startswith("at their roof within the noise: matmul 105% (IQR 98%-110%)") for s in lines)


def test_headline_is_medians_with_spreads_that_hold_them():
    ops = ["add", "gelu", "layernorm", "softmax", "matmul", "gemv", "skinny_matmul", "attn_scores"]
    measured = [{**_p(op, "memory", 0.1 * (i + 1), 0.1 * i + 0.05, 0.1 * (i + 1) + 0.05), "tflops": 1.0 + i,
                 "tflops_lo": 0.9 + i, "tflops_hi": 1.1 + i, "gbps": 10.0 + i, "gbps_lo": 9.0 + i, "gbps_hi": 11.0 + i}
                for i, op in enumerate(ops)]
    head = roofline_lab.headline(measured)
    assert head["matmul achieved"] == (5.0, "TFLOP/s", (4.9, 5.1))
    assert set(head) == {"matmul achieved", "matmul, fraction of its roofline"}  # no cache-resident rates
    value, unit, (lo, hi) = head["matmul, fraction of its roofline"]
    assert unit == "%" and (lo, value, hi) == pytest.approx((45.0, 50.0, 55.0))


def test_an_emulated_format_asked_for_is_said_in_one_sentence(monkeypatch, capsys, results_tmp):
    import torch

    from helpers.measure import hardware, params

    why = "fp16 is emulated on this CPU (a fp16 matmul ran 40x slower than fp32's, so it has no fp16 units)"
    monkeypatch.setattr(hardware, "emulated", lambda d, device="cpu": why if d == "fp16" else None)
    threads = torch.get_num_threads()
    try:
        S = params.setup("smoke", 0, False, str(results_tmp))
    finally:
        torch.set_num_threads(threads)
    capsys.readouterr()
    assert roofline_lab.resolve_parameters(S, DTYPE="fp16", N=None, REPS=None)["DTYPE"] == "fp16"
    assert capsys.readouterr().out.startswith(why + "; this notebook's roof and points are then those of the emulation")
    roofline_lab.resolve_parameters(S, DTYPE="bf16", N=None, REPS=None)
    assert why not in capsys.readouterr().out
