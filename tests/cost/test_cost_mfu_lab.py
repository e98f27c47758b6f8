"""helpers.cost.mfu_lab: sub-block and training-step timing, the FLOPs panel, the ceilings it uses, sentences, figures."""
import matplotlib.pyplot as plt
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from helpers.cost import flops, mfu, mfu_lab
from helpers.gpt.model import GPT, GPTConfig
from helpers.measure import ceilings, claims, hardware
from helpers.measure.results import record


def small(**overrides) -> GPTConfig:
    return GPTConfig(**{**dict(n_layer=2, n_head=4, d_model=64, d_ff=256, seq_len=64), **overrides})


@pytest.mark.parametrize("backward", [False, True], ids=["forward", "train"])
def test_sublayer_closures_do_what_is_counted(backward):
    cfg = small(n_kv_head=1)
    fns = mfu_lab.sublayer_closures(cfg, 2, 12, backward=backward, attn_impl="naive")
    want = mfu.sublayer_flops(cfg, 2, 12, backward=backward)
    for name, fn in fns.items():
        with FlopCounterMode(display=False) as counter:
            fn()
        assert counter.get_total_flops() == want[name], name


def test_time_sublayers_interleaves_and_reports_ratio():
    r = mfu_lab.time_sublayers(small(), 1, 16, reps=3, warmup=1)
    assert set(r) == set(mfu.SUBLAYERS)
    for v in r.values():
        assert len(v["samples"]) == 3 and v["seconds"] > 0
        assert v["tflops"] == pytest.approx(v["flops"] / v["seconds"] / 1e12)
    fake = {"mlp": {"flops": 10, "samples": [1.0, 2.0, 1.0]}, "attention": {"flops": 5, "samples": [1.0, 1.0, 4.0]}}
    assert mfu_lab.efficiency_ratio(fake) == 2.0  # per-repetition ratios 2, 1, 8 -> median 2


def test_measure_train_step_counts_the_step():
    r = mfu_lab.measure_train_step(small(), 2, 16, reps=1, warmup=1)
    assert r["tokens_per_s"] == pytest.approx(32 / r["seconds"])
    assert r["flops"] == flops.transformer_flops(small(), 2, 16)["total"]["total"]
    assert r["tflops_6n"] < r["tflops"]  # 6N leaves out the attention scores and values


def test_train_step_closure_updates_the_weights():
    torch.manual_seed(0)
    m = GPT(small())
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    x = torch.randint(0, 256, (2, 8))
    before = m.blocks[0].mlp.up.weight.detach().clone()
    mfu_lab.train_step_closure(m, opt, x, x)()
    assert not torch.equal(before, m.blocks[0].mlp.up.weight)
    assert all(p.grad is None for p in m.parameters())  # zero_grad(set_to_none=True) after the step


def test_flops_panel_moves_with_the_controls(capsys):
    base = mfu_lab.flops_panel(12, 768, 1024, 50257)
    heights = {t.get_text(): p.get_height() for t, p in zip(base.axes[0].get_xticklabels(), base.axes[0].patches)}
    longer = mfu_lab.flops_panel(12, 768, 4096, 50257)
    h_long = {t.get_text(): p.get_height() for t, p in zip(longer.axes[0].get_xticklabels(), longer.axes[0].patches)}
    assert h_long["attn_scores"] == pytest.approx(4 * heights["attn_scores"])  # grows with T
    assert h_long["mlp_up"] == pytest.approx(heights["mlp_up"])  # does not
    deeper = mfu_lab.flops_panel(24, 768, 1024, 50257)
    h_deep = {t.get_text(): p.get_height() for t, p in zip(deeper.axes[0].get_xticklabels(), deeper.axes[0].patches)}
    assert h_deep["mlp_down"] == pytest.approx(2 * heights["mlp_down"]) and h_deep["lm_head"] == heights["lm_head"]
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("L=12, d=768, T=1024, V=50257: 0.8544 GFLOP per token")
    with pytest.raises(ValueError, match="head_dim"):
        mfu_lab.flops_panel(2, 100, 64, 256)
    plt.close("all")


