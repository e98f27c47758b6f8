"""helpers.cost.mfu: the source text's formulas against the exact count, sub-block FLOPs, 6N's error, byte models, estimates."""
import pytest

from helpers.cost import flops, mfu
from helpers.gpt.model import GPTConfig
from helpers.measure import claims, hardware


def small(**overrides) -> GPTConfig:
    return GPTConfig(**{**dict(n_layer=2, n_head=4, d_model=64, d_ff=256, seq_len=64), **overrides})


def test_source_formulas_miss_projections_ffn_half_and_attention_term():
    cfg = GPTConfig.preset("gpt2")
    T = 1024
    src = mfu.source_formula_flops(cfg, T)
    assert src["attention"] == 2 * 12 * T * 768**2 and src["ffn"] == 2 * 12 * T * 4 * 768**2
    exact = mfu.grouped_flops(cfg, 1, T)
    assert exact["ffn"] == 2 * src["ffn"]  # two h x 4h matmuls, the formula has one
    assert exact["embedding"] == src["embedding"]  # 2·D·V·h is the LM head's forward
    assert exact["attention"] / src["attention"] == pytest.approx(4 + 2 * T / 768)  # 4 projections + scores/values
    train = mfu.grouped_flops(cfg, 1, T, key="total")
    assert train == {k: 3 * v for k, v in exact.items()}
    assert sum(exact.values()) == flops.transformer_flops(cfg, 1, T, backward=False)["total"]["forward"]


