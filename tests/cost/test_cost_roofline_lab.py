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
