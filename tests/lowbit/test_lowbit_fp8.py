"""helpers.lowbit.fp8: formats, casts, every recipe's scales on hand-made tensors, the layer against torchao."""
import copy
import math

import pytest
import torch

from helpers.lowbit import fp8
from helpers.gpt.model import GPT, GPTConfig

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


def test_scaled_mm_and_emulation_agree():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(33, 64, generator=g), torch.randn(64, 48, generator=g)
    (qa, sa), (qb, sb) = fp8.tensorwise(a), fp8.tensorwise(b)
    real = fp8.scaled_mm(qa, qb, sa.reciprocal(), sb.reciprocal())
    emu = fp8.scaled_mm(qa, qb, sa.reciprocal(), sb.reciprocal(), emulate=True)
    torch.testing.assert_close(real, emu, rtol=1e-5, atol=1e-5)  # fp32 accumulation order only


def test_a_refused_unaligned_product_does_not_send_aligned_ones_to_the_emulation(monkeypatch):
    # CUDA's _scaled_mm refuses K or N not a multiple of 16 (a batch of 200 tokens makes dW's K = 200): that
    # refusal must stay with such shapes, not turn every later fp8 product of the process into the emulation
    real, native, tried = torch._scaled_mm, [], []

    def like_cuda(a, b, **kw):
        tried.append(tuple(a.shape))
        if not fp8.mm_aligned(a.shape, b.shape):
            raise RuntimeError("Expected self.size(1) to be divisible by 16, but got self.size(1)=40")
        native.append(tuple(a.shape))
        return real(a, b, **kw)

    monkeypatch.setattr(torch, "_scaled_mm", like_cuda)
    monkeypatch.setattr(fp8, "_SCALED_MM_REFUSED", {})
    g = torch.Generator().manual_seed(0)
    assert fp8.mm_aligned((200, 64), (64, 32)) and not fp8.mm_aligned((32, 200), (200, 64))
    assert not fp8.mm_aligned((16, 64), (64, 40))
    for k in (40, 64, 40, 48):  # unaligned, aligned, unaligned again, aligned
        (qa, sa), (qb, sb) = fp8.tensorwise(torch.randn(16, k, generator=g)), fp8.tensorwise(torch.randn(k, 32, generator=g))
        got = fp8.scaled_mm(qa, qb, sa.reciprocal(), sb.reciprocal())
        torch.testing.assert_close(got, fp8.scaled_mm(qa, qb, sa.reciprocal(), sb.reciprocal(), emulate=True),
                                   rtol=1e-5, atol=1e-5)
    assert native == [(16, 64), (16, 48)]  # both aligned products ran natively
    assert tried == [(16, 40), (16, 64), (16, 48)]  # the unaligned shape was tried once, then emulated
    assert fp8.scaled_mm_refusal("cpu", rowwise=False) is None
    assert "divisible by 16" in fp8.scaled_mm_refusal("cpu", rowwise=False, aligned=False)


def test_blockwise_mm_equals_float64_reference_of_the_same_operands():
    g = torch.Generator().manual_seed(1)
    a, w = torch.randn(40, 300, generator=g), torch.randn(150, 300, generator=g)
    a[3, 10] = 200.0
    (qa, sa), (qw, sw) = fp8.blockwise(a, (1, 128)), fp8.blockwise(w, (128, 128))
    got = fp8.blockwise_mm(qa, sa, qw, sw)
    a64 = qa.double() / fp8.expand_scale(sa.double(), (1, 128), a.shape)
    w64 = qw.double() / fp8.expand_scale(sw.double(), (128, 128), w.shape)
    torch.testing.assert_close(got.double(), a64 @ w64.t(), rtol=1e-5, atol=1e-5)  # fp32 sums of 128 products
    assert fp8.BLOCKWISE_PATH[("cpu", 128)].startswith("emulated: ")  # the path taken is reported, with why


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


