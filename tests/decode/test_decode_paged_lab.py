"""Notebook 10's paged-cache measurements (helpers.decode.paged_lab): waste counted from block tables on planted,
mixed and workload-like lengths, decode-attention speed rows, the KV-memory panel and the paged-waste verdict."""
from __future__ import annotations

import pytest

from helpers.decode import paged_lab
from helpers.measure import claims
from kv_support import tiny_gpt


def test_table_waste_on_planted_lengths():
    w = paged_lab.table_waste([1, 16, 17, 32, 0], 16)
    assert (w["allocated"], w["used"], w["wasted"]) == (16 + 16 + 32 + 32, 66, 30)
    assert w["fraction"] == pytest.approx(30 / 96)


def test_workload_lengths_and_the_waste_verdict():
    lens = paged_lab.workload_lengths("ShareGPT-like", 4000, seed=1)
    mean = sum(lens) / len(lens)
    assert 400 < mean < 550 and max(lens) <= 2048 and min(lens) >= 2  # 161 + 338 on average, capped at 2048
    out = paged_lab.realistic_waste(block_sizes=[16], n=500)
    r = out["row16"]
    assert r["block size"] == 16 and r["workload"] == "ShareGPT-like"
    assert out["verdict"]["verdict"] == ("supported" if r["fraction"] < 0.044 else "contradicted")  # 4%, +10% close
    assert out["verdict"]["expected"] == pytest.approx(8 / r["mean tokens"])
    said = paged_lab.paged_waste_claim(out)
    assert said["measured"].startswith(f"{100 * r['fraction']:.2f}% of KV slots wasted") and "of 500 ShareGPT" in said["measured"]
    assert said["value"] == pytest.approx(100 * r["fraction"]) and said["claimed"] == (None, 4.0)
    with pytest.raises(ValueError, match="workload"):
        paged_lab.workload_lengths("chat", 3)


def test_mix_waste_and_decode_speed_return_consistent_rows_and_print_nothing(capsys):
    model = tiny_gpt(2)
    waste = paged_lab.mix_waste(model, block_sizes=[4, 7], n_requests=6)
    by = {(r["scheme"], r["block size"]): r for r in waste["rows"]}
    assert list(by) == [("preallocate seq_len", None), ("preallocate prompt + cap", None), ("paged", 4), ("paged", 7)]
    assert by[("paged", 4)]["fraction"] < by[("preallocate prompt + cap", None)]["fraction"] \
        < by[("preallocate seq_len", None)]["fraction"]
    assert all(r["used"] == by[("paged", 4)]["used"] for r in waste["rows"])  # the same tokens, held differently
    rows, check, comparison = paged_lab.decode_speed(model, [4, 7], batch=2, context=20, reps=1, seed=0)
    assert [r["block size"] for r in rows] == [4, 7] and all(r["max |err| torch"] < 1e-4 for r in rows)
    assert rows[0]["contiguous us"] == rows[1]["contiguous us"] == 1e6 * comparison["contiguous"].median  # timed once
    sentence = paged_lab.paged_sentence(waste, comparison, [4, 7], 2, 20, check)
    assert sentence.startswith("On this mix of 6 requests") and check in sentence
    assert capsys.readouterr().out == ""  # the notebook's cell prints; the lab only measures
    with pytest.raises(ValueError, match="block_sizes"):
        paged_lab.mix_waste(model, block_sizes=[0])
    with pytest.raises(ValueError, match="context"):
        paged_lab.decode_speed(model, [4], batch=2, context=0, reps=1, seed=0)


