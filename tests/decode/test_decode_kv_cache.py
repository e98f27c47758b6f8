"""helpers.decode.kv_cache: bytes per token equal the allocation, the latent and static caches equal the full
forward (and, in every dtype under a model of every dtype, stay within a stated tolerance of their fp32 cache),
published models' caches, what each attention variant holds in a budget, and the compile options."""
from __future__ import annotations

import pytest
import torch
from torch._inductor import list_mode_options

from helpers.decode import kv_cache
from helpers.gpt import generation
from helpers.gpt.model import GPTConfig
from helpers.lowbit.quant_linear import FUSED_MATVEC
from kv_support import DTYPES, assert_close_to_reference, small_gpt, tolerance


@pytest.mark.parametrize("n_kv_head,dtype", [(4, torch.float32), (2, torch.bfloat16), (1, torch.float16)])
def test_kv_bytes_formula_equals_allocated(n_kv_head, dtype):
    cfg = small_gpt(n_kv_head).config
    cache = generation.KVCache(cfg, batch=3, max_len=17, dtype=dtype)
    per_token = kv_cache.kv_bytes_per_token(cfg.n_layer, cfg.n_kv_head, cfg.head_dim, torch.finfo(dtype).bits // 8)
    assert cache.nbytes == per_token * 3 * 17
    assert cache.nbytes == sum(t.numel() * t.element_size() for t in (cache.k, cache.v))


@pytest.mark.parametrize("n_kv_head", [4, 1])
def test_latent_cache_equals_low_rank_model(n_kv_head):
    model = small_gpt(n_kv_head)
    full_rank = 2 * model.config.n_kv_head * model.config.head_dim
    low, errors = kv_cache.factorise_kv(model, min(full_rank, 32))
    assert max(errors) < 1e-6  # full rank: W is reproduced
    low, errors = kv_cache.factorise_kv(model, 6)
    assert all(0 < e < 1 for e in errors)
    seq = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(5))
    ref = low(seq)[0]
    cache = kv_cache.LatentKVCache(low, 2, 16)
    got = torch.cat([low(seq[:, :5], cache=cache)[0]] + [generation.decode_one(low, seq[:, t], cache)[:, None]
                                                        for t in range(5, 16)], 1)
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
    assert cache.nbytes == model.config.n_layer * 2 * 16 * 6 * 4
    with pytest.raises(ValueError, match="factorise_kv"):
        kv_cache.LatentKVCache(model, 1, 4)
    with pytest.raises(ValueError, match="rank"):
        kv_cache.factorise_kv(model, 0)


def _teacher_forced(model, seq, cache, step, split=6):
    """Logits (B, S, vocab) of seq through the cache: a prefill of `split` tokens, then step() token by token."""
    with torch.no_grad():
        first = model(seq[:, :split], cache=cache)[0]
        rest = [step(model, seq[:, t], cache)[:, None] for t in range(split, seq.size(1))]
    return torch.cat([first] + rest, 1)


