"""helpers.decode.paged_attention: decode attention read through block tables (PyTorch and the Triton kernel)
equal to contiguous attention, in the dtypes it reads, FlexAttention's paged helper, the dtypes it refuses, and
the kernel compiled ahead of time for sm_90."""
from __future__ import annotations

import pytest
import torch

from helpers.decode import paged, paged_attention

IMPLS = ["torch"] + (["triton"] if paged_attention.TRITON_MISSING is None else [])


def _pool_and_tables(lengths, block_size, H_kv=2, hd=16, seed=0):
    """A pool with random keys/values and block tables drawn from a random permutation (non-contiguous)."""
    g = torch.Generator().manual_seed(seed)
    need = [paged.blocks_for(L, block_size) for L in lengths]
    nb = sum(need) + 3
    kp = torch.randn(nb, block_size, H_kv, hd, generator=g)
    vp = torch.randn(nb, block_size, H_kv, hd, generator=g)
    perm = torch.randperm(nb, generator=g).tolist()
    tables = torch.zeros(len(lengths), max(need), dtype=torch.int32)
    rows, i = [], 0
    for b, n in enumerate(need):
        rows.append(perm[i:i + n])
        tables[b, :n] = torch.tensor(perm[i:i + n])
        i += n
    return kp, vp, tables, rows


def _dense(kp, vp, rows, lengths, block_size):
    """Contiguous (B, H_kv, S_max, hd) keys and values copied token by token through slot_of."""
    B, S = len(lengths), max(lengths)
    k = torch.zeros(B, kp.size(2), S, kp.size(3))
    v = torch.zeros_like(k)
    for b, L in enumerate(lengths):
        for p in range(L):
            blk, off = paged.slot_of(p, rows[b], block_size)
            k[b, :, p], v[b, :, p] = kp[blk, off], vp[blk, off]
    return k, v


