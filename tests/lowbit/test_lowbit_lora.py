"""LoRA and QLoRA, fine-tuning and the memory formulas (helpers.lowbit.lora)."""
from __future__ import annotations

import pytest
import torch

from helpers.lowbit import gptq, lora


def test_lora_starts_as_the_base_and_merged_equals_unmerged():
    torch.manual_seed(4)
    base = torch.nn.Linear(24, 40)
    W0 = base.weight.detach().clone()
    layer = lora.LoRALinear(base, r=4, alpha=8, dropout=0.1).eval()
    x = torch.randn(3, 5, 24)
    assert torch.equal(layer(x), base(x))  # B = 0: the adapter adds nothing yet
    with torch.no_grad():
        layer.lora_B.normal_()
    unmerged = layer(x)
    assert not torch.allclose(unmerged, base(x))
    layer.merge()
    assert layer.merged and torch.allclose(layer(x), unmerged, atol=1e-5)
    layer.unmerge()
    assert torch.allclose(base.weight, W0, atol=1e-6) and torch.allclose(layer(x), unmerged, atol=1e-5)
    assert layer.scaling == 2.0 and not base.weight.requires_grad


def test_lora_validates_its_options():
    base = torch.nn.Linear(8, 8)
    for kwargs in ({"r": 0}, {"r": 2, "alpha": -1}, {"r": 2, "dropout": 1.0}):
        with pytest.raises(ValueError):
            lora.LoRALinear(base, **kwargs)
    with pytest.raises(ValueError, match="base"):
        lora.apply_lora(torch.nn.Sequential(base), base="int4")