@pytest.mark.parametrize("model_dtype", DTYPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_static_cache_in_any_dtype_under_a_model_of_any_dtype(model_dtype, dtype):
    model = small_gpt(2).to(model_dtype)
    seq = torch.randint(0, 256, (2, 14), generator=torch.Generator().manual_seed(6))
    cache = kv_cache.StaticKVCache(model.config, 2, 14, dtype=dtype)
    got = _teacher_forced(model, seq, cache, kv_cache.static_step)
    ref = _teacher_forced(model, seq, kv_cache.StaticKVCache(model.config, 2, 14), kv_cache.static_step)
    assert cache.k.dtype == cache.v.dtype == dtype  # stores in its own dtype
    assert got.dtype == model_dtype  # and hands the model back its own
    assert_close_to_reference(got, ref, tolerance(model_dtype, dtype))


@pytest.mark.parametrize("model_dtype", DTYPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_latent_cache_in_any_dtype_under_a_model_of_any_dtype(model_dtype, dtype):
    low, _ = kv_cache.factorise_kv(small_gpt(2).to(model_dtype), 6)
    assert all(p.dtype == model_dtype for p in low.parameters())  # the factorised copy keeps the model's dtype
    seq = torch.randint(0, 256, (2, 14), generator=torch.Generator().manual_seed(7))
    cache = kv_cache.LatentKVCache(low, 2, 14, dtype=dtype)
    got = _teacher_forced(low, seq, cache, generation.decode_one)
    ref = _teacher_forced(low, seq, kv_cache.LatentKVCache(low, 2, 14), generation.decode_one)
    assert cache.c.dtype == dtype and got.dtype == model_dtype
    assert_close_to_reference(got, ref, tolerance(model_dtype, dtype))


def test_static_and_latent_caches_refuse_a_dtype_no_cache_may_hold():
    model = small_gpt(2)
    low, _ = kv_cache.factorise_kv(model, 4)
    for bad in (torch.int8, torch.float8_e4m3fn, "fp16"):
        with pytest.raises(ValueError, match="cannot hold a KV cache; choose one of torch.float32"):
            kv_cache.StaticKVCache(model.config, 1, 4, dtype=bad)
        with pytest.raises(ValueError, match="cannot hold a KV cache; choose one of torch.float32"):
            kv_cache.LatentKVCache(low, 1, 4, dtype=bad)
    with pytest.raises(ValueError, match="max_len=0 must be a positive int"):
        kv_cache.StaticKVCache(model.config, 1, 0)
    with pytest.raises(ValueError, match="batch=0 must be a positive int"):
        kv_cache.LatentKVCache(low, 0, 4)


def test_real_model_rows():
    rows = {r[0]: r for r in kv_cache.real_model_rows(2, 4096)}
    assert rows["Llama 2 7B (MHA)"][4] == 512  # 2*32*32*128*2 bytes = 512 KiB per token
    assert rows["Llama 3 8B (GQA)"][4] == 128
    assert rows["DeepSeek-V2 (MLA)"][3] == 576


def test_budget_rows():
    cfg = GPTConfig.preset("1.3b")
    var = kv_cache.variant_configs(cfg, 512)
    rows = {r[0]: r for r in kv_cache.budget_rows(cfg, var, 80e9, 2.6e9, 2)}
    assert rows["MHA"][1] == 2 * 24 * 32 * 64 * 2
    assert rows["MQA"][2] == pytest.approx(32 * rows["MHA"][2], rel=1e-4)


@pytest.mark.parametrize("n_kv_head", [4, 1])
def test_static_cache_step_equals_full_forward(n_kv_head):
    model = small_gpt(n_kv_head)
    seq = torch.randint(0, 256, (2, 14), generator=torch.Generator().manual_seed(6))
    cache = kv_cache.StaticKVCache(model.config, 2, 14)
    with torch.no_grad():
        first = model(seq[:, :6], cache=cache)[0][:, -1:]
        steps = [kv_cache.static_step(model, seq[:, t], cache)[:, None] for t in range(6, 14)]
        ref = model(seq)[0][:, 5:]
    torch.testing.assert_close(torch.cat([first] + steps, 1), ref, rtol=1e-5, atol=1e-4)
    assert int(cache.pos) == 14


def test_compiled_decode_options_fuse_the_matvec_under_cuda_graphs():
    assert kv_cache.decode_compile_options() == {"triton.cudagraphs": True, **FUSED_MATVEC}
    assert kv_cache.decode_compile_options("default") == FUSED_MATVEC
    assert FUSED_MATVEC == {"coordinate_descent_tuning": True}
    # the mode's own options are Inductor's: what torch.compile(mode="reduce-overhead") would set
    assert list_mode_options("reduce-overhead").items() <= kv_cache.decode_compile_options().items()
    with pytest.raises(ValueError, match="mode"):
        kv_cache.decode_compile_options("max-autotune")


def test_factorising_an_fp64_model_keeps_its_factors_in_fp64():
    model = small_gpt(4).double()
    full_rank = 2 * model.config.n_kv_head * model.config.head_dim
    low, errors = kv_cache.factorise_kv(model, min(full_rank, 32))
    assert max(errors) < 1e-12  # the reported error is that of the stored factors
    for a, b in zip(model.blocks, low.blocks):
        kv = b.attn.kv_proj
        assert kv.up.weight.dtype == kv.down.weight.dtype == torch.float64
        stored = kv.up.weight @ kv.down.weight
        assert (stored - a.attn.kv_proj.weight).abs().max() < 1e-12  # no pass through fp32 (which left 3.6e-8)
