"""helpers.lowbit.quant_decode_lab: notebook 08's decode-speed measurement on a CPU (with a planted
timer), its sentences and the ledger's verdict; the weight-only copies it times."""
from __future__ import annotations

import pytest
import torch

from helpers.gpt.model import GPT, GPTConfig
from helpers.lowbit import quant_decode_lab, quant_linear
from helpers.measure import bench, claims, clock as clocks, protocol

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
    assert res["clock"] == "planted"
    assert rows[FUSED]["bytes"] == rows[DEQ]["bytes"] < rows["fp32"]["bytes"] / 2
    assert rows["fp32"]["gbps"] == pytest.approx(rows["fp32"]["bytes"] / 0.01 / 1e9)
    with pytest.raises(ValueError, match="variants"):
        quant_decode_lab.cpu_decode("tiny", variants=("int3",))


@pytest.mark.slow
def test_cpu_decode_reads_the_threads_clock_on_one_thread_and_the_wall_on_more():
    res = quant_decode_lab.cpu_decode("tiny", prompt=8, variants=("fp32",), budget_s=0.2, max_reps=5, max_warmup=3)
    assert res["clock"] == clocks.THREAD and res["rows"][0]["timing"].clock == clocks.THREAD
    res = quant_decode_lab.cpu_decode("tiny", prompt=8, variants=("fp32",), budget_s=0.2, max_reps=5, max_warmup=3,
                                      threads=2)
    assert res["clock"] == clocks.WALL and res["rows"][0]["timing"].clock == clocks.WALL


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


def test_decode_claim_is_judged_by_the_one_rule_on_the_ratio_and_its_spread(results_tmp):
    fast = protocol.ratio(_timing([0.04, 0.041, 0.042]), _timing([0.01, 0.011, 0.012]))  # ~3.7x, tight
    kw = quant_decode_lab.decode_claim(fast, "planted")
    assert kw["spread"] == (fast.lo, fast.hi) and kw["claimed"] == (1.48, None) and "verdict" not in kw
    assert claims.verdict("quant-decode-speedup", quiet=True, **kw)["verdict"] == "supported"
    tied = protocol.ratio(_timing([0.02, 0.03, 0.04]), _timing([0.019, 0.029, 0.039]))  # IQR-bounded 0.5-2.1x
    kw = quant_decode_lab.decode_claim(tied, "planted")
    row = claims.verdict("quant-decode-speedup", quiet=True, **kw)
    assert row["verdict"] == "not testable" and "within the noise" in kw["measured"] and "too wide" in row["reason"]
    slow = protocol.ratio(_timing([0.0120, 0.0121, 0.0122]), _timing([0.0100, 0.0101, 0.0102]))  # ~1.2x, tight
    assert claims.verdict("quant-decode-speedup", quiet=True, **quant_decode_lab.decode_claim(slow, "p"))["verdict"] == "contradicted"
    # the same 1.2x is held to int4's 1.88x when bits=4, and to nothing else
    assert quant_decode_lab.decode_claim(slow, "p", bits=4)["claimed"] == (1.88, None)
    with pytest.raises(ValueError, match="bits"):
        quant_decode_lab.decode_claim(slow, "p", bits=3)


def test_gpu_decode_sentences_rank_int8_against_int4_only_when_separated():
    def row(variant, ms, q25, q75, batch=1):
        return {"variant": variant, "batch": batch, "ms": ms, "q25_ms": q25, "q75_ms": q75}

    rows = [row("bf16", 10.0, 9.9, 10.1), row("int8", 6.0, 5.9, 6.1), row("int4-triton", 6.05, 5.8, 6.3),
            {"variant": "torchao-int4", "batch": None, "why": "missing"}]
    text = quant_decode_lab.gpu_decode_sentences(rows)
    assert text[0].startswith("Decode batch 1") and "int8 1.67x" in text[0] and "(within the noise)" not in text[0]
    assert "cannot rank them" in text[1] and "torchao" not in " ".join(text)
    apart = quant_decode_lab.gpu_decode_sentences(rows[:2] + [row("int4-triton", 4.0, 3.9, 4.1)])
    assert "int4 (Triton) was" in apart[1] and "faster than int8" in apart[1]
    noisy = quant_decode_lab.gpu_decode_sentences([row("bf16", 10.0, 8.0, 12.0), row("int8", 9.0, 7.0, 11.0)])
    assert noisy == ["Decode batch 1, tokens/s over bf16's: int8 1.11x (IQR-bounded 0.73-1.71x) (within the noise)."]


def test_a_kernel_is_checked_against_dequantize_then_matmul_before_it_is_timed(monkeypatch):
    import pytest
    import torch

    from helpers.gpt.model import GPT, GPTConfig
    from helpers.lowbit import quant_decode_lab, quant_linear

    torch.manual_seed(0)
    base = GPT(GPTConfig(n_layer=1, n_head=2, d_model=64, d_ff=128, seq_len=16)).eval()
    model = quant_decode_lab.checked_copy(base, 4, "triton", 32)  # Triton's interpreter on a CPU, fp32: right
    assert {m.backend for m in model.modules() if isinstance(m, quant_linear.WeightOnlyLinear)} == {"triton"}
    monkeypatch.setattr(quant_linear, "int4_matmul", lambda x, *a: torch.full((x.shape[0], a[0].shape[0]), 1e10))
    with pytest.raises(RuntimeError, match="int4 'triton' logits differ from dequantize-then-matmul's.*not timed"):
        quant_decode_lab.checked_copy(base, 4, "triton", 32)
    monkeypatch.setattr(quant_linear, "int4_matmul", lambda x, *a: torch.full((x.shape[0], a[0].shape[0]), float("nan")))
    with pytest.raises(RuntimeError, match="not timed"):
        quant_decode_lab.checked_copy(base, 4, "triton", 32)