def test_apply_lora_trains_only_adapters_and_qlora_base_is_nf4(tiny):
    m = lora.apply_lora(tiny, r=4)
    trainable = [n for n, p in m.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    expected = sum(4 * (lin.in_features + lin.out_features) for lin in gptq.block_linears(tiny).values())
    assert sum(p.numel() for p in m.parameters() if p.requires_grad) == expected
    q = lora.apply_lora(tiny, r=4, base="nf4")
    import bitsandbytes as bnb

    layer = q.blocks[0].mlp.up
    assert isinstance(layer.base, bnb.nn.Linear4bit) and layer.base.weight.dtype == torch.uint8
    # the QLoRA base computes with the dequantised NF4 weight, within 4-bit error of the original
    W, Wq = tiny.blocks[0].mlp.up.weight, lora.dequantize_nf4(layer.base)
    x = torch.randn(2, 7, W.shape[1])
    assert torch.allclose(layer(x), torch.nn.functional.linear(x, Wq, layer.base.bias), atol=1e-5)
    assert 0 < (Wq - W).abs().max() < 0.25 * W.abs().max()


def test_merged_variants_dequantised_merge_matches_unmerged(tiny):
    q = lora.apply_lora(tiny, r=4, base="nf4")
    with torch.no_grad():
        for a in lora.lora_layers(q).values():
            a.lora_B.normal_(std=0.01)
    x = gptq.calibration_tokens(2, 32, seed=5)
    variants = lora.merged_variants(q, tiny)
    ref = variants["QLoRA, unmerged"](x)[0]
    deq = variants["merged into dequantised NF4, 16-bit"](x)[0]
    orig = variants["merged into original 16-bit W"](x)[0]
    err_deq, err_orig = (deq - ref).abs().max(), (orig - ref).abs().max()
    # bf16 rounding of the merged weights only (about 2^-9 relative) against the NF4 error as well, which is
    # far larger
    assert err_deq < 0.01 * ref.abs().max() and err_orig > 5 * err_deq


def test_an_eval_forward_leaves_the_nf4_weight_readable(tiny):
    """An evaluation (eval mode, no gradients) before the merge, as fine-tuning does: bitsandbytes may repack a
    CPU weight into its AVX512-BF16 layout there, which dequantize_4bit cannot read; the NF4 base must not be."""
    q = lora.apply_lora(tiny, r=4, base="nf4").eval()
    layers = lora.lora_layers(q)
    before = {n: lora.dequantize_nf4(a.base) for n, a in layers.items()}
    with torch.no_grad():
        q(gptq.calibration_tokens(2, 32, seed=5))
    assert all(torch.equal(lora.dequantize_nf4(a.base), before[n]) for n, a in layers.items())
    deq = lora.merged_variants(q, tiny)["merged into dequantised NF4, 16-bit"]
    for name, lin in gptq.block_linears(deq).items():  # B = 0: the merge is the NF4 weight in bf16
        torch.testing.assert_close(lin.weight, before[name].bfloat16().float(), rtol=0, atol=0)


@pytest.mark.slow
def test_finetune_lowers_the_loss_for_every_kind(tiny):
    tokens = lora.finetune_split()[0][:33]  # one window of 32: every step sees the same batch
    for kind in lora.KINDS:
        m = lora.prepare(tiny, kind, r=4)
        losses = lora.finetune(m, 10, 1e-3 if kind == "full" else 1e-2, tokens, batch=2, seq_len=32)
        assert losses[-1] < losses[0] - 0.1, (kind, losses)


def test_memory_formula_bits_per_nf4_weight():
    n = 64 * 256 * 100
    got = lora.memory_formula(n, 0, 0, "qlora")["weights"] * 8 / n
    assert got == pytest.approx(4 + 8 / 64 + 32 / (64 * 256))
    assert lora.memory_formula(n, 0, 0, "qlora", compress_statistics=False)["weights"] * 8 / n == pytest.approx(4.5)
    assert lora.memory_formula(10, 5, 2, "full") == {"weights": 60, "gradients": 60, "optimizer": 120}
    with pytest.raises(ValueError):
        lora.memory_formula(1, 1, 1, "int8")


def test_memory_formulas_reproduce_qlora_65b_numbers():
    full = lora.finetune_gb(65, lora.FINETUNE[0])
    assert sum(full.values()) == pytest.approx(780.0)  # 12 bytes a parameter: QLoRA's ">780GB" baseline
    q = lora.finetune_gb(65, lora.FINETUNE[2], rank=64)
    assert q["weights"] == pytest.approx(65 * (4 + 8 / 64 + 32 / 64 / 256) / 8)
    assert 40 < sum(q.values()) < 48
    assert lora.lora_params(8192, 22016, 80, 64) == 80 * 64 * (8 * 8192 + 3 * (8192 + 22016))
    assert lora.finetune_gb(7, lora.FINETUNE[1], rank=16)["adapters"] < lora.finetune_gb(7, lora.FINETUNE[1], rank=64)["adapters"]
    with pytest.raises(ValueError):
        lora.finetune_gb(7, "full")


def test_finetune_gb_is_lora_memory_formula_in_bf16():
    """One formula: lora.finetune_gb (GB, bf16, Llama shapes) is lora.memory_formula with bf16 weights and
    adapters, every parameter quantisable, divided by 1e9."""
    n, a = 13e9, lora.lora_params(*lora.LLAMA_SHAPES[13], 16)
    for method, kind in zip(lora.FINETUNE, lora.KINDS):
        got = lora.finetune_gb(13, method, rank=16)
        want = lora.memory_formula(n, 0, 0 if kind == "full" else a, kind, weight_bytes=2, adapter_bytes=2)
        assert sum(got.values()) == pytest.approx(sum(want.values()) / 1e9, rel=1e-12)
        assert got["adapters"] == (0 if kind == "full" else pytest.approx(2 * a / 1e9))
    q = lora.finetune_gb(13, lora.FINETUNE[2], rank=16)
    assert q["weights"] == pytest.approx(n * (4 + 8 / 64 + 32 / (64 * 256)) / 8 / 1e9)
    # the course GPT's call (fp32) is the same formula: its adapters in fp32, 4 bytes each
    assert lora.memory_formula(100, 10, 7, "lora") == {"weights": 4 * 110 + 4 * 7, "gradients": 28, "optimizer": 56}


def test_finetune_gb_base_bits_default_is_the_nf4_formula():
    default = lora.finetune_gb(65, lora.FINETUNE[2])
    measured = lora.finetune_gb(65, lora.FINETUNE[2], base_bits=4 + 8 / 64 + 32 / (64 * 256))
    assert measured == pytest.approx(default)
    with pytest.raises(ValueError, match="nf4_bits"):
        lora.finetune_gb(65, lora.FINETUNE[2], base_bits=0)


@pytest.mark.parametrize("kind", ["int8", "nf4"])
def test_merge_refuses_a_quantized_base_instead_of_rounding_the_adapter_away(kind):
    """bitsandbytes' Linear8bitLt and Linear4bit subclass nn.Linear: merge() must not add ΔW to their codes (on
    LLM.int8 it rounded to 0 and marked the layer merged; on NF4 bitsandbytes raised a shape error)."""
    bnb = pytest.importorskip("bitsandbytes")
    torch.manual_seed(0)
    dense = torch.nn.Linear(64, 64)
    if kind == "int8":
        base = bnb.nn.Linear8bitLt(64, 64, has_fp16_weights=False)
        base.weight = bnb.nn.Int8Params(dense.weight.data.clone(), requires_grad=False, has_fp16_weights=False)
    else:
        base = lora.nf4_linear(dense)
    assert isinstance(base, torch.nn.Linear)
    layer = lora.LoRALinear(base, r=4, alpha=8)
    with torch.no_grad():
        layer.lora_B.normal_()
    with pytest.raises(TypeError, match="quantized base"):
        layer.merge()
    assert not layer.merged
