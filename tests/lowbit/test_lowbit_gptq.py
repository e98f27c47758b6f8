"""GPTQ, AWQ and RTN (helpers.lowbit.gptq).

The GPTQ/AWQ-vs-RTN tests run on fixed layers of the cached "tiny" course GPT with calibration
windows from the training split, as notebook 08 does.
"""
from __future__ import annotations

import copy

import pytest
import torch

from helpers.lowbit import gptq


@pytest.fixture(scope="module")
def inputs(tiny, calib):
    return gptq.collect_inputs(tiny, calib)


def _obs_reference(W, H, bits, group, damp=0.01):
    """GPTQ written the slow way (Frantar et al., 2023, eq. 2-3): an explicit inverse Hessian, updated
    after every column by removing that column (Gaussian elimination), no Cholesky, no lazy blocks."""
    W = W.double().clone()
    H = H.double() + damp * torch.diag(H).double().mean() * torch.eye(H.shape[0], dtype=torch.float64)
    Hinv, Q = torch.linalg.inv(H), torch.zeros_like(W)
    g = group or W.shape[1]
    for j in range(W.shape[1]):
        if j % g == 0:
            scale, zero = gptq.minmax_grid(W[:, j:j + g], bits)
        Q[:, j:j + 1] = gptq.round_to_grid(W[:, j:j + 1], scale, zero, bits)
        err = (W[:, j] - Q[:, j]) / Hinv[j, j]
        W[:, j:] -= err[:, None] * Hinv[j, j:][None, :]
        Hinv = Hinv - Hinv[:, j:j + 1] @ Hinv[j:j + 1, :] / Hinv[j, j]
    return Q.float()


LAYERS = ("blocks.0.attn.q_proj", "blocks.0.mlp.up", "blocks.1.attn.out_proj", "blocks.1.mlp.down")


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


def test_gptq_with_uncorrelated_inputs_is_rtn():
    """With H a multiple of the identity there is no error to feed back: GPTQ must round like RTN."""
    torch.manual_seed(1)
    W = torch.randn(8, 32)
    H = 3.0 * torch.eye(32)
    for group in (None, 8):
        assert torch.allclose(gptq.gptq_quantize(W, H, 4, group), gptq.rtn_quantize(W, 4, group), atol=1e-6)


@pytest.mark.parametrize("group", [None, 8])
def test_gptq_equals_the_explicit_inverse_hessian_algorithm(group):
    torch.manual_seed(5)
    W = torch.randn(12, 32)
    X = torch.randn(200, 32) @ torch.randn(32, 32)  # correlated inputs: error feedback matters
    H = gptq.hessian(X)
    ours, ref = gptq.gptq_quantize(W, H, 3, group, block_size=16), _obs_reference(W, H, 3, group)
    # fp32 against fp64 arithmetic: equal values up to float rounding, and at most a rare flipped tie
    assert (~torch.isclose(ours, ref, rtol=1e-5, atol=1e-5)).float().mean() < 0.01
    assert gptq.output_error(W, ours, X) == pytest.approx(gptq.output_error(W, ref, X), rel=1e-3)
    assert not torch.allclose(ours, gptq.rtn_quantize(W, 3, group))


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


@pytest.mark.slow
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
