"""A paged KV cache (Kwon et al., 2023, "Efficient Memory Management for Large Language Model Serving
with PagedAttention", the vLLM paper) for the course GPT: the blocks, the block tables, the free list.

The cache's memory is one pool of fixed-size blocks per layer, (num_blocks, block_size, kv_heads,
head_dim) for keys and the same for values. A sequence owns a list of block numbers, its *block
table*: token position p lives in block `table[p // block_size]` at offset `p % block_size`.
Appending a token writes one slot and takes a new block from the free list only when the last one
is full, so nothing is ever copied, and a finished sequence hands its blocks back at once. The
only memory a sequence wastes is the unused tail of its last block (fewer than block_size slots),
where a cache that preallocates each request's maximum length wastes everything it did not use.

* `BlockAllocator`: the free list with a reference count per block; never hands out a free block twice;
  `OutOfBlocks` when empty; `share` lets several block tables hold one block.
* Prefix sharing with copy-on-write (the vLLM paper, section 4.4): `PagedKVCache.fork(parent, child)`
  gives the child the parent's block table (no copy, each block's count + 1); before a forward writes a
  token into a block that more than one table holds, that block is copied to a fresh one for the writer
  alone (`cow_copies` counts them). Full blocks of a shared prompt are never written again, so they
  stay shared for the requests' whole lives.
* `PagedKVCache`: implements `helpers.gpt.model.KVCacheLike` for a batch of sequences of ragged lengths
  (MHA, GQA and MQA), so `GPT.forward(idx, cache=...)` runs on it unchanged. `add`, `free`,
  `set_batch` choose which sequences a forward call extends. `factory(block_size)` plugs it into
  helpers.gpt.generation's `generate(..., make_cache=...)`. Its attention (PyTorch, or the Triton decode
  kernel) is `helpers.decode.paged_attention`'s.
* `slot_of`: the block-table lookup (position -> physical block, offset).
* `waste`: allocated minus used slots, paged against per-request max-length preallocation.
"""
from __future__ import annotations

import functools
from collections.abc import Hashable, Sequence

import torch

from helpers.decode.paged_attention import TRITON_MISSING, paged_decode_torch, paged_decode_triton, paged_prefill_torch
from helpers.gpt.generation import cache_dtype
from helpers.measure.params import positive

IMPLS = ("torch", "triton")


class OutOfBlocks(RuntimeError):
    """The block pool has no free block left for a request (the scheduler preempts on this)."""


def blocks_for(n_tokens: int, block_size: int) -> int:
    """Blocks needed to hold `n_tokens` tokens: ceil(n_tokens / block_size)."""
    positive("block_size", block_size)
    if n_tokens < 0:
        raise ValueError(f"n_tokens={n_tokens} must be >= 0")
    return -(-n_tokens // block_size)  # ceiling division: a part-filled last block is still a whole block


def slot_of(position: int, table: Sequence[int], block_size: int) -> tuple[int, int]:
    """The physical (block, offset) where token `position` of a sequence with block table `table` lives.

    block = table[position // block_size], offset = position % block_size. Raises IndexError when the
    table does not reach that position, ValueError for a negative position or block_size < 1.
    """
    positive("block_size", block_size)
    if position < 0:
        raise ValueError(f"position={position} must be >= 0")
    logical = position // block_size  # the sequence's own block count: its 0th, 1st, ... block
    if logical >= len(table):  # the free list has not yet given this sequence a block that far
        raise IndexError(f"position {position} needs logical block {logical}; the table has {len(table)}")
    # the table maps the logical block to wherever the free list found room; the offset within it is unchanged
    return table[logical], position % block_size


class BlockAllocator:
    """A free list of `num_blocks` block numbers 0..num_blocks-1, with a reference count per block.

    `allocate()` pops one (LIFO: a block just freed is reused first, while it may still be in cache) with
    count 1; `share(blocks)` adds one holder to each; `free(blocks)` drops one holder from each and returns
    a block to the free list when its count reaches 0. Handing out a block that is in use, or freeing or
    sharing one that is not, is impossible by construction: both are checked and raise.
    """

    def __init__(self, num_blocks: int):
        positive("num_blocks", num_blocks)
        self.num_blocks = num_blocks
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))  # pop() gives 0 first
        self._refs: dict[int, int] = {}

    @property
    def num_free(self) -> int:
        """Blocks on the free list."""
        return len(self._free)

    @property
    def num_used(self) -> int:
        """Physical blocks handed out and not yet freed (a shared block counts once)."""
        return len(self._refs)

    def refcount(self, block: int) -> int:
        """How many block tables hold `block` (0: free)."""
        return self._refs.get(block, 0)

    def allocate(self, n: int = 1) -> list[int]:
        """`n` distinct free blocks, all or none; raises OutOfBlocks when fewer than n are free."""
        if n < 0:
            raise ValueError(f"n={n} must be >= 0")
        if n > len(self._free):
            raise OutOfBlocks(f"asked for {n} block(s) but only {len(self._free)} of {self.num_blocks} are free")
        got = [self._free.pop() for _ in range(n)]
        assert not any(b in self._refs for b in got), "allocator handed out a block twice"
        self._refs.update({b: 1 for b in got})
        return got

    def share(self, blocks: Sequence[int]) -> None:
        """One more holder for each of `blocks`; raises ValueError for a block that is not handed out."""
        for b in blocks:
            if b not in self._refs:
                raise ValueError(f"block {b} is not allocated, so it cannot be shared")
        for b in blocks:
            self._refs[b] += 1

    def free(self, blocks: Sequence[int]) -> None:
        """One holder fewer for each block; at 0 it returns to the free list. Raises ValueError for a block
        that is not handed out."""
        for b in blocks:
            if b not in self._refs:
                raise ValueError(f"block {b} is not allocated (freed twice, or never handed out)")
            self._refs[b] -= 1
            if self._refs[b] == 0:
                del self._refs[b]
                self._free.append(b)


