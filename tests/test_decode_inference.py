"""helpers.decode.inference and helpers.gpt.pretrained: cached generation equals uncached, bytes equal the formula,
sampling is reproducible, the latent cache equals its low-rank model, checkpoints are cached and retrained."""
from __future__ import annotations

import pytest
import torch

from helpers.decode import inference as I
from helpers.gpt import generation
from helpers.gpt import pretrained as P
from helpers.gpt.model import GPT, GPTConfig


def _model(n_kv_head: int, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    cfg = GPTConfig(n_layer=2, n_head=4, n_kv_head=n_kv_head, d_model=32, d_ff=64, seq_len=48)
    model = GPT(cfg).eval()
    with torch.no_grad():  # larger weights than the init so that logits are far from ties
        for p in model.parameters():
            p.mul_(3.0)
    return model


@pytest.mark.parametrize("n_kv_head", [4, 2, 1])  # MHA, GQA (a divisor), MQA
def test_greedy_identical_with_and_without_cache(n_kv_head):
    model = _model(n_kv_head)
    prompt = torch.randint(0, 256, (2, 7), generator=torch.Generator().manual_seed(1))
    with_cache = generation.generate(model, prompt, 30, cache=True)
    without = generation.generate(model, prompt, 30, cache=False)
    assert with_cache.shape == (2, 30)
    assert torch.equal(with_cache, without)


@pytest.mark.parametrize("n_kv_head", [4, 2, 1])
def test_cached_logits_match_full_forward(n_kv_head):
    model = _model(n_kv_head)
    seq = torch.randint(0, 256, (3, 20), generator=torch.Generator().manual_seed(2))
    full = model(seq)[0]
    cache = generation.KVCache(model.config, 3, 20)
    first = model(seq[:, :9], cache=cache)[0]  # a chunk, then tokens one at a time
    rest = [generation.decode_one(model, seq[:, t], cache) for t in range(9, 20)]
    torch.testing.assert_close(first, full[:, :9], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(torch.stack(rest, 1), full[:, 9:], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n_kv_head,dtype", [(4, torch.float32), (2, torch.bfloat16), (1, torch.float16)])
def test_kv_bytes_formula_equals_allocated(n_kv_head, dtype):
    cfg = _model(n_kv_head).config
    cache = generation.KVCache(cfg, batch=3, max_len=17, dtype=dtype)
    per_token = I.kv_bytes_per_token(cfg.n_layer, cfg.n_kv_head, cfg.head_dim, torch.finfo(dtype).bits // 8)
    assert cache.nbytes == per_token * 3 * 17
    assert cache.nbytes == sum(t.numel() * t.element_size() for t in (cache.k, cache.v))


def test_cache_overflow_and_bad_sizes_raise():
    model = _model(2)
    cache = generation.KVCache(model.config, 1, 4)
    with pytest.raises(ValueError, match="max_len=4"):
        model(torch.zeros(1, 5, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="batch"):
        generation.KVCache(model.config, 0, 4)
    with pytest.raises(ValueError, match="seq_len"):
        generation.generate(model, torch.zeros(40, dtype=torch.long), 10)


def test_sampling_reproducible_and_restricted():
    logits = torch.randn(4, 256, generator=torch.Generator().manual_seed(3))
    a = [generation.Sampler(temperature=0.8, top_k=20, seed=5)(logits) for _ in range(1)][0]
    b = generation.Sampler(temperature=0.8, top_k=20, seed=5)(logits)
    assert torch.equal(a, b)
    top1 = generation.Sampler(temperature=1.0, top_k=1, seed=0)(logits)
    assert torch.equal(top1, logits.argmax(-1))
    tiny_p = generation.Sampler(temperature=1.0, top_p=1e-6, seed=0)(logits)  # the nucleus holds only the top token
    assert torch.equal(tiny_p, logits.argmax(-1))
    s = generation.Sampler(temperature=1.0, top_k=5, seed=1)
    draws = torch.stack([s(logits) for _ in range(50)])  # (50, 4)
    top5 = logits.topk(5).indices  # (4, 5)
    assert all(bool((draws[:, i, None] == top5[i]).any(-1).all()) for i in range(4))
    model = _model(2)
    prompt = torch.randint(0, 256, (1, 5), generator=torch.Generator().manual_seed(4))
    x = generation.generate(model, prompt, 12, generation.Sampler(temperature=1.0, top_p=0.9, seed=7))
    y = generation.generate(model, prompt, 12, generation.Sampler(temperature=1.0, top_p=0.9, seed=7))
    assert torch.equal(x, y)
    for bad in (dict(temperature=-1.0), dict(top_k=0), dict(top_p=0.0), dict(top_p=1.5)):
        with pytest.raises(ValueError):
            generation.Sampler(**bad)


@pytest.mark.parametrize("n_kv_head", [4, 1])
def test_latent_cache_equals_low_rank_model(n_kv_head):
    model = _model(n_kv_head)
    full_rank = 2 * model.config.n_kv_head * model.config.head_dim
    low, errors = I.factorise_kv(model, min(full_rank, 32))
    assert max(errors) < 1e-6  # full rank: W is reproduced
    low, errors = I.factorise_kv(model, 6)
    assert all(0 < e < 1 for e in errors)
    seq = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(5))
    ref = low(seq)[0]
    cache = I.LatentKVCache(low, 2, 16)
    got = torch.cat([low(seq[:, :5], cache=cache)[0]] + [generation.decode_one(low, seq[:, t], cache)[:, None]
                                                        for t in range(5, 16)], 1)
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
    assert cache.nbytes == model.config.n_layer * 2 * 16 * 6 * 4
    with pytest.raises(ValueError, match="factorise_kv"):
        I.LatentKVCache(model, 1, 4)
    with pytest.raises(ValueError, match="rank"):
        I.factorise_kv(model, 0)


def test_real_model_rows():
    rows = {r[0]: r for r in I.real_model_rows(2, 4096)}
    assert rows["Llama 2 7B (MHA)"][4] == 512  # 2*32*32*128*2 bytes = 512 KiB per token
    assert rows["Llama 3 8B (GQA)"][4] == 128
    assert rows["DeepSeek-V2 (MLA)"][3] == 576


def test_pretrained_caches_and_retrains(tmp_path, capsys):
    kw = dict(cache_dir=tmp_path, device="cpu", progress=False, n_layer=1, d_model=32, d_ff=64, n_head=2)
    first = P.pretrained("tiny", 3, **kw)
    assert first.trained_now and first.path.is_file()
    assert first.perplexity == pytest.approx(torch.tensor(first.val_loss).exp().item())
    second = P.pretrained("tiny", 3, **kw)
    assert not second.trained_now
    for a, b in zip(first.model.state_dict().values(), second.model.state_dict().values()):
        assert torch.equal(a, b)
    assert P.pretrained("tiny", 4, **kw).path != first.path  # steps are part of the key
    first.path.write_bytes(b"torn")
    capsys.readouterr()
    third = P.pretrained("tiny", 3, **kw)
    assert third.trained_now and "could not be read" in capsys.readouterr().out
    payload = torch.load(first.path, weights_only=True)
    payload["key"]["format"] = -1
    torch.save(payload, first.path)
    assert P.pretrained("tiny", 3, **kw).trained_now
    assert "another configuration" in capsys.readouterr().out
    with pytest.raises(ValueError, match="steps"):
        P.pretrained("tiny", 0, **kw)
    with pytest.raises(ValueError, match="preset"):
        P.pretrained("nope", 3, **kw)


def test_shipped_weights_load_on_any_corpus_and_are_copied_into_the_cache(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(P, "SHIPPED_DIR", tmp_path / "shipped")
    monkeypatch.setitem(P.SCHEDULES, "tiny", dict(steps=3, batch=2, seq_len=16, lr=1e-3))
    small = dict(n_layer=1, d_model=32, d_ff=64, n_head=2)
    kw = dict(device="cpu", progress=False, **small)
    path = P.ship("tiny", progress=False, **small)
    shipped = torch.load(path, weights_only=True)
    assert path.parent == tmp_path / "shipped" and "corpus" not in shipped["key"] and shipped["trained_on"]
    capsys.readouterr()
    got = P.pretrained("tiny", cache_dir=tmp_path / "cache", **kw)
    assert not got.trained_now and "shipped with the course" in capsys.readouterr().out
    assert got.path.is_file() and got.path.is_relative_to(tmp_path / "cache")
    for name, value in shipped["state_dict"].items():
        assert torch.equal(value, got.model.state_dict()[name])
    assert not P.pretrained("tiny", cache_dir=tmp_path / "cache", **kw).trained_now  # now from the cache
    assert "loaded" in capsys.readouterr().out
    real = P.checkpoint_key  # another machine: the same recipe, another corpus key
    monkeypatch.setattr(P, "checkpoint_key", lambda *a: {**real(*a), "corpus": "stdlib-train-elsewhere"})
    assert not P.pretrained("tiny", cache_dir=tmp_path / "other", **kw).trained_now
    assert P.pretrained("tiny", 4, cache_dir=tmp_path / "other", **kw).trained_now  # another recipe: not shipped


def test_the_shipped_smoke_models_are_in_the_repository():
    for preset, overrides in P.SHIP:
        config = P.GPTConfig.preset(preset, **overrides)
        sched = P.schedule_for(preset, None, config)
        assert P.shipped_path(P.checkpoint_key(config, sched, 0)).is_file(), (preset, overrides)


# ---------------------------------------------------------------- kv_lab (notebook 10's measurements)

from helpers.decode import kv_lab as K  # noqa: E402


@pytest.mark.parametrize("n_kv_head", [4, 1])
def test_static_cache_step_equals_full_forward(n_kv_head):
    model = _model(n_kv_head)
    seq = torch.randint(0, 256, (2, 14), generator=torch.Generator().manual_seed(6))
    cache = K.StaticKVCache(model.config, 2, 14)
    with torch.no_grad():
        first = model(seq[:, :6], cache=cache)[0][:, -1:]
        steps = [K.static_step(model, seq[:, t], cache)[:, None] for t in range(6, 14)]
        ref = model(seq)[0][:, 5:]
    torch.testing.assert_close(torch.cat([first] + steps, 1), ref, rtol=1e-5, atol=1e-4)
    assert int(cache.pos) == 14


def test_weight_bytes_and_bandwidth_row():
    model = _model(2)
    n = sum(p.numel() for p in model.parameters())  # the tied head counted once
    assert K.weight_bytes(model) == 4 * (n - model.wpe.weight.numel() + model.config.d_model)
    row = K.bandwidth_row(model, 10, 3, 1, "m")
    cfg = model.config
    kv = I.kv_bytes_per_token(cfg.n_layer, cfg.n_kv_head, cfg.head_dim, 4)
    assert row["bytes"] == K.weight_bytes(model) + 3 * 11 * kv
    assert row["flops"] > 0 and row["tokens_per_s"] > 0
    rows = K.prefill_decode(model, 12, 1)
    assert [r["phase"] for r in rows] == ["prefill", "decode"]
    assert rows[0]["intensity"] > rows[1]["intensity"]  # prefill reuses every weight 12 times


def test_budget_rows_and_serving_estimate():
    cfg = GPTConfig.preset("1.3b")
    var = K.variant_configs(cfg, 512)
    rows = {r[0]: r for r in K.budget_rows(cfg, var, 80e9, 2.6e9, 2)}
    assert rows["MHA"][1] == 2 * 24 * 32 * 64 * 2
    assert rows["MQA"][2] == pytest.approx(32 * rows["MHA"][2], rel=1e-4)
    lens = K.request_mix("heavy-tailed", 50, 2048, seed=1)
    assert len(lens) == 50 and all(1 <= n <= 2048 for n in lens)
    est = K.serving_estimate(lens, 2048, 1000.0, 16, 1e7, 0.0, 100.0)
    assert est["paged"]["reserved_tokens"] == sum(-(-n // 16) * 16 for n in lens)
    assert est["paged"]["waste"] < est["preallocated"]["waste"]
    assert est["paged"]["batch"] >= est["preallocated"]["batch"]
    one = K.serving_estimate(lens, 2048, 1000.0, 1, 1e12, 0.0, 100.0)
    assert one["paged"]["waste"] == 0.0  # blocks of one token waste nothing
    with pytest.raises(ValueError, match="mix"):
        K.request_mix("bursty", 3, 10)


def test_serving_panel_callback(capsys):
    est = K.serving_panel(2, 32, "uniform", 16, weight_bytes_=2.6e9, gbps=100.0)
    assert "paged" in capsys.readouterr().out
    assert est["paged"]["waste"] < est["preallocated"]["waste"]
    more_heads = K.serving_panel(32, 32, "uniform", 16, weight_bytes_=2.6e9, gbps=100.0, show=False)
    assert more_heads["paged"]["batch"] <= est["paged"]["batch"]  # bigger KV per token: fewer requests fit


def test_bandwidth_rows_interleaved_and_sequential_agree_on_counts():
    m1, m2 = _model(4), _model(1)
    cases = [("mha", m1, 8, 2), ("mqa", m2, 8, 3)]
    a, b = K.bandwidth_rows(cases, 2, True), K.bandwidth_rows(cases, 2, False)
    for x, y in zip(a, b):
        assert (x["model"], x["bytes"], x["flops"], x["batch"]) == (y["model"], y["bytes"], y["flops"], y["batch"])
        assert x["seconds"] > 0 and x["tokens_per_s"] == x["batch"] / x["seconds"]


def test_paged_waste_verdict_is_not_testable_on_short_requests():
    short = K.paged_waste_verdict(0.179, 16, 43)
    assert short["verdict"] == "not testable" and "16" in short["reason"]
    assert abs(short["expected"] - 8 / 43) < 1e-12
    assert K.paged_waste_verdict(0.02, 16, 1000)["verdict"] == "supported"
    assert K.paged_waste_verdict(0.10, 16, 1000)["verdict"] == "contradicted"
    with pytest.raises(ValueError):
        K.paged_waste_verdict(0.1, 0, 100)


def test_variant_speeds_times_every_case_round_robin():
    models = {"mha": _model(4), "mqa": _model(1)}
    low, _ = I.factorise_kv(models["mha"], 4)
    rows = K.variant_speeds(models, ("latent", low), 8, 2, warmup=1)
    assert [r["variant"] for r in rows] == ["mha", "mqa", "latent"]
    assert all(r["seconds"] > 0 and r["spread"] >= 0 for r in rows)
    assert rows[0]["kv_share"] > rows[1]["kv_share"] and rows[2]["kv_share"] is None
    with pytest.raises(ValueError):
        K.variant_speeds(models, None, 8, 0)


def test_per_position_reports_spreads():
    sp = {}
    out = K.per_position(_model(2), [4, 8], 2, warmup=1, spreads=sp)
    assert set(sp) == set(out) and all(len(v) == 2 for v in sp.values())


def test_compiled_decode_options_fuse_the_matvec_under_cuda_graphs():
    from helpers.lowbit.quant_linear import FUSED_MATVEC

    assert K.decode_compile_options() == {"triton.cudagraphs": True, **FUSED_MATVEC}
    assert K.decode_compile_options("default") == FUSED_MATVEC
    assert FUSED_MATVEC == {"coordinate_descent_tuning": True}
    # the mode's own options are Inductor's: what torch.compile(mode="reduce-overhead") would set
    from torch._inductor import list_mode_options

    assert list_mode_options("reduce-overhead").items() <= K.decode_compile_options().items()
    with pytest.raises(ValueError, match="mode"):
        K.decode_compile_options("max-autotune")
