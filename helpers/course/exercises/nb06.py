"""Notebook 06's exercises: merging two partial softmax states, one query tile of FlashAttention-2's
forward, and two counts the notebook never prints (K re-reads under a causal mask, L against P).

A partial softmax state of some rows over a subset of their keys is (m, l, o): m the largest score
(..., R), l = sum_j exp(s_j - m) (..., R) and o = sum_j exp(s_j - m) v_j, the *unnormalised* output
(..., R, d). A row that saw no key (all masked) has m = -inf, l = 0, o = 0.

The tile exercise is checked against dense attention computed in float64 (every score materialised,
the softmax taken at once), not against another tiled loop; fully masked rows there have O = 0 and
L = logsumexp(empty) = -inf. The planted wrong answers are the classic slips: the old sum not
rescaled when the max grows, no max subtracted (exp overflows), no final division by l, and no
guard for rows whose max is -inf.
"""
from __future__ import annotations

import math

import torch

from helpers.course.check import Case, register

NEG_INF = float("-inf")


# ---------------------------------------------------------------- 06.merge (code)

def merge_reference(m_a, l_a, o_a, m_b, l_b, o_b):
    """The state of the union of two parts: m = max, each part's l and o rescaled by exp(m_part - m)."""
    m = torch.maximum(m_a, m_b)
    safe = torch.where(m == NEG_INF, 0.0, m)  # both parts empty: exp(-inf - 0) = 0, never -inf - (-inf)
    a, b = torch.exp(m_a - safe), torch.exp(m_b - safe)
    return m, l_a * a + l_b * b, o_a * a[..., None] + o_b * b[..., None]


def _merge_no_old_rescale(m_a, l_a, o_a, m_b, l_b, o_b):
    m = torch.maximum(m_a, m_b)
    safe = torch.where(m == NEG_INF, 0.0, m)
    a, b = torch.exp(m_a - safe), torch.exp(m_b - safe)
    return m, l_a + l_b * b, o_a * a[..., None] + o_b * b[..., None]  # l_a kept at its old max


def _merge_no_max(m_a, l_a, o_a, m_b, l_b, o_b):
    m = torch.maximum(m_a, m_b)
    a, b = torch.exp(m_a), torch.exp(m_b)  # exp of the raw maxima: inf beyond ~88 in fp32
    scale = torch.exp(-torch.where(m == NEG_INF, 0.0, m))
    return m, (l_a * a + l_b * b) * scale, (o_a * a[..., None] + o_b * b[..., None]) * scale[..., None]


def _merge_no_guard(m_a, l_a, o_a, m_b, l_b, o_b):
    m = torch.maximum(m_a, m_b)
    a, b = torch.exp(m_a - m), torch.exp(m_b - m)  # -inf - (-inf) = nan for a row that saw nothing
    return m, l_a * a + l_b * b, o_a * a[..., None] + o_b * b[..., None]


def state(scores: torch.Tensor, values: torch.Tensor):
    """(m, l, o) of rows of scores (..., R, n) over values (..., n, d); -inf scores are masked."""
    m = scores.amax(dim=-1)
    p = torch.exp(scores - torch.where(m == NEG_INF, 0.0, m)[..., None])  # masked: exp(-inf) = 0
    return m, p.sum(dim=-1), p @ values


def _merge_case(label: str, shape: tuple, n_a: int, n_b: int, d: int, seed: int, scale: float = 3.0,
                mask_a=None, mask_b=None) -> Case:
    g = torch.Generator().manual_seed(seed)
    s_a, s_b = (torch.randn(*shape, n, generator=g) * scale for n in (n_a, n_b))
    s_b = s_b + 2.0  # part b's maxima tend to be larger: the old part must be rescaled
    v_a, v_b = (torch.randn(*shape[:-1], n, d, generator=g) for n in (n_a, n_b))
    if mask_a is not None:
        s_a[mask_a] = NEG_INF
    if mask_b is not None:
        s_b[mask_b] = NEG_INF
    return Case(label, (*state(s_a, v_a), *state(s_b, v_b)))


