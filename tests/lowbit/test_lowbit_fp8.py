"""helpers.lowbit.fp8: formats, casts and every recipe's scales on hand-made tensors."""
import math

import pytest
import torch

from helpers.lowbit import fp8


E4, E5 = fp8.E4M3, fp8.E5M2


def test_formats_come_from_precision_and_grid_is_complete():
    assert fp8.fmax(E4) == 448.0 and fp8.fmax(E5) == 57344.0
    g4, g5 = fp8.grid(E4), fp8.grid(E5)
    assert len(g4) == 127 and len(g5) == 124  # 0 plus 126 / 123 positive finite values
    assert g4[1].item() == fp8.facts(E4).smallest_subnormal == 2.0 ** -9
    assert g5[1].item() == fp8.facts(E5).smallest_subnormal == 2.0 ** -16
    assert g4[-1].item() == 448.0 and g5[-1].item() == 57344.0
    with pytest.raises(ValueError, match="float8"):
        fp8.fmax(torch.float16)


@pytest.mark.parametrize("dtype", [E4, E5])
def test_cast_saturates_the_same_in_both_formats_and_nan_propagates(dtype):
    m = fp8.fmax(dtype)
    x = torch.tensor([m, -m, 2 * m, -2 * m, math.inf, -math.inf, math.nan, 0.0])
    got = fp8.cast(x, dtype).float()
    assert got[:6].tolist() == [m, -m, m, -m, m, -m]  # ±inf saturate too (clamp before the cast)
    assert math.isnan(got[6].item()) and got[7].item() == 0.0  # NaN propagates, stated in cast's docstring


def test_tensorwise_scale_exact():
    x = torch.tensor([[0.5, -2.0], [1.0, 0.25]])
    q, s = fp8.tensorwise(x)
    assert s.item() == 224.0 and s.dtype == torch.float32  # 448 / 2
    assert q.float().tolist() == [[112.0, -448.0], [224.0, 56.0]]
    _, s0 = fp8.tensorwise(torch.zeros(3, 3))
    assert math.isfinite(s0.item()) and s0.item() > 0  # amax floored at EPS
    _, s5 = fp8.tensorwise(x, E5)
    assert s5.item() == 57344.0 / 2


def test_rowwise_power_of_two_scales_exact():
    x = torch.tensor([[3.0, -1.0], [0.1, 0.05], [0.0, 0.0]])
    q, s = fp8.rowwise(x, -1)
    assert s.shape == (3, 1)
    # 448/3 = 149.3 -> 128; 448/0.1 = 4480 -> 4096; zero row: 448/1e-12 floored to a power of two
    assert s[0].item() == 128.0 and s[1].item() == 4096.0 and s[2].item() == 2.0 ** math.floor(math.log2(448e12))
    assert q[0].float().tolist() == [384.0, -128.0]
    _, s_col = fp8.rowwise(x, 0)
    assert s_col.shape == (1, 2) and s_col[0, 0].item() == 128.0
    _, s_exact = fp8.rowwise(x, -1, power_of_2=False)
    assert s_exact[0].item() == pytest.approx(448 / 3)


def test_blockwise_scales_per_tile_and_block():
    x = torch.ones(3, 260)
    x[1, 130] = 8.0  # second tile of row 1
    q, s = fp8.blockwise(x, (1, 128))
    assert s.shape == (3, 3) and q.shape == x.shape
    assert s[1, 1].item() == 56.0 and (s[0] == 448.0).all() and s[1, 0].item() == 448.0
    _, sw = fp8.blockwise(torch.arange(1, 301, dtype=torch.float32).view(3, 100), (2, 64))
    assert sw.shape == (2, 2) and sw[1, 1].item() == pytest.approx(448 / 300)


def test_mx_shared_exponent_exact():
    x = torch.zeros(2, 40)
    x[0, 0] = 5.0  # floor(log2 5) = 2; e4m3's emax = 8 -> shared exponent -6 -> scale 2^6
    x[0, 35] = 448.0 * 4  # second block: floor(log2 1792) = 10 -> 2^-2
    q, s = fp8.mx(x)
    assert s.shape == (2, 2)
    assert s[0].tolist() == [64.0, 0.25] and s[1].tolist() == [1.0, 1.0]  # all-zero blocks: scale 1
    assert q[0, 0].float().item() == 320.0 and q[0, 35].float().item() == 448.0
    _, s5 = fp8.mx(x, E5)
    assert s5[0, 0].item() == 2.0 ** 13  # e5m2's emax is 15


