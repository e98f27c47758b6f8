"""A paged KV cache (Kwon et al., 2023, "Efficient Memory Management for Large Language Model Serving
with PagedAttention", the vLLM paper) for the course GPT, with decode attention in PyTorch and Triton.

The cache's memory is one pool of fixed-size blocks per layer, (num_blocks, block_size, kv_heads,
head_dim) for keys and the same for values. A sequence owns a list of block numbers, its *block
table*: token position p lives in block `table[p // block_size]` at offset `p % block_size`.
Appending a token writes one slot and takes a new block from the free list only when the last one
is full, so nothing is ever copied, and a finished sequence hands its blocks back at once. The
only memory a sequence wastes is the unused tail of its last block (fewer than block_size slots),
where a cache that preallocates each request's maximum length wastes everything it did not use.

* `BlockAllocator`: the free list; never hands out a block twice; `OutOfBlocks` when empty.
* `PagedKVCache`: implements `helpers.model.KVCacheLike` for a batch of sequences of ragged lengths
  (MHA, GQA and MQA), so `GPT.forward(idx, cache=...)` runs on it unchanged. `add`, `free`,
  `set_batch` choose which sequences a forward call extends. `factory(block_size)` plugs it into
  helpers.inference's `generate(..., make_cache=...)`.
* `paged_decode_torch`, `paged_decode_triton`: attention of one new query per sequence over its
  cached keys, read through the block table. The Triton kernel looks each token's block up in the
  table as it loads a tile of keys, and splits long sequences over several programs whose partial
  softmaxes are merged afterwards (the split-KV of FlashDecoding); it runs in Triton's interpreter
  without CUDA and is compiled on a GPU (`compile_decode_kernel`: for sm_90, without one).
  `dense_decode`: the contiguous reference. `flex_paged_decode`: PyTorch's FlexAttention paged
  helper reading the same pool and tables (a cross-check).
* `slot_of`: the block-table lookup (position -> physical block, offset) the exercise asks for.
* `waste`: allocated minus used slots, paged against per-request max-length preallocation.
"""
from __future__ import annotations

try:  # first: helpers.flash_triton switches Triton's interpreter on (no CUDA) before triton is imported
    from . import flash_triton as _flash_triton
    TRITON_MISSING: str | None = _flash_triton.BROKEN
except ImportError as err:  # triton is a Linux-only dependency
    _flash_triton, TRITON_MISSING = None, f"triton is not installed ({err})"

import functools
import math
from collections.abc import Hashable, Sequence

import torch

if TRITON_MISSING is None:
    import triton
    import triton.language as tl
else:  # pragma: no cover - without triton only the PyTorch path exists
    triton = tl = None

IMPLS = ("torch", "triton")


class OutOfBlocks(RuntimeError):
    """The block pool has no free block left for a request (the scheduler preempts on this)."""


