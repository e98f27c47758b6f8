"""helpers.training.checkpointing: bytes kept term by term, every strategy with gradients unchanged,
recompute FLOPs with early stop, the activation model, and exercise 04.selective."""
import pytest
import torch
from torch.utils.checkpoint import checkpoint

from helpers.course import check
from helpers.cost import flops
from helpers.gpt.model import GPT, GPTConfig, naive_attention
from helpers.training import checkpointing, checkpointing_lab


def tiny(**overrides) -> GPTConfig:
    return GPTConfig.preset("tiny", **{"n_layer": 4, "seq_len": 32, **overrides})


def batch(cfg, b=2, t=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(0, cfg.vocab_size, (b, t), generator=g), torch.randint(0, cfg.vocab_size, (b, t), generator=g))


@pytest.mark.parametrize("attn", ["naive", "sdpa"])
@pytest.mark.parametrize("autocast", [None, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("overrides", [dict(), dict(n_kv_head=2, d_ff=384)], ids=["mha", "gqa"])
def test_block_bytes_equal_the_term_by_term_count(attn, autocast, overrides):
    torch.manual_seed(0)
    cfg = tiny(**overrides)
    block = GPT(cfg, attn_impl=attn).blocks[0]
    x = torch.randn(3, 24, cfg.d_model, requires_grad=True)
    saved = checkpointing_lab.block_saved_bytes(block, x, autocast)
    terms = checkpointing.course_block_terms(cfg, 3, 24, attn=attn, autocast=autocast is not None)
    assert saved["activations"] == sum(terms.values())
    assert (saved["weight_copies"] > 0) == (autocast is not None)  # autocast's 16-bit copies of the weights


def test_korthikanti_formula_and_the_differences_for_the_course_gpt():
    s, b, h, a = 2048, 1, 12288, 96  # GPT-3 175B's layer shape (Korthikanti et al., 2022, table 3)
    assert checkpointing.korthikanti_bytes(s, b, h, a) == s * b * h * (34 + 5 * a * s // h)
    cfg = GPTConfig(n_layer=1, n_head=8, d_model=256, d_ff=1024, seq_len=64)
    s, b, h, a = 64, 3, 256, 8
    paper = checkpointing.korthikanti_bytes(s, b, h, a)
    no_dropout = paper - 2 * s * b * h - 3 * a * s * s * b  # two residual dropout masks; attention dropout mask + output
    ours = sum(checkpointing.course_block_terms(cfg, b, s, attn="naive", autocast=True).values())
    # fp32 LayerNorm inputs (+2sbh each), LN output cast separately for q_proj and kv_proj (+2sbh),
    # fp32 mean and rstd of both LayerNorms (16sb), the (T, T) causal mask (s² bytes)
    assert ours == no_dropout + 6 * s * b * h + 16 * s * b + s * s
    sdpa = sum(checkpointing.course_block_terms(cfg, b, s, attn="sdpa", autocast=True).values())
    assert ours - sdpa == 2 * a * s * s * b + s * s - 4 * a * s * b  # probabilities and mask vs log-sum-exp


def test_cuda_autocast_keeps_fp32_probabilities_and_their_copy():
    cfg = GPTConfig(n_layer=1, n_head=8, d_model=256, d_ff=1024, seq_len=64)
    s, b, a = 64, 3, 8
    cpu = sum(checkpointing.course_block_terms(cfg, b, s, attn="naive", autocast=True).values())
    cuda = sum(checkpointing.course_block_terms(cfg, b, s, attn="naive", autocast=True, device="cuda").values())
    assert cuda - cpu == 4 * a * s * s * b  # softmax in fp32 on CUDA: fp32 P plus its 16-bit copy
    for attn, autocast in (("sdpa", True), ("naive", False)):  # only naive attention under autocast differs
        assert (sum(checkpointing.course_block_terms(cfg, b, s, attn=attn, autocast=autocast).values())
                == sum(checkpointing.course_block_terms(cfg, b, s, attn=attn, autocast=autocast, device="cuda").values()))


@pytest.mark.slow
def test_every_strategy_keeps_less_and_gradients_stay_equal():
    torch.manual_seed(0)
    cfg = tiny()
    m = GPT(cfg, attn_impl="naive")
    idx, tgt = batch(cfg)
    ref = checkpointing_lab.gradients(m, idx, tgt)
    keys = list(m.state_dict())
    none = checkpointing_lab.saved_by(lambda: m(idx, tgt), m.parameters())["activations"]
    for strategy in checkpointing.STRATEGIES[1:]:
        checkpointing.apply_strategy(m, strategy, k=2)
        kept = checkpointing_lab.saved_by(lambda: m(idx, tgt), m.parameters())["activations"]
        assert kept < none, strategy
        grads = checkpointing_lab.gradients(m, idx, tgt)
        for name, g in ref.items():
            torch.testing.assert_close(grads[name], g, rtol=1e-6, atol=1e-7, msg=f"{strategy}: {name}")
        assert list(m.state_dict()) == keys  # no wrapper modules: parameter names unchanged
        checkpointing.remove_strategy(m)
        assert checkpointing_lab.saved_by(lambda: m(idx, tgt), m.parameters())["activations"] == none
        assert m.checkpointed_layers == [] and "forward" not in m.blocks[0].__dict__
    with torch.no_grad():  # without autograd a strategy runs the plain forward
        plain = m(idx)[0]
        for strategy in checkpointing.STRATEGIES[1:]:
            checkpointing.apply_strategy(m, strategy)
            torch.testing.assert_close(m(idx)[0], plain, rtol=0, atol=0)
    checkpointing.remove_strategy(m)


@pytest.mark.parametrize("strategy", ["every", "selective-mlp", "selective-attention"])
def test_dropout_is_replayed_in_recompute(strategy):
    torch.manual_seed(0)
    cfg = tiny(dropout=0.2)
    m = GPT(cfg, attn_impl="naive")
    idx, tgt = batch(cfg)
    torch.manual_seed(1)
    ref = checkpointing_lab.gradients(m, idx, tgt)
    checkpointing.apply_strategy(m, strategy)
    torch.manual_seed(1)
    grads = checkpointing_lab.gradients(m, idx, tgt)
    for name, g in ref.items():
        torch.testing.assert_close(grads[name], g, rtol=1e-6, atol=1e-7, msg=name)


def test_recompute_flops_follow_early_stop():
    torch.manual_seed(0)
    cfg = tiny(n_layer=9)
    m = GPT(cfg, attn_impl="naive")
    idx, tgt = batch(cfg, b=2, t=32)
    layer = flops.per_layer_forward(cfg, 2, 32, is_causal=False)
    block = sum(layer.values())
    base = checkpointing_lab.step_flops(m, idx, tgt)
    assert base["backward"] == flops.transformer_flops(cfg, 2, 32)["total"]["backward"]
    expected = {  # early stop: a checkpointed unit's last matmul output is never needed, so never recomputed
        "every": 9 * (block - layer["mlp_down"]),
        "every-k": 3 * (block - layer["mlp_down"]),  # k=3: blocks 0, 3, 6
        "sqrt-L": 2 * (3 * block - layer["mlp_down"]),  # 3 segments of 3; the last one is not checkpointed
        "selective-attention": 9 * layer["attn_scores"],  # softmax(.)v is the last op: not recomputed
        "selective-mlp": 0,  # GELU is not a matmul; the down projection is skipped by early stop
    }
    for strategy, extra in expected.items():
        checkpointing.apply_strategy(m, strategy, k=3)
        assert checkpointing_lab.step_flops(m, idx, tgt)["backward"] - base["backward"] == extra, strategy
        checkpointing.remove_strategy(m)
    assert [checkpointing.recomputed_blocks(9, s, 3) for s in ("none", "every", "every-k", "sqrt-L")] == [0, 9, 3, 6]
    assert checkpointing.recomputed_blocks(7, "sqrt-L") == 4  # segments of 7 // 3 = 2 blocks


def test_strategy_validation_and_helpers():
    m = GPT(tiny())
    with pytest.raises(ValueError, match="strategy='all'"):
        checkpointing.apply_strategy(m, "all")
    with pytest.raises(ValueError, match="k=0"):
        checkpointing.apply_strategy(m, "every-k", k=0)
    assert checkpointing.every_k_layers(12, 4) == [0, 4, 8] and checkpointing.sqrt_segments(12) == 3 and checkpointing.sqrt_segments(1) == 1
    assert checkpointing.max_batch(100, 20, 7) == 11 and checkpointing.max_batch(10, 20, 7) == 0
    with pytest.raises(ValueError, match="per_sample_bytes"):
        checkpointing.max_batch(100, 20, 0)


def test_activation_model_reproduces_the_measured_bytes():
    torch.manual_seed(0)
    cfg = tiny(n_layer=7)
    m = GPT(cfg, attn_impl="naive")
    idx, tgt = batch(cfg, b=2, t=32)
    x = torch.randn(2, 32, cfg.d_model, requires_grad=True)
    block = checkpointing_lab.block_saved_bytes(m.blocks[0], x)["activations"]
    kept = {}
    for s in checkpointing.STRATEGIES:
        checkpointing.apply_strategy(m, s, k=3)
        kept[s] = checkpointing_lab.saved_by(lambda: m(idx, tgt), m.parameters())["activations"]
        checkpointing.remove_strategy(m)
    head = kept["none"] - 7 * block
    assert checkpointing.checkpointed_units(7, "sqrt-L") == [(0, 1), (2, 3)]  # 3 segments of 7 // 3 = 2; the last takes 3
    for s in checkpointing.STRATEGIES:
        sel = (kept[s] - head) // 7 if s.startswith("selective") else None
        est = checkpointing.activation_model(7, s, 3, block_bytes=block, input_bytes=x.nbytes, head_bytes=head,
                                 selective_block_bytes=sel)
        assert est["kept"] == kept[s], s
        assert kept[s] <= est["peak"] <= kept["none"], s
    every = checkpointing.activation_model(7, "every", block_bytes=block, input_bytes=x.nbytes, head_bytes=head)
    assert every["peak"] == 6 * x.nbytes + block  # rebuilding the last block, with the six inputs before it


def test_selective_exercise_accepts_other_right_answers_and_names_what_is_wrong(capsys):
    """The 04.selective checker must accept any selective recompute, not only the reference's choice."""


    def attention_kernel_recomputed(block, x):  # Korthikanti et al.'s choice: the T×T scores are rebuilt
        a = block.attn
        B, T, _ = x.shape
        h = block.ln_1(x)
        q = a.q_proj(h).view(B, T, a.n_head, a.head_dim).transpose(1, 2)
        k, v = a.kv_proj(h).view(B, T, 2, a.n_kv_head, a.head_dim).permute(2, 0, 3, 1, 4)
        k = k.repeat_interleave(a.n_head // a.n_kv_head, dim=1)
        v = v.repeat_interleave(a.n_head // a.n_kv_head, dim=1)
        y = checkpoint(naive_attention, q, k, v, True, use_reentrant=False)
        x = x + a.resid_drop(a.out_proj(y.transpose(1, 2).reshape(B, T, -1)))
        return x + block.mlp(block.ln_2(x))

    def forgot_the_residual(block, x):
        return checkpointing.mlp_recompute_activation(block.mlp, block.ln_2(x + block.attn(block.ln_1(x))))

    def unwritten(block, x):
        ...

    check.exercise("04.selective", attention_kernel_recomputed)
    assert capsys.readouterr().out.startswith("PASS")
    check.exercise("04.selective", forgot_the_residual)
    out = capsys.readouterr().out
    assert out.startswith("FAIL") and "case 1/5" in out and "['output']" in out
    check.exercise("04.selective", unwritten)
    assert capsys.readouterr().out.startswith("TODO")
    check.exercise("04.selective", lambda block, x: checkpoint(type(block).forward, block, x, use_reentrant=False))
    out = capsys.readouterr().out
    assert "recomputes" in out and "of forward FLOPs" in out  # whole block: right gradients, not selective


def test_activation_crossover_is_where_the_formula_meets_the_weights():
    h, a, weight_bytes = 768, 12, 2 * 12 * 768**2
    s = checkpointing.activation_crossover(h, a, weight_bytes)
    assert 34 * s * h + 5 * a * s * s == pytest.approx(weight_bytes)
    assert checkpointing.korthikanti_bytes(int(s), 1, h, a) < weight_bytes < checkpointing.korthikanti_bytes(int(s) + 1, 1, h, a)
    assert checkpointing.activation_crossover(h, a, weight_bytes, b=4) < s  # a larger micro-batch crosses earlier
    with pytest.raises(ValueError, match="layer_param_bytes"):
        checkpointing.activation_crossover(h, a, 0)