@pytest.mark.slow
def test_sweep_train_steps_skips_the_points_that_run_out_of_memory(monkeypatch):
    real = mfu_lab.measure_train_step

    def measure(config, batch_size, seq_len, **kwargs):
        if batch_size > 1:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(config, batch_size, seq_len, **kwargs)
    monkeypatch.setattr(mfu_lab, "measure_train_step", measure)
    rows, too_big = mfu_lab.sweep_train_steps(["tiny"], [1, 2], 16, reps=1, warmup=0)
    assert [(r["model"], r["batch_size"]) for r in rows] == [("tiny", 1)] and too_big == ["tiny B=2"]
    assert rows[0]["seq_len"] == 16 and rows[0]["tflops"] > 0


def test_matmul_ceiling_is_the_best_of_the_record_and_a_measurement_now(results_tmp):
    record(ceilings.CEILINGS_RECORD, {"matmul_tflops": {"fp32": 1e-9}, "copy_gbps": 1e-9}, quiet=True)
    tflops, source = ceilings.matmul_ceiling("fp32", [32, (16, 8, 24)], "cpu", reps=1)
    assert tflops > 1e-9 and "measured just now" in source and "above notebook 00's record" in source
    record(ceilings.CEILINGS_RECORD, {"matmul_tflops": {"fp32": 1e6}, "copy_gbps": 1e9}, quiet=True)
    tflops, source = ceilings.matmul_ceiling("fp32", [32], "cpu", reps=1)
    assert tflops == 1e6 and source.startswith("notebook 00") and "measured now" in source
    assert ceilings.matmul_ceiling("fp8", [32], "cpu", reps=1)[0] is None  # cannot run: no ceiling invented


def test_a_fraction_above_the_ceiling_is_called_a_ceiling_problem():
    assert mfu_lab.over_ceiling_note({"a": 0.5, "b": 1.0}, "x") == ""
    note = mfu_lab.over_ceiling_note({"MLP B=1 T=256": 1.01, "attention": 0.4}, "notebook 00")
    assert note.startswith("CEILING PROBLEM") and "MLP B=1 T=256 at 101%" in note and "notebook 00" in note
    assert mfu_lab.pct(1.01) == "101% (!)" and mfu_lab.pct(0.45) == "45%"


def test_six_n_takeaway_names_the_main_cause():
    text = mfu.six_n_takeaway({n: mfu.six_n_error(GPTConfig.preset(n)) for n in ("tiny", "gpt2")})
    assert "13% low" in text and "main cause is the attention" in text and "lookup" not in text


def test_projection_takeaway_says_the_attention_half_is_mostly_projections():
    cfg = GPTConfig.preset("small10m")
    pts = [{"B": 1, "T": 64, "attention_seconds": 1.0, "attention_core_seconds": 0.1},
           {"B": 1, "T": 512, "attention_seconds": 2.0, "attention_core_seconds": 0.5}]
    text = mfu_lab.projection_takeaway(cfg, pts, backward=True)
    # projections 8d^2 against 4Td per token: d=384 -> 92% at T=64, 60% at T=512
    assert "60%–92% of the attention half's FLOPs" in text and "10%–25% of the attention half's time" in text
    assert "mostly matmuls" in text


@pytest.mark.parametrize("ridge, words", [(5.0, "nothing in this sweep is memory-bound"),
                                          (300.0, "attention is memory-bound here"),
                                          (10.0, "depends on how much")])
def test_roofline_takeaway_follows_the_measured_ridge(ridge, words):
    cfg = GPTConfig.preset("small10m")  # head_dim 64: the core is 5.3 to 16 FLOP/B at T=64 in fp32
    pts = [{"B": 1, "T": 64}, {"B": 2, "T": 512}]
    text = mfu_lab.roofline_takeaway(ridge, cfg, pts, 4)
    assert words in text and f"{ridge:.3g} FLOP/B" in text


def _point(B, T, ratio, attn=0.4, mlp=0.7, spread=0.05, iqr=0.02):
    return {"B": B, "T": T, "ratio": ratio, "ratio_q25": ratio - iqr, "ratio_q75": ratio + iqr, "attention_tflops": attn,
            "mlp_tflops": mlp, "attention_core_tflops": 0.1 * T, "attention_spread": spread, "mlp_spread": spread}


