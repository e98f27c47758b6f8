"""helpers.attention.flash_v1: FlashAttention-1's loop order, its traffic model and the program counts."""
import pytest
import torch

from helpers.attention import flash_v1, kernels
from helpers.gpt.model import naive_attention

FP32 = dict(rtol=1e-5, atol=2e-5)  # fp32 sums taken in another order


def qkv(b, h, n, d, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, n, d, generator=g) for _ in range(3)]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("tiles", [(32, 16), (16, 32), (7, 5), (128, 128)])
def test_flash1_equals_naive_and_flash2_at_a_ragged_length(causal, tiles):
    q, k, v = qkv(2, 3, 53, 16, seed=1)
    o, lse = flash_v1.flash1_forward(q, k, v, causal, *tiles)
    torch.testing.assert_close(o, naive_attention(q, k, v, causal), **FP32)
    scores = q @ k.mT / 16 ** 0.5
    if causal:
        scores = scores.masked_fill(torch.ones(53, 53, dtype=torch.bool).triu(1), float("-inf"))
    torch.testing.assert_close(lse, torch.logsumexp(scores, dim=-1), **FP32)
    torch.testing.assert_close(o, kernels.FlashAttentionPyTorch.apply(q, k, v, causal, *tiles), **FP32)


def test_flash1_returns_the_input_dtype_and_refuses_bad_tiles():
    q, k, v = (t.half() for t in qkv(1, 1, 20, 8))
    o, lse = flash_v1.flash1_forward(q, k, v, False, 8, 8)
    assert o.dtype == torch.float16 and lse.dtype == torch.float32
    with pytest.raises(ValueError, match="block_k"):
        flash_v1.flash1_forward(q, k, v, False, 8, 0)


def test_traffic_counts_by_hand():
    # N=4, d=2, tiles of 2, 2 bytes: O zeroed (8) + K, V (16) + 2 key tiles x 4 rows x (Q, O read, O written) (48)
    # elements = 144 bytes; m, l: 8 + 8 visits x 4 = 40 fp32 = 160 bytes
    assert flash_v1.flash1_traffic_bytes(4, 2, 2, 2) == 304
    # causal: the second key tile visits only the second query tile: 6 visits
    assert flash_v1.flash1_traffic_bytes(4, 2, 2, 2, is_causal=True) == (8 + 16 + 36) * 2 + (8 + 24) * 4
    assert flash_v1.flash1_traffic_bytes(4, 2, 2, 2, batch_heads=3) == 3 * 304
    with pytest.raises(ValueError, match="block_q"):
        flash_v1.flash1_traffic_bytes(4, 2, 0, 2)


@pytest.mark.parametrize("d, itemsize", [(64, 4), (128, 2)])
def test_flash1_moves_about_one_and_a_half_times_flash2s_bytes_at_long_n(d, itemsize):
    # the quadratic terms: FA1 (3sd + 16) N²/B against FA2's 2sd N²/B with equal tiles
    ratio = flash_v1.flash1_traffic_bytes(8192, d, 128, 128, itemsize=itemsize) / \
        kernels.tiled_traffic_bytes(8192, d, 128, itemsize=itemsize)
    assert ratio == pytest.approx(1.5 + 8 / (d * itemsize), rel=0.02)


def test_program_counts():
    assert flash_v1.program_counts(1, 16, 16384, 128) == {"FlashAttention-1": 16, "FlashAttention-2": 2048}
    assert flash_v1.program_counts(2, 3, 100, 64) == {"FlashAttention-1": 6, "FlashAttention-2": 12}
    with pytest.raises(ValueError, match="heads"):
        flash_v1.program_counts(1, 0, 10, 4)
