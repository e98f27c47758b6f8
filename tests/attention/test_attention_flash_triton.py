"""helpers.attention.flash_triton: the Triton FlashAttention-2 kernels, under the interpreter on a CPU (tiny shapes).

On a GPU the same tests run the compiled kernels (on CUDA tensors; bf16 added there).
"""
import pytest
import torch

from helpers.attention import flash_triton, kernels
from helpers.gpt.model import GPT, GPTConfig, naive_attention

if flash_triton.BROKEN:
    pytest.skip(flash_triton.BROKEN, allow_module_level=True)

DEVICE = "cpu" if flash_triton.INTERPRETED else "cuda"
DTYPES = [torch.float32, torch.float16] + ([] if flash_triton.INTERPRETED else [torch.bfloat16])
FP32 = dict(rtol=1e-5, atol=2e-5)  # fp32 sums in another order; products in true fp32 ("ieee")


def make(shape_q, n_k=None, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    shape_k = (*shape_q[:-2], n_k or shape_q[-2], shape_q[-1])
    return [torch.randn(s, generator=g).to(DEVICE, dtype) for s in (shape_q, shape_k, shape_k, shape_q)]


def grads(fn, q, k, v, do):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = fn(q, k, v)
    return (out, *torch.autograd.grad(out, (q, k, v), do.to(out.dtype)))


def reference(q, k, v, is_causal, do):
    return grads(lambda q, k, v: naive_attention(q, k, v, is_causal), *(t.double() for t in (q, k, v, do)))


def check(q, k, v, do, is_causal, blocks=(16, 16)):
    """fp32: within FP32 of the float64 reference. Low precision: the flash-attn suite's rule, error
    at most 2x that of naive attention in the same dtype (plus a 1e-4 floor for exact ties)."""
    ours = grads(lambda q, k, v: flash_triton.FlashAttentionTriton.apply(q, k, v, is_causal, *blocks), q, k, v, do)
    want = reference(q, k, v, is_causal, do)
    if q.dtype == torch.float32:
        for name, got, ref in zip(("out", "dq", "dk", "dv"), ours, want):
            torch.testing.assert_close(got, ref.float(), **FP32, msg=name)
        return
    naive = grads(lambda q, k, v: naive_attention(q, k, v, is_causal), q, k, v, do)
    for name, got, base, ref in zip(("out", "dq", "dk", "dv"), ours, naive, want):
        assert got.dtype == q.dtype, name
        err, base_err = (got.double() - ref).abs().max(), (base.double() - ref).abs().max()
        assert err <= 2 * base_err + 1e-4, f"{name}: {err:.2e} vs naive {base_err:.2e}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_4d_odd_length_matches_reference(is_causal, dtype):
    q, k, v, do = make((1, 2, 45, 32), dtype=dtype)
    check(q, k, v, do, is_causal)


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("blocks", [(32, 16), (16, 32)], ids=lambda b: f"{b[0]}x{b[1]}")
def test_3d_unequal_blocks_and_lengths(blocks, is_causal):
    q, k, v, do = make((2, 37, 16))
    check(q, k, v, do, is_causal, blocks)
    q, k, v, do = make((2, 21, 16), n_k=50)  # fewer queries than keys (causal mask top-left aligned)
    check(q, k, v, do, is_causal, blocks)


@pytest.mark.parametrize("head_dim", [24, 128])
def test_head_dims_padded_and_large(head_dim):
    q, k, v, do = make((1, 33, head_dim), seed=head_dim)
    check(q, k, v, do, True, (32, 32))


def test_saves_q_k_v_output_and_logsumexp_only(check_keeps_only_qkv_o_lse):
    q, k, v, _ = make((2, 2, 40, 16))
    check_keeps_only_qkv_o_lse(lambda q, k, v, c: flash_triton.FlashAttentionTriton.apply(q, k, v, c, 16, 16), q, k, v, False)


def test_strided_inputs_as_the_gpt_makes_them_and_output_laid_out_like_q():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 20, 4, 16, generator=g).to(DEVICE)  # (B, T, H, d)
    kv = torch.randn(2, 20, 2, 4, 16, generator=g).to(DEVICE)  # (B, T, k|v, H, d): k and v interleaved
    q, k, v = x.transpose(1, 2), kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2)  # (B, H, T, d) views
    q.requires_grad_()
    out = flash_triton.FlashAttentionTriton.apply(q, k, v, True, 16, 16)
    assert out.stride() == q.stride()  # so the GPT's transpose + reshape afterwards is free
    out.sum().backward()  # an expanded (stride 0) upstream gradient
    want = reference(q, k, v, True, torch.ones_like(q))
    torch.testing.assert_close(out, want[0].float(), **FP32)
    torch.testing.assert_close(q.grad, want[1].float(), **FP32)


