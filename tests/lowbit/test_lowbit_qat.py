"""helpers.lowbit.qat: the straight-through fake quantizer, its parametrization on the GPT's block linears, PTQ
copies, and the QAT-against-PTQ comparison and its sentences."""
from __future__ import annotations

import copy

import pytest
import torch

from helpers.lowbit import gptq, qat, quant


def test_fake_quant_ste_forward_equals_rtn_and_its_gradient_is_the_identity():
    w = torch.randn(16, 128, generator=torch.Generator().manual_seed(0), requires_grad=True)
    y = qat.fake_quant_ste(w, 4, 64)
    assert torch.equal(y.detach(), quant.fake_quantize(w.detach(), 4, "absmax", 64))
    (y * torch.arange(128.0)).sum().backward()
    assert torch.equal(w.grad, torch.arange(128.0).expand(16, 128))  # straight through: d y / d w = 1
    assert len(torch.unique(y.detach()[0, :64])) <= 15  # at most 2 * 7 + 1 levels in a group


def test_attach_fake_quantizes_every_block_linear_and_detach_keeps_the_latent_weights(tiny):
    m = qat.attach(copy.deepcopy(tiny))
    lins = gptq.block_linears(m)
    latent = {k: l.parametrizations.weight.original.detach().clone() for k, l in lins.items()}
    for k, l in lins.items():
        assert torch.equal(l.weight, quant.fake_quantize(latent[k], 4, "absmax", 64))
    qat.detach(m)
    for k, l in gptq.block_linears(m).items():
        assert torch.equal(l.weight, latent[k])
    p = qat.ptq_copy(m)
    assert all(torch.equal(l.weight, quant.fake_quantize(latent[k], 4, "absmax", 64))
               for k, l in gptq.block_linears(p).items())
    assert torch.equal(gptq.block_linears(m)["blocks.0.mlp.up"].weight, latent["blocks.0.mlp.up"])  # a copy


@pytest.mark.slow
def test_qat_compare_runs_the_three_models_on_the_same_windows(tiny):
    res = qat.qat_compare(tiny, steps=3, eval_batches=1)
    assert set(res["windows"]) == {"fp32", "PTQ", "fine-tune, then PTQ", "QAT, then PTQ"}
    assert len({v.numel() for v in res["windows"].values()}) == 1
    assert res["loss"]["PTQ"] != res["loss"]["fp32"] and len(res["train"]["QAT"]) == 3
    assert len(qat.qat_sentences(res)) == 3


def test_qat_sentences_say_when_ptq_cost_nothing():
    w = torch.tensor([1.0, 1.1, 0.9, 1.0], dtype=torch.float64)
    res = {"windows": {k: w for k in ("fp32", "PTQ", "fine-tune, then PTQ", "QAT, then PTQ")},
           "loss": {k: 1.0 for k in ("fp32", "PTQ", "fine-tune, then PTQ", "QAT, then PTQ")}, "bits": 4, "steps": 5}
    out = qat.qat_sentences(res)
    assert "nothing for QAT to win back" in out[2] and "cannot be told apart" in out[0]
    res["loss"] = {"fp32": 1.0, "PTQ": 1.1, "fine-tune, then PTQ": 1.1, "QAT, then PTQ": 1.05}
    assert "50% of PTQ's increase won back" in qat.qat_sentences(res)[2]
