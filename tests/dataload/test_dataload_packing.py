"""helpers.dataload.packing: packing keeps every token once, the mask is block-diagonal causal, positions
restart per document, padding fractions are exact, and packed-with-mask losses equal unpacked ones."""
from collections import Counter

import pytest
import torch
import torch.nn.functional as F

from helpers.dataload import packing
from helpers.gpt.model import GPT, GPTConfig


def _docs(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, 256, (n,), generator=g) for n in lengths]


LENGTHS = [5, 17, 3, 9, 30, 2, 12, 7, 25, 11]


def test_first_fit_decreasing_places_every_document_once_and_fits():
    rows = packing.first_fit_decreasing(LENGTHS, 32)
    placed = sorted(i for r in rows for i in r)
    assert placed == list(range(len(LENGTHS)))
    assert all(sum(LENGTHS[i] for i in r) <= 32 for r in rows)
    assert rows == [[4, 5], [8, 7], [1, 6, 2], [9, 3, 0]]  # 30+2, 25+7, 17+12+3, 11+9+5: the 4 rows 121 tokens need
    with pytest.raises(ValueError):
        packing.first_fit_decreasing([33], 32)
    with pytest.raises(ValueError):
        packing.first_fit_decreasing([1], 32)


def test_pack_batch_keeps_every_token_once_with_targets_inside_documents():
    docs = _docs(LENGTHS)
    b = packing.pack_batch(docs, 32)
    assert b.tokens == sum(LENGTHS) == int((b.doc >= 0).sum())
    for i, d in enumerate(docs):
        sel = b.doc == i
        assert torch.equal(b.x[sel], d)  # every token once, in order
        assert torch.equal(b.pos[sel], torch.arange(len(d)))  # positions restart per document
        assert torch.equal(b.y[sel][:-1], d[1:]) and int(b.y[sel][-1]) == -1  # no target crosses a boundary
    assert bool((b.y[b.doc < 0] == -1).all())
    assert b.padding == pytest.approx(1 - sum(LENGTHS) / (len(b.x) * 32), abs=0)


def test_padding_fraction_is_exact():
    assert packing.padding_fraction([4, 8], 8) == 0.25
    assert packing.padding_fraction(LENGTHS, 32) == 1 - 121 / 320
    assert packing.padding_fraction(LENGTHS, 32, rows=4) == 1 - 121 / 128
    assert packing.pad_batch(_docs(LENGTHS), 32).padding == 1 - 121 / 320
    with pytest.raises(ValueError):
        packing.padding_fraction(LENGTHS, 32, rows=3)


def test_mask_is_block_diagonal_causal():
    doc = torch.tensor([[0, 0, 1, 1, 1, -1], [2, 2, 2, 2, 2, 2]])
    m = packing.block_causal_mask(doc)
    assert m.shape == (2, 6, 6)
    for r in range(2):
        for i in range(6):
            for j in range(6):
                assert bool(m[r, i, j]) == (j <= i and int(doc[r, i]) == int(doc[r, j]))
    assert bool(m.any(-1).all())  # no query is left with nothing to attend to


def test_positions_from_doc_match_the_packer():
    b = packing.pack_batch(_docs(LENGTHS), 32)
    assert torch.equal(packing.positions_from_doc(b.doc), b.pos)
    assert packing.positions_from_doc(torch.tensor([[4, 4, 1, -1, -1]])).tolist() == [[0, 1, 0, 0, 0]]


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return GPT(GPTConfig.preset("tiny", seq_len=32)).eval()


def test_packed_with_mask_equals_unpacked_and_differs_without(model):
    docs = _docs(LENGTHS, seed=1)
    b = packing.pack_batch(docs, 32)
    with torch.no_grad():
        alone = packing.unpacked_losses(model, docs)
        logits, _ = packing.forward_packed(model, b.x, b.pos, packing.block_causal_mask(b.doc))
        packed = packing.per_document_loss(logits, b.y, b.doc, len(docs))
        logits_nomask, _ = packing.forward_packed(model, b.x, b.pos, None)
        leaked = packing.per_document_loss(logits_nomask, b.y, b.doc, len(docs))
    torch.testing.assert_close(packed, alone, rtol=1e-5, atol=1e-5)
    assert (leaked - alone).abs().max() > 1e-3  # documents placed after another one see it
    assert model.attn_impl == "sdpa"  # the kernel is restored


def test_varlen_masks_equal_per_document_attention_run_separately():
    docs = _docs([40, 17, 3, 9, 30, 2, 12, 7, 25, 11, 60, 33])
    b = packing.pack_batch(docs, 64)
    R, T = b.doc.shape
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(R, 2, T, 8, generator=g) for _ in range(3))
    cu = packing.cu_seqlens(b.doc)
    runs = (cu[1:] - cu[:-1]).tolist()
    assert cu[0] == 0 and cu[-1] == R * T and cu.dtype == torch.int32
    assert Counter(len(d) for d in docs) <= Counter(runs) and sum(runs) == R * T  # one run per document (+ padding)
    ref = packing.varlen_attention(q, k, v, cu)
    # document i alone, straight from its own tokens' q, k, v: the same as the reference's run
    r0, at = int((b.doc == 4).nonzero()[0, 0]), int((b.doc == 4).nonzero()[0, 1])
    alone = F.scaled_dot_product_attention(q[r0:r0 + 1, :, at:at + 30], k[r0:r0 + 1, :, at:at + 30],
                                           v[r0:r0 + 1, :, at:at + 30], is_causal=True)
    torch.testing.assert_close(ref[r0:r0 + 1, :, at:at + 30], alone, rtol=1e-5, atol=1e-6)  # strided vs contiguous
    dense = F.scaled_dot_product_attention(q, k, v, attn_mask=packing.block_causal_mask(b.doc)[:, None])
    bm = packing.document_block_mask(b.doc, block_size=16)
    flex = packing.flex_document_attention(q, k, v, bm)
    torch.testing.assert_close(dense, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(flex, ref, rtol=1e-5, atol=1e-5)
    # a leaking mask (plain causal over the row) must fail the same check
    leaky = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert float((leaky - ref).abs().max()) > 1e-2
    # counted bytes: T^2 booleans per row densely, (T/16)^2-sized int32 block tables for FlexAttention
    assert packing.block_mask_bytes(bm) < R * T * T
    assert packing.block_mask_bytes(bm) >= 4 * R * (T // 16) ** 2
    with pytest.raises(ValueError, match="block_size"):
        packing.document_block_mask(b.doc, block_size=0)