def test_five_dim_inputs():
    q, k, v, do = make((2, 1, 2, 19, 16))
    check(q, k, v, do, True)


def test_gqa_through_the_dispatcher():
    g = torch.Generator().manual_seed(4)
    q = torch.randn(1, 4, 20, 16, generator=g).to(DEVICE)
    k, v = (torch.randn(1, 2, 20, 16, generator=g).to(DEVICE) for _ in range(2))  # 2 kv heads for 4 q heads
    want = naive_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), True)
    torch.testing.assert_close(kernels.attention(q, k, v, "flash_triton", is_causal=True), want, **FP32)


def test_bad_inputs_raise_value_errors():
    q, k, v, _ = make((1, 16, 16))
    with pytest.raises(ValueError, match="head dim 8"):
        flash_triton.FlashAttentionTriton.apply(q[..., :8], k[..., :8], v[..., :8])
    with pytest.raises(ValueError, match="same leading dims"):
        flash_triton.FlashAttentionTriton.apply(q, k[None], v[None])
    if flash_triton.INTERPRETED:
        with pytest.raises(ValueError, match="bf16"):
            flash_triton.FlashAttentionTriton.apply(q.bfloat16(), k.bfloat16(), v.bfloat16())


def test_gpt_trains_the_same_with_the_triton_kernel():
    kernels.register_course_kernels()
    torch.manual_seed(0)
    m = GPT(GPTConfig.preset("tiny", seq_len=24, n_layer=1)).to(DEVICE)
    idx, tgt = torch.randint(0, 256, (1, 24), device=DEVICE), torch.randint(0, 256, (1, 24), device=DEVICE)
    losses, grads_ = [], []
    for impl in ("sdpa", "flash_triton"):
        m.zero_grad()
        m.attn_impl = impl
        loss = m(idx, tgt)[1]
        loss.backward()
        losses.append(loss)
        grads_.append(m.blocks[0].attn.kv_proj.weight.grad.clone())
    torch.testing.assert_close(losses[1], losses[0], **FP32)
    torch.testing.assert_close(grads_[1], grads_[0], **FP32)


def test_tuned_configs_lists_the_autotuner_choice_per_shape(monkeypatch):
    class Tuned:
        cache = {(1040, 1040, 128, True, "tf32", "torch.bfloat16"): "BLOCK_M: 128, BLOCK_N: 64, num_warps: 8",
                 (2048, 2048, 128, False, "tf32", "torch.bfloat16"): "BLOCK_M: 128, BLOCK_N: 128, num_warps: 8"}
    monkeypatch.setattr(flash_triton, "TUNED", {("forward", 128): Tuned()})
    assert flash_triton.tuned_configs() == {"forward N=1040x1040 d_pad=128 causal": "BLOCK_M: 128, BLOCK_N: 64, num_warps: 8",
                                  "forward N=2048x2048 d_pad=128": "BLOCK_M: 128, BLOCK_N: 128, num_warps: 8"}


def test_the_shortlist_is_drawn_from_autotune_and_shrinks_what_use_configs_installs(monkeypatch):
    for name, by_class in flash_triton.SHORTLIST.items():
        for d_class, configs in by_class.items():
            assert configs and set(configs) <= set(flash_triton.AUTOTUNE[name][d_class]), (name, d_class)
    monkeypatch.setattr(flash_triton, "TUNED", {})
    assert flash_triton.use_configs("shortlist") is False  # nothing is autotuned: nothing installed
    assert flash_triton.TUNED == {}
    monkeypatch.setattr(flash_triton, "TUNED", dict(flash_triton.autotuners(flash_triton.AUTOTUNE)))
    assert flash_triton.use_configs("shortlist") is True
    counts = {key: len(fn.configs) for key, fn in flash_triton.TUNED.items()}
    assert counts == {(k, d): len(flash_triton.SHORTLIST[k][d]) for k in ("forward", "dkdv", "dq") for d in (64, 128)}
    assert sum(counts[(k, 128)] for k in ("forward", "dkdv", "dq")) == 4
    flash_triton.use_configs("all")
    assert sum(len(flash_triton.TUNED[(k, 128)].configs) for k in ("forward", "dkdv", "dq")) == 10
    with pytest.raises(ValueError, match="which"):
        flash_triton.use_configs("some")
