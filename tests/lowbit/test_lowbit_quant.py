"""helpers.lowbit.quant and helpers.lowbit.quant_linear: integer grids, int4 packing, NF4 and double quantisation bit for bit
against bitsandbytes, LLM.int8 against Linear8bitLt, weight-only linears and the Triton int4 kernel."""

import pytest
import torch

from helpers.lowbit import quant as Q
from helpers.lowbit import quant_linear as QL

bnbf = pytest.importorskip("bitsandbytes.functional")


def _w(shape, seed=0, dtype=torch.float32):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


# ---------------------------------------------------------------- integer grids and packing

def test_absmax_and_zeropoint_grids_exact_on_small_tensors():
    w = torch.tensor([[-1.0, 0.5, 0.25, 1.27]])
    qt = Q.quantize(w, 8, "absmax", "tensor")
    assert qt.scale.item() == pytest.approx(1.27 / 127) and qt.q.tolist() == [[-100, 50, 25, 127]]
    z = Q.quantize(torch.tensor([[0.0, 1.0, 2.0, 3.0]]), 2, "zeropoint", "channel")  # 4 levels, step 1
    assert z.q.tolist() == [[0, 1, 2, 3]] and z.zero.tolist() == [0.0] and z.scale.tolist() == [1.0]
    assert torch.equal(Q.dequantize(z), torch.tensor([[0.0, 1.0, 2.0, 3.0]]))
    assert torch.equal(Q.dequantize(Q.quantize(torch.zeros(2, 4), 4, "absmax", 2)), torch.zeros(2, 4))


@pytest.mark.parametrize("scheme", Q.SCHEMES)
def test_finer_granularity_never_worse_and_error_within_half_step(scheme):
    w = _w((16, 64)) * torch.logspace(-2, 1, 16)[:, None]  # rows of very different size
    errs = [Q.error(w, Q.fake_quantize(w, 4, scheme, g)) for g in ("tensor", "channel", 16)]
    assert errs[0] > errs[1] >= errs[2]
    qt = Q.quantize(w, 4, scheme, 16)
    step = qt.scale.repeat_interleave(16).reshape(w.shape)
    assert ((Q.dequantize(qt) - w).abs() <= step / 2 + 1e-6).all()


def test_quantize_rejects_bad_arguments():
    for kw in (dict(bits=1), dict(bits=9), dict(scheme="sym"), dict(granularity=48), dict(granularity=0),
               dict(bits=8, pack=True)):
        with pytest.raises(ValueError):
            Q.quantize(_w((4, 64)), **{"bits": 4, **kw})


def test_int4_pack_unpack_round_trip_and_half_the_bytes():
    codes = torch.randint(0, 16, (5, 34), generator=torch.Generator().manual_seed(1), dtype=torch.uint8)
    packed = Q.pack_int4(codes)
    assert packed.shape == (5, 17) and packed.dtype == torch.uint8
    assert torch.equal(Q.unpack_int4(packed), codes)
    assert Q.pack_int4(torch.tensor([3, 12])).item() == 3 | (12 << 4)  # element 0 in the low nibble
    with pytest.raises(ValueError):
        Q.pack_int4(torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError):
        Q.pack_int4(torch.tensor([16, 0]))
    w = _w((8, 64))
    for scheme in Q.SCHEMES:
        a, b = Q.quantize(w, 4, scheme, 32), Q.quantize(w, 4, scheme, 32, pack=True)
        assert torch.equal(Q.dequantize(a), Q.dequantize(b))
        assert b.bits_per_param() == 4 + 8 * (4 + (4 if scheme == "zeropoint" else 0)) / 32


# ---------------------------------------------------------------- NF4 against bitsandbytes

def test_nf4_codebook_bitwise_equal_to_bitsandbytes():
    code = Q.nf4_codebook()
    assert torch.equal(code, bnbf.get_4bit_type("nf4", device="cpu"))
    assert code[7].item() == 0.0 and code[0].item() == -1.0 and code[-1].item() == 1.0
    assert torch.equal(Q.dynamic_map(), bnbf.create_dynamic_map(signed=True))