def test_verdict_bullets_quote_the_rule_at_each_shape():
    pts = [_point(1, 64, 1.7), _point(1, 512, 1.8)]
    lines, summary = mfu_lab.attention_vs_mlp_verdict(pts, [1], [64, 512], 1.0)
    assert "2 supported (of 2)" in lines[-1] and summary["by_shape"] == {"supported": 2}
    assert summary["ratio_min"] == 1.7 and summary["trend_with_T"] == {"1": "stays within ±25%"}
    assert summary["claimed"] == pytest.approx([1.36, 2.125]) and summary["judged"]["T"] == 512  # farther from 1.7
    assert summary["ratio_iqr_median"] == pytest.approx([1.73, 1.77])
    pts = [_point(1, 64, 3.0, mlp=1.01), _point(1, 512, 1.0)]
    lines, summary = mfu_lab.attention_vs_mlp_verdict(pts, [1], [64, 512], 1.0, ceiling_source="notebook 00")
    text = "\n".join(lines)
    assert "2 contradicted (of 2)" in text and "among those the rule finds against it" in text and "shrinks" in text
    assert "CEILING PROBLEM" in text and "101% (!)" in text and "verdict:" not in text


def test_the_gap_claim_is_judged_where_a_precise_shape_leaves_the_claimed_range(results_tmp):
    claimed = mfu.gap_claimed()
    # every shape inside the range: judged at the farthest one, and the rule supports the claim
    point, counts = mfu.judged_point([_point(1, 64, 1.6), _point(1, 128, 2.0), _point(2, 64, 1.7)], claimed)
    assert point["ratio"] == 2.0 and counts == {"supported": 3}
    # one precise shape below: that shape is judged, even though a noisy one lies farther off
    noisy = _point(1, 512, 3.0, iqr=1.2)  # IQR 1.8-4.2: wider than half its value and across the claim's top
    point, counts = mfu.judged_point([_point(1, 64, 1.7), _point(1, 128, 1.1), noisy], claimed)
    assert point["ratio"] == 1.1 and counts == {"supported": 1, "contradicted": 1, "not testable": 1}
    row = claims.verdict("attention-mlp-gap", notebook="02", claim="c", source="s", measured="m", value=point["ratio"],
                         unit="x", spread=(point["ratio_q25"], point["ratio_q75"]), claimed=claimed, above="contradicted",
                         quiet=True)
    assert row["verdict"] == "contradicted" and row["claimed"]["lo"] == pytest.approx(1.36)
    # the same median inside the claim's range but with a spread too wide to judge: not testable, never support
    point, counts = mfu.judged_point([_point(1, 64, 1.7, iqr=0.6)], claimed)
    assert counts == {"not testable": 1}
    # a gap far above the claim is against a universal constant too
    assert mfu.judged_point([_point(1, 64, 3.0)], claimed)[1] == {"contradicted": 1}
    with pytest.raises(ValueError, match="no points"):
        mfu.judged_point([], claimed)


def _step(model, b, seconds, q25, q75, flops=1e12):
    return {"model": model, "batch_size": b, "seq_len": 64, "seconds": seconds, "q25": q25, "q75": q75, "flops": flops}


def test_mfu_comes_with_its_range_and_is_withheld_for_an_emulated_format(monkeypatch):
    row = _step("tiny", 4, 2.0, 1.6, 2.5)
    f = mfu.step_fractions(row, ceiling=1.0, peak=2.0)
    assert f["mfu_ceiling"] == pytest.approx(0.5) and f["mfu_datasheet"] == pytest.approx(0.25)
    assert f["mfu_ceiling_lo"] == pytest.approx(0.4) and f["mfu_ceiling_hi"] == pytest.approx(0.625)
    monkeypatch.setattr(hardware, "emulated", lambda d, dev="cpu": f"{d} is emulated" if d == "bf16" else None)
    assert mfu.withheld("fp32", "cpu") is None and mfu.withheld("fp16", "cpu") is None
    why = mfu.withheld("bf16", "cpu")
    assert why == "bf16 is emulated"
    assert all(v is None for v in mfu.step_fractions(row, 1.0, 2.0, why).values())
    text = mfu_lab.formats_sentence("bf16", "cpu")
    assert "fp16 is native and bf16 emulated" in text and "bf16 is emulated here, so its MFU is withheld" in text
    assert "runs natively here" in mfu_lab.formats_sentence("fp32", "cpu")
    assert "this GPU emulates" in mfu_lab.formats_sentence("bf16", "cuda") and "this CPU emulates" in text
    steps = [dict(row, **mfu.step_fractions(row, 1.0, None, why))]
    point, head = mfu.step_headline(steps)
    assert point == "tiny B=4 T=64" and list(head) == ["training step throughput, largest model and batch"]
    value, unit, (lo, hi) = head["training step throughput, largest model and batch"]
    assert unit == "TFLOP/s" and (value, lo, hi) == pytest.approx((0.5, 0.4, 0.625))
    assert mfu_lab.extremes_sentence(steps) == "no MFU was computed for these steps" and mfu_lab.pct(None) == "n/a"