def _merge_cases() -> list[Case]:
    rows = 7
    one_empty = torch.zeros(rows, dtype=torch.bool)
    one_empty[[1, 4]] = True
    both = torch.zeros(rows, dtype=torch.bool)
    both[2] = True
    return [
        _merge_case("random scores, 7 rows, 5 + 9 keys, d=3", (rows,), 5, 9, 3, seed=0),
        _merge_case("batch of (2, 3) x 7 rows, odd sizes 1 + 13 keys, d=5", (2, 3, rows), 1, 13, 5, seed=1),
        _merge_case("rows 1 and 4 of part a fully masked (m=-inf, l=0, o=0)", (rows,), 6, 6, 4, seed=2,
                    mask_a=one_empty),
        _merge_case("row 2 fully masked in both parts (the merged row must stay m=-inf, l=0, o=0)", (rows,),
                    6, 6, 4, seed=3, mask_a=both, mask_b=both),
        _merge_case("large magnitudes: scores of about 1000 (exp overflows fp32 beyond ~88)", (rows,), 8, 8, 4,
                    seed=4, scale=1000.0),
    ]


register(
    "06.merge", "code",
    prompt="state_merge(m_a, l_a, o_a, m_b, l_b, o_b) -> (m, l, o): merge two partial softmax states",
    hint="bring both parts to the common maximum before adding them (l and o alike); a row where both "
         "parts are empty has max -inf, and -inf - (-inf) is nan",
    solution=merge_reference,
    wrong=(_merge_no_old_rescale, _merge_no_max, _merge_no_guard),
    cases=_merge_cases,
    rtol=1e-5, atol=1e-6,
    tolerance="fp32: rtol=1e-5, atol=1e-6 against the same formula (only the order of two products differs)",
    outputs=("m", "l", "o"),
)


# ---------------------------------------------------------------- 06.tile (code)

def _visible(rows: int, row0: int, n_k: int, is_causal: bool, keep, device) -> torch.Tensor:
    """bool (..., rows, n_k): True where query row row0 + r may attend to key j."""
    vis = torch.ones(rows, n_k, dtype=torch.bool, device=device)
    if is_causal:
        vis = torch.arange(n_k, device=device)[None, :] <= torch.arange(row0, row0 + rows, device=device)[:, None]
    if keep is not None:
        vis = vis & keep[..., None, :]
    return vis


def tile_reference(q, k, v, row0, is_causal, block_k, keep):
    """Dense attention in float64 for the query rows row0.. of q: (O like q, L fp32); empty rows O=0, L=-inf."""
    s = (q.double() / math.sqrt(q.shape[-1])) @ k.double().mT  # (..., B_r, N_k)
    s = s.masked_fill(~_visible(q.shape[-2], row0, k.shape[-2], is_causal, keep, q.device), NEG_INF)
    lse = torch.logsumexp(s, dim=-1)  # -inf for a row that sees no key
    p = torch.exp(s - torch.where(lse == NEG_INF, 0.0, lse)[..., None])
    return (p @ v.double()).to(q.dtype), lse.float()


def _tile(q, k, v, row0, is_causal, block_k, keep, *, rescale_sum=True, subtract_max=True, divide=True,
          guard=True):
    """FlashAttention-2's inner loop for one query tile; the flags plant the wrong answers."""
    qi = q.float() / math.sqrt(q.shape[-1])
    m = torch.full(qi.shape[:-1], NEG_INF, device=q.device)
    l = torch.zeros_like(m)
    acc = torch.zeros_like(qi)
    for j0 in range(0, k.shape[-2], block_k):
        kj, vj = k[..., j0:j0 + block_k, :].float(), v[..., j0:j0 + block_k, :].float()
        s = qi @ kj.mT
        vis = _visible(q.shape[-2], row0 - j0, kj.shape[-2], is_causal, None if keep is None else
                       keep[..., j0:j0 + block_k], q.device)
        s = s.masked_fill(~vis, NEG_INF)
        m_new = torch.maximum(m, s.amax(dim=-1)) if subtract_max else torch.zeros_like(m)
        shift = torch.where(m_new == NEG_INF, 0.0, m_new) if guard else m_new
        p = torch.exp(s - shift[..., None])
        alpha = torch.exp(m - shift) if subtract_max else torch.ones_like(m)
        l = (l * alpha if rescale_sum else l) + p.sum(dim=-1)
        acc = acc * alpha[..., None] + p @ vj
        m = m_new
    out = acc / torch.where(l == 0, 1.0, l)[..., None] if divide else acc
    lse = (m if subtract_max else 0.0) + torch.log(l)  # log(0) = -inf for an empty row
    return out.to(q.dtype), lse


def _tile_no_old_rescale(q, k, v, row0, is_causal, block_k, keep):
    return _tile(q, k, v, row0, is_causal, block_k, keep, rescale_sum=False)


