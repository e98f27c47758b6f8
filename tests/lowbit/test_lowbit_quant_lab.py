"""helpers.lowbit.quant_lab's CPU decode measurement and the sentences notebook 08 generates from its tables
(decode ranks, loss gaps against their noise, AWQ's explanation, the zero-point bits), the ledger's verdicts
(helpers.lowbit.lora_lab.qlora_65b_claim, quant_lab.decode_claim), and LLM.int8 against bitsandbytes across
thresholds (helpers.lowbit.quant_linear)."""
from __future__ import annotations

import logging

import pytest
import torch

from helpers.gpt import data
from helpers.gpt.model import GPT, GPTConfig
from helpers.gpt.pretrained import validation_loss
from helpers.lowbit import lora, lora_lab, quant, quant_lab, quant_linear
from helpers.measure import bench, claims, protocol

FUSED, DEQ = quant_lab.CPU_DECODE_VARIANTS[1], quant_lab.CPU_DECODE_VARIANTS[2]


def _timing(xs):
    return bench.Timing(*bench.quartiles(xs), list(xs))


def _result(fp32_s, int8_s, fp32_bytes=40e6, int8_bytes=10e6):
    rows = [{"variant": v, "bytes": n, "timing": _timing(xs), "tokens_per_s": 1 / _timing(xs).median}
            for v, n, xs in (("fp32", fp32_bytes, fp32_s), (FUSED, int8_bytes, int8_s))]
    for r in rows:
        t = r["timing"]
        r.update(gbps=r["bytes"] / t.median / 1e9, gbps_lo=r["bytes"] / t.q75 / 1e9, gbps_hi=r["bytes"] / t.q25 / 1e9)
    return {"rows": rows, "preset": "planted"}


# ---------------------------------------------------------------- CPU decode: the measurement and its sentences

def test_cpu_decode_sentences_rank_only_separated_timings():
    fast = quant_lab.cpu_decode_sentences(_result([0.040, 0.041, 0.042, 0.043], [0.010, 0.011, 0.012, 0.013]), 2.0)
    assert "was" in fast[1] and "faster than fp32" in fast[1] and len(fast) == 2
    assert "40.0 MB per token" in fast[0] and "10.0 MB (4.0x fewer)" in fast[0]
    tied = quant_lab.cpu_decode_sentences(_result([0.02, 0.025, 0.03, 0.035], [0.004, 0.006, 0.03, 0.05]), 2.0)
    assert "cannot rank them" in tied[1] and "did not measurably speed decode up" in tied[2]
    assert "IQRs overlap too" in tied[2]
    same_time = quant_lab.cpu_decode_sentences(_result([0.02, 0.03, 0.04, 0.05], [0.025, 0.035, 0.045, 0.055]), 2.0)
    assert "cannot rank them" in same_time[1] and "work per weight" in same_time[2]  # 4x fewer bytes, same time
    busy = quant_lab.cpu_decode_sentences(_result([0.02, 0.025, 0.03, 0.035], [0.004, 0.006, 0.03, 0.05]), 100.0)
    assert "not bandwidth-bound" in busy[2] and "IQRs overlap" not in busy[2]  # fp32 at 2% of a 100 GB/s ceiling
    slow = quant_lab.cpu_decode_sentences(_result([0.010, 0.011, 0.012, 0.013], [0.050, 0.051, 0.052, 0.053]), 2.0)
    assert "fp32 was" in slow[1] and "work per weight" in slow[2]  # bandwidths separated: int8 streams slower
    assert "int8 weight-only was slower" in slow[2]


def test_cpu_decode_times_every_variant_and_counts_fewer_bytes_for_int8():
    res = quant_lab.cpu_decode("tiny", prompt=8, variants=("fp32", FUSED, DEQ), timer=lambda fn: (fn(), 0.01)[1],
                               budget_s=1.0)
    rows = {r["variant"]: r for r in res["rows"]}
    assert list(rows) == ["fp32", FUSED, DEQ] and res["comparison"].stopped == "steady"
    assert res["threads"] == 1 and "on 1 thread:" in quant_lab.cpu_decode_sentences(res, 1.0)[0]
    assert rows[FUSED]["bytes"] == rows[DEQ]["bytes"] < rows["fp32"]["bytes"] / 2
    assert rows["fp32"]["gbps"] == pytest.approx(rows["fp32"]["bytes"] / 0.01 / 1e9)
    with pytest.raises(ValueError, match="variants"):
        quant_lab.cpu_decode("tiny", variants=("int3",))
    threads = torch.get_num_threads()
    assert quant_lab.copy_gbps_on(1, 2 ** 20) > 0 and torch.get_num_threads() == threads  # restored after


