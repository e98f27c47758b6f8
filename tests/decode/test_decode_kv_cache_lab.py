"""Notebook 10's parameters and measurements of one sequence's cache (helpers.decode.kv_cache_lab): the compiled
model's layers, prefill against decode, the per-position timings and the sentences read from them."""
from __future__ import annotations

import pytest

from helpers.decode import kv_cache_lab
from helpers.gpt.model import GPTConfig
from kv_support import small_gpt


def test_the_compiled_model_keeps_its_presets_width_and_at_most_its_layers():
    assert kv_cache_lab.compiled_layers("1.3b", kv_cache_lab.COMPILE_LAYERS_DEFAULT) == 8 < GPTConfig.preset("1.3b").n_layer
    assert kv_cache_lab.compiled_layers("small10m", 12) == GPTConfig.preset("small10m").n_layer == 6  # smoke: all of them
    assert kv_cache_lab.compiled_layers("1.3b", 1) == 1
    with pytest.raises(ValueError, match="layers"):
        kv_cache_lab.compiled_layers("1.3b", 0)


def test_prefill_decode_counts_both_phases():
    rows = kv_cache_lab.prefill_decode(small_gpt(2), 12, 1)
    assert [r["phase"] for r in rows] == ["prefill", "decode"]
    assert rows[0]["intensity"] > rows[1]["intensity"]  # prefill reuses every weight 12 times


def test_per_position_times_every_position_in_one_interleaved_comparison(monkeypatch):
    calls = []
    real = kv_cache_lab.compare

    def spy(fns, *args):
        calls.append(list(fns))
        return real(fns, *args)
    monkeypatch.setattr(kv_cache_lab, "compare", spy)
    out = kv_cache_lab.per_position(small_gpt(2), [4, 8], 2, budget_s=0.01)
    assert calls == [["with cache 4", "without cache 4", "with cache 8", "without cache 8"]]  # one run, not one a position
    assert set(out) == {"with cache", "without cache"} and all(len(v) == 2 for v in out.values())
    assert len({len(t.samples) for v in out.values() for t in v}) == 1  # the same rounds for every case
    assert all(len(t.samples) >= 2 and t.q25 <= t.median <= t.q75 for v in out.values() for t in v)


def test_the_cached_sentence_says_longer_or_shorter_only_beyond_the_noise():
    said = kv_cache_lab.cached_sentence
    assert "1.50x): it grows" in said([8, 96], [_timing(1.0), _timing(1.5)])
    assert "1.50x shorter at the longer context" in said([8, 96], [_timing(1.5), _timing(1.0)])
    assert "cannot tell" in said([8, 96], [_timing(1.0, 0.3), _timing(1.2, 0.3)])


def _timing(median, spread=0.02):
    from helpers.measure.bench import Timing
    return Timing(median, median * (1 - spread), median * (1 + spread), [median] * 5)


def test_position_report_ranks_only_separated_points():
    pos = [8, 96]
    t = {"with cache": [_timing(1.0, 0.5), _timing(1.0)], "without cache": [_timing(1.2, 0.5), _timing(4.0)]}
    rep = kv_cache_lab.position_report(pos, t, "t")
    assert [r[-1] for r in rep["rows"]] == ["no: IQRs overlap", "yes"]
    assert "cannot rank them there" in rep["sentences"][1] and "faster" in rep["sentences"][0]
    assert "O(n^2)" in kv_cache_lab.growth_sentence(pos, t)  # 1.2 -> 4.0 with disjoint IQRs: growth shows
    flat = {"with cache": t["with cache"], "without cache": [_timing(1.0), _timing(1.1)]}
    assert "did not grow beyond the noise" in kv_cache_lab.growth_sentence(pos, flat)


def test_roofline_sentence_follows_where_the_points_sit():
    peak, bw = 1.0, 10.0  # ridge at 100 FLOP/byte; roof at intensity 1 is 0.01 TFLOP/s
    near = [{"phase": "decode", "intensity": 1.0, "tflops": 0.008},
            {"phase": "prefill", "intensity": 500.0, "tflops": 0.6}]
    text = kv_cache_lab.roofline_sentence(near, peak, bw)
    assert "decode (1.00 FLOP/byte) reached 80% of its roof and is memory-bound" in text
    assert "prefill (500.00 FLOP/byte) reached 60% of its roof and is compute-bound" in text
    assert "neither" not in text
    under = [{"phase": "decode", "intensity": 1.0, "tflops": 0.0001},
             {"phase": "prefill", "intensity": 500.0, "tflops": 0.6}]
    text = kv_cache_lab.roofline_sentence(under, peak, bw)
    assert "memory-bound" not in text and "2.0 decades under it" in text
    assert "Decode is neither memory- nor compute-bound" in text and "compute-bound" in text
    with pytest.raises(ValueError):
        kv_cache_lab.roofline_sentence(near, 0.0, bw)