@pytest.mark.slow
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("block_size,H,H_kv", [(3, 4, 4), (5, 4, 2), (4, 6, 1)])
def test_paged_decode_equals_contiguous(impl, block_size, H, H_kv):
    lengths = [7, 1, 13, 5]  # ragged, and no block size here divides all of them
    kp, vp, tables, rows = _pool_and_tables(lengths, block_size, H_kv=H_kv, hd=12)
    q = torch.randn(len(lengths), H, 12, generator=torch.Generator().manual_seed(1))
    lens = torch.tensor(lengths)
    if impl == "triton":  # 3 pieces of 4-token tiles: tiles across blocks, and empty pieces for the 1-token row
        got = paged_attention.paged_decode_triton(q, kp, vp, tables, lens, splits=3, tile=4)
        auto = paged_attention.paged_decode_triton(q, kp, vp, tables, lens)  # splits and tile chosen for this device
        torch.testing.assert_close(auto, got, atol=1e-5, rtol=1e-5)
    else:
        got = paged_attention.paged_decode_torch(q, kp, vp, tables, lens)
    want = paged_attention.dense_decode(q, *_dense(kp, vp, rows, lengths, block_size), lens)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # and against PyTorch's SDPA on each sequence alone (GQA by repeating kv heads)
    k, v = _dense(kp, vp, rows, lengths, block_size)
    for b, L in enumerate(lengths):
        kk = k[b, :, :L].repeat_interleave(H // H_kv, 0)
        vv = v[b, :, :L].repeat_interleave(H // H_kv, 0)
        ref = torch.nn.functional.scaled_dot_product_attention(q[b][:, None], kk, vv)[:, 0]
        torch.testing.assert_close(got[b], ref, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_flexattention_paged_helper_agrees_with_our_block_tables():
    lengths, block_size = [7, 1, 13, 5], 4
    kp, vp, tables, _ = _pool_and_tables(lengths, block_size, H_kv=2, hd=16)
    q = torch.randn(len(lengths), 4, 16, generator=torch.Generator().manual_seed(3))
    flex = paged_attention.flex_paged_decode(q, kp, vp, tables, torch.tensor(lengths))
    if flex is None:
        pytest.skip("this torch has no FlexAttention paged helper")
    torch.testing.assert_close(flex, paged_attention.paged_decode_torch(q, kp, vp, tables, torch.tensor(lengths)),
                               atol=1e-5, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.skipif(paged_attention.TRITON_MISSING is not None, reason="triton is not installed")
def test_the_triton_decode_kernel_compiles_for_an_h100_without_a_gpu():
    """The interpreter accepts code the compiler rejects: compile for sm_90 in a process with it off."""
    pytest.importorskip("triton.backends.compiler", reason="this triton has no ahead-of-time compile API")
    import os
    import subprocess
    import sys
    from pathlib import Path

    code = ("from helpers.decode import paged_attention\nfrom helpers.attention import triton_aot\n"
            "for bs, hd, group in ((12, 48, 3), (16, 128, 1)):\n"
            "    kernel = paged_attention.compile_decode_kernel('bf16', block_size=bs, head_dim=hd, group=group)\n"
            "    r = triton_aot.resources(kernel)\n"
            "    print('compiled', bs, hd, 'spills', r['spill_stores'] + r['spill_loads'])\n"
            "print('combine', paged_attention.compile_decode_kernel(head_dim=128, combine=True).metadata.shared)")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"COURSE_TRITON_AOT": "1"}
    done = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[2], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.count("compiled") == 2, done.stderr[-2000:]
    assert done.stdout.count("spills 0") == 2 and "combine" in done.stdout, done.stdout  # registers suffice at head_dim 48 and 128


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("q_dtype,pool_dtype", [(torch.float32, torch.bfloat16), (torch.bfloat16, torch.float32),
                                                (torch.float16, torch.bfloat16), (torch.bfloat16, torch.bfloat16)])
def test_paged_decode_reads_query_and_pools_in_their_own_dtypes_and_computes_in_fp32(impl, q_dtype, pool_dtype):
    lengths = [5, 9]
    kp, vp, tables, rows = _pool_and_tables(lengths, 4, H_kv=2, hd=8)
    q = torch.randn(2, 4, 8, generator=torch.Generator().manual_seed(3))
    kp, vp, q = kp.to(pool_dtype), vp.to(pool_dtype), q.to(q_dtype)
    lens = torch.tensor(lengths)
    fn = paged_attention.paged_decode_triton if impl == "triton" else paged_attention.paged_decode_torch
    got = fn(q, kp, vp, tables, lens)
    want = paged_attention.paged_decode_torch(q.float(), kp.float(), vp.float(), tables, lens)  # same values, fp32
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_paged_cache_refuses_a_dtype_it_cannot_hold_or_compute_in():
    for bad in (torch.int8, torch.float8_e4m3fn, "bf16"):
        with pytest.raises(ValueError, match="cannot hold a KV cache; choose one of torch.float32"):
            paged.PagedKVCache(1, 1, 4, num_blocks=2, block_size=2, dtype=bad)
    paged.PagedKVCache(1, 1, 4, num_blocks=2, block_size=2, dtype=torch.float64)  # the PyTorch path: fp64
    if paged_attention.TRITON_MISSING is None:
        with pytest.raises(ValueError, match="float64 cannot run with impl='triton'"):
            paged.PagedKVCache(1, 1, 4, num_blocks=2, block_size=2, dtype=torch.float64, impl="triton")
        kp, vp, tables, _ = _pool_and_tables([3], 2, H_kv=1, hd=4)
        with pytest.raises(ValueError, match="reads float32, bfloat16 or float16 tensors, not torch.float64"):
            paged_attention.paged_decode_triton(torch.randn(1, 1, 4, dtype=torch.float64), kp, vp, tables,
                                                torch.tensor([3]))


def test_the_head_dim_64_kernel_check_agrees_with_pytorch_and_uses_eight_warps():
    if paged_attention.TRITON_MISSING:
        pytest.skip(paged_attention.TRITON_MISSING)
    assert paged_attention.decode_warps(64, 64) == 8
    device = "cuda" if torch.cuda.is_available() else "cpu"  # the interpreter on a CPU
    assert paged_attention.check_triton_decode(64, dtype=torch.float32, device=device) < 1e-4
