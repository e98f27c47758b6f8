"""helpers.lowbit.quant: integer grids, int4 packing, NF4 and double quantisation bit for bit
against bitsandbytes."""
import pytest
import torch

from helpers.lowbit import quant as Q

bnbf = pytest.importorskip("bitsandbytes.functional")


def _w(shape, seed=0, dtype=torch.float32):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


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


def test_nf4_compress_statistics_equal_to_bitsandbytes_and_bits_per_param_measured():
    w = _w((256, 256), seed=3)
    packed, state = bnbf.quantize_4bit(w, blocksize=64, quant_type="nf4", compress_statistics=True)
    mine = Q.nf4_quantize(w, 64, compress_statistics=True)
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


def test_nf4_odd_count_and_partial_block_round_trip():
    w = _w((3, 7), seed=9)  # 21 values: a padded last byte, one partial block of 21 at block size 32
    s = Q.nf4_quantize(w, 32)
    assert s.packed.shape == (11, 1) and s.absmax.shape == (1,)
    back = Q.nf4_dequantize(s)
    assert back.shape == w.shape and Q.error(w, back) < 0.15
    assert (back.abs().amax() == w.abs().amax())  # the absmax value is a level (±1) exactly
