"""helpers.cost.roofline: the ops' counted FLOPs and bytes against the tensors and FlopCounterMode, and the roofline."""
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