def test_fused_int8_backend_equals_the_torch_backend():
    lin = torch.nn.Linear(128, 48)
    m = quant_linear.WeightOnlyLinear.from_linear(lin, 8)
    x = torch.randn(3, 5, 128, generator=torch.Generator().manual_seed(1))
    ref = m(x)
    m.backend = "fused"
    torch.testing.assert_close(m(x), ref, rtol=1e-5, atol=1e-5)


def test_uncompiled_runs_the_compiled_int8_linears_eagerly_and_restores_them():
    torch.manual_seed(0)
    model = quant_lab.weight_only_copy(GPT(GPTConfig.preset("tiny")).eval(), 8, "compile")
    lins = [m for m in model.modules() if isinstance(m, quant_linear.WeightOnlyLinear)]
    lins[0].backend = "fused"  # a backend other than "compile" is left as it is
    with pytest.raises(RuntimeError, match="inside"):
        with quant_lab.uncompiled(model):
            assert lins[0].backend == "fused" and {m.backend for m in lins[1:]} == {"torch"}
            raise RuntimeError("inside")
    assert lins[0].backend == "fused" and {m.backend for m in lins[1:]} == {"compile"}  # restored after an error too
    calls = []
    quant_linear._COMPILED = lambda *a: calls.append(a) or quant_linear._int8_linear(*a)  # stands in for torch.compile
    try:
        step = quant_lab._decode_step(model, 2, 8, "cpu", torch.float32)  # the prefill: 2 x 8 tokens, uncompiled
        assert calls == []
        step()  # the timed step: one token per sequence, compiled
        assert {tuple(a[0].shape[:2]) for a in calls} == {(2, 1)}
    finally:
        quant_linear._COMPILED = None

def test_copy_size_exceeds_the_last_level_cache(monkeypatch):
    monkeypatch.setattr(quant_lab.hardware, "last_level_cache", lambda device: (480 * 2 ** 20, "L3"))
    assert quant_lab.copy_size("cpu") == 512 * 2 ** 20
    monkeypatch.setattr(quant_lab.hardware, "last_level_cache", lambda device: (None, ""))
    assert quant_lab.copy_size("cpu") == 2 ** 26 and quant_lab.copy_size("cuda") == 2 ** 30


# ---------------------------------------------------------------- loss gaps against their noise

def test_window_losses_average_to_the_validation_loss():
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("tiny")).eval()
    val = data.load_corpus("val")
    win = quant_lab.window_losses(model, val, batches=2, batch=4)
    assert win.shape == (8,)
    assert float(win.mean()) == pytest.approx(validation_loss(model, val, batches=2, batch=4), abs=1e-5)


def test_loss_sentences_flip_with_the_noise():
    base = torch.tensor([1.0, 1.2, 0.8, 1.1, 0.9, 1.0])
    noisy = base + torch.tensor([0.02, -0.03, 0.01, -0.02, 0.03, 0.0])  # mean gap ~0.0017, spread 0.02
    shifted = base + 0.05 + torch.tensor([0.001, -0.001, 0.0, 0.001, -0.001, 0.0])
    assert "cannot be told apart" in quant_lab.compare_losses("A", noisy, "B", base)
    said = quant_lab.compare_losses("A", shifted, "B", base)
    assert said.startswith("B's loss is below A's by 0.0500") and "yardstick 2 x the standard error" in said
    assert "cannot be told apart" in quant_lab.highest_loss({"A": noisy, "B": base, "C": base - 0.5})
    assert quant_lab.highest_loss({"A": shifted, "B": base}).startswith("the highest loss is A's")
    with pytest.raises(ValueError):
        quant_lab.loss_gap(base, base[:3])


def test_finetune_verdict_ranks_only_beyond_the_noise():
    kinds = list(lora.KINDS)
    up = {k: 0.01 for k in kinds}
    jitter = torch.tensor([0.02, -0.02, 0.01, -0.01])
    tied = {k: -0.0001 + jitter for k in kinds}  # the qlora-by-0.0001 case: no drop beats the noise
    text = lora_lab._verdict([], "qlora", 10, up, tied)
    assert "changed the held-out loss by less than the noise" in text and "not named" in text
    clear = {"full": torch.full((4,), -0.05) + jitter / 10, "lora": torch.full((4,), -0.01) + jitter / 10,
             "qlora": torch.full((4,), -0.02) + jitter / 10}
    text = lora_lab._verdict([], "full", 10, up, clear)
    assert text == "All three lowered it from where they started; the largest drop: full."


# ---------------------------------------------------------------- sentences from the tables

def _outliers(max_abs, cols_over):
    return [{"layer": "blocks.0.mlp.down", "max_abs": max_abs, "cols_over": cols_over}]