def test_roofline_sentence_names_a_side_or_a_bound_only_when_the_numbers_allow():
    peak, bw = 1.0, 10.0  # ridge at 100 FLOP/byte
    near = [{"phase": "prefill", "intensity": 150.0, "tflops": 0.6}]  # within 2x of the ridge: no side
    text = kv_cache_lab.roofline_sentence(near, peak, bw)
    assert "within 2x of the ridge" in text and "cannot tell which roof" in text and "-bound" not in text
    # an IQR across the 10% mark: neither bound nor far below can be said
    t = 1e-3
    across = [{"phase": "decode", "intensity": 1.0, "flops": 0.01e12 * 0.1 * t, "seconds": t, "q25": 0.8 * t,
               "q75": 1.2 * t, "tflops": 0.01 * 0.1}]
    text = kv_cache_lab.roofline_sentence(across, peak, bw)
    assert "between 5% and 10% of it" in text and "and is memory-bound" not in text and "decades under" not in text
    below = [{**across[0], "q25": 0.99 * t, "q75": 1.01 * t, "flops": 0.01e12 * 0.07 * t, "tflops": 0.0007}]
    assert "cannot tell" in kv_cache_lab.roofline_sentence(below, peak, bw)  # 7%: under 10%, not far under it
    tight = [{**across[0], "q25": 0.99 * t, "q75": 1.01 * t, "flops": 0.01e12 * 0.5 * t, "tflops": 0.005}]
    assert "reached 50% of its roof (IQR-bounded 50%-51%) and is memory-bound" in kv_cache_lab.roofline_sentence(
        tight, peak, bw)


def test_batch_scaling_finds_the_knee_only_beyond_the_noise():
    def row(batch, median, spread=0.02):
        return {"batch": batch, **{k: v for k, v in zip(("seconds", "q25", "q75"),
                                                           (median, median * (1 - spread), median * (1 + spread)))},
                "samples": [median]}

    clear = kv_cache_lab.batch_scaling([row(1, 1.0), row(4, 1.5), row(16, 4.0)])  # shares 67%, 25%
    assert clear["knee"] == 16 and clear["unclear"] == []
    assert clear["gain"][0] == pytest.approx(4.0) and clear["gain"][1] < 4.0 < clear["gain"][2]
    noisy = kv_cache_lab.batch_scaling([row(1, 1.0, 0.3), row(4, 2.2, 0.3), row(16, 8.0, 0.02)])  # 45% at 4, noisy
    assert noisy["unclear"] == [4] and noisy["knee"] == 16
    flat = kv_cache_lab.batch_scaling([row(1, 1.0), row(4, 1.1)])
    assert flat["knee"] is None and flat["unclear"] == []


def test_copy_fraction_and_the_bandwidth_claim_read_the_compiled_step_where_there_is_one():
    row = {"model": "tiny", "bytes": 2e9, "seconds": 1.0, "q25": 0.8, "q75": 2.0, "gbps": 2.0, "samples": [1.0]}
    assert kv_cache_lab.copy_fraction(None, row, 4.0) == pytest.approx((0.5, 0.25, 0.625))  # q75 gives the low end
    compiled = {"bytes": 3e9, "compiled_s": 1.0, "compiled_q25": 1.0, "compiled_q75": 1.5}
    assert kv_cache_lab.copy_fraction(compiled, row, 4.0) == pytest.approx((0.75, 0.5, 0.75))
    judged = kv_cache_lab.decode_bandwidth_claim(compiled, "1.3b (8 of its 24 layers)", None, row, 4.0, "cuda")
    assert judged["value"] == pytest.approx(75) and judged["spread"] == pytest.approx((50, 75))
    assert judged["claimed"] == (70.0, None) and "1.3b (8 of its 24 layers) at 75%" in judged["measured"]
    cpu = kv_cache_lab.decode_bandwidth_claim(None, "tiny", None, row, 4.0, "cpu")
    assert cpu["verdict"] == "not testable" and "CUDA graphs" in cpu["reason"] and "50% of the copy" in cpu["measured"]
    failed = kv_cache_lab.decode_bandwidth_claim(None, "tiny", "RuntimeError: x", row, 4.0, "cuda")
    assert failed["reason"] == "torch.compile failed: RuntimeError: x"
