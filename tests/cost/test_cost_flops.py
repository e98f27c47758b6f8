"""FLOP accounting: integer equality with FlopCounterMode, and the back-of-envelope formulas."""
import pytest
import torch
from torch.utils.checkpoint import set_checkpoint_early_stop
from torch.utils.flop_counter import FlopCounterMode

from helpers.cost import flops
from helpers.gpt.model import GPT, GPTConfig, sdpa_attention

# (config overrides, batch, seq_len): MHA, GQA, MQA, bias on/off, tied/untied, odd sizes
CASES = {
    "mha-bias-tied": (dict(n_layer=2, n_head=4, d_model=64, d_ff=256), 2, 16),
    "gqa-nobias": (dict(n_layer=2, n_head=4, n_kv_head=2, d_model=64, d_ff=256, bias=False), 2, 16),
    "mqa-untied": (dict(n_layer=2, n_head=4, n_kv_head=1, d_model=64, d_ff=256, tie_embeddings=False), 1, 24),
    "gqa-odd-sizes": (dict(n_layer=3, n_head=6, n_kv_head=3, d_model=48, d_ff=80, vocab_size=97), 3, 13),
    "mqa-nobias-untied": (dict(n_layer=1, n_head=2, n_kv_head=1, d_model=32, d_ff=64, bias=False,
                               tie_embeddings=False), 2, 7),
}


def build(name):
    overrides, batch, T = CASES[name]
    cfg = GPTConfig(seq_len=32, **overrides)
    torch.manual_seed(0)
    idx = torch.randint(0, cfg.vocab_size, (batch, T))
    tgt = torch.randint(0, cfg.vocab_size, (batch, T))
    return cfg, GPT(cfg, attn_impl="naive"), idx, tgt


@pytest.mark.parametrize("name", CASES)
def test_equals_flop_counter_forward_and_backward(name):
    cfg, m, idx, tgt = build(name)
    B, T = idx.shape
    assert flops.measure_flops(m, idx, tgt, backward=False) == flops.transformer_flops(cfg, B, T, backward=False)["total"]
    measured = flops.measure_flops(m, idx, tgt)
    predicted = flops.transformer_flops(cfg, B, T)["total"]
    assert measured == predicted  # forward, backward and total, to the FLOP
    assert measured["backward"] == 2 * measured["forward"]


def test_frozen_parameters_skip_gradient_matmuls():
    """What the counter charges depends on requires_grad: the formula assumes everything trains."""
    cfg, m, idx, tgt = build("mha-bias-tied")
    f = flops.transformer_flops(cfg, *idx.shape)
    m.wte.weight.requires_grad_(False)  # tied: the LM head's weight no longer needs a gradient
    m.wpe.weight.requires_grad_(False)
    lm_head_weight_grad = f["lm_head"]["forward"]
    assert flops.measure_flops(m, idx, tgt)["backward"] == f["total"]["backward"] - lm_head_weight_grad
    for p in m.blocks[0].ln_1.parameters():  # now block 0's q/kv input needs no gradient either
        p.requires_grad_(False)
    qkv_input_grad = f["qkv"]["forward"] // cfg.n_layer
    assert flops.measure_flops(m, idx, tgt)["backward"] == f["total"]["backward"] - lm_head_weight_grad - qkv_input_grad


@pytest.mark.parametrize("name", ["gqa-odd-sizes", "mqa-untied"])
def test_each_component_equals_the_counter_per_module(name):
    cfg, m, idx, _ = build(name)
    with FlopCounterMode(display=False) as counter:
        m(idx)
    per_module = {k: sum(v.values()) for k, v in counter.get_flop_counts().items()}
    L = range(cfg.n_layer)

    def total(suffix):
        return sum(per_module.get(f"GPT.blocks.{i}.{suffix}", 0) for i in L)

    fwd = {k: v["forward"] for k, v in flops.transformer_flops(cfg, *idx.shape, backward=False).items()}
    assert total("attn.q_proj") + total("attn.kv_proj") == fwd["qkv"]
    assert total("attn.out_proj") == fwd["attn_out"]
    assert total("attn") - total("attn.q_proj") - total("attn.kv_proj") - total("attn.out_proj") \
        == fwd["attn_scores"] + fwd["attn_values"]  # the matmuls inside the attention kernel
    assert total("mlp.up") == fwd["mlp_up"] and total("mlp.down") == fwd["mlp_down"]
    assert per_module["GPT.lm_head"] == fwd["lm_head"]
    assert fwd["embedding"] == 0 and per_module["Global"] == fwd["total"]


