"""helpers.decode.paged: the allocator never hands out a block twice, reference counts and copy-on-write when
prefixes are shared, slots through block tables, waste counted, and the course GPT on the paged cache equal to
its full forward and to the contiguous cache (in every cache dtype, within a stated tolerance)."""
from __future__ import annotations

import pytest
import torch

from helpers.decode import paged, paged_attention
from helpers.gpt import generation
from kv_support import DTYPES, tiny_gpt, tolerance

IMPLS = ["torch"] + (["triton"] if paged_attention.TRITON_MISSING is None else [])


def test_refcounts_share_and_free():
    alloc = paged.BlockAllocator(4)
    a, b = alloc.allocate(2)
    alloc.share([a])
    assert alloc.refcount(a) == 2 and alloc.num_used == 2 and alloc.num_free == 2
    alloc.free([a])
    assert alloc.refcount(a) == 1 and alloc.num_free == 2  # still held once
    alloc.free([a, b])
    assert alloc.num_used == 0 and alloc.num_free == 4
    with pytest.raises(ValueError):
        alloc.share([a])
    with pytest.raises(ValueError):
        alloc.free([a])


def test_fork_shares_blocks_and_copies_only_a_written_shared_block():
    cache = paged.PagedKVCache(2, 1, 4, num_blocks=10, block_size=4)
    cache.add("p")
    cache.reserve("p", 6)  # blocks for 6 tokens: one full, one holding 2 of 4
    cache.lengths["p"] = 6
    cache.k_pool[:, cache.tables["p"][1]] = 7.0
    for c in ("a", "b", "c"):
        cache.fork("p", c)
    cache.free("p")
    assert cache.allocator.num_used == 2 and cache.logical_blocks() == 6
    shared_full, shared_tail = cache.tables["a"]
    cache.set_batch(["a", "b", "c"])
    cache.positions(1)  # each writes position 6, in the shared partly filled block
    assert cache.cow_copies == 2  # a and b copy it; c, its last holder, writes in place
    assert cache.tables["c"][1] == shared_tail and cache.tables["a"][1] != shared_tail != cache.tables["b"][1]
    assert all(cache.tables[s][0] == shared_full for s in "abc")  # the full block stays shared
    assert cache.allocator.refcount(shared_full) == 3 and cache.allocator.refcount(shared_tail) == 1
    assert torch.equal(cache.k_pool[:, cache.tables["a"][1]], cache.k_pool[:, shared_tail])  # copied, all layers
    assert cache.allocator.num_used == 4
    for s in "abc":
        cache.free(s)
    assert cache.allocator.num_used == 0


def test_allocator_never_hands_out_a_block_twice_and_frees_everything():
    alloc = paged.BlockAllocator(10)
    got = alloc.allocate(4) + alloc.allocate(3)
    assert len(set(got)) == 7 and alloc.num_free == 3
    alloc.free(got[:2])
    again = alloc.allocate(5)
    assert not set(again) & set(got[2:]), "a block in use was handed out again"
    with pytest.raises(paged.OutOfBlocks, match="only 0 of 10 are free"):
        alloc.allocate(1)
    with pytest.raises(paged.OutOfBlocks):
        alloc.allocate(99)
    assert alloc.num_free == 0  # a refused request takes nothing
    alloc.free(got[2:] + again)
    assert alloc.num_free == 10 and alloc.num_used == 0
    with pytest.raises(ValueError, match="not allocated"):
        alloc.free([got[0]])  # freed twice
    with pytest.raises(ValueError):
        paged.BlockAllocator(0)


def test_slot_of_maps_positions_through_the_table():
    table = [7, 2, 9]
    assert [paged.slot_of(p, table, 4) for p in (0, 3, 4, 10)] == [(7, 0), (7, 3), (2, 0), (9, 2)]
    with pytest.raises(IndexError):
        paged.slot_of(12, table, 4)
    with pytest.raises(ValueError):
        paged.slot_of(-1, table, 4)


def test_waste_counts_allocated_minus_used_slots():
    paged_w = paged.waste([5, 8, 1], block_size=4)
    assert paged_w == {"allocated": 20, "used": 14, "wasted": 6, "fraction": 6 / 20}
    pre = paged.waste([5, 8, 1], reserve=16)
    assert pre["allocated"] == 48 and pre["wasted"] == 34
    with pytest.raises(ValueError):
        paged.waste([5], block_size=4, reserve=8)
    with pytest.raises(ValueError):
        paged.waste([20], reserve=16)


@pytest.mark.slow
@pytest.mark.parametrize("impl,kv_heads", [("torch", 4), ("torch", 2), ("torch", 1)]
                         + [(impl, 2) for impl in IMPLS if impl != "torch"])  # the kernel's MHA/MQA: above