def test_sublayer_flops_partition_one_block():
    cfg = small(n_kv_head=2)
    f = flops.transformer_flops(cfg, 3, 20)
    sub = mfu.sublayer_flops(cfg, 3, 20, backward=True)
    per_layer = {c: f[c]["total"] // cfg.n_layer for c in flops.COMPONENTS}
    assert sub["attention"] == sum(per_layer[c] for c in ("qkv", "attn_scores", "attn_values", "attn_out"))
    assert sub["attention_core"] == per_layer["attn_scores"] + per_layer["attn_values"]
    assert sub["mlp"] == per_layer["mlp_up"] + per_layer["mlp_down"]
    fwd = mfu.sublayer_flops(cfg, 3, 20)
    assert {k: 3 * v for k, v in fwd.items()} == sub
    assert mfu.sublayer_flops(cfg, 1, 200)["mlp"] == 2 * 2 * 200 * 64 * 256  # longer than cfg.seq_len is allowed


def test_gpu_hours_and_implied_mfu_invert_each_other():
    a100 = hardware.PEAKS["a100"].bf16 * 1e12
    hours = mfu.gpu_hours(7e9, 2e12, a100, 0.4)
    assert hours == pytest.approx(6 * 7e9 * 2e12 / (312e12 * 0.4) / 3600)
    assert mfu.implied_mfu(7e9, 2e12, a100, hours) == pytest.approx(0.4)
    # Llama 2 7B: 184,320 A100 GPU-hours reported (Touvron et al., 2023) -> about 40.6% MFU by 6ND
    assert mfu.implied_mfu(7e9, 2e12, a100, 184_320) == pytest.approx(0.4058, abs=1e-4)
    # GPU-hours shared by n GPUs give the same days as training_days
    days = mfu.days_from_gpu_hours(hours, 1024)
    assert days == pytest.approx(flops.training_days(7e9, 2e12, a100, 1024, 0.4))
    with pytest.raises(ValueError, match="mfu=0.0 must be a positive"):
        mfu.gpu_hours(1e9, 1e9, a100, 0.0)
    with pytest.raises(ValueError, match=r"mfu=1.5 must be in \(0, 1\]"):
        mfu.gpu_hours(1e9, 1e9, a100, 1.5)
    with pytest.raises(ValueError, match="reported_gpu_hours=0 must be a positive"):
        mfu.implied_mfu(1e9, 1e9, a100, 0)


def test_per_token_breakdown_is_palm_formula():
    cfg = GPTConfig.preset("gpt2")
    parts = mfu.per_token_breakdown(cfg)
    assert sum(parts.values()) == flops.palm_flops_per_token(flops.matmul_params(cfg), 12, 12, 64, 1024)


def test_six_n_error_names_the_missing_attention_term_as_the_cause():
    e = mfu.six_n_error(GPTConfig.preset("gpt2"))
    exact = 854_438_400  # per token, test_gpt2_by_hand_and_palm_formula
    assert e["six_n_all"] == pytest.approx(6 * 124_439_808 / exact - 1)  # 12.6% low
    assert e["attention"] == pytest.approx(12 * 12 * 1024 * 768 / exact)  # 13.3% of the exact count
    assert e["unmultiplied"] == pytest.approx(6 * (124_439_808 - 123_532_032) / exact)  # 0.6% back
    assert e["six_n_all"] == pytest.approx(e["unmultiplied"] - e["attention"])
    assert mfu.six_n_error(GPTConfig.preset("gpt2"), n_params=124_439_808) == e


def test_intensity_bounds_by_hand():
    cfg = GPTConfig(n_layer=1, n_head=1, d_model=64, d_ff=256, seq_len=128)
    b = mfu.intensity_bounds(cfg, 1, 128, 4)
    lo, hi = b["attention_core"]
    # q, k, v, o and q's scaling (6 T x hd) plus 6 passes over the T x T scores, 4 bytes each
    assert lo == pytest.approx(4 * 128**2 * 64 / (4 * (6 * 128 * 64 + 6 * 128 * 128)))  # 64/9 FLOP/B
    assert hi == pytest.approx(128 / 4)  # T / bytes per element
    assert b["mlp_up"] == pytest.approx(2 * 128 * 64 * 256 / (4 * (128 * 64 + 64 * 256 + 128 * 256)))


# ---------------------------------------------------------------- the fixed-rate recipe and the utilisation claim

STEP_ROW = {"model": "tiny", "params": 1_000, "batch_size": 2, "seq_len": 8, "flops": 1e6, "seconds": 1e-3,
            "q25": 0.9e-3, "q75": 1.2e-3, "tflops": 1e-3}


def test_fixed_rate_estimate_is_the_same_for_every_model_and_counts_params_as_flops():
    small = mfu.fixed_rate_estimate(10, 1, 1)
    big = mfu.fixed_rate_estimate(10**9, 64, 2048)
    assert [e["tflops"] for e in small.values()] == [e["tflops"] for e in big.values()] == [312.0, 312.0 * 0.7, 156.0]
    assert big["realistic"]["step_seconds"] == pytest.approx(6 * 10**9 * 64 * 2048 / 156e12)
    with pytest.raises(ValueError, match="batch_size"):
        mfu.fixed_rate_estimate(10, 0, 1)
    with pytest.raises(ValueError, match="realistic"):
        mfu.fixed_rate_estimate(10, 1, 1, rates={"realistic": 0.0})


def test_fixed_rate_rows_put_the_recipe_beside_the_timed_step():
    est = mfu.fixed_rate_estimate(STEP_ROW["params"], 2, 8)
    rows = mfu.fixed_rate_rows(STEP_ROW, est, peak=None, ceiling=0.5, device_name="a CPU")
    assert [r[0] for r in rows] == ["'model FLOPs'", "peak", "'ideal' throughput", "'with overhead' throughput",
                                    "'realistic' throughput", "iteration time"]
    assert "1,000 (the parameter count)" in rows[0][1] and "1e+03x the parameter count" in rows[0][2]
    assert "no datasheet row" in rows[1][2] and "0.5 TFLOP/s" in rows[1][2]
    assert "156 TFLOP/s" in rows[4][1] and "0.001 TFLOP/s" in rows[4][2]
    assert "1 ms" in rows[5][2]


def test_utilization_claim_is_not_testable_off_a_gpu_and_judged_on_one():
    off = mfu.utilization_claim(STEP_ROW, peak=None, why_withheld=None, device_kind="cpu")
    assert off["verdict"] == "not testable" and "CPU" in off["reason"] and off["claimed"] == (50.0, 75.0)
    emulated = mfu.utilization_claim(STEP_ROW, peak=1.0, why_withheld="bf16 is emulated", device_kind="cuda")
    assert emulated["verdict"] == "not testable" and emulated["reason"] == "bf16 is emulated"
    on = mfu.utilization_claim(STEP_ROW, peak=0.002, why_withheld=None, device_kind="cuda")  # 1e-3 / 2e-3 = 50%
    assert "verdict" not in on and on["value"] == pytest.approx(50.0)
    assert on["spread"] == pytest.approx((100 / 1.2 / 2, 100 / 0.9 / 2))
    assert claims.judge_interval(on["value"], *on["spread"], *on["claimed"])[0] == "supported"