def _pair(recipe, in_f=64, out_f=48, seed=0):
    torch.manual_seed(seed)
    lin = torch.nn.Linear(in_f, out_f)
    ref = torch.nn.Sequential(copy.deepcopy(lin))
    fp8.torchao_convert(ref, recipe)
    return fp8.Float8Linear.from_linear(copy.deepcopy(lin), recipe), ref


def _skip_unless_torchao_runs(recipe, device="cpu"):
    why = fp8.torchao_problem(recipe, device)
    if why:
        pytest.skip(why)


def test_torchao_problem_probes_each_recipe_once_and_says_why_in_one_sentence(monkeypatch):
    with pytest.raises(ValueError, match="recipe"):
        fp8.torchao_problem("delayed")
    if fp8.import_torchao()[0] is None:
        assert fp8.torchao_problem("tensorwise") == fp8.import_torchao()[1].rstrip(".") + "."
        return
    for recipe in fp8.TORCHAO_RECIPES:  # whatever this torch says, it is None or one sentence, and cached
        why = fp8.torchao_problem(recipe, "cpu")
        assert why is None or (why.startswith(f"torchao's {recipe} recipe") and why.endswith(".")), why
        assert fp8.torchao_problem(recipe, torch.device("cpu")) is why
    calls = []

    def refuse(model, recipe, skip=("lm_head",)):  # as torch 2.11's CPU _scaled_mm refuses rowwise scales
        calls.append(recipe)
        raise RuntimeError('(scale_a.numel() == 1) INTERNAL ASSERT FAILED at "Blas.cpp":249, please report a bug '
                           "to PyTorch. Now _scaled_mm only supports per-tensor scaling for CPU backend\nmore")
    monkeypatch.setattr(fp8, "_TORCHAO_PROBLEMS", {})
    monkeypatch.setattr(fp8, "torchao_convert", refuse)
    why = fp8.torchao_problem("rowwise", "cpu")
    assert why == (f"torchao's rowwise recipe does not run on cpu with torch {torch.__version__}, which raises "
                   "RuntimeError: Now _scaled_mm only supports per-tensor scaling for CPU backend.")
    assert fp8.torchao_problem("rowwise", "cpu") == why and calls == ["rowwise"]  # probed once


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_float8_linear_matches_torchao(recipe):
    _skip_unless_torchao_runs(recipe)
    ours, ref = _pair(recipe)
    x = torch.randn(2, 24, 64) * 3
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    y1, y2 = ours(x1), ref(x2)
    assert torch.equal(y1, y2)  # forward: bit for bit on a CPU
    g = torch.randn_like(y1)
    y1.backward(g), y2.backward(g)
    tol = dict(rtol=1e-5, atol=1e-6)  # the same recipe: only accumulation order may differ
    torch.testing.assert_close(x1.grad, x2.grad, **tol)
    torch.testing.assert_close(ours.weight.grad, ref[0].weight.grad, **tol)
    torch.testing.assert_close(ours.bias.grad, ref[0].bias.grad, **tol)


@pytest.mark.parametrize("recipe", fp8.RECIPES)
def test_float8_linear_close_to_fp32(recipe):
    torch.manual_seed(3)
    lin = torch.nn.Linear(144, 80)
    ours = fp8.Float8Linear.from_linear(copy.deepcopy(lin), recipe)
    x = torch.randn(5, 30, 144)
    y = ours(x)
    rel = (y - lin(x)).norm() / lin(x).norm()
    assert rel < 0.08, rel  # e4m3 keeps 3 mantissa bits: a few % per operand


