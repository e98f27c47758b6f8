"""helpers.lowbit.fp8_linear: the fp8 matmuls against their emulation, Float8Linear and the
model swap against fp32 and torchao, torchao's probe."""
import copy

import pytest
import torch

from helpers.gpt.model import GPT, GPTConfig
from helpers.lowbit import fp8, fp8_linear


def _pair(recipe, in_f=64, out_f=48, seed=0):
    torch.manual_seed(seed)
    lin = torch.nn.Linear(in_f, out_f)
    ref = torch.nn.Sequential(copy.deepcopy(lin))
    fp8_linear.torchao_convert(ref, recipe)
    return fp8_linear.Float8Linear.from_linear(copy.deepcopy(lin), recipe), ref


def _skip_unless_torchao_runs(recipe, device="cpu"):
    why = fp8_linear.torchao_problem(recipe, device)
    if why:
        pytest.skip(why)


def test_scaled_mm_and_emulation_agree():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(33, 64, generator=g), torch.randn(64, 48, generator=g)
    (qa, sa), (qb, sb) = fp8.tensorwise(a), fp8.tensorwise(b)
    real = fp8_linear.scaled_mm(qa, qb, sa.reciprocal(), sb.reciprocal())
    emu = fp8_linear.scaled_mm(qa, qb, sa.reciprocal(), sb.reciprocal(), emulate=True)
    torch.testing.assert_close(real, emu, rtol=1e-5, atol=1e-5)  # fp32 accumulation order only


def test_a_refused_unaligned_product_does_not_send_aligned_ones_to_the_emulation(monkeypatch):
    # CUDA's _scaled_mm refuses K or N not a multiple of 16 (a batch of 200 tokens makes dW's K = 200): that
    # refusal must stay with such shapes, not turn every later fp8 product of the process into the emulation
    real, native, tried = torch._scaled_mm, [], []

    def like_cuda(a, b, **kw):
        tried.append(tuple(a.shape))
        if not fp8_linear.mm_aligned(a.shape, b.shape):
            raise RuntimeError("Expected self.size(1) to be divisible by 16, but got self.size(1)=40")
        native.append(tuple(a.shape))
        return real(a, b, **kw)

    monkeypatch.setattr(torch, "_scaled_mm", like_cuda)
    monkeypatch.setattr(fp8_linear, "_SCALED_MM_REFUSED", {})
    g = torch.Generator().manual_seed(0)
    assert fp8_linear.mm_aligned((200, 64), (64, 32)) and not fp8_linear.mm_aligned((32, 200), (200, 64))
    assert not fp8_linear.mm_aligned((16, 64), (64, 40))
    for k in (40, 64, 40, 48):  # unaligned, aligned, unaligned again, aligned
        (qa, sa), (qb, sb) = fp8.tensorwise(torch.randn(16, k, generator=g)), fp8.tensorwise(torch.randn(k, 32, generator=g))
        got = fp8_linear.scaled_mm(qa, qb, sa.reciprocal(), sb.reciprocal())
        torch.testing.assert_close(got, fp8_linear.scaled_mm(qa, qb, sa.reciprocal(), sb.reciprocal(), emulate=True),
                                   rtol=1e-5, atol=1e-5)
    assert native == [(16, 64), (16, 48)]  # both aligned products ran natively
    assert tried == [(16, 40), (16, 64), (16, 48)]  # the unaligned shape was tried once, then emulated
    assert fp8_linear.scaled_mm_refusal("cpu", rowwise=False) is None
    assert "divisible by 16" in fp8_linear.scaled_mm_refusal("cpu", rowwise=False, aligned=False)


def test_blockwise_mm_equals_float64_reference_of_the_same_operands():
    g = torch.Generator().manual_seed(1)
    a, w = torch.randn(40, 300, generator=g), torch.randn(150, 300, generator=g)
    a[3, 10] = 200.0
    (qa, sa), (qw, sw) = fp8.blockwise(a, (1, 128)), fp8.blockwise(w, (128, 128))
    got = fp8_linear.blockwise_mm(qa, sa, qw, sw)
    a64 = qa.double() / fp8.expand_scale(sa.double(), (1, 128), a.shape)
    w64 = qw.double() / fp8.expand_scale(sw.double(), (128, 128), w.shape)
    torch.testing.assert_close(got.double(), a64 @ w64.t(), rtol=1e-5, atol=1e-5)  # fp32 sums of 128 products
    assert fp8_linear.BLOCKWISE_PATH[("cpu", 128)].startswith("emulated: ")  # the path taken is reported, with why