def test_gpt_on_the_paged_cache_matches_the_full_forward(impl, kv_heads):
    model = tiny_gpt(kv_heads)
    cache = paged.PagedKVCache.for_model(model, num_blocks=40, block_size=3, impl=impl)
    g = torch.Generator().manual_seed(2)
    seqs = [torch.randint(0, 256, (L,), generator=g) for L in (6, 10, 4)]
    with torch.no_grad():
        for i, s in enumerate(seqs):  # ragged prefills, one sequence at a time
            cache.add(i)
            cache.set_batch([i])
            model(s[None, :-3], cache=cache)
        for step in (3, 2, 1):  # then batched decode of the last three tokens of each
            cache.set_batch([2, 0, 1])  # rows in any order
            out, _ = model(torch.stack([seqs[i][-step] for i in (2, 0, 1)])[:, None], cache=cache)
            for row, i in enumerate((2, 0, 1)):
                full, _ = model(seqs[i][None, :len(seqs[i]) - step + 1])
                torch.testing.assert_close(out[row, 0], full[0, -1], atol=1e-5, rtol=1e-5)
    allocated, used = cache.slots()
    assert used == sum(len(s) for s in seqs) and allocated == sum(paged.blocks_for(len(s), 3) for s in seqs) * 3
    for i in range(3):
        cache.free(i)
    assert cache.allocator.num_free == 40


def test_paged_cache_refuses_when_out_of_blocks_and_stays_consistent():
    model = tiny_gpt(2)
    cache = paged.PagedKVCache.for_model(model, num_blocks=3, block_size=4)
    cache.add("a")
    cache.set_batch(["a"])
    with torch.no_grad():
        model(torch.zeros(1, 10, dtype=torch.long), cache=cache)
        with pytest.raises(paged.OutOfBlocks, match="need 1 block"):
            model(torch.zeros(1, 3, dtype=torch.long), cache=cache)
    assert cache.lengths["a"] == 10 and cache.allocator.num_used == 3
    with pytest.raises(ValueError, match="already"):
        cache.add("a")
    with pytest.raises(ValueError):
        cache.set_batch(["b"])
    with pytest.raises(ValueError, match="impl"):
        paged.PagedKVCache(1, 1, 4, num_blocks=2, block_size=2, impl="cuda-magic")


@pytest.mark.parametrize("block_size", [5, 16])
def test_generation_on_the_paged_cache_equals_the_contiguous_cache(block_size):
    model = tiny_gpt(2)
    prompt = torch.randint(0, 256, (3, 9), generator=torch.Generator().manual_seed(4))
    contiguous = generation.KVCache(model.config, 3, 20)
    pag = paged.factory(block_size)(model.config, 3, 20, dtype=torch.float32, device="cpu")
    with torch.no_grad():
        a, b = generation.prefill(model, prompt, contiguous), generation.prefill(model, prompt, pag)
        for _ in range(4):  # batched prefill, then decode steps, logits compared at each
            torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)
            token = a.argmax(-1)
            a, b = generation.decode_one(model, token, contiguous), generation.decode_one(model, token, pag)
    want = generation.generate(model, prompt, 6)
    assert torch.equal(generation.generate(model, prompt, 6, make_cache=paged.factory(block_size)), want)


def _teacher_forced(model, seq, cache, split):
    """Logits (B, S, vocab) of seq through the cache: a prefill of `split` tokens, then one token at a time."""
    with torch.no_grad():
        first = model(seq[:, :split], cache=cache)[0]
        rest = [generation.decode_one(model, seq[:, t], cache)[:, None] for t in range(split, seq.size(1))]
    return torch.cat([first] + rest, 1)


@pytest.mark.slow
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("model_dtype", DTYPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_paged_cache_in_any_dtype_under_a_model_of_any_dtype(impl, model_dtype, dtype):
    model = tiny_gpt(2)
    with torch.no_grad():  # larger weights than the init so that logits are far from ties
        for p in model.parameters():
            p.mul_(3.0)
    model = model.to(model_dtype)
    seq = torch.randint(0, 256, (2, 10), generator=torch.Generator().manual_seed(8))
    make = paged.factory(3, impl)
    cache = make(model.config, 2, 10, dtype=dtype, device="cpu")
    got = _teacher_forced(model, seq, cache, 6).float()
    ref = _teacher_forced(model, seq, make(model.config, 2, 10, dtype=torch.float32, device="cpu"), 6).float()
    assert cache.k_pool.dtype == cache.v_pool.dtype == dtype  # stores in its dtype
    err, scale = float((got - ref).abs().max()), float(ref.abs().max())
    assert err <= tolerance(model_dtype, dtype) * scale
    top2 = ref.topk(2, dim=-1).values  # greedy tokens agree wherever the error cannot swap the top two
    sure = top2[..., 0] - top2[..., 1] > 2 * err
    assert torch.equal(got.argmax(-1)[sure], ref.argmax(-1)[sure])
    tokens = generation.generate(model, seq[:, :6], 3, dtype=dtype, make_cache=make)
    assert tokens.shape == (2, 3)