def test_convert_skips_lm_head_and_odd_shapes():
    cfg = GPTConfig(n_layer=1, n_head=2, d_model=32, d_ff=40, seq_len=16)
    model = GPT(cfg)
    report = fp8.convert_to_float8(model, "tensorwise", module_filter=lambda m, name: "q_proj" not in name)
    assert report["skipped"] == {"lm_head": "LM head", "blocks.0.attn.q_proj": "refused by module_filter",
                                 "blocks.0.mlp.up": "32x40 not multiples of 16",
                                 "blocks.0.mlp.down": "40x32 not multiples of 16"}
    assert report["converted"] == ["blocks.0.attn.kv_proj", "blocks.0.attn.out_proj"]
    assert isinstance(model.blocks[0].attn.out_proj, fp8.Float8Linear)
    assert type(model.lm_head) is torch.nn.Linear
    with pytest.raises(ValueError, match="recipe"):
        fp8.convert_to_float8(model, "fp4")


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_gpt_loss_and_grads_close_to_torchao(recipe):
    _skip_unless_torchao_runs(recipe)
    torch.manual_seed(0)
    base = GPT(GPTConfig.preset("tiny"))
    idx = torch.randint(0, 256, (2, 32))
    ours, ref = copy.deepcopy(base), copy.deepcopy(base)
    fp8.convert_to_float8(ours, recipe)
    fp8.torchao_convert(ref, recipe)
    l1, l2 = ours(idx, idx)[1], ref(idx, idx)[1]
    l1.backward(), l2.backward()
    assert abs(l1.item() - l2.item()) < 1e-5
    for (n, p1), p2 in zip(ours.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p1.grad, p2.grad, rtol=1e-4, atol=1e-6, msg=n)


# ---------------------------------------------------------------- notebook 07's measurements (helpers.lowbit.fp8_lab)

from helpers.lowbit import fp8_lab  # noqa: E402