@pytest.mark.parametrize("shape,blocksize", [((64, 128), 64), ((5, 22), 64), ((3, 100), 128), ((2, 16), 32)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_nf4_quantize_dequantize_bitwise_equal_to_bitsandbytes(shape, blocksize, dtype):
    w = _w(shape, seed=blocksize, dtype=dtype)
    packed, state = bnbf.quantize_4bit(w, blocksize=blocksize, quant_type="nf4")
    mine = Q.nf4_quantize(w, blocksize)
    assert torch.equal(mine.packed, packed) and torch.equal(mine.absmax, state.absmax)
    assert torch.equal(Q.nf4_dequantize(mine, dtype), bnbf.dequantize_4bit(packed, state))


def test_nf4_midpoint_goes_to_lower_level_as_in_bitsandbytes():
    code = Q.nf4_codebook()
    mids = (code[:-1] + code[1:]) / 2
    w = torch.cat([torch.tensor([1.0]), mids, code[1:-1]]).reshape(1, -1)[:, :32]
    packed, _ = bnbf.quantize_4bit(w, blocksize=32, quant_type="nf4")
    assert torch.equal(Q.nf4_quantize(w, 32).packed, packed)


def test_double_quant_equal_to_bitsandbytes_and_bits_per_param_measured():
    w = _w((256, 256), seed=3)
    packed, state = bnbf.quantize_4bit(w, blocksize=64, quant_type="nf4", compress_statistics=True)
    mine = Q.nf4_quantize(w, 64, double=True)
    assert torch.equal(mine.absmax2, state.state2.absmax) and torch.equal(mine.offset, state.offset)
    differ = mine.absmax != state.absmax  # near-midpoint constants: bitsandbytes' search picks the neighbour
    assert differ.float().mean() < 0.01 and (mine.absmax.int() - state.absmax.int()).abs().max() <= 1
    same = ~differ.repeat_interleave(64).reshape(w.shape)
    assert torch.equal(Q.nf4_dequantize(mine)[same], bnbf.dequantize_4bit(packed, state)[same])
    assert torch.equal(mine.packed, packed)  # the 4-bit codes use the fp32 absmax: identical
    plain = Q.nf4_quantize(w, 64)
    assert plain.bits_per_param() == 4.5
    assert 4.12 < mine.bits_per_param() < 4.14  # 4 + 8/64 + 32/(64*256) + the offset's 32 bits / n
    assert Q.error(w, Q.nf4_dequantize(mine)) < 1.01 * Q.error(w, Q.nf4_dequantize(plain))
    with pytest.raises(ValueError):
        Q.nf4_quantize(w, 48)


def test_fake_quant_methods_and_bits():
    w = _w((32, 128), seed=4)
    errs = {m: Q.error(w, Q.fake_quant(w, m, 64)) for m in Q.METHODS}
    assert errs["int8"] < errs["nf4"] < errs["int4"]  # NF4's levels suit Gaussian weights better than int4's
    assert Q.method_bits("nf4", 64, (32, 128)) == 4.5 and Q.method_bits("int8", "channel", (32, 128)) == 8 + 32 / 128
    with pytest.raises(ValueError):
        Q.fake_quant(w, "fp4")


# ---------------------------------------------------------------- LLM.int8

def test_llm_int8_decomposition_beats_plain_int8_on_outliers_and_matches_bitsandbytes():
    x = QL.planted_outliers(32, 128, columns=3, size=25.0, seed=1)
    w = _w((64, 128), seed=2) * 0.05
    ref = x @ w.T
    plain, none = QL.llm_int8_matmul(x, w, threshold=0.0)
    mixed, cols = QL.llm_int8_matmul(x, w, threshold=6.0)
    assert none.numel() == 0 and cols.numel() == 3
    assert Q.error(ref, mixed) < 0.5 * Q.error(ref, plain)
    for th in (0.0, 6.0):
        with torch.no_grad():
            theirs = QL.bnb_int8_linear(w, th)(x)
        ours, _ = QL.llm_int8_matmul(x, w, th, outlier_weight="int8")
        assert Q.error(theirs, ours) < 1e-2  # bitsandbytes casts x to fp16 before quantising it
    with pytest.raises(ValueError):
        QL.llm_int8_matmul(x, w.T)


# ---------------------------------------------------------------- weight-only linears and the Triton kernel

@pytest.mark.parametrize("bits", [8, 4])
def test_weight_only_linear_equals_dequantise_then_matmul(bits):
    lin = torch.nn.Linear(128, 48)
    torch.nn.init.normal_(lin.weight, std=0.05, generator=torch.Generator().manual_seed(5))
    m = QL.WeightOnlyLinear.from_linear(lin, bits, 32)
    x = _w((3, 7, 128), seed=6)
    ref = torch.nn.functional.linear(x, m.dequantized(), lin.bias)
    torch.testing.assert_close(m(x), ref, rtol=1e-5, atol=1e-5)
    assert Q.error(lin.weight, m.dequantized()) < (0.01 if bits == 8 else 0.1)
    assert m.weight_bytes() == (48 * 128 + 48 * 4 if bits == 8 else 48 * 64 + 2 * 48 * 4 * 4)


@pytest.mark.skipif(QL.BROKEN is not None, reason=str(QL.BROKEN))
def test_compiled_int8_asks_inductor_to_fuse_the_conversion_into_the_matvec(monkeypatch):
    # without coordinate_descent_tuning Inductor keeps a batch-1 matmul as cuBLAS's mm and converts the int8
    # weight to bf16 in a kernel of its own (5 bytes moved per weight); gpt-fast's recipe sets it
    seen = {}

    def fake_compile(fn, **kw):
        seen.update(kw)
        return fn

    monkeypatch.setattr(QL, "_COMPILED", None)
    monkeypatch.setattr(torch, "compile", fake_compile)
    assert QL._compiled_int8() is QL._int8_linear
    assert seen == {"dynamic": True, "options": {"coordinate_descent_tuning": True}}


def test_triton_int4_kernel_equals_pytorch_dequantise_then_matmul():
    lin = torch.nn.Linear(96, 40)  # odd tile edges: N=40 over BLOCK_N=32, K=96 over BLOCK_K=64
    m = QL.WeightOnlyLinear.from_linear(lin, 4, 32)
    dev = "cpu" if QL.INTERPRETED else "cuda"
    m = m.to(dev)
    x = _w((3, 96), seed=7).to(dev)
    got = QL.int4_matmul(x, m.qweight, m.scale, m.zero, 32)
    torch.testing.assert_close(got, x @ m.dequantized().T, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError):
        QL.int4_matmul(x, m.qweight, m.scale, m.zero, 48)


def test_swap_linears_keeps_head_and_changes_blocks():
    from helpers.gpt.model import GPT, GPTConfig
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("tiny", n_layer=1)).eval()
    x = torch.randint(0, model.config.vocab_size, (2, 16))
    with torch.no_grad():
        before = model(x)[0]
        QL.swap_linears(model, lambda lin: QL.WeightOnlyLinear.from_linear(lin, 8))
        after = model(x)[0]
    assert isinstance(model.lm_head, torch.nn.Linear)
    assert sum(isinstance(m, QL.WeightOnlyLinear) for m in model.modules()) == 5  # q, kv, out, up, down
    assert 0 < Q.error(before, after) < 0.05


def test_nf4_odd_count_and_partial_block_round_trip():
    w = _w((3, 7), seed=9)  # 21 values: a padded last byte, one partial block of 21 at block size 32
    s = Q.nf4_quantize(w, 32)
    assert s.packed.shape == (11, 1) and s.absmax.shape == (1,)
    back = Q.nf4_dequantize(s)
    assert back.shape == w.shape and Q.error(w, back) < 0.15
    assert (back.abs().amax() == w.abs().amax())  # the absmax value is a level (±1) exactly


# ---------------------------------------------------------------- notebook 08's measurements (helpers.lowbit.quant_lab)

def test_grid_quantizes_in_place_then_restores_and_orders_bits():
    from helpers.lowbit import quant_lab
    from helpers.gpt.model import GPT, GPTConfig
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("tiny", n_layer=1)).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randint(0, model.config.vocab_size, (2, 16))
    specs = [("absmax", 8, "channel"), ("zeropoint", 3, 32), ("nf4", 4, 64)]
    with torch.no_grad():
        ref = model(x)[0]
        got = quant_lab.grid(model, specs, lambda m: Q.error(ref, m(x)[0]))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    e8, e3, e4 = (got[(m, b, str(g))] for m, b, g in specs)
    assert e8["value"] < e4["value"] < e3["value"] and e8["error"] < e4["error"] < e3["error"]
    assert 8 + 32 / 512 <= e8["bits"] <= 8 + 32 / 128  # codes plus one fp32 scale per row of 128 or 512 inputs
    assert e4["bits"] == 4.5 and e3["bits"] == 3 + 64 / 32
    rows = quant_lab.weight_error_rows({"w": _w((16, 64))}, ["tensor", "channel", 32])
    assert [r["method"] for r in rows][-2:] == ["nf4", "nf4-dq"]


