"""helpers.lowbit.w8a8: activation scales (static against dynamic), the W8A8 product through torch._int_mm against
dequantize-then-matmul, the CPU int4 kernel's layout, and the int4 CPU backend of the weight-only linear."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from helpers.lowbit import quant, quant_decode_lab, quant_linear, w8a8
from helpers.measure import bench, claims, protocol


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def test_act_scale_maps_the_largest_value_to_the_top_code_and_quantize_act_clips_beyond_it():
    x = torch.tensor([0.5, -2.54, 1.0])
    s = w8a8.act_scale(x)
    assert torch.isclose(s, torch.tensor(2.54 / 127))
    assert w8a8.quantize_act(x, s).tolist() == [25, -127, 50]
    assert w8a8.quantize_act(torch.tensor([10.0, -10.0]), s).tolist() == [127, -128]  # clipped to the grid
    assert w8a8.act_scale(torch.zeros(3)) > 0  # never divides by zero


def test_int_mm_on_the_cpu_equals_the_int32_product_for_odd_shapes():
    a = torch.randint(-128, 128, (3, 7), dtype=torch.int8, generator=_gen(0))
    b = torch.randint(-128, 128, (7, 5), dtype=torch.int8, generator=_gen(1))
    assert torch.equal(w8a8.int_mm(a, b), a.int() @ b.int())


def test_w8a8_matches_dequantize_then_matmul_and_is_close_to_fp32():
    x = torch.randn(40, 64, generator=_gen(2))
    w = 0.05 * torch.randn(24, 64, generator=_gen(3))
    chk = w8a8.w8a8_check(x, w)
    assert chk["ok"] and chk["max_diff"] <= 1e-5 * chk["scale"]
    assert 0 < chk["error_vs_fp32"] < 0.02  # int8 rounding of both operands, no more
    broken = w8a8.w8a8_matmul(x, w8a8.act_scale(x), *w8a8.rowwise_weight(w)) * 1.01
    assert (broken - F.linear(x, w)).abs().max() > chk["max_diff"] * 10  # the check can tell a wrong product


def test_static_scales_come_from_the_calibration_and_clip_a_larger_input():
    calib = [{"a": torch.tensor([1.0, -2.0])}, {"a": torch.tensor([0.5, 3.0])}]
    static = w8a8.calibrated_scales(calib)
    assert torch.isclose(static["a"], torch.tensor(3.0 / 127))
    rows = w8a8.static_dynamic_rows({"a": torch.tensor([6.0, 1.0, -0.5, 0.25])}, static)
    r = rows[0]
    assert r["clipped"] == 0.25 and r["static"] > r["dynamic"] and r["scale_ratio"] == pytest.approx(2.0)
    same = w8a8.static_dynamic_rows({"a": torch.tensor([3.0, 1.0])}, static)[0]
    assert same["static"] == same["dynamic"] and same["clipped"] == 0.0
    s = w8a8.static_dynamic_sentence(rows + [same], 2)
    assert "2 other held-out batches" in s and "lower in 0 of 2" in s and "25.000%" in s


def test_w8a8_claim_takes_fp32_over_w8a8_and_the_judge_decides():
    def t(xs):
        return bench.Timing(*bench.quartiles(xs), list(xs))
    comp = protocol.Comparison({"fp32 F.linear": t([2.0, 2.1, 2.2]), "W8A8 (quantize x + int_mm)": t([1.0, 1.0, 1.05])},
                               {}, 3, "separated")
    kw = w8a8.w8a8_claim(comp, (8, 4, 2))
    assert kw["value"] == pytest.approx(2.1) and kw["claimed"] == (1.0, None)
    assert claims.judge_interval(kw["value"], *kw["spread"], *kw["claimed"])[0] == "supported"


@pytest.mark.skipif(not w8a8.int4_cpu_available(), reason="this torch build has no CPU int4 kernels")
def test_int4_cpu_kernel_on_our_codes_equals_dequantize_then_matmul():
    w = torch.randn(48, 128, generator=_gen(4))
    qt = quant.quantize(w, 4, "zeropoint", 64)
    scale, zero = qt.scale.reshape(48, 2), qt.zero.reshape(48, 2)
    packed, sz = w8a8.int4_cpu_pack(qt.q.reshape(48, 128), scale, zero)
    x = torch.randn(3, 128, generator=_gen(5))
    ref = x @ quant.dequantize(qt).t()
    got = w8a8.int4_cpu_matmul(x, packed, sz, 64)
    assert (got - ref).abs().max() <= 1e-5 * ref.abs().max()
    wrong = w8a8.int4_cpu_matmul(x, packed, torch.stack([sz[..., 0], zero.t() * 0], -1).contiguous(), 64)
    assert (wrong - ref).abs().max() > 1e-2 * ref.abs().max()  # the zero-point conversion matters
    lin = torch.nn.Linear(128, 48, bias=True)
    q = quant_linear.WeightOnlyLinear.from_linear(lin, 4, 64)
    with torch.no_grad():
        plain = q(x)
        q.backend = "cpu_int4"
        assert (q(x) - plain).abs().max() <= 1e-5 * plain.abs().max()


def test_int4_sentence_says_why_when_the_variant_is_absent():
    t = bench.Timing(*bench.quartiles([1.0, 1.1, 1.2]), [1.0, 1.1, 1.2])
    res = {"rows": [{"variant": "fp32", "bytes": 4e6, "timing": t, "tokens_per_s": 1 / t.median}]}
    s = quant_decode_lab.cpu_int4_sentence(res)
    assert "not run" in s or "no CPU int4 kernels" in s
    name = quant_decode_lab.CPU_DECODE_VARIANTS[4]
    t4 = bench.Timing(*bench.quartiles([3.0, 3.1, 3.2]), [3.0, 3.1, 3.2])
    res["rows"].append({"variant": name, "bytes": 1e6, "timing": t4, "tokens_per_s": 1 / t4.median})
    s = quant_decode_lab.cpu_int4_sentence(res)
    assert s.startswith("int4 (1.0 MB") and "fp32 was" in s and "faster" in s
