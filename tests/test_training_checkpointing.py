"""Checkpointing strategies on the course GPT: bytes kept, gradients unchanged, recompute FLOPs, helpers."""
import matplotlib.pyplot as plt
import pytest
import torch

from helpers.training import checkpointing as C
from helpers.cost import flops
from helpers.gpt.model import GPT, GPTConfig


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
    saved = C.block_saved_bytes(block, x, autocast)
    terms = C.course_block_terms(cfg, 3, 24, attn=attn, autocast=autocast is not None)
    assert saved["activations"] == sum(terms.values())
    assert (saved["weight_copies"] > 0) == (autocast is not None)  # autocast's 16-bit copies of the weights


def test_korthikanti_formula_and_the_differences_for_the_course_gpt():
    s, b, h, a = 2048, 1, 12288, 96  # GPT-3 175B's layer shape (Korthikanti et al., 2022, table 3)
    assert C.korthikanti_bytes(s, b, h, a) == s * b * h * (34 + 5 * a * s // h)
    cfg = GPTConfig(n_layer=1, n_head=8, d_model=256, d_ff=1024, seq_len=64)
    s, b, h, a = 64, 3, 256, 8
    paper = C.korthikanti_bytes(s, b, h, a)
    no_dropout = paper - 2 * s * b * h - 3 * a * s * s * b  # two residual dropout masks; attention dropout mask + output
    ours = sum(C.course_block_terms(cfg, b, s, attn="naive", autocast=True).values())
    # fp32 LayerNorm inputs (+2sbh each), LN output cast separately for q_proj and kv_proj (+2sbh),
    # fp32 mean and rstd of both LayerNorms (16sb), the (T, T) causal mask (s² bytes)
    assert ours == no_dropout + 6 * s * b * h + 16 * s * b + s * s
    sdpa = sum(C.course_block_terms(cfg, b, s, attn="sdpa", autocast=True).values())
    assert ours - sdpa == 2 * a * s * s * b + s * s - 4 * a * s * b  # probabilities and mask vs log-sum-exp


def test_cuda_autocast_keeps_fp32_probabilities_and_their_copy():
    cfg = GPTConfig(n_layer=1, n_head=8, d_model=256, d_ff=1024, seq_len=64)
    s, b, a = 64, 3, 8
    cpu = sum(C.course_block_terms(cfg, b, s, attn="naive", autocast=True).values())
    cuda = sum(C.course_block_terms(cfg, b, s, attn="naive", autocast=True, device="cuda").values())
    assert cuda - cpu == 4 * a * s * s * b  # softmax in fp32 on CUDA: fp32 P plus its 16-bit copy
    for attn, autocast in (("sdpa", True), ("naive", False)):  # only naive attention under autocast differs
        assert (sum(C.course_block_terms(cfg, b, s, attn=attn, autocast=autocast).values())
                == sum(C.course_block_terms(cfg, b, s, attn=attn, autocast=autocast, device="cuda").values()))


def test_every_strategy_keeps_less_and_gradients_stay_equal():
    torch.manual_seed(0)
    cfg = tiny()
    m = GPT(cfg, attn_impl="naive")
    idx, tgt = batch(cfg)
    ref = C.gradients(m, idx, tgt)
    keys = list(m.state_dict())
    none = C.saved_by(lambda: m(idx, tgt), m.parameters())["activations"]
    for strategy in C.STRATEGIES[1:]:
        C.apply_strategy(m, strategy, k=2)
        kept = C.saved_by(lambda: m(idx, tgt), m.parameters())["activations"]
        assert kept < none, strategy
        grads = C.gradients(m, idx, tgt)
        for name, g in ref.items():
            torch.testing.assert_close(grads[name], g, rtol=1e-6, atol=1e-7, msg=f"{strategy}: {name}")
        assert list(m.state_dict()) == keys  # no wrapper modules: parameter names unchanged
        C.remove_strategy(m)
        assert C.saved_by(lambda: m(idx, tgt), m.parameters())["activations"] == none
        assert m.checkpointed_layers == [] and "forward" not in m.blocks[0].__dict__
    with torch.no_grad():  # without autograd a strategy runs the plain forward
        plain = m(idx)[0]
        for strategy in C.STRATEGIES[1:]:
            C.apply_strategy(m, strategy)
            torch.testing.assert_close(m(idx)[0], plain, rtol=0, atol=0)
    C.remove_strategy(m)


@pytest.mark.parametrize("strategy", ["every", "selective-mlp", "selective-attention"])
def test_dropout_is_replayed_in_recompute(strategy):
    torch.manual_seed(0)
    cfg = tiny(dropout=0.2)
    m = GPT(cfg, attn_impl="naive")
    idx, tgt = batch(cfg)
    torch.manual_seed(1)
    ref = C.gradients(m, idx, tgt)
    C.apply_strategy(m, strategy)
    torch.manual_seed(1)
    grads = C.gradients(m, idx, tgt)
    for name, g in ref.items():
        torch.testing.assert_close(grads[name], g, rtol=1e-6, atol=1e-7, msg=name)


def test_recompute_flops_follow_early_stop():
    torch.manual_seed(0)
    cfg = tiny(n_layer=9)
    m = GPT(cfg, attn_impl="naive")
    idx, tgt = batch(cfg, b=2, t=32)
    layer = flops._per_layer_forward(cfg, 2, 32, causal=False)
    block = sum(layer.values())
    base = C.step_flops(m, idx, tgt)
    assert base["backward"] == flops.transformer_flops(cfg, 2, 32)["total"]["backward"]
    expected = {  # early stop: a checkpointed unit's last matmul output is never needed, so never recomputed
        "every": 9 * (block - layer["mlp_down"]),
        "every-k": 3 * (block - layer["mlp_down"]),  # k=3: blocks 0, 3, 6
        "sqrt-L": 2 * (3 * block - layer["mlp_down"]),  # 3 segments of 3; the last one is not checkpointed
        "selective-attention": 9 * layer["attn_scores"],  # softmax(.)v is the last op: not recomputed
        "selective-mlp": 0,  # GELU is not a matmul; the down projection is skipped by early stop
    }
    for strategy, extra in expected.items():
        C.apply_strategy(m, strategy, k=3)
        assert C.step_flops(m, idx, tgt)["backward"] - base["backward"] == extra, strategy
        C.remove_strategy(m)
    assert [C.recomputed_blocks(9, s, 3) for s in ("none", "every", "every-k", "sqrt-L")] == [0, 9, 3, 6]
    assert C.recomputed_blocks(7, "sqrt-L") == 4  # segments of 7 // 3 = 2 blocks


def test_strategy_validation_and_helpers():
    m = GPT(tiny())
    with pytest.raises(ValueError, match="strategy='all'"):
        C.apply_strategy(m, "all")
    with pytest.raises(ValueError, match="k=0"):
        C.apply_strategy(m, "every-k", k=0)
    assert C.every_k_layers(12, 4) == [0, 4, 8] and C.sqrt_segments(12) == 3 and C.sqrt_segments(1) == 1
    assert C.max_batch(100, 20, 7) == 11 and C.max_batch(10, 20, 7) == 0
    with pytest.raises(ValueError):
        C.max_batch(100, 20, 0)
    points = {"none": (1.0, 10.0), "every": (1.3, 2.0), "bad": (1.4, 5.0), "tie": (1.3, 2.0), "mid": (1.1, 6.0)}
    assert C.pareto_front(points) == ["none", "mid", "every", "tie"]
    fig = C.pareto_figure(points)
    assert len(fig.axes[0].texts) == 5
    plt.close(fig)


def test_measure_strategy_and_panel_change_with_the_controls(capsys):
    torch.manual_seed(0)
    cfg = tiny()
    m = GPT(cfg, attn_impl="naive")
    idx, tgt = batch(cfg)
    base = C.measure_strategy(m, idx, tgt, "none", reps=1, warmup=0)
    assert base["cuda_peak_bytes"] is None  # CPU tensors: no CUDA peak
    every = C.measure_strategy(m, idx, tgt, "every", reps=1, warmup=0)
    assert every["activation_bytes"] < base["activation_bytes"] and m.checkpointed_layers == []
    heights = {}
    for strategy, k in (("every-k", 1), ("every-k", 4), ("selective-mlp", 2)):
        fig = C.strategy_panel(strategy, k, model=m, idx=idx, tgt=tgt, reps=1)
        heights[(strategy, k)] = fig.axes[0].patches[1].get_height()
        assert len(fig.axes[1].containers) == 1 + 2  # the bars, and an error bar (quartiles) on each
        assert fig.axes[0].patches[0].get_height() == pytest.approx(base["activation_bytes"] / 2**20)
        plt.close(fig)
    assert heights[("every-k", 1)] < heights[("every-k", 4)] < base["activation_bytes"] / 2**20
    out = capsys.readouterr().out
    assert "every-k (k=4)" in out and "selective-mlp" in out


def test_activation_model_reproduces_the_measured_bytes():
    torch.manual_seed(0)
    cfg = tiny(n_layer=7)
    m = GPT(cfg, attn_impl="naive")
    idx, tgt = batch(cfg, b=2, t=32)
    x = torch.randn(2, 32, cfg.d_model, requires_grad=True)
    block = C.block_saved_bytes(m.blocks[0], x)["activations"]
    kept = {}
    for s in C.STRATEGIES:
        C.apply_strategy(m, s, k=3)
        kept[s] = C.saved_by(lambda: m(idx, tgt), m.parameters())["activations"]
        C.remove_strategy(m)
    head = kept["none"] - 7 * block
    assert C.checkpointed_units(7, "sqrt-L") == [(0, 1), (2, 3)]  # 3 segments of 7 // 3 = 2; the last takes 3
    for s in C.STRATEGIES:
        sel = (kept[s] - head) // 7 if s.startswith("selective") else None
        est = C.activation_model(7, s, 3, block_bytes=block, input_bytes=x.nbytes, head_bytes=head,
                                 selective_block_bytes=sel)
        assert est["kept"] == kept[s], s
        assert kept[s] <= est["peak"] <= kept["none"], s
    every = C.activation_model(7, "every", block_bytes=block, input_bytes=x.nbytes, head_bytes=head)
    assert every["peak"] == 6 * x.nbytes + block  # rebuilding the last block, with the six inputs before it


def test_selective_exercise_accepts_other_right_answers_and_names_what_is_wrong(capsys):
    """The 04.selective checker must accept any selective recompute, not only the reference's choice."""
    from torch.utils.checkpoint import checkpoint

    from helpers.course import check
    from helpers.gpt.model import naive_attention

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
        return C._mlp_recompute_activation(block.mlp, block.ln_2(x + block.attn(block.ln_1(x))))

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


def test_noise_aware_front_treats_overlapping_spreads_as_ties():
    points = {"none": (1.00, 10.0), "every": (1.40, 1.0), "every-2": (1.20, 5.0), "sqrt-L": (1.18, 4.9),
              "selective": (1.10, 8.0)}
    assert C.pareto_front(points) == ["none", "selective", "sqrt-L", "every"]  # medians alone drop every-2
    wide = {"none": (0.95, 1.05), "every": (1.31, 1.5), "every-2": (1.1, 1.3), "sqrt-L": (1.1, 1.3),
            "selective": (1.04, 1.2)}
    # every-2 and sqrt-L overlap: a tie keeps both; selective overlaps none: neither removes the other
    assert C.pareto_front(points, wide) == ["none", "selective", "sqrt-L", "every-2", "every"]
    beaten = {"none": (0.95, 1.0), "every": (1.31, 1.5), "every-2": (1.21, 1.3), "sqrt-L": (1.1, 1.2),
              "selective": (1.04, 1.09)}
    assert C.dominators(points, beaten)["every-2"] == ["sqrt-L"]  # less memory and its range lies below
    assert C.dominators(points, beaten)["selective"] == []  # faster than all with less memory: not beaten
    assert C.pareto_front(points, beaten) == ["none", "selective", "sqrt-L", "every"]
    narrow = {n: (t * 0.999, t * 1.001) for n, (t, _) in points.items()}
    assert C.pareto_front(points, narrow) == C.pareto_front(points)
    with pytest.raises(ValueError, match="every"):
        C.dominators(points, {**wide, "every": (1.5, 1.3)})
    fig = C.pareto_figure(points, intervals=wide)
    ax = fig.axes[0]
    assert ax.get_xlim()[0] == 0 and ax.get_ylim()[0] == 0  # no truncated axes
    fig.canvas.draw()
    assert ax.get_legend().get_window_extent().x0 >= ax.get_window_extent().x1  # legend outside the data
    assert len(ax.containers) == 5  # one error bar (the quartiles) per point
    plt.close(fig)


def test_rule_verdict_follows_the_numbers():
    def verdict(low, mid, high, flops, added=None):
        return C.rule_verdict(low, mid, high, flops, added)

    above = verdict(0.54, 0.63, 0.83, 0.222, {"total_ms": 10.0, "matmul_ms": 3.6, "other_ms": 6.4,
                                              "top": [("AddmmBackward0", 5.0), ("aten::addmm", 3.0)]})
    assert "exceeded" in above and "64% of the 10.00 ms" in above and "AddmmBackward0" in above
    assert "autograd node" in above and "early stop" in above
    below = verdict(0.20, 0.25, 0.30, 0.28)
    assert "stayed below" in below and "about as much as the counted FLOPs" in below
    tie = verdict(0.30, 0.34, 0.40, 0.34)
    assert "this run matched, within its measured spread, the" in tie and "exceeded" not in tie
    faster = verdict(0.05, 0.10, 0.15, 0.222)
    assert "grew less than the counted FLOPs" in faster


def test_added_self_time_splits_matmuls_from_the_rest():
    from helpers.measure.profiling import Profile

    base = Profile([("aten::mm", 10.0, 4, 0.5), ("aten::gelu", 2.0, 1, 0.1)], "cpu", 2, 20.0)
    other = Profile([("aten::mm", 13.0, 6, 0.4), ("aten::gelu", 4.0, 2, 0.1), ("AddmmBackward0", 5.0, 2, 0.1)],
                    "cpu", 2, 30.0)
    added = C.added_self_time(base, other)
    assert added["total_ms"] == 10.0 and added["matmul_ms"] == 3.0 and added["other_ms"] == 7.0
    assert [n for n, _ in added["top"]] == ["AddmmBackward0", "aten::mm", "aten::gelu"]
    assert C.is_matmul("sm90_xmma_gemm_bf16") and C.is_matmul("aten::bmm") and not C.is_matmul("aten::gelu")
    assert C.is_matmul("nvjet_hsh_128x256_64x4_2x1_v_bz_coopB_TNT")  # cuBLAS's GEMM kernels on Hopper
    assert "+5.00 ms" in C.added_summary("every", added)


def _validate_04(tmp_path, **overrides):
    """Run notebook 04's parameters cell, the overrides, then its validation cell, in a plain namespace."""
    import json
    from pathlib import Path

    nb = Path(__file__).resolve().parent.parent / "notebooks" / "04_activation_checkpointing.ipynb"
    cells = [c for c in json.loads(nb.read_text())["cells"] if c["cell_type"] == "code"]
    ns = {}
    exec("".join(cells[0]["source"]), ns)
    ns.update(RESULTS_DIR=str(tmp_path), INTERACTIVE=False, **overrides)
    exec("".join(cells[1]["source"]), ns)
    return ns


@pytest.mark.parametrize("name, value", [("REPS", 0), ("REPS", -2), ("BATCH", 0), ("N_LAYER", 2.5), ("K", 0),
                                         ("DTYPE", "auto"), ("MODEL", "gpt5"), ("BUDGET_MB", 0),
                                         ("PROFILE_STEPS", 0), ("CPU_THREADS", 0), ("ATTN", "flash")])
def test_notebook_parameters_fail_at_once_naming_the_parameter(tmp_path, name, value):
    with pytest.raises(ValueError, match=name):
        _validate_04(tmp_path, **{name: value})


def test_notebook_parameters_none_means_the_profile_default(tmp_path):
    threads = torch.get_num_threads()
    try:
        ns = _validate_04(tmp_path, PROFILE="smoke")
    finally:
        torch.set_num_threads(threads)
    assert (ns["MODEL"], ns["N_LAYER"], ns["BATCH"], ns["SEQ_LEN"], ns["REPS"], ns["PROFILE_STEPS"]) == \
        ("tiny", 4, 4, 64, 10, 2)
    assert ns["BUDGET_MB"] == 48.0 and ns["DTYPE"] == ("fp32" if not torch.cuda.is_available() else ns["HALF"])


def test_cuda_batch_fit_fits_a_line_confirms_and_survives_out_of_memory(monkeypatch, capsys):
    """The logic of the CUDA-only section, with the allocator's peak replaced by a known linear law."""
    cfg = tiny(n_layer=1)
    models = {"none": GPT(cfg), "every": GPT(cfg)}
    n_params = sum(p.numel() for p in models["none"].parameters())
    per = {id(models["none"]): 400, id(models["every"]): 100}  # bytes per sample

    def fake_peak(model, idx, tgt, autocast=None, others=()):
        if idx.shape[0] > 50 and model is models["every"]:
            raise torch.cuda.OutOfMemoryError("fake")
        return 1_000 + per[id(model)] * idx.shape[0]

    monkeypatch.setattr(C, "cuda_step_peak", fake_peak)
    idx, tgt = batch(cfg, b=4, t=8)
    tokens = torch.randint(0, cfg.vocab_size, (1000,))
    budget = 1_000 + 8 * n_params + 10_000
    fit = C.cuda_batch_fit(models, idx, tgt, tokens, autocast=None, budget=budget)
    assert fit["none"]["cuda_per_sample"] == 400 and fit["every"]["cuda_per_sample"] == 100
    assert fit["none"]["max_batch_cuda"] == 25 and fit["every"]["max_batch_cuda"] == 100
    assert fit["none"]["confirmed_peak"] == 1_000 + 400 * 25 + 8 * n_params <= budget
    assert "confirmed_peak" not in fit["every"]
    out = capsys.readouterr().out
    assert "none: batch 25 ran" in out and "every: batch 100 ran out of memory" in out