def _acts(seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(32, 256, generator=g) * torch.exp2(torch.randn(32, 1, generator=g))


def test_planted_outlier_is_left_out_of_the_error_and_the_order_appears():
    x = _acts()
    planted = fp8_lab.plant_outlier(x, 2.0 ** 14)
    mask = planted != x
    assert mask.sum() == 4 and mask[::8, 7].all()  # one channel, every eighth row
    rows = {r["recipe"]: r for r in fp8_lab.error_rows({"p": planted}, masks={"p": mask})}
    assert rows["tensorwise"]["row_rel_error"] > rows["rowwise"]["row_rel_error"] > rows["blockwise"]["row_rel_error"]
    sweep = fp8_lab.outlier_sweep(x, [0, 14])
    assert sweep["tensorwise"][1] > 2 * sweep["tensorwise"][0]  # a large outlier costs the rest dearly
    with pytest.raises(ValueError, match="magnitude"):
        fp8_lab.plant_outlier(x, 0.0)


def test_delayed_scaling_overflows_at_a_spike_that_current_scaling_absorbs():
    rows = fp8_lab.delayed_vs_current(_acts(), [1.0, 1.0, 16.0, 1.0, 2.0 ** -12, 2.0 ** -12], history_len=2)
    assert [r["current"]["overflow"] for r in rows] == [0] * 6
    assert rows[2]["delayed max"]["overflow"] > 0 and rows[1]["delayed max"]["overflow"] == 0
    # after the fall, 'max' still remembers the spike's neighbours one step longer than 'most_recent'
    assert rows[5]["delayed max"]["underflow"] >= rows[5]["delayed most_recent"]["underflow"]
    assert rows[4]["delayed most_recent"]["underflow"] > rows[4]["current"]["underflow"]


def test_quant_panel_is_a_plain_callback(capsys):
    import matplotlib

    matplotlib.use("Agg")
    x = _acts(1)
    a = fp8_lab.quant_panel("blockwise", 64, 12, x=x)
    b = fp8_lab.quant_panel("tensorwise", 64, 12, x=x)
    out = capsys.readouterr().out
    assert "recipe=blockwise, block=64 (tiles of 1x64), log2_outlier=12" in out
    assert "recipe=tensorwise, block=64 (one scale per tensor), log2_outlier=12" in out
    assert b["row_rel_error"] > a["row_rel_error"]


def test_training_sentences_state_the_measured_gap():
    res = {"fp32": {"losses": [3.0, 2.0], "val_loss": 2.5}, "ours rowwise": {"losses": [3.0, 2.1], "val_loss": 2.6}}
    (line,) = fp8_lab.training_sentences(res, 1)
    assert "2.1000, +0.1000 vs fp32" in line and "validation 2.6000, +0.1000 (+4.00%)" in line


def test_the_baseline_comes_first_and_names_the_sentences():
    assert fp8_lab.train_variants("bf16")[0] == "bf16" and fp8_lab.train_variants("fp32")[1:] == fp8_lab.TRAIN_VARIANTS[1:]
    with pytest.raises(ValueError, match="baseline"):
        fp8_lab.train_variants("fp16")
    res = {"bf16": {"losses": [3.0, 2.0], "val_loss": 2.5}, "ours rowwise": {"losses": [3.0, 2.1], "val_loss": 2.6}}
    assert "vs bf16" in fp8_lab.training_sentences(res, 1)[0]


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_float8_linear_follows_autocast_like_a_linear(recipe):
    torch.manual_seed(0)
    lin = torch.nn.Linear(32, 48)
    f8 = fp8.Float8Linear.from_linear(copy.deepcopy(lin), recipe)
    x = torch.randn(5, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, ref = f8(x), lin(x)
    assert y.dtype == ref.dtype == torch.bfloat16  # the output in the autocast dtype, as F.linear's
    assert torch.equal(y, f8(x.to(torch.bfloat16)))  # the same as casting the input by hand
    assert f8(x).dtype == torch.float32  # and no cast outside autocast


def test_training_under_bf16_autocast_keeps_fp32_master_weights():
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("tiny", n_layer=1))
    fp8.convert_to_float8(model, "rowwise")
    batches = [(torch.randint(0, 256, (2, 16)), torch.randint(0, 256, (2, 16))) for _ in range(2)]
    out = fp8_lab.train(model, batches, batches[:1], lr=1e-3, autocast=torch.bfloat16)
    assert len(out["losses"]) == 2 and all(math.isfinite(v) for v in out["losses"] + [out["val_loss"]])
    assert all(p.dtype == torch.float32 and p.grad is not None for p in model.parameters() if p.requires_grad)


@pytest.mark.notebook
def test_notebook_07_rejects_a_bad_outlier_at_once(tmp_path):
    import papermill as pm

    from tests.test_course_notebooks import NOTEBOOKS, _execute

    path = next(p for p in NOTEBOOKS if p.stem.startswith("07"))
    with pytest.raises(pm.PapermillExecutionError) as err:
        _execute(path, tmp_path, OUTLIER=0)
    assert err.value.ename == "ValueError" and "OUTLIER=0" in err.value.evalue


def test_gpt_steps_times_every_variant_or_says_why():
    torch.manual_seed(0)
    base = GPT(GPTConfig(n_layer=1, n_head=2, d_model=32, d_ff=64, seq_len=16))
    x = torch.randint(0, 256, (2, 16))
    out = fp8_lab.gpt_steps(base, x, x, reps=1, compile=False, with_torchao=False)
    assert out["failed"] == [] and out["skipped"] == {} and set(out) == {"failed", "skipped", "bf16", "ours rowwise"}
    assert all(out[v] > 0 for v in ("bf16", "ours rowwise"))
    assert next(base.parameters()).dtype == torch.float32  # the base model is left as it was


def test_gpt_steps_compiles_each_block_not_the_whole_model(monkeypatch):
    compiled = []
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, *a, **k: compiled.append(type(self).__name__))
    monkeypatch.setattr(torch, "compile", lambda *a, **k: pytest.fail("the whole model was compiled"))
    base = GPT(GPTConfig(n_layer=2, n_head=2, d_model=32, d_ff=64, seq_len=16))
    x = torch.randint(0, 256, (2, 16))
    out = fp8_lab.gpt_steps(base, x, x, reps=1, compile=True, with_torchao=False)
    assert out["failed"] == [] and out["bf16"] > 0 and out["ours rowwise"] > 0
    assert compiled == ["Block"] * 4  # two blocks in each of the two variants


