"""Notebook 10's decode-speed measurements (helpers.decode.kv_decode_lab): bytes and FLOPs counted per decode step,
interleaved and sequential timing agreeing on the counts, the attention variants timed round-robin, and every
headline from the protocol, one comparison per model."""
from __future__ import annotations

import pytest

from helpers.decode import kv_cache, kv_cache_lab, kv_decode_lab
from helpers.gpt import footprint
from kv_support import small_gpt


def test_bandwidth_row_counts_the_weights_and_every_sequences_cache():
    model = small_gpt(2)
    row = kv_decode_lab.bandwidth_row(model, 10, 3, 1, "m")
    cfg = model.config
    kv = kv_cache.kv_bytes_per_token(cfg.n_layer, cfg.n_kv_head, cfg.head_dim, 4)
    assert row["bytes"] == footprint.decode_step_bytes(model) + 3 * 11 * kv
    assert row["flops"] > 0 and row["tokens_per_s"] > 0


def test_bandwidth_rows_interleaved_and_sequential_agree_on_counts():
    m1, m2 = small_gpt(4), small_gpt(1)
    cases = [("mha", m1, 8, 2), ("mqa", m2, 8, 3)]
    a, b = kv_decode_lab.bandwidth_rows(cases, 2, True), kv_decode_lab.bandwidth_rows(cases, 2, False)
    for x, y in zip(a, b):
        assert (x["model"], x["bytes"], x["flops"], x["batch"]) == (y["model"], y["bytes"], y["flops"], y["batch"])
        assert x["seconds"] > 0 and x["tokens_per_s"] == x["batch"] / x["seconds"]


def test_variant_speeds_times_every_case_round_robin():
    models = {"mha": small_gpt(4), "mqa": small_gpt(1)}
    low, _ = kv_cache.factorise_kv(models["mha"], 4)
    rows = kv_decode_lab.variant_speeds(models, ("latent", low), 8, 2, budget_s=0.01)
    assert [r["variant"] for r in rows] == ["mha", "mqa", "latent"]
    assert all(r["seconds"] > 0 and r["spread"] >= 0 for r in rows)
    assert rows[0]["kv_share"] > rows[1]["kv_share"] and rows[2]["kv_share"] is None
    with pytest.raises(ValueError):
        kv_decode_lab.variant_speeds(models, None, 8, 0)


def test_headlines_come_from_the_protocol_and_one_measurement(monkeypatch):
    calls = []
    real = kv_cache_lab.protocol.compare

    def spy(fns, **kw):
        calls.append(sorted(map(str, fns)))
        return real(fns, **kw)
    monkeypatch.setattr(kv_cache_lab.protocol, "compare", spy)
    models = {"a": small_gpt(2), "b": small_gpt(1)}
    bw, batches = kv_decode_lab.decode_sweep(models, 8, [1, 3], 2, True, budget_s=0.01)
    assert [len(c) for c in calls] == [1, 2]  # a@1, then b@1 and b@3 interleaved: one comparison a model, b@1 once
    assert batches[0] is bw[-1] and [r["batch"] for r in batches] == [1, 3]
    assert kv_cache_lab.timing(bw[0]).median == bw[0]["seconds"] and len(bw[0]["samples"]) >= 2
    kv_cache_lab.prefill_decode(small_gpt(2), 6, 2, budget_s=0.01)
    kv_cache_lab.per_position(small_gpt(2), [4], 2, budget_s=0.01)
    assert calls[2:] == [["decode", "prefill"], ["with cache 4", "without cache 4"]]