def test_request_mix_and_serving_estimate():
    lens = paged_lab.request_mix("heavy-tailed", 50, 2048, seed=1)
    assert len(lens) == 50 and all(1 <= n <= 2048 for n in lens)
    est = paged_lab.serving_estimate(lens, 2048, 1000.0, 16, 1e7, 0.0, 100.0)
    assert est["paged"]["reserved_tokens"] == sum(-(-n // 16) * 16 for n in lens)
    assert est["paged"]["waste"] < est["preallocated"]["waste"]
    assert est["paged"]["batch"] >= est["preallocated"]["batch"]
    one = paged_lab.serving_estimate(lens, 2048, 1000.0, 1, 1e12, 0.0, 100.0)
    assert one["paged"]["waste"] == 0.0  # blocks of one token waste nothing
    with pytest.raises(ValueError, match="mix"):
        paged_lab.request_mix("bursty", 3, 10)


def test_serving_panel_callback(capsys):
    est = paged_lab.serving_panel(2, 32, "uniform", 16, weight_bytes_=2.6e9, gbps=100.0)
    assert "paged" in capsys.readouterr().out
    assert est["paged"]["waste"] < est["preallocated"]["waste"]
    more_heads = paged_lab.serving_panel(32, 32, "uniform", 16, weight_bytes_=2.6e9, gbps=100.0, show=False)
    assert more_heads["paged"]["batch"] <= est["paged"]["batch"]  # bigger KV per token: fewer requests fit


def test_paged_waste_verdict_is_not_testable_on_short_requests(results_tmp):
    short = paged_lab.paged_waste_verdict(0.179, 16, 43)
    assert short["verdict"] == "not testable" and "16" in short["reason"]
    assert abs(short["expected"] - 8 / 43) < 1e-12
    assert short["kwargs"]["verdict"] == "not testable" and short["kwargs"]["claimed"] == (None, 4.0)
    assert paged_lab.paged_waste_verdict(0.02, 16, 1000)["verdict"] == "supported"
    assert paged_lab.paged_waste_verdict(0.042, 16, 1000)["verdict"] == "supported"  # within 10% of 4%: not against it
    over = paged_lab.paged_waste_verdict(0.10, 16, 1000)
    assert over["verdict"] == "contradicted" and "above the claimed at most 4%" in over["reason"]
    row = claims.verdict("paged-waste-under-4pct", notebook="10", claim="c", source="s", measured="m", quiet=True,
                         **over["kwargs"])
    assert row["verdict"] == "contradicted" and row["claimed"] == {"lo": None, "hi": 4.0, "above": "contradicted"}
    with pytest.raises(ValueError):
        paged_lab.paged_waste_verdict(0.1, 0, 100)


def test_the_waste_sentence_names_every_other_mix_beside_the_judged_row():
    real = paged_lab.realistic_waste(block_sizes=[16, 32], n=300, seed=0)
    alpaca = [r for r in real["rows"] if r["workload"] == "Alpaca-like" and r["scheme"] == "paged"]
    at16 = next(r for r in alpaca if r["block size"] == 16)
    assert [o["workload"] for o in real["others"]] == ["Alpaca-like"]
    assert f"{100 * at16['fraction']:.2f}% in blocks of 16" in real["sentence"]
    assert ("Not on every mix" in real["sentence"]) == (100 * at16["fraction"] > paged_lab.WASTE_CLAIM_PCT)
    said = paged_lab.paged_waste_claim(real)
    assert said["value"] == 100 * real["row16"]["fraction"]  # the judged row is still ShareGPT-like's
    assert "Alpaca-like" in said["measured"]


def test_the_speed_note_names_each_variant_by_its_block_size_apart_from_its_warm_up_calls():
    from helpers.measure.bench import Timing
    from helpers.measure.protocol import Comparison

    t = Timing(1e-4, 9e-5, 1.1e-4, [1e-4] * 3)
    c = Comparison({"contiguous": t, "paged torch 4": t, "paged torch 16": t},
                   {"contiguous": 4, "paged torch 4": 6, "paged torch 16": 3}, 30, "max_reps")
    note = paged_lab.speed_note(c)
    assert ("30 interleaved rounds, after a warm-up until steady that took 4 calls for contiguous SDPA, 6 for paged torch "
            "at block size 4, 3 for paged torch at block size 16;") in note
    assert note.endswith("the rounds stopped when they reached the most allowed")


def test_the_speed_sentence_names_a_best_block_size_only_when_no_other_ties_it():
    from helpers.measure.bench import Timing
    from helpers.measure.protocol import Comparison

    def t(med, half):  # a timing with median `med` and quartiles med -/+ half
        return Timing(med, med - half, med + half, [med - half, med, med + half])

    def sentence(t16, t64):
        c = Comparison({"contiguous": t(400e-6, 8e-6), "paged torch 16": t16, "paged torch 64": t64},
                       {"contiguous": 1, "paged torch 16": 1, "paged torch 64": 1}, 3, "max_reps")
        return paged_lab.speed_sentence(c, [16, 64], batch=4, context=512)

    tied = sentence(t(497e-6, 8e-6), t(480e-6, 10e-6))  # 64's median lowest, its IQR overlapping 16's
    assert "at the block size with the lowest median (64; its IQR overlaps 16's" in tied
    assert "best block size (" not in tied
    apart = sentence(t(600e-6, 5e-6), t(480e-6, 5e-6))
    assert "paged torch at its best block size (64) took" in apart and "overlaps" not in apart
