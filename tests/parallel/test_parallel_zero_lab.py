"""Notebook 13's ZeRO memory: bytes per rank measured on real gloo ranks against the paper's formulas, and the
plan and figure of the instructor panel."""
import pytest

from helpers.parallel import launch, zero
from helpers.parallel import zero_lab as L


def test_the_panel_plan_follows_the_formulas_and_draws_a_new_figure():
    import matplotlib.pyplot as plt

    p = L.plan(8, 1e9, 3)
    assert p["total"] == pytest.approx(16e9 / 8) and p["sent"] == pytest.approx(3 * 7 / 8 * 4e9)
    assert L.plan(8, 1e9, 0)["sent"] == pytest.approx(2 * 7 / 8 * 4e9)
    a, b = L.plan_figure(4, 1e8, 1), L.plan_figure(4, 1e8, 2)
    assert a is not b
    mib = L.plan_figure(4, 1e8, 1, unit="MiB")
    assert mib.axes[0].get_ylabel().startswith("MiB")
    with pytest.raises(ValueError, match="unit"):
        L.plan_figure(4, 1e8, 1, unit="GB")
    plt.close("all")


@pytest.mark.ranks
def test_memory_per_rank_follows_zero():
    ranks = launch.run_on_ranks(L.measure_memory, 2, dict(n_layer=2, n_head=4, d_model=64, d_ff=256, seq_len=16))
    for stage in range(4):
        rows = [r[stage] for r in ranks]
        n = rows[0]["n_params"]
        want = zero.zero_formula(stage, n, 2)
        total = sum(r["total"] for r in rows) / 2
        assert total == pytest.approx(want["total"], rel=0.1), stage
    assert ranks[0][3]["params"] < 0.6 * ranks[0][0]["params"]
