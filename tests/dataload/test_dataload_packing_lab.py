"""helpers.dataload.packing_lab: the dense mask and FlexAttention's block mask match each document attended to
alone, and the bytes of the three mask layouts are counted from real tensors (dense T^2 per row, the rest not)."""
import torch

from helpers.dataload import packing_lab


def _docs(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, 256, (n,), generator=g) for n in lengths]


def test_varlen_check_agrees_with_per_document_attention_and_counts_the_masks():
    docs = _docs([50, 17, 3, 9, 30, 2, 12, 7, 25, 11, 60, 33, 44, 5])
    out = packing_lab.varlen_check(docs, 128, heads=2, head_dim=8, block_size=32, seed=1)
    assert out["dense_err"] <= 1e-5 and out["flex_err"] <= 1e-5
    R = out["rows"]
    assert out["docs"] == 14 and out["blocks"] == [4, 4]
    assert out["dense_mask_bytes"] == R * 128 * 128  # one byte per (query, key) pair of every row
    assert 0 < out["block_mask_bytes"] < out["dense_mask_bytes"]
    assert out["cu_seqlens_bytes"] >= 4 * (14 + 1)  # one int32 per document (and padding run) plus the leading 0


def test_mask_memory_grows_as_tokens_times_row_length_for_the_dense_mask_only():
    lengths = [40, 17, 3, 9, 30, 2, 12, 7, 25, 11, 60, 33] * 4
    rows = packing_lab.mask_memory(lengths, [64, 256], block_size=64)
    assert [r["row_len"] for r in rows] == [64, 256] and all(r["tokens"] == sum(lengths) for r in rows)
    for r in rows:
        assert r["dense"] == r["rows"] * r["row_len"] ** 2
        assert r["block_mask"] < r["dense"] and r["cu_seqlens"] < r["dense"]
    assert rows[1]["rows"] < rows[0]["rows"]  # longer rows hold more documents each


def test_varlen_check_uses_the_reference_it_is_given():
    """Notebook 12 passes the cu_seqlens its cell defines: a planted one that lets each row's runs merge into
    one (cross-document attention) must show as a large error of both masks against that reference."""
    docs = _docs([20, 9, 30, 7, 12])

    def one_run_per_row(doc):  # planted wrong: ignores where documents start
        T = doc.size(-1)
        return torch.arange(0, doc.numel() + 1, T, dtype=torch.int32)

    out = packing_lab.varlen_check(docs, 64, heads=2, head_dim=8, block_size=32, seed=1, cu_seqlens=one_run_per_row)
    assert out["dense_err"] > 1e-2 and out["flex_err"] > 1e-2