def blocks_for(n_tokens: int, block_size: int) -> int:
    """Blocks needed to hold `n_tokens` tokens: ceil(n_tokens / block_size)."""
    if n_tokens < 0 or block_size <= 0:
        raise ValueError(f"n_tokens={n_tokens} must be >= 0 and block_size={block_size} > 0")
    return -(-n_tokens // block_size)


def slot_of(position: int, table: Sequence[int], block_size: int) -> tuple[int, int]:
    """The physical (block, offset) where token `position` of a sequence with block table `table` lives.

    block = table[position // block_size], offset = position % block_size. Raises IndexError when the
    table does not reach that position, ValueError for a negative position or block_size < 1.
    """
    if position < 0 or block_size < 1:
        raise ValueError(f"position={position} must be >= 0 and block_size={block_size} >= 1")
    logical = position // block_size
    if logical >= len(table):
        raise IndexError(f"position {position} needs logical block {logical}; the table has {len(table)}")
    return table[logical], position % block_size


class BlockAllocator:
    """A free list of `num_blocks` block numbers 0..num_blocks-1.

    `allocate()` pops one (LIFO: a block just freed is reused first, while it may still be in cache),
    `free(b)` pushes it back. Handing out a block that is in use, or freeing one that is not, is
    impossible by construction: both are checked and raise.
    """

    def __init__(self, num_blocks: int):
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 1:
            raise ValueError(f"num_blocks={num_blocks!r} must be a positive int")
        self.num_blocks = num_blocks
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))  # pop() gives 0 first
        self._used: set[int] = set()

    @property
    def num_free(self) -> int:
        """Blocks on the free list."""
        return len(self._free)

    @property
    def num_used(self) -> int:
        """Blocks handed out and not yet freed."""
        return len(self._used)

    def allocate(self, n: int = 1) -> list[int]:
        """`n` distinct free blocks, all or none; raises OutOfBlocks when fewer than n are free."""
        if n < 0:
            raise ValueError(f"n={n} must be >= 0")
        if n > len(self._free):
            raise OutOfBlocks(f"asked for {n} block(s) but only {len(self._free)} of {self.num_blocks} are free")
        got = [self._free.pop() for _ in range(n)]
        assert not self._used.intersection(got), "allocator handed out a block twice"
        self._used.update(got)
        return got

    def free(self, blocks: Sequence[int]) -> None:
        """Return blocks to the free list; raises ValueError for a block that is not handed out."""
        for b in blocks:
            if b not in self._used:
                raise ValueError(f"block {b} is not allocated (freed twice, or never handed out)")
            self._used.remove(b)
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
    """

    def __init__(self, n_layer: int, n_kv_head: int, head_dim: int, *, num_blocks: int, block_size: int,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu", impl: str = "torch"):
        for name, value in (("n_layer", n_layer), ("n_kv_head", n_kv_head), ("head_dim", head_dim),
                            ("block_size", block_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} must be a positive int")
        if impl not in IMPLS:
            raise ValueError(f"impl={impl!r} is unknown; choose one of {', '.join(map(repr, IMPLS))}")
        if impl == "triton" and TRITON_MISSING:
            raise ValueError(f"impl='triton' cannot run here: {TRITON_MISSING}")
        self.allocator = BlockAllocator(num_blocks)
        self.block_size, self.n_layer, self.impl = block_size, n_layer, impl
        shape = (n_layer, num_blocks, block_size, n_kv_head, head_dim)
        self.k_pool = torch.zeros(shape, dtype=dtype, device=device)
        self.v_pool = torch.zeros(shape, dtype=dtype, device=device)
        self.tables: dict[Hashable, list[int]] = {}
        self.lengths: dict[Hashable, int] = {}
        self.batch: list[Hashable] = []
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

        The signature of helpers.inference's `generate(..., make_cache=)` once block_size and impl are
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

    def free(self, sid: Hashable) -> None:
        """Hand a sequence's blocks back to the free list and forget it (also drops it from the batch)."""
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
        """New blocks that appending T tokens to each of `sids` would take from the free list."""
        return sum(max(0, blocks_for(self.lengths[s] + T, self.block_size) - len(self.tables[s])) for s in sids)

    def slots(self) -> tuple[int, int]:
        """(allocated slots, used slots) over every sequence: blocks * block_size and cached tokens."""
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
    """make_cache(config, batch, max_len, dtype=, device=) -> PagedKVCache, for inference.generate."""
    return functools.partial(PagedKVCache.for_batch, block_size=block_size, impl=impl)


# -------------------------------------------------------------------- attention through the table

def _gather(pool: torch.Tensor, tables: torch.Tensor) -> torch.Tensor:
    """(B, H_kv, max_blocks * block_size, hd): each sequence's blocks, in table order, from a layer's pool."""
    B, nb = tables.shape
    g = pool[tables.long()]  # (B, max_blocks, block_size, H_kv, hd)
    return g.reshape(B, nb * pool.size(1), pool.size(2), pool.size(3)).transpose(1, 2)


