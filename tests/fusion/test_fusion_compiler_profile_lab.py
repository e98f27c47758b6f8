"""helpers.fusion.compiler_profile_lab: the fused kernel's share of a profile, Inductor's graph-call record
labelled for the table, and the sentence built from the share. Planted rows only: nothing is profiled."""
import pytest

from helpers.fusion import compiler_profile_lab
from helpers.measure import profiling

KEY = "fgg57ms6zrdjce5epjjja54hg2sijezpcfjsiox5efexzj4eupey"


def test_profile_sentence_and_fused_kernel_share():
    rows = [("graph_1_cpp_fused_add_mean_0", 0.08, 1, 0.616), ("TorchDynamo Cache Lookup", 0.01, 1, 0.08)]
    assert compiler_profile_lab.fused_kernel_share(rows) == pytest.approx(0.616)
    middle = compiler_profile_lab.profile_sentence(0.616, 0.13, 0.35)
    assert "62%" in middle and "other 38%" in middle and "both" in middle and "not what limits it" not in middle
    assert "other 38%, so at this size" in middle and middle.count(":") == 1  # one colon: no "...%: at this size"
    assert "not what limits it" in compiler_profile_lab.profile_sentence(0.95, 0.13, 0.35)
    assert "both" in compiler_profile_lab.profile_sentence(0.4, 0.13, 0.35)
    assert "overhead around the kernel" in compiler_profile_lab.profile_sentence(0.2, 0.13, 0.35)
    assert "profiler" not in middle  # no timed medians given: nothing to set the profile against
    against = compiler_profile_lab.profile_sentence(0.84, 0.276, 0.410, timed=(0.122, 0.222))
    assert "0.122 ms and 0.222 ms" in against and "2.26x and 1.85x those" in against
    assert "include the profiler's own cost for each op it records" in against and "for shares" in against
    close = compiler_profile_lab.profile_sentence(0.71, 0.080, 0.160, timed=(0.084, 0.153))
    assert "0.95x and 1.05x those" in close and "agree within 25%" in close and "for shares" not in close


def test_the_graph_call_record_gets_a_readable_label_and_nothing_else_changes():
    assert compiler_profile_lab.row_label(f"## Call CompiledFxGraph {KEY} ##") == \
        "Call CompiledFxGraph (FX-graph cache key fgg57ms6…)"
    for name in ("graph_6_cpp_fused_add_mean_mul_rsqrt_sub_0", "TorchDynamo Cache Lookup", "## other record ##"):
        assert compiler_profile_lab.row_label(name) == name
    prof = profiling.Profile(rows=[("graph_6_cpp_fused_add_0", 0.061, 1, 0.72), (f"## Call CompiledFxGraph {KEY} ##", 0.005, 1, 0.06)],
                             device="cpu", steps=20, total_ms=0.085)
    shown = compiler_profile_lab.labelled(prof)
    assert [r[0] for r in shown.rows] == ["graph_6_cpp_fused_add_0", "Call CompiledFxGraph (FX-graph cache key fgg57ms6…)"]
    assert [r[1:] for r in shown.rows] == [r[1:] for r in prof.rows] and shown.total_ms == prof.total_ms
    assert "##" not in shown.table() and KEY not in shown.table()
    assert prof.rows[1][0].startswith("## Call")  # the original is left as it was