def test_awq_explanation_follows_the_outlier_table():
    layers = [{"bits": 3, "alpha": 0.0}, {"bits": 3, "alpha": 0.25}, {"bits": 4, "alpha": 0.0}]
    none = quant_lab.awq_explanation(_outliers(4.98, 0.0), layers, 3, 6.0)
    assert "no salient channels to protect" in none and "4.98" in none and "α = 0 (RTN itself) in 1 of 2" in none
    some = quant_lab.awq_explanation(_outliers(40.0, 0.02), layers, 3, 6.0)
    assert "there were channels to protect" in some and "no salient" not in some


def test_zero_point_bits_note_prices_the_fp32_zero():
    note = quant_lab.zero_point_bits_note(4, 64, 5.0)
    assert "4 + 64/64 = 5.00 bits" in note and "(5.00 in the table)" in note and "NF4's 4 + 32/64 = 4.50" in note
    assert "fp16 scale and zero they would cost 4.50" in note and "4-bit integer zero 4.31" in note
    assert "4 + 64/128 = 4.50" in quant_lab.zero_point_bits_note(4, 128)
    measured = quant.quantize(torch.randn(8, 128), 4, "zeropoint", 64).packed_bits_per_param()
    assert measured == pytest.approx(4 + 64 / 64)  # the table's count is the note's formula


# ---------------------------------------------------------------- the ledger

def test_qlora_claim_is_a_formula_verdict_from_the_measured_bits(results_tmp):
    kw = lora_lab.qlora_65b_claim(4.127, 64)
    total = sum(lora.finetune_gb(65, lora.FINETUNE[2], rank=64, base_bits=4.127).values())
    assert kw["basis"] == "formula" and kw["verdict"] == "supported" and kw["value"] == pytest.approx(total)
    assert "4.127 bits" in kw["measured"] and "blocks of 64" in kw["measured"] and "activations are not counted" in kw["measured"]
    heavy = lora_lab.qlora_65b_claim(5.5, 32)  # 65e9 * 5.5 / 8 = 44.7 GB of base alone, plus the adapters
    assert heavy["verdict"] == "contradicted" and heavy["value"] > 48 and "5.500 bits" in heavy["measured"]
    assert claims.verdict("qlora-65b-48gb", quiet=True, **kw)["basis"] == "formula"


def test_finetune_gb_base_bits_default_is_the_nf4_formula():
    default = lora.finetune_gb(65, lora.FINETUNE[2])
    measured = lora.finetune_gb(65, lora.FINETUNE[2], base_bits=4 + 8 / 64 + 32 / (64 * 256))
    assert measured == pytest.approx(default)
    with pytest.raises(ValueError, match="nf4_bits"):
        lora.finetune_gb(65, lora.FINETUNE[2], base_bits=0)


def test_decode_claim_is_judged_on_the_ratios_low_bound():
    fast = protocol.ratio(_timing([0.04, 0.041, 0.042]), _timing([0.01, 0.011, 0.012]))
    tied = protocol.ratio(_timing([0.02, 0.03, 0.04]), _timing([0.019, 0.029, 0.039]))
    assert quant_lab.decode_claim(fast, "planted")["verdict"] == "supported"
    kw = quant_lab.decode_claim(tied, "planted")
    assert kw["verdict"] == "contradicted" and "within the noise" in kw["measured"] and kw["value"] > 1


# ---------------------------------------------------------------- LLM.int8 against bitsandbytes at every threshold

@pytest.mark.parametrize("threshold", [6.0, 19.5, 30.0, 45.0, 65.0, 100.0])
def test_llm_int8_bitsandbytes_rule_matches_linear8bitlt_at_and_past_the_outlier_range(threshold):
    pytest.importorskip("bitsandbytes")
    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
    x = quant_linear.planted_outliers(64, 256, columns=3, size=20.0, seed=0)  # notebook 08's input: columns up to ~60
    w = 0.05 * torch.randn(128, 256, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        theirs = quant_linear.bnb_int8_linear(w, threshold)(x).float()
    ours, _ = quant_linear.llm_int8_matmul(x, w, threshold, outlier_weight="int8", row_scale="bitsandbytes")
    assert quant.error(theirs, ours) < 1e-2
    paper, cols = quant_linear.llm_int8_matmul(x, w, threshold, outlier_weight="int8")
    if 19.5 <= threshold <= 45:  # the threshold inside the outlier columns' range: the two rules' scales differ
        assert cols.numel() > 0 and quant.error(theirs, paper) > 1e-2 * 0.9
    with pytest.raises(ValueError, match="row_scale"):
        quant_linear.llm_int8_matmul(x, w, threshold, row_scale="rowwise")
