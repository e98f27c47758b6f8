"""helpers.lowbit.quant_linear: LLM.int8's decomposition against bitsandbytes, the weight-only int8 / int4
linears and their backends, the Triton int4 kernel, the linear swap."""
from __future__ import annotations

import logging

import pytest
import torch

from helpers.lowbit import quant, quant_linear


def _w(shape, seed=0, dtype=torch.float32):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def test_llm_int8_decomposition_beats_plain_int8_on_outliers_and_matches_bitsandbytes():
    pytest.importorskip("bitsandbytes")
    x = quant_linear.planted_outliers(32, 128, columns=3, size=25.0, seed=1)
    w = _w((64, 128), seed=2) * 0.05
    ref = x @ w.T
    plain, none = quant_linear.llm_int8_matmul(x, w, threshold=0.0)
    mixed, cols = quant_linear.llm_int8_matmul(x, w, threshold=6.0)
    assert none.numel() == 0 and cols.numel() == 3
    assert quant.error(ref, mixed) < 0.5 * quant.error(ref, plain)
    for th in (0.0, 6.0):
        with torch.no_grad():
            theirs = quant_linear.bnb_int8_linear(w, th)(x)
        ours, _ = quant_linear.llm_int8_matmul(x, w, th, outlier_weight="int8")
        assert quant.error(theirs, ours) < 1e-2  # bitsandbytes casts x to fp16 before quantising it
    with pytest.raises(ValueError):
        quant_linear.llm_int8_matmul(x, w.T)


@pytest.mark.parametrize("bits", [8, 4])
def test_weight_only_linear_equals_dequantise_then_matmul(bits):
    lin = torch.nn.Linear(128, 48)
    torch.nn.init.normal_(lin.weight, std=0.05, generator=torch.Generator().manual_seed(5))
    m = quant_linear.WeightOnlyLinear.from_linear(lin, bits, 32)
    x = _w((3, 7, 128), seed=6)
    ref = torch.nn.functional.linear(x, m.dequantized(), lin.bias)
    torch.testing.assert_close(m(x), ref, rtol=1e-5, atol=1e-5)
    assert quant.error(lin.weight, m.dequantized()) < (0.01 if bits == 8 else 0.1)
    assert m.weight_bytes() == (48 * 128 + 48 * 4 if bits == 8 else 48 * 64 + 2 * 48 * 4 * 4)


@pytest.mark.skipif(quant_linear.BROKEN is not None, reason=str(quant_linear.BROKEN))
def test_compiled_int8_asks_inductor_to_fuse_the_conversion_into_the_matvec(monkeypatch):
    # without coordinate_descent_tuning Inductor keeps a batch-1 matmul as cuBLAS's mm and converts the int8
    # weight to bf16 in a kernel of its own (5 bytes moved per weight); gpt-fast's recipe sets it
    seen = {}

    def fake_compile(fn, **kw):
        seen.update(kw)
        return fn

    monkeypatch.setattr(quant_linear, "_COMPILED", None)
    monkeypatch.setattr(torch, "compile", fake_compile)
    assert quant_linear._compiled_int8() is quant_linear._int8_linear
    assert seen == {"dynamic": True, "options": {"coordinate_descent_tuning": True}}


def test_triton_int4_kernel_equals_pytorch_dequantise_then_matmul():
    lin = torch.nn.Linear(96, 40)  # odd tile edges: N=40 over BLOCK_N=32, K=96 over BLOCK_K=64
    m = quant_linear.WeightOnlyLinear.from_linear(lin, 4, 32)
    dev = "cpu" if quant_linear.INTERPRETED else "cuda"
    m = m.to(dev)
    x = _w((3, 96), seed=7).to(dev)
    got = quant_linear.int4_matmul(x, m.qweight, m.scale, m.zero, 32)
    torch.testing.assert_close(got, x @ m.dequantized().T, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError):
        quant_linear.int4_matmul(x, m.qweight, m.scale, m.zero, 48)
    if quant_linear.INTERPRETED:  # the interpreter returns ~1e10 for bf16 activations: refused, not computed wrong
        with pytest.raises(ValueError, match="bf16"):
            quant_linear.int4_matmul(x.bfloat16(), m.qweight, m.scale, m.zero, 32)


def test_swap_linears_keeps_head_and_changes_blocks():
    from helpers.gpt.model import GPT, GPTConfig
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("tiny", n_layer=1)).eval()
    x = torch.randint(0, model.config.vocab_size, (2, 16))
    with torch.no_grad():
        before = model(x)[0]
        quant_linear.swap_linears(model, lambda lin: quant_linear.WeightOnlyLinear.from_linear(lin, 8))
        after = model(x)[0]
    assert isinstance(model.lm_head, torch.nn.Linear)
    assert sum(isinstance(m, quant_linear.WeightOnlyLinear) for m in model.modules()) == 5  # q, kv, out, up, down
    assert 0 < quant.error(before, after) < 0.05


def test_fused_int8_backend_equals_the_torch_backend():
    lin = torch.nn.Linear(128, 48)
    m = quant_linear.WeightOnlyLinear.from_linear(lin, 8)
    x = torch.randn(3, 5, 128, generator=torch.Generator().manual_seed(1))
    ref = m(x)
    m.backend = "fused"
    torch.testing.assert_close(m(x), ref, rtol=1e-5, atol=1e-5)


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