def _grouped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """softmax(q kᵀ/sqrt(hd)) v in fp32 with GQA grouping: q (B, H, T, hd), k/v (B, H_kv, S, hd), keep (B, T, S)."""
    B, H, T, hd = q.shape
    H_kv = k.size(1)
    qg = q.float().reshape(B, H_kv, H // H_kv, T, hd)  # query heads h = g*(H/H_kv) + i share kv head g
    scores = (qg / math.sqrt(hd)) @ k.float().unsqueeze(2).transpose(-2, -1)  # (B, H_kv, G, T, S)
    scores = scores.masked_fill(~keep[:, None, None], float("-inf"))
    out = torch.softmax(scores, dim=-1) @ v.float().unsqueeze(2)  # (B, H_kv, G, T, hd)
    return out.reshape(B, H, T, hd)


def paged_decode_torch(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, tables: torch.Tensor,
                       lengths: torch.Tensor) -> torch.Tensor:
    """Decode attention read through block tables, in PyTorch (a gather, then masked attention).

    q (B, H, hd): one query per sequence; k_pool, v_pool (num_blocks, block_size, H_kv, hd) one layer's
    pool; tables (B, max_blocks) int block numbers; lengths (B,) keys per sequence (>= 1, including
    the new token's). Returns (B, H, hd) in float32. H must be a multiple of H_kv (GQA/MQA).
    """
    k, v = _gather(k_pool, tables), _gather(v_pool, tables)  # (B, H_kv, S, hd)
    keep = torch.arange(k.size(2), device=q.device)[None, None, :] < lengths.to(q.device)[:, None, None]
    return _grouped_attention(q[:, :, None], k, v, keep)[:, :, 0]  # (B, H, hd)


def paged_prefill_torch(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, tables: torch.Tensor,
                        cached: torch.Tensor) -> torch.Tensor:
    """Causal attention of T new queries per sequence over its cached and new keys, through the table.

    q (B, H, T, hd); cached (B,) tokens each sequence held before these T (new token t sits at position
    cached + t and sees positions <= cached + t). Returns (B, H, T, hd) in float32.
    """
    T = q.size(2)
    k, v = _gather(k_pool, tables), _gather(v_pool, tables)  # (B, H_kv, S, hd)
    last = cached.to(q.device)[:, None, None] + torch.arange(T, device=q.device)[None, :, None]  # (B, T, 1)
    keep = torch.arange(k.size(2), device=q.device)[None, None, :] <= last  # (B, T, S)
    return _grouped_attention(q, k, v, keep)


def dense_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """The contiguous reference: q (B, H, hd), k/v (B, H_kv, S_max, hd) padded; lengths (B,). -> (B, H, hd) fp32."""
    keep = torch.arange(k.size(2), device=q.device)[None, None, :] < lengths.to(q.device)[:, None, None]
    return _grouped_attention(q[:, :, None], k, v, keep)[:, :, 0]


def flex_paged_decode(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, tables: torch.Tensor,
                      lengths: torch.Tensor) -> torch.Tensor | None:
    """The same decode through PyTorch's FlexAttention paged helper (a cross-check, not the lesson).

    Our block tables are copied into torch's experimental `PagedAttention` page table, and
    `flex_attention` reads our pools through its converted block mask. Same shapes as
    `paged_decode_torch`; returns (B, H, hd) float32, or None when this torch has no such helper.
    Eager (uncompiled) on a CPU: the first call takes seconds, later ones are quick.
    """
    try:
        from torch.nn.attention.experimental._paged_attention import PagedAttention
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError:
        return None
    B, H, hd = q.shape
    nb, bs, H_kv, _ = k_pool.shape
    dev = q.device
    pa = PagedAttention(nb, bs, B, device=dev)
    for b in range(B):
        n = blocks_for(int(lengths[b]), bs)
        row = tables[b, :n].to(device=dev, dtype=torch.int64)
        pa.page_table[b, :n] = row
        pa.physical_to_logical[b, row] = torch.arange(n, device=dev)
        pa.capacity[b] = n * bs
    logical = create_block_mask(lambda b, h, q_idx, kv_idx: kv_idx >= 0, B, None, 1, tables.size(1) * bs,
                                device=dev, BLOCK_SIZE=bs)
    mask = pa.convert_logical_block_mask(logical, kv_len=lengths.to(dev))
    kc = k_pool.permute(2, 0, 1, 3).reshape(1, H_kv, nb * bs, hd).expand(B, -1, -1, -1)  # pool as one long sequence
    vc = v_pool.permute(2, 0, 1, 3).reshape(1, H_kv, nb * bs, hd).expand(B, -1, -1, -1)
    import warnings

    with warnings.catch_warnings():  # "flex_attention called without torch.compile": fine for a check
        warnings.simplefilter("ignore")
        out = flex_attention(q[:, :, None].float(), kc.float(), vc.float(), block_mask=mask, enable_gqa=True)
    return out[:, :, 0]


if tl is not None:
    @triton.jit
    def _paged_decode_kernel(q_ptr, k_ptr, v_ptr, table_ptr, len_ptr, acc_ptr, ml_ptr,
                             s_qb, s_qh, s_kb, s_ks, s_kh, s_tb, s_ab, s_ah, s_as, scale, split_tokens,
                             GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr,
                             HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr):
        """One program per (sequence, query head, split): an online softmax over that split's tokens.

        Tokens come TILE at a time; each token's block is looked up in the table (so a tile may span
        several blocks, and the block size need not be a power of two). Writes the split's unnormalised
        output and its (max, sum) for `_combine_kernel`.
        """
        b = tl.program_id(0)
        h = tl.program_id(1)
        sp = tl.program_id(2)
        kvh = h // GROUP  # the kv head this query head shares
        offs_d = tl.arange(0, D_PAD)
        offs_t = tl.arange(0, TILE)
        d_ok = offs_d < HEAD_DIM
        q = tl.load(q_ptr + b * s_qb + h * s_qh + offs_d, mask=d_ok, other=0.0).to(tl.float32) * scale
        n_keys = tl.load(len_ptr + b)
        lo = sp * split_tokens
        hi = tl.minimum(lo + split_tokens, n_keys)
        m_i = -float("inf")
        l_i = 0.0
        acc = tl.zeros([D_PAD], dtype=tl.float32)
        for start in range(lo, hi, TILE):
            pos = start + offs_t  # (TILE,) token positions
            ok = pos < hi
            blk = tl.load(table_ptr + b * s_tb + pos // BLOCK_SIZE, mask=ok, other=0).to(tl.int64)  # the lookup
            rows = blk * s_kb + (pos % BLOCK_SIZE) * s_ks + kvh * s_kh  # (TILE,) where each token's key lives
            kv_ok = ok[:, None] & d_ok[None, :]
            k = tl.load(k_ptr + rows[:, None] + offs_d[None, :], mask=kv_ok, other=0.0).to(tl.float32)
            s = tl.where(ok, tl.sum(k * q[None, :], axis=1), -float("inf"))  # (TILE,) scores
            m_new = tl.maximum(m_i, tl.max(s, axis=0))
            alpha = tl.exp(m_i - m_new)
            p = tl.exp(s - m_new)
            v = tl.load(v_ptr + rows[:, None] + offs_d[None, :], mask=kv_ok, other=0.0).to(tl.float32)
            acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
            l_i = l_i * alpha + tl.sum(p, axis=0)
            m_i = m_new
        tl.store(acc_ptr + b * s_ab + h * s_ah + sp * s_as + offs_d, acc, mask=d_ok)
        piece = (b * tl.num_programs(1) + h) * tl.num_programs(2) + sp  # row of the contiguous (B, H, S, 2) ml
        tl.store(ml_ptr + 2 * piece, m_i)  # an empty split leaves m = -inf, l = 0
        tl.store(ml_ptr + 2 * piece + 1, l_i)


    @triton.jit
    def _combine_kernel(acc_ptr, ml_ptr, out_ptr, n_splits, s_ob, s_oh,
                        S_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr):
        """One program per (sequence, query head): merge its pieces' partial softmaxes into the output.

        out = sum_s exp(m_s - M) acc_s / sum_s exp(m_s - M) l_s, with M = max_s m_s (an empty piece
        has m = -inf and weighs 0). acc (B, H, S, hd) and ml (B, H, S, 2) are contiguous.
        """
        b = tl.program_id(0)
        h = tl.program_id(1)
        row = b * tl.num_programs(1) + h
        offs_s = tl.arange(0, S_PAD)
        offs_d = tl.arange(0, D_PAD)
        s_ok = offs_s < n_splits
        m = tl.load(ml_ptr + 2 * (row * n_splits + offs_s), mask=s_ok, other=-float("inf"))
        l = tl.load(ml_ptr + 2 * (row * n_splits + offs_s) + 1, mask=s_ok, other=0.0)
        acc = tl.load(acc_ptr + (row * n_splits + offs_s[:, None]) * HEAD_DIM + offs_d[None, :],
                      mask=s_ok[:, None] & (offs_d[None, :] < HEAD_DIM), other=0.0)
        w = tl.exp(m - tl.max(m, axis=0))  # (S_PAD,)
        out = tl.sum(w[:, None] * acc, axis=0) / tl.sum(w * l, axis=0)
        tl.store(out_ptr + b * s_ob + h * s_oh + offs_d, out, mask=offs_d < HEAD_DIM)


@functools.lru_cache(maxsize=None)
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def decode_splits(batch_heads: int, max_len: int, tile: int, device: str | torch.device) -> int:
    """How many pieces to split each sequence into so that a GPU has enough programs to run at once.

    On CUDA: enough (batch * heads * splits) to give each streaming multiprocessor about four, with
    at least `tile` tokens a piece; elsewhere 1 (the interpreter runs programs one after another).
    """
    device = torch.device(device)
    if device.type != "cuda":
        return 1
    sms = _sm_count(device)
    return max(1, min(-(-max_len // tile), -(-4 * sms // batch_heads)))


def paged_decode_triton(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, tables: torch.Tensor,
                        lengths: torch.Tensor, *, splits: int | None = None, tile: int = 64,
                        max_len: int | None = None) -> torch.Tensor:
    """`paged_decode_torch` as one Triton kernel: no gather, each program reads its tokens in place.

    Same shapes and result (B, H, hd) float32. Each sequence is cut into `splits` pieces (None:
    `decode_splits`), each piece handled by its own program, `tile` tokens (a power of two) at a
    time; a second small kernel merges the pieces' partial softmaxes (FlashDecoding's split-KV).
    `max_len`: the longest length if the caller knows it on the host (saves a device sync). Runs in
    Triton's interpreter without CUDA (slow, correctness only). Raises RuntimeError when triton is
    unavailable, ValueError on bad shapes or arguments.
    """
    if TRITON_MISSING:
        raise RuntimeError(f"the Triton paged decode cannot run here: {TRITON_MISSING}")
    B, H, hd = q.shape
    nb, bs, H_kv, hd_k = k_pool.shape
    if hd_k != hd or H % H_kv or v_pool.shape != k_pool.shape or tables.size(0) != B or lengths.numel() != B:
        raise ValueError(f"shapes do not fit: q {tuple(q.shape)}, pools {tuple(k_pool.shape)}, "
                         f"tables {tuple(tables.shape)}, lengths {tuple(lengths.shape)}")
    if tile < 1 or tile & (tile - 1):
        raise ValueError(f"tile={tile} must be a power of two")
    max_len = int(lengths.max()) if max_len is None else max_len
    splits = decode_splits(B * H, max_len, tile, q.device) if splits is None else splits
    if isinstance(splits, bool) or not isinstance(splits, int) or splits < 1:
        raise ValueError(f"splits={splits!r} must be a positive int")
    split_tokens = -(-max_len // splits)
    split_tokens = -(-split_tokens // tile) * tile  # whole tiles per piece
    splits = -(-max_len // split_tokens)
    k_pool, v_pool, q = k_pool.contiguous(), v_pool.contiguous(), q.contiguous()
    tables = tables.to(torch.int32).contiguous()
    lengths = lengths.to(device=q.device, dtype=torch.int32).contiguous()
    acc = torch.empty(B, H, splits, hd, dtype=torch.float32, device=q.device)
    ml = torch.empty(B, H, splits, 2, dtype=torch.float32, device=q.device)
    _paged_decode_kernel[(B, H, splits)](
        q, k_pool, v_pool, tables, lengths, acc, ml,
        q.stride(0), q.stride(1), k_pool.stride(0), k_pool.stride(1), k_pool.stride(2), tables.stride(0),
        acc.stride(0), acc.stride(1), acc.stride(2), 1.0 / math.sqrt(hd), split_tokens,
        GROUP=H // H_kv, BLOCK_SIZE=bs, TILE=tile, HEAD_DIM=hd, D_PAD=triton.next_power_of_2(hd),
        num_warps=decode_warps(tile, hd))
    out = torch.empty(B, H, hd, dtype=torch.float32, device=q.device)
    _combine_kernel[(B, H)](acc, ml, out, splits, out.stride(0), out.stride(1),
                            S_PAD=triton.next_power_of_2(splits), HEAD_DIM=hd, D_PAD=triton.next_power_of_2(hd))
    return out


def decode_warps(tile: int, head_dim: int) -> int:
    """Warps per program: 8 once a (tile, head_dim) fp32 tile has 4096 elements or more, else 4. With 4
    warps, a 64 x 128 tile spills registers to local memory on sm_90 (compile_decode_kernel's report)."""
    return 8 if tile * triton.next_power_of_2(head_dim) >= 4096 else 4


def compile_decode_kernel(dtype: str = "bf16", *, block_size: int = 16, head_dim: int = 64, group: int = 1,
                          tile: int = 64, arch: int = 90, num_warps: int | None = None, combine: bool = False):
    """Compile the Triton decode kernel for sm_<arch> ahead of time, with no GPU needed (Triton's real
    compiler, down to ptxas): catches what the interpreter accepts and the compiler rejects.

    dtype: "bf16", "fp16" or "fp32" pools and query. Must run in a process where Triton's
    interpreter is off: set COURSE_TRITON_AOT=1 before importing helpers (see helpers.triton_aot).
    num_warps: None for what paged_decode_triton launches with (decode_warps). combine: compile the
    kernel that merges the pieces instead. Returns Triton's
    compiled kernel (helpers.triton_aot.resources reads its registers and spills); raises RuntimeError
    when the interpreter is on.
    """
    if _flash_triton is None or _flash_triton.INTERPRETED:
        raise RuntimeError("Triton's interpreter is on in this process: set COURSE_TRITON_AOT=1 before importing")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if combine:  # the merge of the pieces: fp32 throughout, whatever the pools' dtype
        fn = _combine_kernel
        meta = dict(S_PAD=16, HEAD_DIM=head_dim, D_PAD=triton.next_power_of_2(head_dim))
        types = {n: "constexpr" if n in meta else "*fp32" if n.endswith("_ptr") else "i32" for n in fn.arg_names}
        return triton.compile(ASTSource(fn, types, meta, {}), target=GPUTarget("cuda", arch, 32),
                              options={"num_warps": 4})
    p = {"bf16": "*bf16", "fp16": "*fp16", "fp32": "*fp32"}[dtype]
    fn = _paged_decode_kernel
    args = dict(q_ptr=p, k_ptr=p, v_ptr=p, table_ptr="*i32", len_ptr="*i32", acc_ptr="*fp32", ml_ptr="*fp32",
                scale="fp32")
    meta = dict(GROUP=group, BLOCK_SIZE=block_size, TILE=tile, HEAD_DIM=head_dim,
                D_PAD=triton.next_power_of_2(head_dim))
    types = {n: "constexpr" if n in meta else args.get(n, "i32") for n in fn.arg_names}  # strides: i32
    return triton.compile(ASTSource(fn, types, meta, {}), target=GPUTarget("cuda", arch, 32),
                          options={"num_warps": num_warps or decode_warps(tile, head_dim)})


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
