"""GPTQ, AWQ and RTN (helpers.lowbit.gptq) and notebook 08's sections on them (helpers.lowbit.quant_lab); LoRA
and QLoRA, fine-tuning and the memory formulas (helpers.lowbit.lora); the fine-tuning measurements and the check
against peft (helpers.lowbit.lora_lab); 8-bit optimizer state (helpers.lowbit.quant_lab).

The GPTQ/AWQ-vs-RTN tests run on fixed layers of the cached "tiny" course GPT with calibration
windows from the training split, as notebook 08 does.
"""
from __future__ import annotations

import copy

import pytest
import torch

from helpers.lowbit import gptq, lora, lora_lab, quant_lab


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Small CPU matmuls and column loops: one thread is faster than two fighting a busy machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny():
    from helpers.gpt.pretrained import pretrained

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


def _obs_reference(W, H, bits, group, damp=0.01):
    """GPTQ written the slow way (Frantar et al., 2023, eq. 2-3): an explicit inverse Hessian, updated
    after every column by removing that column (Gaussian elimination), no Cholesky, no lazy blocks."""
    W = W.double().clone()
    H = H.double() + damp * torch.diag(H).double().mean() * torch.eye(H.shape[0], dtype=torch.float64)
    Hinv, Q = torch.linalg.inv(H), torch.zeros_like(W)
    g = group or W.shape[1]
    for j in range(W.shape[1]):
        if j % g == 0:
            scale, zero = gptq._scale_zero(W[:, j:j + g], bits)
        Q[:, j:j + 1] = gptq._fake_quant(W[:, j:j + 1], scale, zero, bits)
        err = (W[:, j] - Q[:, j]) / Hinv[j, j]
        W[:, j:] -= err[:, None] * Hinv[j, j:][None, :]
        Hinv = Hinv - Hinv[:, j:j + 1] @ Hinv[j:j + 1, :] / Hinv[j, j]
    return Q.float()


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
    rows = quant_lab.layer_error_section(tiny, calib, bits=(3,), group_size=64)
    assert len(rows) == len(gptq.block_linears(tiny))
    out = capsys.readouterr().out
    assert "3-bit, groups of 64: GPTQ's output error is below RTN's in" in out
    ppl = quant_lab.perplexity_section(tiny, calib, bits=(4,), group_size=64, batches=1)
    assert [r["method"] for r in ppl] == ["fp32", "rtn", "gptq", "awq"]
    assert all(r["perplexity"] > 1 for r in ppl)


# ---------------------------------------------------------------- LoRA and QLoRA

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


def test_finetune_lowers_the_loss_for_every_kind(tiny):
    tokens = lora.finetune_split()[0][:33]  # one window of 32: every step sees the same batch
    for kind in lora.KINDS:
        m = lora.prepare(tiny, kind, r=4)
        losses = lora.finetune(m, 10, 1e-3 if kind == "full" else 1e-2, tokens, batch=2, seq_len=32)
        assert losses[-1] < losses[0] - 0.1, (kind, losses)


def test_finetune_section_returns_its_numbers(tiny, capsys):
    res = lora_lab.finetune_section(tiny, steps=2, eval_batches=1)
    assert set(res["losses"]) == set(lora.KINDS) and all(len(v) == 2 for v in res["losses"].values())
    assert len(res["untuned"]) == 2 and res["untuned"][0] == pytest.approx(res["losses"]["lora"][0], abs=1e-5)
    assert res["trainable"]["lora"] == res["trainable"]["qlora"] < res["trainable"]["full"]
    assert len(res["merged"]) == 4 and "Held-out loss before fine-tuning" in capsys.readouterr().out
    import matplotlib.pyplot as plt

    plt.close(lora_lab.finetune_figure(res))


def test_finetune_sentences_follow_the_signs():
    kinds = list(lora.KINDS)
    up = {k: 0.01 for k in kinds}
    assert "All three lowered it" in lora_lab._verdict([], "lora", 10, up)
    text = lora_lab._verdict(kinds, "lora", 10, up)
    assert "All three made the held-out loss worse (the least: lora)" in text and "did not fall either" in text
    text = lora_lab._verdict(["full"], "lora", 10, {**up, "full": -0.01})
    assert "The largest drop: lora; full made the held-out loss worse" in text and "fell for full" in text
    assert "did not fall" not in text
    assert lora_lab._merge_reason("merged into original 16-bit W", -0.01).startswith(": lower")
    assert lora_lab._merge_reason("merged into original 16-bit W", 0.01).startswith(": higher")
    assert lora_lab._merge_reason("merged, re-quantised to NF4", 0.01) == "."