@pytest.mark.slow
def test_torchao_problem_probes_each_recipe_once_and_says_why_in_one_sentence(monkeypatch):
    with pytest.raises(ValueError, match="recipe"):
        fp8_linear.torchao_problem("delayed")
    if fp8_linear.import_torchao()[0] is None:
        assert fp8_linear.torchao_problem("tensorwise") == fp8_linear.import_torchao()[1].rstrip(".") + "."
        return
    for recipe in fp8_linear.TORCHAO_RECIPES:  # whatever this torch says, it is None or one sentence, and cached
        why = fp8_linear.torchao_problem(recipe, "cpu")
        assert why is None or (why.startswith(f"torchao's {recipe} recipe") and why.endswith(".")), why
        assert fp8_linear.torchao_problem(recipe, torch.device("cpu")) is why
    calls = []

    def refuse(model, recipe, skip=("lm_head",)):  # as torch 2.11's CPU _scaled_mm refuses rowwise scales
        calls.append(recipe)
        raise RuntimeError('(scale_a.numel() == 1) INTERNAL ASSERT FAILED at "Blas.cpp":249, please report a bug '
                           "to PyTorch. Now _scaled_mm only supports per-tensor scaling for CPU backend\nmore")
    monkeypatch.setattr(fp8_linear, "_TORCHAO_PROBLEMS", {})
    monkeypatch.setattr(fp8_linear, "torchao_convert", refuse)
    why = fp8_linear.torchao_problem("rowwise", "cpu")
    assert why == (f"torchao's rowwise recipe does not run on cpu with torch {torch.__version__}, which raises "
                   "RuntimeError: Now _scaled_mm only supports per-tensor scaling for CPU backend.")
    assert fp8_linear.torchao_problem("rowwise", "cpu") == why and calls == ["rowwise"]  # probed once


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


@pytest.mark.parametrize("recipe", fp8_linear.RECIPES)
def test_float8_linear_close_to_fp32(recipe):
    torch.manual_seed(3)
    lin = torch.nn.Linear(144, 80)
    ours = fp8_linear.Float8Linear.from_linear(copy.deepcopy(lin), recipe)
    x = torch.randn(5, 30, 144)
    y = ours(x)
    rel = (y - lin(x)).norm() / lin(x).norm()
    assert rel < 0.08, rel  # e4m3 keeps 3 mantissa bits: a few % per operand


def test_convert_skips_lm_head_and_odd_shapes():
    cfg = GPTConfig(n_layer=1, n_head=2, d_model=32, d_ff=40, seq_len=16)
    model = GPT(cfg)
    report = fp8_linear.convert_to_float8(model, "tensorwise", module_filter=lambda m, name: "q_proj" not in name)
    assert report["skipped"] == {"lm_head": "LM head", "blocks.0.attn.q_proj": "refused by module_filter",
                                 "blocks.0.mlp.up": "32x40 not multiples of 16",
                                 "blocks.0.mlp.down": "40x32 not multiples of 16"}
    assert report["converted"] == ["blocks.0.attn.kv_proj", "blocks.0.attn.out_proj"]
    assert isinstance(model.blocks[0].attn.out_proj, fp8_linear.Float8Linear)
    assert type(model.lm_head) is torch.nn.Linear
    with pytest.raises(ValueError, match="recipe"):
        fp8_linear.convert_to_float8(model, "fp4")


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_gpt_loss_and_grads_close_to_torchao(recipe):
    _skip_unless_torchao_runs(recipe)
    torch.manual_seed(0)
    base = GPT(GPTConfig.preset("tiny"))
    idx = torch.randint(0, 256, (2, 32))
    ours, ref = copy.deepcopy(base), copy.deepcopy(base)
    fp8_linear.convert_to_float8(ours, recipe)
    fp8_linear.torchao_convert(ref, recipe)
    l1, l2 = ours(idx, idx)[1], ref(idx, idx)[1]
    l1.backward(), l2.backward()
    assert abs(l1.item() - l2.item()) < 1e-5
    for (n, p1), p2 in zip(ours.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p1.grad, p2.grad, rtol=1e-4, atol=1e-6, msg=n)


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_float8_linear_follows_autocast_like_a_linear(recipe):
    torch.manual_seed(0)
    lin = torch.nn.Linear(32, 48)
    f8 = fp8_linear.Float8Linear.from_linear(copy.deepcopy(lin), recipe)
    x = torch.randn(5, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, ref = f8(x), lin(x)
    assert y.dtype == ref.dtype == torch.bfloat16  # the output in the autocast dtype, as F.linear's
    assert torch.equal(y, f8(x.to(torch.bfloat16)))  # the same as casting the input by hand
    assert f8(x).dtype == torch.float32  # and no cast outside autocast