def test_attention_components_by_hand():
    cfg = GPTConfig(n_layer=2, n_head=4, n_kv_head=1, d_model=64, d_ff=256, seq_len=32)
    f = flops.transformer_flops(cfg, 3, 10)
    # (10, 16) @ (16, 10) per head: 2*10*10*16 FLOPs, x 4 heads x 3 sequences x 2 layers
    assert f["attn_scores"]["forward"] == f["attn_values"]["forward"] == 2 * 10 * 10 * 16 * 4 * 3 * 2
    # q: 64 -> 64, kv: 64 -> 2*1*16 = 32 (MQA), per token, x 30 tokens x 2 layers
    assert f["qkv"]["forward"] == 2 * 30 * 64 * (64 + 32) * 2
    assert f["lm_head"] == {"forward": 2 * 30 * 64 * 256, "backward": 4 * 30 * 64 * 256, "total": 6 * 30 * 64 * 256}
    causal = flops.transformer_flops(cfg, 3, 10, is_causal=True)
    assert causal["attn_scores"]["forward"] * 2 == f["attn_scores"]["forward"]
    assert causal["mlp_up"] == f["mlp_up"]
    off = flops.transformer_flops(cfg, 3, 10, backward=False)
    assert all(row["backward"] == 0 and row["total"] == row["forward"] for row in off.values())


@pytest.mark.parametrize("impl", ["sdpa", "function", "wrapped"])
def test_sdpa_counts_nothing_on_cpu_and_is_detected_whatever_its_name(impl):
    """FlopCounterMode has no formula for the CPU flash kernel: attention FLOPs vanish, and measure_flops
    says so from the ops that ran, whether attention was given as "sdpa", as the function, or wrapped."""
    cfg, m, idx, tgt = build("gqa-nobias")
    m.attn_impl = {"sdpa": "sdpa", "function": sdpa_attention,
                   "wrapped": lambda q, k, v, causal: sdpa_attention(q, k, v, causal)}[impl]
    with pytest.warns(UserWarning, match="_scaled_dot_product_flash_attention_for_cpu"):
        measured = flops.measure_flops(m, idx, tgt)
    f = flops.transformer_flops(cfg, *idx.shape)
    attention = {k: f["attn_scores"][k] + f["attn_values"][k] for k in ("forward", "backward", "total")}
    assert measured == {k: f["total"][k] - attention[k] for k in attention}


def test_no_blind_spot_warning_when_everything_is_counted(recwarn):
    cfg, m, idx, tgt = build("mqa-untied")
    assert flops.measure_flops(m, idx, tgt) == flops.transformer_flops(cfg, *idx.shape)["total"]
    assert not [w for w in recwarn if "FlopCounterMode" in str(w.message)]


def test_uncounted_ops_picks_matmul_like_ops_without_a_formula():
    aten = torch.ops.aten
    registry = {aten.mm: None, aten.bmm: None}
    seen = {aten.mm, aten.bmm, aten.add, aten.mv, aten._scaled_dot_product_flash_attention_for_cpu, aten.softmax}
    assert flops.uncounted_ops(seen, registry) == ["aten._scaled_dot_product_flash_attention_for_cpu", "aten.mv"]


