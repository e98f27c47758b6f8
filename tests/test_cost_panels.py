"""The instructor panels' callbacks, called as plain functions without a kernel."""
import matplotlib.pyplot as plt
import pytest

from helpers.measure import hardware
from helpers.cost import panels


def test_matmul_panel_draws_measured_ceiling_and_datasheet(capsys):
    fig = panels.matmul_panel("fp32", 32, ceiling_tflops={"fp32": 0.5}, peak=hardware.PEAKS["h100"], reps=1)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["fp32 n=32", "measured ceiling", "datasheet"]
    assert ax.patches[1].get_height() == 0.5 and ax.patches[2].get_height() == 67.0
    assert "fp32, n=32:" in capsys.readouterr().out
    plt.close(fig)


def test_matmul_panel_explains_a_format_the_device_lacks(capsys):
    assert panels.matmul_panel("fp8", 32, device="cpu") is None
    assert "fp8" in capsys.readouterr().out


def test_roofline_panel_moves_the_point_with_the_controls(capsys):
    kw = dict(ceiling_tflops=0.1, bandwidth_gbs=20.0, reps=1)
    small = panels.roofline_panel("matmul", 16, "fp32", **kw)
    large = panels.roofline_panel("matmul", 64, "fp32", background=[{"intensity": 1.0, "tflops": 0.01}], **kw)
    (x_small, _), = small.axes[0].collections[0].get_offsets()
    (x_large, _), = large.axes[0].collections[0].get_offsets()
    assert x_large == pytest.approx(4 * x_small)  # a square matmul's intensity grows with n
    assert [t.get_text() for t in large.axes[0].texts] == ["matmul n=64"]
    assert len(large.axes[0].collections) == 2  # the point and the faded background
    assert "compute-bound" in capsys.readouterr().out.splitlines()[-1]
    plt.close("all")


def test_roofline_panel_rejects_unknown_dtype():
    with pytest.raises(ValueError, match="dtype="):
        panels.roofline_panel("add", 16, "fp64", ceiling_tflops=1.0, bandwidth_gbs=1.0)