def test_notebook_08_sources_hold_no_control_characters():
    """No control characters: a LaTeX `\\rVert` in a Python string without r"" is a carriage return + "Vert"."""
    import json
    from pathlib import Path

    nb = json.loads((Path(__file__).resolve().parents[2] / "notebooks" / "08_quantization.ipynb").read_text())
    for i, cell in enumerate(nb["cells"]):
        text = "".join(cell["source"])
        assert not any(ch in text for ch in "\r\t\b\f\v"), f"cell {i} holds a control character"


def test_weight_only_copy_swaps_the_block_linears_of_a_copy_and_leaves_the_base():
    from helpers.lowbit import quant_lab
    from helpers.gpt.model import GPT, GPTConfig

    torch.manual_seed(0)
    base = GPT(GPTConfig.preset("tiny")).eval()
    n_linear = sum(isinstance(m, torch.nn.Linear) for b in base.blocks for m in b.modules())
    q = quant_lab.weight_only_copy(base, 4, "torch", 32)
    swapped = [m for m in q.modules() if isinstance(m, QL.WeightOnlyLinear)]
    assert len(swapped) == n_linear and {(m.bits, m.backend) for m in swapped} == {(4, "torch")}
    assert not any(isinstance(m, QL.WeightOnlyLinear) for m in base.modules())  # the base is untouched
    x = torch.randint(0, 256, (1, 16))
    with torch.no_grad():
        assert (q(x)[0] - base(x)[0]).abs().max() < 1.0  # int4 rounding only, on the same weights


def test_outlier_profile_counts_columns_at_the_threshold_it_is_given():
    """The notebook's column header names its THRESHOLD parameter, so the share must be counted at that threshold,
    not at a fixed 6."""
    from helpers.lowbit import quant_lab

    x = torch.zeros(4, 10)
    x[0, 0], x[1, 1], x[2, 2] = 7.0, -4.5, 3.0  # column maxima 7, 4.5, 3 and zeros elsewhere
    (at6,) = quant_lab.outlier_profile({"l": x})
    (at4,) = quant_lab.outlier_profile({"l": x}, threshold=4.0)
    (at3,) = quant_lab.outlier_profile({"l": x}, threshold=3.0)  # |x| >= threshold: 3 itself counts
    assert (at6["cols_over"], at4["cols_over"], at3["cols_over"]) == pytest.approx((0.1, 0.2, 0.3))
    assert at4["threshold"] == 4.0 and at6["top_column"] == 0
    for bad in (0, -1.0, True, "6"):
        with pytest.raises(ValueError, match="threshold"):
            quant_lab.outlier_profile({"l": x}, threshold=bad)
