"""helpers.decode.kv_cache and notebook 10's measurements of one sequence's cache (helpers.decode.kv_lab): bytes
per token equal the allocation, the latent and static caches equal the full forward (and, in every dtype under
a model of every dtype, stay within a stated tolerance of their fp32 cache), the compile options, and the decode
measurements' counts and timings."""
from __future__ import annotations

import pytest
import torch
from torch._inductor import list_mode_options

from helpers.decode import kv_cache, kv_lab
from helpers.gpt import generation
from helpers.gpt.model import GPT, GPTConfig
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


def test_the_compiled_model_keeps_its_presets_width_and_at_most_its_layers():
    assert kv_lab.compiled_layers("1.3b", kv_lab.COMPILE_LAYERS_DEFAULT) == 8 < GPTConfig.preset("1.3b").n_layer
    assert kv_lab.compiled_layers("small10m", 12) == GPTConfig.preset("small10m").n_layer == 6  # smoke: all of them
    assert kv_lab.compiled_layers("1.3b", 1) == 1
    with pytest.raises(ValueError, match="layers"):
        kv_lab.compiled_layers("1.3b", 0)


def test_weight_bytes_and_bandwidth_row():
    model = small_gpt(2)
    n = sum(p.numel() for p in model.parameters())  # the tied head counted once
    assert kv_lab.weight_bytes(model) == 4 * (n - model.wpe.weight.numel() + model.config.d_model)
    row = kv_lab.bandwidth_row(model, 10, 3, 1, "m")
    cfg = model.config
    kv = kv_cache.kv_bytes_per_token(cfg.n_layer, cfg.n_kv_head, cfg.head_dim, 4)
    assert row["bytes"] == kv_lab.weight_bytes(model) + 3 * 11 * kv
    assert row["flops"] > 0 and row["tokens_per_s"] > 0
    rows = kv_lab.prefill_decode(model, 12, 1)
    assert [r["phase"] for r in rows] == ["prefill", "decode"]
    assert rows[0]["intensity"] > rows[1]["intensity"]  # prefill reuses every weight 12 times


def test_budget_rows():
    cfg = GPTConfig.preset("1.3b")
    var = kv_lab.variant_configs(cfg, 512)
    rows = {r[0]: r for r in kv_lab.budget_rows(cfg, var, 80e9, 2.6e9, 2)}
    assert rows["MHA"][1] == 2 * 24 * 32 * 64 * 2
    assert rows["MQA"][2] == pytest.approx(32 * rows["MHA"][2], rel=1e-4)


def test_bandwidth_rows_interleaved_and_sequential_agree_on_counts():
    m1, m2 = small_gpt(4), small_gpt(1)
    cases = [("mha", m1, 8, 2), ("mqa", m2, 8, 3)]
    a, b = kv_lab.bandwidth_rows(cases, 2, True), kv_lab.bandwidth_rows(cases, 2, False)
    for x, y in zip(a, b):
        assert (x["model"], x["bytes"], x["flops"], x["batch"]) == (y["model"], y["bytes"], y["flops"], y["batch"])
        assert x["seconds"] > 0 and x["tokens_per_s"] == x["batch"] / x["seconds"]


def test_variant_speeds_times_every_case_round_robin():
    models = {"mha": small_gpt(4), "mqa": small_gpt(1)}
    low, _ = kv_cache.factorise_kv(models["mha"], 4)
    rows = kv_lab.variant_speeds(models, ("latent", low), 8, 2, budget_s=0.01)
    assert [r["variant"] for r in rows] == ["mha", "mqa", "latent"]
    assert all(r["seconds"] > 0 and r["spread"] >= 0 for r in rows)
    assert rows[0]["kv_share"] > rows[1]["kv_share"] and rows[2]["kv_share"] is None
    with pytest.raises(ValueError):
        kv_lab.variant_speeds(models, None, 8, 0)


def test_per_position_returns_protocol_timings():
    out = kv_lab.per_position(small_gpt(2), [4, 8], 2, budget_s=0.01)
    assert set(out) == {"with cache", "without cache"} and all(len(v) == 2 for v in out.values())
    assert all(len(t.samples) >= 2 and t.q25 <= t.median <= t.q75 for v in out.values() for t in v)


def test_headlines_come_from_the_protocol_and_one_measurement(monkeypatch):
    calls = []
    real = kv_lab.protocol.compare

    def spy(fns, **kw):
        calls.append(sorted(map(str, fns)))
        return real(fns, **kw)
    monkeypatch.setattr(kv_lab.protocol, "compare", spy)
    models = {"a": small_gpt(2), "b": small_gpt(1)}
    bw, batches = kv_lab.decode_sweep(models, 8, [1, 3], 2, True, budget_s=0.01)
    assert len(calls) == 1 and len(calls[0]) == 3  # a@1, b@1, b@3: one interleaved comparison, b@1 once
    assert batches[0] is bw[-1] and [r["batch"] for r in batches] == [1, 3]
    assert kv_lab.timing(bw[0]).median == bw[0]["seconds"] and len(bw[0]["samples"]) >= 2
    kv_lab.prefill_decode(small_gpt(2), 6, 2, budget_s=0.01)
    kv_lab.per_position(small_gpt(2), [4], 2, budget_s=0.01)
    assert calls[1:] == [["decode", "prefill"], ["with cache", "without cache"]]


def _timing(median, spread=0.02):
    from helpers.measure.bench import Timing
    return Timing(median, median * (1 - spread), median * (1 + spread), [median] * 5)


def test_position_report_ranks_only_separated_points():
    pos = [8, 96]
    t = {"with cache": [_timing(1.0, 0.5), _timing(1.0)], "without cache": [_timing(1.2, 0.5), _timing(4.0)]}
    rep = kv_lab.position_report(pos, t, "t")
    assert [r[-1] for r in rep["rows"]] == ["no: IQRs overlap", "yes"]
    assert "cannot rank them there" in rep["sentences"][1] and "faster" in rep["sentences"][0]
    assert "O(n^2)" in kv_lab.growth_sentence(pos, t)  # 1.2 -> 4.0 with disjoint IQRs: growth shows
    flat = {"with cache": t["with cache"], "without cache": [_timing(1.0), _timing(1.1)]}
    assert "did not grow beyond the noise" in kv_lab.growth_sentence(pos, flat)


def test_roofline_sentence_follows_where_the_points_sit():
    peak, bw = 1.0, 10.0  # ridge at 100 FLOP/byte; roof at intensity 1 is 0.01 TFLOP/s
    near = [{"phase": "decode", "intensity": 1.0, "tflops": 0.008},
            {"phase": "prefill", "intensity": 500.0, "tflops": 0.6}]
    text = kv_lab.roofline_sentence(near, peak, bw)
    assert "decode (1.00 FLOP/byte) reached 80% of its roof and is memory-bound" in text
    assert "prefill (500.00 FLOP/byte) reached 60% of its roof and is compute-bound" in text
    assert "neither" not in text
    under = [{"phase": "decode", "intensity": 1.0, "tflops": 0.0001},
             {"phase": "prefill", "intensity": 500.0, "tflops": 0.6}]
    text = kv_lab.roofline_sentence(under, peak, bw)
    assert "memory-bound" not in text and "2.0 decades under it" in text
    assert "Decode is neither memory- nor compute-bound" in text and "compute-bound" in text
    with pytest.raises(ValueError):
        kv_lab.roofline_sentence(near, 0.0, bw)
