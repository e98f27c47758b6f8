"""GPTQ, AWQ and RTN (helpers.gptq); LoRA, QLoRA and 8-bit optimizer state (helpers.lora).

The GPTQ/AWQ-vs-RTN tests run on fixed layers of the cached "tiny" course GPT with calibration
windows from the training split, as notebook 08 does.
"""
from __future__ import annotations

import copy

import pytest
import torch

from helpers import gptq


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Small CPU matmuls and column loops: one thread is faster than two fighting a busy machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny():
    from helpers.pretrained import pretrained

    return pretrained("tiny", quiet=True, device="cpu").model


@pytest.fixture(scope="module")
def calib():
    return gptq.calibration_tokens(4, 128, seed=0)


@pytest.fixture(scope="module")
def inputs(tiny, calib):
    return gptq.collect_inputs(tiny, calib)


# ---------------------------------------------------------------- RTN

@pytest.mark.parametrize("bits,group", [(4, None), (3, 16), (2, 8)])
def test_rtn_grid_has_at_most_2_to_the_bits_values_per_group(bits, group):
    torch.manual_seed(0)
    W = torch.randn(6, 48)
    Q = gptq.rtn_quantize(W, bits, group)
    g = group or 48
    for row in Q.reshape(-1, g):
        assert len(torch.unique(row)) <= 2 ** bits
    step = (W.reshape(-1, g).amax(1).clamp(min=0) - W.reshape(-1, g).amin(1).clamp(max=0)) / (2 ** bits - 1)
    assert ((Q - W).abs().reshape(-1, g) <= step[:, None] / 2 + 1e-6).all()  # round to nearest: half a step


def test_rtn_keeps_a_zero_row_and_rejects_bad_options():
    W = torch.zeros(2, 8)
    assert torch.equal(gptq.rtn_quantize(W, 4), W)
    with pytest.raises(ValueError, match="bits"):
        gptq.rtn_quantize(W, 1)
    with pytest.raises(ValueError, match="group_size"):
        gptq.rtn_quantize(W, 4, 3)
    with pytest.raises(ValueError, match="group_size"):
        gptq.rtn_quantize(W, 4, 0)


# ---------------------------------------------------------------- GPTQ

def test_gptq_with_uncorrelated_inputs_is_rtn():
    """With H a multiple of the identity there is no error to feed back: GPTQ must round like RTN."""
    torch.manual_seed(1)
    W = torch.randn(8, 32)
    H = 3.0 * torch.eye(32)
    for group in (None, 8):
        assert torch.allclose(gptq.gptq_quantize(W, H, 4, group), gptq.rtn_quantize(W, 4, group), atol=1e-6)


def test_gptq_lazy_blocks_do_not_change_the_result(inputs, tiny):
    W = tiny.blocks[0].mlp.up.weight.detach()
    H = gptq.hessian(inputs["blocks.0.mlp.up"])
    one = gptq.gptq_quantize(W, H, 4, 64, block_size=64)
    lazy = gptq.gptq_quantize(W, H, 4, 64, block_size=128)
    assert torch.allclose(one, lazy, atol=1e-4)
    assert (one != W).any()


def test_gptq_zeroes_columns_whose_input_is_always_zero():
    torch.manual_seed(2)
    W, X = torch.randn(4, 16), torch.randn(64, 16)
    X[:, 3] = 0
    Q = gptq.gptq_quantize(W, gptq.hessian(X), 4)
    assert (Q[:, 3] == 0).all() and torch.isfinite(Q).all()


LAYERS = ("blocks.0.attn.q_proj", "blocks.0.mlp.up", "blocks.1.attn.out_proj", "blocks.1.mlp.down")