def test_gpt_steps_skips_just_the_torchao_recipe_that_cannot_run(monkeypatch):
    if fp8.import_torchao()[0] is None:
        pytest.skip(fp8.import_torchao()[1])
    why = "torchao's rowwise recipe does not run on cpu here."
    monkeypatch.setattr(fp8, "_TORCHAO_PROBLEMS", {("rowwise", "cpu"): why})
    torch.manual_seed(0)
    base = GPT(GPTConfig(n_layer=1, n_head=2, d_model=32, d_ff=64, seq_len=16))
    x = torch.randint(0, 256, (2, 16))
    out = fp8_lab.gpt_steps(base, x, x, reps=1, compile=False, with_torchao=True)
    assert out["skipped"] == {"torchao rowwise": why} and "torchao rowwise" not in out
    assert out["bf16"] > 0 and out["ours rowwise"] > 0


def test_linear_profile_attributes_time_to_ops(tmp_path):
    prof = fp8_lab.linear_profile(64, "rowwise", "cpu", trace_dir=tmp_path, top=30)
    ops = [row[0] for row in prof.rows]
    refused = fp8.scaled_mm_refusal("cpu")  # torch 2.11's CPU _scaled_mm takes per-tensor scales only
    sentences = fp8_lab.profile_sentences(prof, 64)
    if refused:  # the forward's rowwise product is the fp32 emulation: an aten::mm, said so in a sentence
        assert "aten::mm" in ops and len(sentences) == 2 and "emulated" in sentences[1] and refused.rstrip(".") in sentences[1]
    else:
        assert any("scaled_mm" in op for op in ops) and len(sentences) == 1 and "fp8 matmuls" in sentences[0]
    assert prof.trace_path.exists()
    assert 0.0 <= fp8_lab.cast_share(prof) < 1.0
    assert f"{fp8_lab.cast_share(prof):.0%} of the profiled CPU time" in sentences[0]


def test_compiled_linears_each_get_their_graph_past_dynamos_recompile_limit(monkeypatch):
    # every compiled module shares Dynamo's recompile limit: without a reset per layer, those past it run eagerly
    graphs, real = [], torch.compile

    def counting(gm, example_inputs):
        graphs.append(len(gm.graph.nodes))
        return gm.forward
    monkeypatch.setattr(torch, "compile", lambda model: real(model, backend=counting))  # Dynamo only: cheap
    sizes = range(16, 16 * (torch._dynamo.config.recompile_limit + 3), 16)
    for n in sizes:
        assert fp8_lab.linear_tflops(n, "bf16", reps=1, compile=True, device="cpu") > 0
    assert len(graphs) == len(sizes)
    torch._dynamo.reset()


def test_speed_sweep_leaves_out_just_the_torchao_recipe_that_cannot_run(monkeypatch):
    why = "torchao's rowwise recipe does not run on cuda here."
    monkeypatch.setattr(fp8, "_TORCHAO_PROBLEMS", {("rowwise", "cuda"): why, ("tensorwise", "cuda"): None})
    monkeypatch.setattr(fp8_lab, "matmul_tflops", lambda n, kind, reps: float(n))  # no GPU needed: the bookkeeping only
    monkeypatch.setattr(fp8_lab, "linear_tflops", lambda n, variant, reps, compile: n / 2)
    out = fp8_lab.speed_sweep([64, 128], 1, True, False)
    assert out["skipped"] == {"torchao rowwise": why} and out["failed"] == []
    assert list(out["linear"]) == ["bf16", "ours tensorwise", "ours rowwise", "torchao tensorwise"]
    assert out["linear"]["torchao tensorwise"] == [32.0, 64.0] and out["matmul"]["rowwise"] == [64.0, 128.0]
    without = fp8_lab.speed_sweep([64], 1, False, False)
    assert without["skipped"] == {} and not any(v.startswith("torchao") for v in without["linear"])