def test_the_highest_mfu_is_named_only_when_its_iqr_clears_the_others():
    def fr(r):
        return dict(r, **mfu.step_fractions(r, ceiling=1.0))
    apart = [fr(_step("tiny", 1, 4.0, 3.9, 4.1)), fr(_step("tiny", 2, 2.0, 1.95, 2.05)), fr(_step("small", 1, 1.0, 0.98, 1.02))]
    text = mfu_lab.extremes_sentence(apart)
    assert text.startswith("highest MFU: small B=1 at 100% (IQR 98%–102%) of the measured ceiling, clear of") and "lowest: tiny B=1" in text
    tied = apart[:2] + [fr(_step("small", 1, 1.9, 1.5, 2.2))]  # small B=1's IQR reaches tiny B=2's
    text = mfu_lab.extremes_sentence(tied)
    assert text.startswith("this run cannot tell which step reached the highest MFU") and "tiny B=2" in text
    low = [fr(_step("tiny", 1, 4.0, 3.0, 5.0)), fr(_step("tiny", 2, 3.5, 3.2, 4.4)), apart[2]]  # 0.25 (0.2-0.33) vs 0.29 (0.23-0.31)
    assert "the lowest cannot be told apart: tiny B=1" in mfu_lab.extremes_sentence(low)
    value, unit, (lo, hi) = mfu.step_headline(apart)[1]["MFU vs measured ceiling, largest model and batch"]
    assert unit == "%" and (value, lo, hi) == pytest.approx((100.0, 100 / 1.02, 100 / 0.98))


def test_ratio_quartiles_and_kernel_share():
    fake = {"mlp": {"flops": 10, "samples": [1.0, 2.0, 1.0, 1.0]}, "attention": {"flops": 5, "samples": [1.0, 1.0, 4.0, 2.0]}}
    q25, med, q75 = mfu_lab.ratio_quartiles(fake)  # per-repetition ratios 2, 1, 8, 4
    assert (q25, med, q75) == (1.75, 3.0, 5.0) and mfu_lab.efficiency_ratio(fake) == 3.0
    rows = [("aten::addmm", 1.0, 1, 0.5), ("aten::_scaled_dot_product_flash_attention_for_cpu", 1.0, 1, 0.2),
            ("aten::gelu", 1.0, 1, 0.3)]
    assert mfu_lab.kernel_share(rows) == pytest.approx(0.7)


def test_plot_fractions_starts_at_zero_with_error_bars_and_the_legend_outside():
    fig = mfu_lab.plot_fractions([64, 128], {"a": ([0.5, 0.6], [0.4, 0.5], [0.7, 0.65]), "b": ([None, 0.9], [None, 0.8], [None, 1.0])},
                             xlabel="T", ylabel="fraction of the measured ceiling", title="t", hlines={"claim": 0.45})
    ax = fig.axes[0]
    assert ax.get_ylim()[0] == 0 and ax.get_ylabel() == "fraction of the measured ceiling"
    assert len(ax.containers) == 2  # one errorbar container per series
    legend = ax.get_legend()
    assert legend.get_bbox_to_anchor().x0 >= ax.get_window_extent().x1 - 1  # anchored right of the axes
    plt.close(fig)
