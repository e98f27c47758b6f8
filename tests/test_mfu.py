"""helpers.mfu: the source text's formulas against the exact count, sub-block FLOPs and timing, estimates, panel."""
import matplotlib.pyplot as plt
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from helpers import flops as FL
from helpers import hardware, mfu
from helpers.model import GPTConfig


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
    assert sum(exact.values()) == FL.transformer_flops(cfg, 1, T, backward=False)["total"]["forward"]


def test_sublayer_flops_partition_one_block():
    cfg = small(n_kv_head=2)
    f = FL.transformer_flops(cfg, 3, 20)
    sub = mfu.sublayer_flops(cfg, 3, 20, backward=True)
    per_layer = {c: f[c]["total"] // cfg.n_layer for c in FL.COMPONENTS}
    assert sub["attention"] == sum(per_layer[c] for c in ("qkv", "attn_scores", "attn_values", "attn_out"))
    assert sub["attention_core"] == per_layer["attn_scores"] + per_layer["attn_values"]
    assert sub["mlp"] == per_layer["mlp_up"] + per_layer["mlp_down"]
    fwd = mfu.sublayer_flops(cfg, 3, 20)
    assert {k: 3 * v for k, v in fwd.items()} == sub
    assert mfu.sublayer_flops(cfg, 1, 200)["mlp"] == 2 * 2 * 200 * 64 * 256  # longer than cfg.seq_len is allowed


@pytest.mark.parametrize("backward", [False, True], ids=["forward", "train"])
def test_sublayer_closures_do_what_is_counted(backward):
    cfg = small(n_kv_head=1)
    fns = mfu.sublayer_closures(cfg, 2, 12, backward=backward, attn_impl="naive")
    want = mfu.sublayer_flops(cfg, 2, 12, backward=backward)
    for name, fn in fns.items():
        with FlopCounterMode(display=False) as counter:
            fn()
        assert counter.get_total_flops() == want[name], name


def test_time_sublayers_interleaves_and_reports_ratio():
    r = mfu.time_sublayers(small(), 1, 16, reps=3, warmup=1)
    assert set(r) == set(mfu.SUBLAYERS)
    for v in r.values():
        assert len(v["samples"]) == 3 and v["seconds"] > 0
        assert v["tflops"] == pytest.approx(v["flops"] / v["seconds"] / 1e12)
    fake = {"mlp": {"flops": 10, "samples": [1.0, 2.0, 1.0]}, "attention": {"flops": 5, "samples": [1.0, 1.0, 4.0]}}
    assert mfu.efficiency_ratio(fake) == 2.0  # per-repetition ratios 2, 1, 8 -> median 2


def test_measure_train_step_counts_the_step():
    r = mfu.measure_train_step(small(), 2, 16, reps=1, warmup=1)
    assert r["tokens_per_s"] == pytest.approx(32 / r["seconds"])
    assert r["flops"] == FL.transformer_flops(small(), 2, 16)["total"]["total"]
    assert r["tflops_6n"] < r["tflops"]  # 6N leaves out the attention scores and values


def test_train_step_closure_updates_the_weights():
    from helpers.model import GPT

    torch.manual_seed(0)
    m = GPT(small())
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    x = torch.randint(0, 256, (2, 8))
    before = m.blocks[0].mlp.up.weight.detach().clone()
    mfu.train_step_closure(m, opt, x, x)()
    assert not torch.equal(before, m.blocks[0].mlp.up.weight)
    assert all(p.grad is None for p in m.parameters())  # zero_grad(set_to_none=True) after the step


def test_gpu_hours_and_implied_mfu_invert_each_other():
    a100 = hardware.PEAKS["a100"].bf16 * 1e12
    hours = mfu.gpu_hours(7e9, 2e12, a100, 0.4)
    assert hours == pytest.approx(6 * 7e9 * 2e12 / (312e12 * 0.4) / 3600)
    assert mfu.implied_mfu(7e9, 2e12, a100, hours) == pytest.approx(0.4)
    # Llama 2 7B: 184,320 A100 GPU-hours reported (Touvron et al., 2023) -> about 40.6% MFU by 6ND
    assert mfu.implied_mfu(7e9, 2e12, a100, 184_320) == pytest.approx(0.4058, abs=1e-4)
    # GPU-hours shared by n GPUs give the same days as training_days
    days = mfu.days_from_gpu_hours(hours, 1024)
    assert days == pytest.approx(FL.training_days(7e9, 2e12, a100, 1024, 0.4))
    with pytest.raises(ValueError):
        mfu.gpu_hours(1e9, 1e9, a100, 0.0)
    with pytest.raises(ValueError):
        mfu.implied_mfu(1e9, 1e9, a100, 0)


def test_per_token_breakdown_is_palm_formula():
    cfg = GPTConfig.preset("gpt2")
    parts = mfu.per_token_breakdown(cfg)
    assert sum(parts.values()) == FL.palm_flops_per_token(FL.matmul_params(cfg), 12, 12, 64, 1024)


def test_flops_panel_moves_with_the_controls(capsys):
    base = mfu.flops_panel(12, 768, 1024, 50257)
    heights = {t.get_text(): p.get_height() for t, p in zip(base.axes[0].get_xticklabels(), base.axes[0].patches)}
    longer = mfu.flops_panel(12, 768, 4096, 50257)
    h_long = {t.get_text(): p.get_height() for t, p in zip(longer.axes[0].get_xticklabels(), longer.axes[0].patches)}
    assert h_long["attn_scores"] == pytest.approx(4 * heights["attn_scores"])  # grows with T
    assert h_long["mlp_up"] == pytest.approx(heights["mlp_up"])  # does not
    deeper = mfu.flops_panel(24, 768, 1024, 50257)
    h_deep = {t.get_text(): p.get_height() for t, p in zip(deeper.axes[0].get_xticklabels(), deeper.axes[0].patches)}
    assert h_deep["mlp_down"] == pytest.approx(2 * heights["mlp_down"]) and h_deep["lm_head"] == heights["lm_head"]
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("L=12, d=768, T=1024, V=50257: 0.8544 GFLOP per token")
    with pytest.raises(ValueError, match="head_dim"):
        mfu.flops_panel(2, 100, 64, 256)
    plt.close("all")


def test_sweep_train_steps_skips_the_points_that_run_out_of_memory(monkeypatch):
    real = mfu.measure_train_step

    def measure(config, batch_size, seq_len, **kwargs):
        if batch_size > 1:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(config, batch_size, seq_len, **kwargs)
    monkeypatch.setattr(mfu, "measure_train_step", measure)
    rows, too_big = mfu.sweep_train_steps(["tiny"], [1, 2], 16, reps=1, warmup=0)
    assert [(r["model"], r["batch_size"]) for r in rows] == [("tiny", 1)] and too_big == ["tiny B=2"]
    assert rows[0]["seq_len"] == 16 and rows[0]["tflops"] > 0