class PagedKVCache:
    """Keys and values of many sequences in a shared pool of blocks; a `KVCacheLike` for GPT.forward.

    Pools: `k_pool`, `v_pool` of shape (n_layer, num_blocks, block_size, n_kv_head, head_dim).
    Sequences are named by any hashable id: `add(sid)` registers one (no blocks yet), `free(sid)`
    returns its blocks, `set_batch([sid, ...])` says which B sequences the next forward call
    extends (row b of idx is sequence b). Each of them gets the same number T of new tokens per
    call, on top of its own (ragged) cached length. Blocks for the T new tokens are taken in
    `positions(T)` all at once or not at all (OutOfBlocks), before any layer writes.

    `impl` picks the decode attention (T == 1): "torch" (gather through the block table) or
    "triton" (the kernel; in the interpreter without CUDA). Prefill (T > 1) always gathers in PyTorch.

    Stores in `dtype` (any of helpers.gpt.generation.CACHE_DTYPES, whatever the model's), computes in
    float32 (the PyTorch paths in float64 when the query or the pools are float64; the Triton kernel
    always in float32, so it refuses float64 pools) and returns the query's dtype. Raises ValueError for
    another dtype or impl.
    """

    def __init__(self, n_layer: int, n_kv_head: int, head_dim: int, *, num_blocks: int, block_size: int,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu", impl: str = "torch"):
        for name, value in (("n_layer", n_layer), ("n_kv_head", n_kv_head), ("head_dim", head_dim),
                            ("block_size", block_size)):
            positive(name, value)
        if impl not in IMPLS:
            raise ValueError(f"impl={impl!r} is unknown; choose one of {', '.join(map(repr, IMPLS))}")
        if impl == "triton" and TRITON_MISSING:
            raise ValueError(f"impl='triton' cannot run here: {TRITON_MISSING}")
        if cache_dtype(dtype) == torch.float64 and impl == "triton":
            raise ValueError("dtype=torch.float64 cannot run with impl='triton' (the kernel computes in float32); "
                             "use impl='torch' or a float32, bfloat16 or float16 cache")
        self.allocator = BlockAllocator(num_blocks)
        self.block_size, self.n_layer, self.impl = block_size, n_layer, impl
        shape = (n_layer, num_blocks, block_size, n_kv_head, head_dim)
        self.k_pool = torch.zeros(shape, dtype=dtype, device=device)
        self.v_pool = torch.zeros(shape, dtype=dtype, device=device)
        self.tables: dict[Hashable, list[int]] = {}
        self.lengths: dict[Hashable, int] = {}
        self.batch: list[Hashable] = []
        self.cow_copies = 0  # blocks copied because a sequence wrote into a block another table shares
        self._pending: tuple[int, torch.Tensor, torch.Tensor, torch.Tensor] | None = None  # T, slots, tables, lens

    @classmethod
    def for_model(cls, model, *, num_blocks: int, block_size: int, impl: str = "torch",
                  dtype: torch.dtype | None = None) -> "PagedKVCache":
        """A cache shaped for a course GPT, on its device and (unless given) in its dtype."""
        cfg, p = model.config, next(model.parameters())
        return cls(cfg.n_layer, cfg.n_kv_head, cfg.head_dim, num_blocks=num_blocks, block_size=block_size,
                   dtype=dtype or p.dtype, device=p.device, impl=impl)

    @classmethod
    def for_batch(cls, config, batch: int, max_len: int, *, block_size: int = 16, impl: str = "torch",
                  dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu") -> "PagedKVCache":
        """`batch` sequences (ids 0..batch-1, already the batch) with blocks enough for max_len tokens each.

        The signature of helpers.gpt.generation's `generate(..., make_cache=)` once block_size and impl are
        bound (see `factory`), so generation runs on the paged cache unchanged.
        """
        cache = cls(config.n_layer, config.n_kv_head, config.head_dim, block_size=block_size, impl=impl,
                    num_blocks=batch * blocks_for(max_len, block_size), dtype=dtype, device=device)
        for b in range(batch):
            cache.add(b)
        cache.set_batch(list(range(batch)))
        return cache

    # ---------------------------------------------------------------- bookkeeping
    def add(self, sid: Hashable) -> None:
        """Register an empty sequence; raises ValueError when the id is already in use."""
        if sid in self.tables:
            raise ValueError(f"sequence {sid!r} is already in the cache")
        self.tables[sid], self.lengths[sid] = [], 0

    def fork(self, parent: Hashable, child: Hashable) -> None:
        """Register `child` holding everything `parent` has cached, sharing its blocks (no copy): the two
        block tables name the same physical blocks, each block's reference count + 1. Raises ValueError for
        an unknown parent or a child id already in use."""
        if parent not in self.tables:
            raise ValueError(f"sequence {parent!r} is not in the cache")
        self.add(child)
        self.tables[child] = list(self.tables[parent])
        self.lengths[child] = self.lengths[parent]
        self.allocator.share(self.tables[child])

    def logical_blocks(self) -> int:
        """Blocks the sequences' tables name in all, a shared block once per table: what the cache would hold
        without sharing (compare `allocator.num_used`, the physical blocks)."""
        return sum(len(t) for t in self.tables.values())

    def _copies_needed(self, sids: Sequence[Hashable], T: int) -> list[tuple[Hashable, int]]:
        """(sequence, logical block) pairs that appending T tokens would write while the block is shared."""
        out = []
        for s in sids:
            table, n = self.tables[s], self.lengths[s]
            for logical in range(n // self.block_size, min(len(table), blocks_for(n + T, self.block_size))):
                if self.allocator.refcount(table[logical]) > 1:
                    out.append((s, logical))
        return out

    def _copy_on_write(self, sids: Sequence[Hashable], T: int) -> None:
        """Give each of `sids` a private copy (every layer, keys and values) of each shared block the next T
        tokens write into; the shared original loses one holder."""
        for s, logical in self._copies_needed(sids, T):
            old = self.tables[s][logical]
            if self.allocator.refcount(old) < 2:  # an earlier writer's copy left this one the last holder
                continue
            new = self.allocator.allocate(1)[0]
            self.k_pool[:, new] = self.k_pool[:, old]
            self.v_pool[:, new] = self.v_pool[:, old]
            self.allocator.free([old])
            self.tables[s][logical] = new
            self.cow_copies += 1

    def free(self, sid: Hashable) -> None:
        """Hand a sequence's blocks back to the free list and forget it (also drops it from the batch); a
        block another sequence still shares stays allocated to it."""
        self.allocator.free(self.tables.pop(sid))
        del self.lengths[sid]
        self.batch = [s for s in self.batch if s != sid]

    def reserve(self, sid: Hashable, n_tokens: int) -> None:
        """Make sure `sid` has blocks for `n_tokens` tokens in all (preallocation; OutOfBlocks if not)."""
        need = blocks_for(n_tokens, self.block_size) - len(self.tables[sid])
        if need > 0:
            self.tables[sid] += self.allocator.allocate(need)

    def set_batch(self, sids: Sequence[Hashable]) -> None:
        """The sequences (rows, in order) the next forward call extends; each must have been `add`ed."""
        missing = [s for s in sids if s not in self.tables]
        if missing or not sids or len(set(sids)) != len(sids):
            raise ValueError(f"batch {list(sids)!r} must be distinct sequences already added (unknown: {missing})")
        self.batch = list(sids)

    def blocks_needed(self, sids: Sequence[Hashable], T: int) -> int:
        """New blocks that appending T tokens to each of `sids` would take from the free list: the blocks
        past each table's end, plus a copy of each shared block those tokens write into (at most; a block
        shared only within `sids` is left to its last writer uncopied)."""
        grow = sum(max(0, blocks_for(self.lengths[s] + T, self.block_size) - len(self.tables[s])) for s in sids)
        return grow + len(self._copies_needed(sids, T))

    def slots(self) -> tuple[int, int]:
        """(allocated slots, used slots) over every sequence: blocks * block_size and cached tokens (a block
        shared by several tables is counted once per table, as an unshared cache would hold it)."""
        return sum(len(t) for t in self.tables.values()) * self.block_size, sum(self.lengths.values())

    def block_table_tensor(self, sids: Sequence[Hashable] | None = None) -> torch.Tensor:
        """(B, max_blocks) int32 block numbers of `sids` (default: the batch), padded with 0 (never read)."""
        sids = self.batch if sids is None else sids
        width = max(1, max(len(self.tables[s]) for s in sids))
        rows = [self.tables[s] + [0] * (width - len(self.tables[s])) for s in sids]
        return torch.tensor(rows, dtype=torch.int32, device=self.k_pool.device)

    # ---------------------------------------------------------------- KVCacheLike
    def positions(self, T: int) -> torch.Tensor:
        """(B, T) absolute positions of the batch's T new tokens; takes the blocks they need (or raises)."""
        if not self.batch:
            raise ValueError("call set_batch([...]) before a forward pass")
        need = self.blocks_needed(self.batch, T)
        if need > self.allocator.num_free:
            raise OutOfBlocks(f"{T} new token(s) for {len(self.batch)} sequence(s) need {need} block(s); "
                              f"{self.allocator.num_free} are free")
        self._copy_on_write(self.batch, T)
        for s in self.batch:
            self.reserve(s, self.lengths[s] + T)
        dev = self.k_pool.device
        lens = torch.tensor([self.lengths[s] for s in self.batch], device=dev)  # (B,)
        pos = lens[:, None] + torch.arange(T, device=dev)  # (B, T)
        tables = self.block_table_tensor().long()  # (B, max_blocks)
        blk = tables.gather(1, pos // self.block_size)  # (B, T) physical blocks
        slots = blk * self.block_size + pos % self.block_size  # (B, T) flat slot numbers in the pool
        self._pending = (T, slots.reshape(-1), tables, lens)
        return pos

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Write k, v (B, H_kv, T, hd) into the batch's slots, then attend q (B, H, T, hd) causally over all."""
        if self._pending is None or self._pending[0] != q.size(2):
            raise RuntimeError("attend() without a matching positions(T): call the model with cache=... ")
        T, slots, tables, lens = self._pending
        B, H_kv, _, hd = k.shape
        flat_k = self.k_pool[layer].view(-1, H_kv, hd)  # (num_blocks * block_size, H_kv, hd)
        flat_v = self.v_pool[layer].view(-1, H_kv, hd)
        flat_k[slots] = k.transpose(1, 2).reshape(B * T, H_kv, hd).to(flat_k.dtype)
        flat_v[slots] = v.transpose(1, 2).reshape(B * T, H_kv, hd).to(flat_v.dtype)
        kp, vp = self.k_pool[layer], self.v_pool[layer]
        if T == 1 and self.impl == "triton":
            longest = max(self.lengths[s] for s in self.batch) + 1  # known here: no device sync in the kernel call
            return paged_decode_triton(q[:, :, 0], kp, vp, tables, lens + 1, max_len=longest).unsqueeze(2).to(q.dtype)
        if T == 1:
            return paged_decode_torch(q[:, :, 0], kp, vp, tables, lens + 1).unsqueeze(2).to(q.dtype)  # (B, H, 1, hd)
        return paged_prefill_torch(q, kp, vp, tables, lens).to(q.dtype)  # (B, H, T, hd)

    def advance(self, T: int) -> None:
        """Count the T new tokens as cached for every sequence of the batch."""
        for s in self.batch:
            self.lengths[s] += T
        self._pending = None


def factory(block_size: int = 16, impl: str = "torch"):
    """make_cache(config, batch, max_len, dtype=, device=) -> PagedKVCache, for generation.generate."""
    return functools.partial(PagedKVCache.for_batch, block_size=block_size, impl=impl)


# -------------------------------------------------------------------- memory waste

def waste(lengths: Sequence[int], *, block_size: int | None = None, reserve: int | Sequence[int] | None = None
          ) -> dict[str, float]:
    """Allocated vs used KV slots for sequences holding `lengths` tokens.

    Paged (block_size given): each sequence holds ceil(L / block_size) blocks. Preallocated (reserve
    given): each holds `reserve` slots (an int for all, or one per sequence, each >= its length).
    Returns {"allocated", "used", "wasted", "fraction"} in slots (token positions; multiply by the
    bytes per token for bytes); fraction = wasted / allocated. Exactly one of the two must be given.
    """
    if (block_size is None) == (reserve is None):
        raise ValueError("give exactly one of block_size (paged) or reserve (preallocated)")
    lengths = list(lengths)
    if any(L < 0 for L in lengths):
        raise ValueError(f"lengths must be >= 0, got {lengths}")
    if block_size is not None:
        alloc = [blocks_for(L, block_size) * block_size for L in lengths]
    else:
        alloc = [reserve] * len(lengths) if isinstance(reserve, int) else list(reserve)
        if len(alloc) != len(lengths) or any(a < L for a, L in zip(alloc, lengths)):
            raise ValueError(f"reserve {reserve} must cover every length {lengths}")
    used, total = sum(lengths), sum(alloc)
    return {"allocated": total, "used": used, "wasted": total - used,
            "fraction": (total - used) / total if total else 0.0}