def test_memory_measured_against_formula(tiny):
    rows = {r["method"]: r for r in lora_lab.memory_rows(tiny, r=4)}
    for kind in ("full", "lora"):
        assert rows[kind]["measured"] == rows[kind]["formula"]
    q = rows["qlora"]
    assert q["measured"]["gradients"] == q["formula"]["gradients"] == rows["lora"]["measured"]["gradients"]
    gap = q["measured"]["weights"] - q["formula"]["weights"]
    assert 0 <= gap - q["code_tables"] < 0.002 * q["formula"]["weights"]  # the rest: a few scalars and padding
    assert q["measured"]["weights"] < 0.4 * rows["full"]["measured"]["weights"]


def test_memory_formula_bits_per_nf4_weight():
    n = 64 * 256 * 100
    got = lora.memory_formula(n, 0, 0, "qlora")["weights"] * 8 / n
    assert got == pytest.approx(4 + 8 / 64 + 32 / (64 * 256))
    assert lora.memory_formula(n, 0, 0, "qlora", double_quant=False)["weights"] * 8 / n == pytest.approx(4.5)
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


def test_adamw8bit_state_is_uint8_above_the_threshold_only(tiny, capsys):
    res = quant_lab.optimizer_section(tiny, steps=2)
    by = {t["name"]: t for t in res["tensors"]}
    big, small = by["blocks.0.mlp.up.weight"], by["blocks.0.mlp.up.bias"]
    assert big["adamw"] == small["adamw"] == 8.0
    assert big["dtypes8"] == "float32/uint8" and big["adamw8bit"] == pytest.approx(2 + 2 * 4 / 256)
    assert small["dtypes8"] == "float32" and small["adamw8bit"] == 8.0
    assert res["losses"]["adamw"][0] == res["losses"]["adamw8bit"][0]  # same start, same batch
    out = capsys.readouterr().out
    assert "consistent with bitsandbytes' min_8bit_size of 4096" in out and "4095 elements → float32" in out
    assert 0 < res["update_gap"] < 0.05


def test_adamw8bit_threshold_and_update_against_adamw():
    assert quant_lab.threshold_probe() == {4095: "float32", 4096: "uint8"}
    gap = quant_lab.update_gap(steps=5)
    assert 0 < gap < 0.05  # 8-bit moments: the update moves, by about a percent, never by much


# ---------------------------------------------------------------- LoRA against peft (skipped without peft)


@pytest.fixture(scope="module")
def need_peft():
    why = lora_lab.peft_missing()
    if why:
        pytest.skip(why)


@pytest.mark.parametrize("base,cls", [("fp32", "Linear"), ("nf4", "Linear4bit")])
def test_lora_and_qlora_equal_peft_bitwise(tiny, need_peft, base, cls):
    p = lora_lab.peft_parity(tiny, r=4, alpha=8, base=base)
    assert p["layers"] == len(gptq.block_linears(tiny)) and p["peft_class"] == cls
    assert p["bitwise"], p  # the same ops in the same order on a CPU in fp32


def test_peft_parity_catches_a_wrong_merge(tiny, need_peft, monkeypatch):
    delta = lora.LoRALinear.delta
    monkeypatch.setattr(lora.LoRALinear, "delta", lambda self: 1.01 * delta(self))  # a planted 1% error
    p = lora_lab.peft_parity(tiny, r=4, alpha=8)
    assert p["logits"] == 0 and p["grad_A"] == 0  # the forward does not use delta()
    assert p["merged"] > 0 and not p["bitwise"]


def test_peft_initialises_like_ours(tiny, need_peft, capsys):
    res = lora_lab.parity_section(tiny, r=4)
    out = capsys.readouterr().out
    assert out.count("bitwise equal") == 2 and "Kaiming-uniform with a = √5" in out
    got = res["init"]
    for who in ("ours", "peft"):
        assert got[who]["B_zero"]
        assert 0.9 < got[who]["A_max_over_bound"] <= 1.0  # uniform on ±1/√in: Kaiming-uniform with a = √5
        assert 0.9 < got[who]["A_std_over_uniform"] < 1.1


def test_parity_section_says_one_sentence_without_peft(tiny, monkeypatch, capsys):
    def missing():
        raise ImportError("No module named 'peft'")

    monkeypatch.setattr(lora_lab, "_import_peft", missing)
    assert lora_lab.parity_section(tiny, r=4) is None
    out = capsys.readouterr().out.strip()
    assert out.startswith("peft is not installed") and len(out.splitlines()) == 1
    with pytest.raises(ValueError, match="base"):
        lora_lab.peft_parity(tiny, base="int4")

    def broken():
        raise RuntimeError("torchao built for another torch")

    monkeypatch.setattr(lora_lab, "_import_peft", broken)
    assert lora_lab.peft_missing().startswith("peft is installed but its import failed (RuntimeError")