def test_delayed_scaling_history_on_a_scripted_sequence():
    sc = fp8.DelayedScaler(history_len=3, margin=1, algo="max")
    used = []
    for amax in [1.0, 4.0, 2.0, 0.5, 0.5, 0.5, 0.0]:
        used.append(sc.scale.item())
        sc.update(amax)
    assert used == [1.0, 224.0, 56.0, 56.0, 56.0, 112.0, 448.0]  # 448/max(window)/2^1
    assert sc.scale.item() == 448.0  # an all-zero step keeps the scale from history [0.5, 0.5, 0]
    recent = fp8.DelayedScaler(history_len=3, algo="most_recent")
    seen = []
    for amax in [1.0, 4.0, 2.0, 0.0, math.inf]:
        recent.update(amax)
        seen.append(recent.scale.item())
    assert seen == [448.0, 112.0, 224.0, 224.0, 224.0]  # 0 and inf leave the scale as it was
    with pytest.raises(ValueError, match="algo"):
        fp8.DelayedScaler(algo="mean")


def test_delayed_cast_uses_the_previous_scale_and_counts_overflow():
    sc = fp8.DelayedScaler(history_len=2)
    x = torch.full((4,), 2.0)
    q, s = sc.cast(x)
    assert s.item() == 1.0 and q.float().tolist() == [2.0] * 4
    counts = fp8.cast_counts(x * 10, sc.scale)  # amax jumped 10x: 20 * 224 > 448
    assert counts == {"overflow": 4, "underflow": 0}
    assert fp8.cast_counts(torch.tensor([1e-9, 1.0]), 1.0) == {"overflow": 0, "underflow": 1}


@pytest.mark.parametrize("dtype", [fp8.E4M3, fp8.E5M2])
def test_an_amax_one_fp32_ulp_over_max_is_not_counted_as_saturated(dtype):
    m = fp8.fmax(dtype)
    assert fp8.saturation_threshold(fp8.E4M3) == 464.0 and fp8.saturation_threshold(fp8.E5M2) == 57344.0 + 4096.0
    x = torch.tensor([1.0, 0.5])
    scale = torch.tensor(m, dtype=torch.float32).nextafter(torch.tensor(math.inf))  # 1.0 * scale: one ulp over max
    assert (x * scale)[0] > m and fp8.cast_counts(x, scale, dtype)["overflow"] == 0
    assert fp8.cast(x * scale, dtype)[0].float() == m  # what a clamp and rounding give alike
    assert fp8.cast_counts(x, 1.1 * m, dtype)["overflow"] == 1  # 1.1 x max: the clamp decided it


def test_current_scaling_saturates_nothing_on_a_real_tensor():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 96, generator=g) * 3.7
    assert fp8.cast_counts(x, fp8.tensorwise(x)[1])["overflow"] == 0


def test_quantise_orders_recipes_on_an_outlier():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(64, 256, generator=g) * torch.exp2(torch.randn(64, 1, generator=g) * 2)
    x[5, 7] = 2e4  # one outlier: tensorwise pays everywhere, rowwise in one row, blockwise in one tile
    stats = {r: fp8.error_stats(x, fp8.quantise(x, r)) for r in fp8.NUMERIC_RECIPES}
    err = {r: s["row_rel_error"] for r, s in stats.items()}
    assert err["tensorwise"] > 2 * err["rowwise"] and err["rowwise"] > err["blockwise"]
    # over the whole tensor the outlier dominates the norm: tensorwise keeps it exactly (scale 448/amax)
    assert stats["tensorwise"]["rel_error"] < stats["rowwise"]["rel_error"]
    assert fp8.error_stats(x, x)["snr_db"] == math.inf
    with pytest.raises(ValueError, match="recipe"):
        fp8.quantise(x, "channelwise")


def test_a_nan_anywhere_in_the_history_leaves_the_scale_as_it_was():
    """Python's max() drops a NaN unless it comes first; the reference amax of a window holding a NaN is NaN (as a
    tensor amax over the history is in Transformer Engine), so the scale does not change while the NaN is in it."""
    for history in ([2.0, float("nan")], [float("nan"), 2.0], [1.0, float("nan"), 0.5]):
        hist, scale = fp8.delayed_update(history[:-1], history[-1], 7.0, 16, 0, "max", 448.0)
        assert scale == 7.0 and len(hist) == len(history), history
    # once the NaN has left the window, the scale follows the amaxes again
    hist, scale = fp8.delayed_update([float("nan"), 4.0], 2.0, 7.0, 2, 0, "max", 448.0)
    assert hist == [4.0, 2.0] and scale == 448.0 / 4.0
