"""helpers.decode.paged's reference counts and prefix sharing with copy-on-write: which blocks are shared,
copied and freed, counted exactly; and helpers.decode.serving's shared-prefix generation against the unshared
cache (identical tokens, bitwise logits, the blocks the formula predicts)."""
from __future__ import annotations

import pytest
import torch

from helpers.decode import paged, serving, serving_lab
from kv_support import small_gpt


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


@pytest.mark.parametrize("prompt_len,block", [(13, 4), (12, 4)])
def test_shared_prefix_generation_equals_unshared_and_saves_the_formulas_blocks(prompt_len, block):
    model = small_gpt(2)
    prompt = list(range(3, 3 + prompt_len))
    suffixes = [[1, 2], [5, 6], [9, 10]]
    sh = serving.shared_prefix_generate(model, prompt, suffixes, 5, block_size=block, share=True)
    un = serving.shared_prefix_generate(model, prompt, suffixes, 5, block_size=block, share=False)
    assert sh.tokens == un.tokens and torch.equal(sh.logits, un.logits)
    f = serving_lab.prefix_blocks(prompt_len, prompt_len + 2 + 5, 3, block)
    assert (sh.physical, un.physical, sh.cow_copies, un.cow_copies) == (f["shared"], f["unshared"], f["copies"], 0)
    assert f["saved"] == 2 * (prompt_len // block) and f["copies"] == (2 if prompt_len % block else 0)
    assert sh.logical == un.physical
    out = serving_lab.prefix_section(model, prompt, suffixes, 5, block_size=block, show=False)
    assert out["bitwise"] and f"{f['saved']} saved" in out["sentence"]
    with pytest.raises(ValueError):
        serving.shared_prefix_generate(model, prompt, [[1], [2, 3]], 5)
