"""helpers.lowbit.quant_decode_lab: notebook 08's decode-speed measurement on a CPU (with a planted
timer), its sentences and the ledger's verdict; the weight-only copies it times."""
from __future__ import annotations

import pytest
import torch

from helpers.gpt.model import GPT, GPTConfig
from helpers.lowbit import quant_decode_lab, quant_linear
from helpers.measure import bench, protocol

FUSED, DEQ = quant_decode_lab.CPU_DECODE_VARIANTS[1], quant_decode_lab.CPU_DECODE_VARIANTS[2]


@pytest.mark.slow
def test_weight_only_copy_swaps_the_block_linears_of_a_copy_and_leaves_the_base():
    torch.manual_seed(0)
    base = GPT(GPTConfig.preset("tiny")).eval()
    n_linear = sum(isinstance(m, torch.nn.Linear) for b in base.blocks for m in b.modules())
    q = quant_decode_lab.weight_only_copy(base, 4, "torch", 32)
    swapped = [m for m in q.modules() if isinstance(m, quant_linear.WeightOnlyLinear)]
    assert len(swapped) == n_linear and {(m.bits, m.backend) for m in swapped} == {(4, "torch")}
    assert not any(isinstance(m, quant_linear.WeightOnlyLinear) for m in base.modules())  # the base is untouched
    x = torch.randint(0, 256, (1, 16))
    with torch.no_grad():
        assert (q(x)[0] - base(x)[0]).abs().max() < 1.0  # int4 rounding only, on the same weights


def _timing(xs):
    return bench.Timing(*bench.quartiles(xs), list(xs))


def _result(fp32_s, int8_s, fp32_bytes=40e6, int8_bytes=10e6):
    rows = [{"variant": v, "bytes": n, "timing": _timing(xs), "tokens_per_s": 1 / _timing(xs).median}
            for v, n, xs in (("fp32", fp32_bytes, fp32_s), (FUSED, int8_bytes, int8_s))]
    for r in rows:
        t = r["timing"]
        r.update(gbps=r["bytes"] / t.median / 1e9, gbps_lo=r["bytes"] / t.q75 / 1e9, gbps_hi=r["bytes"] / t.q25 / 1e9)
    return {"rows": rows, "preset": "planted"}


def test_cpu_decode_sentences_rank_only_separated_timings():
    fast = quant_decode_lab.cpu_decode_sentences(_result([0.040, 0.041, 0.042, 0.043], [0.010, 0.011, 0.012, 0.013]), 2.0)
    assert "was" in fast[1] and "faster than fp32" in fast[1] and len(fast) == 2
    assert "40.0 MB per token" in fast[0] and "10.0 MB (4.0x fewer)" in fast[0]
    tied = quant_decode_lab.cpu_decode_sentences(_result([0.02, 0.025, 0.03, 0.035], [0.004, 0.006, 0.03, 0.05]), 2.0)
    assert "cannot rank them" in tied[1] and "did not measurably speed decode up" in tied[2]
    assert "IQRs overlap too" in tied[2]
    same_time = quant_decode_lab.cpu_decode_sentences(_result([0.02, 0.03, 0.04, 0.05], [0.025, 0.035, 0.045, 0.055]), 2.0)
    assert "cannot rank them" in same_time[1] and "work per weight" in same_time[2]  # 4x fewer bytes, same time
    busy = quant_decode_lab.cpu_decode_sentences(_result([0.02, 0.025, 0.03, 0.035], [0.004, 0.006, 0.03, 0.05]), 100.0)
    assert "not bandwidth-bound" in busy[2] and "IQRs overlap" not in busy[2]  # fp32 at 2% of a 100 GB/s ceiling
    slow = quant_decode_lab.cpu_decode_sentences(_result([0.010, 0.011, 0.012, 0.013], [0.050, 0.051, 0.052, 0.053]), 2.0)
    assert "fp32 was" in slow[1] and "work per weight" in slow[2]  # bandwidths separated: int8 streams slower
    assert "int8 weight-only was slower" in slow[2]


@pytest.mark.slow
def test_cpu_decode_times_every_variant_and_counts_fewer_bytes_for_int8():
    res = quant_decode_lab.cpu_decode("tiny", prompt=8, variants=("fp32", FUSED, DEQ), timer=lambda fn: (fn(), 0.01)[1],
                                      budget_s=1.0)
    rows = {r["variant"]: r for r in res["rows"]}
    assert list(rows) == ["fp32", FUSED, DEQ] and res["comparison"].stopped == "steady"
    assert res["threads"] == 1 and "on 1 thread:" in quant_decode_lab.cpu_decode_sentences(res, 1.0)[0]
    assert rows[FUSED]["bytes"] == rows[DEQ]["bytes"] < rows["fp32"]["bytes"] / 2
    assert rows["fp32"]["gbps"] == pytest.approx(rows["fp32"]["bytes"] / 0.01 / 1e9)
    with pytest.raises(ValueError, match="variants"):
        quant_decode_lab.cpu_decode("tiny", variants=("int3",))


def test_uncompiled_runs_the_compiled_int8_linears_eagerly_and_restores_them():
    torch.manual_seed(0)
    model = quant_decode_lab.weight_only_copy(GPT(GPTConfig.preset("tiny")).eval(), 8, "compile")
    lins = [m for m in model.modules() if isinstance(m, quant_linear.WeightOnlyLinear)]
    lins[0].backend = "fused"  # a backend other than "compile" is left as it is
    with pytest.raises(RuntimeError, match="inside"):
        with quant_decode_lab.uncompiled(model):
            assert lins[0].backend == "fused" and {m.backend for m in lins[1:]} == {"torch"}
            raise RuntimeError("inside")
    assert lins[0].backend == "fused" and {m.backend for m in lins[1:]} == {"compile"}  # restored after an error too
    calls = []
    quant_linear._COMPILED = lambda *a: calls.append(a) or quant_linear._int8_linear(*a)  # stands in for torch.compile
    try:
        step = quant_decode_lab._decode_step(model, 2, 8, "cpu", torch.float32)  # the prefill: 2 x 8 tokens, uncompiled
        assert calls == []
        step()  # the timed step: one token per sequence, compiled
        assert {tuple(a[0].shape[:2]) for a in calls} == {(2, 1)}
    finally:
        quant_linear._COMPILED = None


def test_decode_claim_is_judged_on_the_ratios_low_bound():
    fast = protocol.ratio(_timing([0.04, 0.041, 0.042]), _timing([0.01, 0.011, 0.012]))
    tied = protocol.ratio(_timing([0.02, 0.03, 0.04]), _timing([0.019, 0.029, 0.039]))
    assert quant_decode_lab.decode_claim(fast, "planted")["verdict"] == "supported"
    kw = quant_decode_lab.decode_claim(tied, "planted")
    assert kw["verdict"] == "contradicted" and "within the noise" in kw["measured"] and kw["value"] > 1