def test_recompute_under_activation_checkpointing():
    cfg, m, idx, tgt = build("gqa-odd-sizes")
    m.set_checkpointing([0, 2])
    predicted = flops.transformer_flops(cfg, *idx.shape, recompute_layers=2)
    with set_checkpoint_early_stop(False):  # recompute each checkpointed block's whole forward
        assert flops.measure_flops(m, idx, tgt) == predicted["total"]
    # default early stop: no backward needs the block's last matmul's output, so it is not rerun
    skipped = 2 * predicted["mlp_down"]["forward"] // cfg.n_layer
    assert flops.measure_flops(m, idx, tgt)["backward"] == predicted["total"]["backward"] - skipped
    with pytest.raises(ValueError, match="recompute_layers"):
        flops.transformer_flops(cfg, 1, 8, recompute_layers=4)


def test_gpt2_by_hand_and_palm_formula():
    cfg = GPTConfig.preset("gpt2")
    # per block 4*768^2 (attention) + 2*768*3072 (MLP), plus the 768 x 50257 LM head
    assert flops.matmul_params(cfg) == 12 * (4 * 768**2 + 2 * 768 * 3072) + 768 * 50257 == 123_532_032
    per_token = flops.palm_flops_per_token(flops.matmul_params(cfg), 12, 12, 64, 1024)
    assert per_token == 6 * 123_532_032 + 12 * 12 * 12 * 64 * 1024 == 854_438_400
    assert flops.transformer_flops(cfg, 2, 1024)["total"]["total"] == per_token * 2 * 1024


@pytest.mark.parametrize("name", ["gqa-nobias", "mqa-nobias-untied"])
def test_palm_formula_is_exact_with_matmul_params(name):
    cfg, _, idx, _ = build(name)
    B, T = idx.shape
    f = flops.transformer_flops(cfg, B, T)
    per_token = flops.palm_flops_per_token(flops.matmul_params(cfg), cfg.n_layer, cfg.n_head, cfg.head_dim, T)
    assert f["total"]["total"] == per_token * B * T
    no_attention = f["total"]["total"] - f["attn_scores"]["total"] - f["attn_values"]["total"]
    assert no_attention == flops.six_nd(flops.matmul_params(cfg), B * T)


def test_six_nd_and_mfu_arithmetic():
    assert flops.six_nd(124e6, 1e9) == pytest.approx(7.44e17)
    assert flops.six_nd(10, 7) == 420
    assert flops.mfu(400e12, 989e12) == pytest.approx(0.40445, abs=1e-5)
    with pytest.warns(UserWarning, match="no peak"):
        assert flops.mfu(400e12, None) is None
    with pytest.raises(ValueError, match="peak_flops_per_s=0.0 must be a positive"):
        flops.mfu(1.0, 0.0)


def test_training_days_gpt3_scale():
    # GPT-3 175B on 300B tokens: 6*N*D = 3.15e23 FLOPs; 1024 GPUs x 312 TFLOP/s x 50% = 1.597e17 FLOP/s
    days = flops.training_days(175e9, 300e9, 312e12, 1024, 0.5)
    assert days == pytest.approx(3.15e23 / (1024 * 312e12 * 0.5) / 86400, rel=1e-12)
    assert days == pytest.approx(22.82, abs=0.01)
    assert flops.training_days(175e9, 300e9, 312e12, 2048, 0.5) == pytest.approx(days / 2)
    with pytest.raises(ValueError, match="mfu"):
        flops.training_days(1e9, 1e9, 1e15, 8, 1.5)
    with pytest.raises(ValueError, match="n_gpus=0 must be a positive int"):
        flops.training_days(1e9, 1e9, 1e15, 0, 0.5)


def test_flops_table_lists_every_component():
    cfg = GPTConfig.preset("tiny")
    table = flops.flops_table(flops.transformer_flops(cfg, 1, 128))
    for name in (*flops.COMPONENTS, "total"):
        assert name in table
    total_row = table.splitlines()[-2].split()
    assert total_row[0] == "total" and total_row[-1] == "100.0%"
    assert float(total_row[3]) == pytest.approx(flops.transformer_flops(cfg, 1, 128)["total"]["total"] / 1e9, abs=1e-3)