@pytest.mark.parametrize("bits", [4, 3])
@pytest.mark.parametrize("group,act_order", [(None, False), (32, False), (None, True)])
def test_gptq_output_error_is_below_rtn(tiny, inputs, bits, group, act_order):
    layers = gptq.block_linears(tiny)
    for name in LAYERS:
        W, X = layers[name].weight.detach(), inputs[name]
        rtn = gptq.output_error(W, gptq.rtn_quantize(W, bits, group), X)
        ours = gptq.output_error(W, gptq.gptq_quantize(W, gptq.hessian(X), bits, group, act_order=act_order), X)
        assert ours <= rtn, (name, ours, rtn)


def test_gptq_rejects_a_hessian_of_the_wrong_shape():
    with pytest.raises(ValueError, match="shape"):
        gptq.gptq_quantize(torch.randn(4, 8), torch.eye(6), 4)
    with pytest.raises(ValueError, match="damp"):
        gptq.gptq_quantize(torch.randn(4, 8), torch.eye(8), 4, damp=0)


# ---------------------------------------------------------------- AWQ

@pytest.mark.parametrize("bits", [4, 3])
def test_awq_output_error_is_not_above_rtn(tiny, inputs, bits):
    layers = gptq.block_linears(tiny)
    for name in LAYERS:
        W, X = layers[name].weight.detach(), inputs[name]
        rtn = gptq.output_error(W, gptq.rtn_quantize(W, bits, 32), X)
        W_hat, alpha = gptq.awq_quantize(W, X, bits, 32)
        assert gptq.output_error(W, W_hat, X) <= rtn + 1e-7
        assert 0.0 <= alpha <= 1.0


def test_awq_protects_a_salient_channel():
    """A channel whose inputs are 50x larger than the rest: AWQ picks α > 0 and beats RTN."""
    torch.manual_seed(3)
    W, X = torch.randn(16, 64) * 0.02, torch.randn(256, 64)
    X[:, 5] *= 50
    W_hat, alpha = gptq.awq_quantize(W, X, 3, 32)
    assert alpha > 0
    assert gptq.output_error(W, W_hat, X) < gptq.output_error(W, gptq.rtn_quantize(W, 3, 32), X)


# ---------------------------------------------------------------- whole model

def test_quantize_model_returns_a_quantised_copy(tiny, calib):
    before = copy.deepcopy(tiny.state_dict())
    q = gptq.quantize_model(tiny, "gptq", 3, 64, calib)
    for k, v in tiny.state_dict().items():
        assert torch.equal(v, before[k]), k  # the original is untouched
    info = q.quantization
    assert info["method"] == "gptq" and info["bits"] == 3 and set(info["layers"]) == set(gptq.block_linears(tiny))
    w = q.blocks[1].mlp.down.weight.detach()
    assert not torch.equal(w, tiny.blocks[1].mlp.down.weight)
    for row in w.reshape(-1, 64):
        assert len(torch.unique(row)) <= 8
    assert torch.equal(q.wte.weight, tiny.wte.weight)  # embeddings (and the tied LM head) stay fp32
    awq = gptq.quantize_model(tiny, "awq", 4, 64, calib)
    assert all(0 <= v["alpha"] <= 1 for v in awq.quantization["layers"].values())


def test_quantize_model_validates(tiny, calib):
    with pytest.raises(ValueError, match="method"):
        gptq.quantize_model(tiny, "nf4", 4, 64, calib)
    with pytest.raises(ValueError, match="calib"):
        gptq.quantize_model(tiny, "gptq", 4, 64, None)
    with pytest.raises(ValueError, match="group_size"):
        gptq.quantize_model(tiny, "rtn", 4, 48, None)


def test_sections_print_and_return_rows(tiny, calib, capsys):
    rows = gptq.layer_error_section(tiny, calib, bits=(3,), group_size=64)
    assert len(rows) == len(gptq.block_linears(tiny))
    out = capsys.readouterr().out
    assert "3-bit, groups of 64: GPTQ's output error is below RTN's in" in out
    ppl = gptq.perplexity_section(tiny, calib, bits=(4,), group_size=64, batches=1)
    assert [r["method"] for r in ppl] == ["fp32", "rtn", "gptq", "awq"]
    assert all(r["perplexity"] > 1 for r in ppl)