def _tile_no_max(q, k, v, row0, is_causal, block_k, keep):
    return _tile(q, k, v, row0, is_causal, block_k, keep, subtract_max=False)


def _tile_no_division(q, k, v, row0, is_causal, block_k, keep):
    return _tile(q, k, v, row0, is_causal, block_k, keep, divide=False)


def _tile_no_guard(q, k, v, row0, is_causal, block_k, keep):
    return _tile(q, k, v, row0, is_causal, block_k, keep, guard=False)


def _tile_case(label: str, shape: tuple, rows: int, row0: int, n_k: int, d: int, block_k: int, is_causal: bool,
               seed: int, scale: float = 1.0, padded=None) -> Case:
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(*shape, rows, d, generator=g) * scale
    k = torch.randn(*shape, n_k, d, generator=g) * scale
    v = torch.randn(*shape, n_k, d, generator=g)
    keep = None
    if padded is not None:  # {batch index: number of real keys}; the rest is padding
        keep = torch.ones(*shape, n_k, dtype=torch.bool)
        for b, n_real in padded.items():
            keep[b, ..., n_real:] = False
    return Case(label, (q, k, v, row0, is_causal, block_k, keep))


def _tile_cases() -> list[Case]:
    return [
        _tile_case("one head, 16 query rows, 64 keys in tiles of 16", (1,), 16, 0, 64, 8, 16, False, seed=0),
        _tile_case("odd sizes: 13 rows from row 26, 97 keys in tiles of 32 (last tile ragged), d=5", (2, 3), 13, 26,
                   97, 5, 32, False, seed=1),
        _tile_case("causal, rows 32..47 of 61 keys in tiles of 16 (diagonal inside a tile)", (2,), 16, 32, 61, 8,
                   16, True, seed=2),
        _tile_case("causal, the first tile: rows 0..10, 40 keys in tiles of 7", (1, 2), 11, 0, 40, 6, 7, True,
                   seed=3),
        _tile_case("key padding: batch 1 has no real key at all (its rows are fully masked), batch 0 has 20",
                   (2,), 9, 0, 50, 4, 16, False, seed=4, padded={0: 20, 1: 0}),
        _tile_case("large scores: q, k ~ 12 N(0,1), d=16 (scaled scores up to ~300; exp overflows fp32 beyond "
                   "~88)", (1,), 16, 16, 48, 16, 16, True, seed=5, scale=12.0),
    ]


register(
    "06.tile", "code",
    prompt="flash_tile(q, k, v, row0, is_causal, block_k, keep) -> (O, L) for one query tile, "
           "looping over key tiles with the online softmax",
    hint="keep a running max, a running sum and an unnormalised output per row; whenever a row's max grows, "
         "everything accumulated under the old max is too large by a known factor; divide once, at the end; "
         "causal: key j is visible to query row row0 + r when j <= row0 + r; a row that has seen no key yet "
         "has max -inf, and -inf - (-inf) is nan",
    solution=tile_reference,
    wrong=(_tile_no_old_rescale, _tile_no_max, _tile_no_division, _tile_no_guard),
    cases=_tile_cases,
    rtol=1e-4, atol=1e-4,
    tolerance="fp32 against dense float64 attention: rtol=atol=1e-4 (scores near 300 carry fp32 rounding "
              "of ~1e-5 into each exponent)",
    outputs=("O", "L"),
)


# ---------------------------------------------------------------- numbers the notebook does not print

register(
    "06.causal_reads", "value",
    prompt="causal forward, N = 8192, query and key tiles of 128 rows: how many times, on average over all "
           "rows of K, is a row of K read from memory?",
    hint="number the key tiles t = 0, 1, ...: which query tiles reach key tile t when tiles above the diagonal "
         "are skipped? Then average over t",
    solution=lambda: sum(8192 // 128 - t for t in range(8192 // 128)) / (8192 // 128),
    wrong=(8192 / 128, 8192 / 256, 1.0),
    rtol=1e-3,
)

register(
    "06.lse_vs_probs", "value",
    prompt="batch 8, 16 heads, N = 4096: how many times more bytes does naive attention's bf16 N x N "
           "probability matrix take than FlashAttention's fp32 log-sum-exp L?",
    hint="count the numbers in each tensor (per head: N x N against N) and the bytes per number of each format",
    solution=lambda: (8 * 16 * 4096 * 4096 * 2) / (8 * 16 * 4096 * 4),
    wrong=(4096.0, 1024.0, 8192.0),
    rtol=1e-3,
)