def _tiny_batches(n=2):
    g = torch.Generator().manual_seed(0)
    return [(torch.randint(0, 256, (2, 16), generator=g), torch.randint(0, 256, (2, 16), generator=g)) for _ in range(n)]


@pytest.mark.parametrize("recipe", ["tensorwise", "delayed", "rowwise"])
def test_our_emulated_training_matches_the_scaled_mm_path(recipe):
    # where torch._scaled_mm runs (the CPU), emulating it changes no bit with rowwise's power-of-two scales,
    # and at most fp32 rounding where a scale is not a power of two
    if fp8.scaled_mm_refusal("cpu", rowwise=recipe == "rowwise"):
        pytest.skip("torch._scaled_mm refuses these scales on this CPU")
    torch.manual_seed(0)
    base = GPT(GPTConfig.preset("tiny", n_layer=1))
    runs = [fp8_lab.train(fp8_lab.make_variant(base, f"ours {recipe}", emulate=e)[0], _tiny_batches(), _tiny_batches(1),
                          lr=1e-3, emulate=e) for e in (False, True)]
    if recipe == "rowwise":
        assert runs[0] == runs[1]
    else:
        assert runs[0]["losses"] + [runs[0]["val_loss"]] == pytest.approx(runs[1]["losses"] + [runs[1]["val_loss"]],
                                                                         rel=1e-5, abs=0)


def test_torchao_emulate_option_is_set_and_trains():
    _skip_unless_torchao_runs("rowwise")
    torch.manual_seed(0)
    model, _ = fp8_lab.make_variant(GPT(GPTConfig.preset("tiny", n_layer=1)), "torchao rowwise", emulate=True)
    converted = [m for m in model.modules() if type(m).__name__ == "Float8Linear"]
    assert converted and all(m.config.emulate for m in converted)
    out = fp8_lab.train(model, _tiny_batches(), _tiny_batches(1), lr=1e-3, emulate=True)
    assert all(math.isfinite(v) for v in out["losses"] + [out["val_loss"]])


def test_reference_kernel_cost_times_both_paths_or_says_none(monkeypatch):
    cost = fp8_lab.reference_kernel_cost(32, 64, 48, reps=2)
    if fp8.scaled_mm_refusal("cpu", rowwise=False):
        assert cost is None
    else:
        assert len(cost["scaled_mm"].samples) == len(cost["emulated"].samples) == 2
        assert cost["ratio"].value == pytest.approx(cost["scaled_mm"].median / cost["emulated"].median)
    monkeypatch.setitem(fp8._SCALED_MM_REFUSED, ("cpu", False, fp8.E4M3, fp8.E4M3, True), "refused.")
    assert fp8_lab.reference_kernel_cost(32, 64, 48, reps=2) is None


def test_mx_clipped_blocks_counts_the_blocks_whose_top_the_floor_rule_clamps():
    x = torch.ones(2, 64)
    x[0, 0], x[0, 40], x[1, 3] = 1.9, 1.8, 0.0  # 1.9: mantissa past 1.8125, clamped; 1.8: rounds to 448
    assert fp8_lab.mx_clipped_blocks(x) == (1, 4)
    assert fp8_lab.mx_clipped_blocks(torch.zeros(1, 32)) == (0, 0)


def test_the_matmul_headline_is_timed_by_the_protocol():
    # on a CPU torch._scaled_mm runs its reference kernel: slow, but the protocol's bookkeeping is the same
    if fp8.scaled_mm_refusal("cpu", rowwise=False):
        pytest.skip("torch._scaled_mm refuses per-tensor scales on this CPU")
    r, c = fp8_lab.matmul_speedup(32, "tensorwise", reps=3, device="cpu")
    assert set(c.timings) == {"bf16", "tensorwise"} and 3 <= c.rounds <= 9
    assert r.value == pytest.approx(c["bf16"].median / c["tensorwise"].median) and r.lo <= r.value <= r.hi
