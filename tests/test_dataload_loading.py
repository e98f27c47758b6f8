"""helpers.dataload.loading: document lengths are heavy-tailed and validated, the dataset is the same for any
number of workers and layout, no worker is left behind, and host buffers are written pageable memory."""
import psutil
import pytest
import torch

from helpers.dataload import loading


def _children() -> set[int]:
    """This process's child processes now (a session's JupyterLab or browser may already be among them)."""
    return {p.pid for p in psutil.Process().children(recursive=True)}


def test_dataset_is_deterministic_across_worker_counts():
    before = _children()
    tokens = torch.randint(0, 256, (20000,), dtype=torch.uint8)
    lengths = loading.document_lengths(60, median=40, sigma=1.0, max_len=64, seed=3)
    batches = {}
    for layout in ("numpy", "python"):
        ds = loading.DocumentDataset(loading.DocumentStore(tokens, lengths, layout))
        for w in (0, 2):
            kw = dict(prefetch_factor=2) if w else {}
            loader = loading.make_loader(ds, batch_size=8, num_workers=w, kind="pack", row_len=64, seed=7, **kw)
            try:
                batches[layout, w] = [(b.x, b.doc) for b in loader]
            finally:
                loading.shutdown(loader)
    ref = batches["numpy", 0]
    assert len(ref) == 7
    for key, got in batches.items():
        assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(ref, got)), key
    assert _children() <= before  # no worker left behind


def test_lengths_are_heavy_tailed_and_validated():
    n = loading.document_lengths(2000, median=100, sigma=1.0, seed=0)
    assert n.min() >= 8 and 80 < float(sorted(n)[1000]) < 120 and n.mean() > 1.3 * 100
    with pytest.raises(ValueError):
        loading.document_lengths(0, median=10)
    with pytest.raises(ValueError):
        loading.DocumentStore(torch.zeros(10, dtype=torch.uint8), [20])
    with pytest.raises(ValueError):
        loading.make_loader(None, batch_size=2, num_workers=0, prefetch_factor=2, row_len=8)


def test_collate_refuses_an_unknown_kind():
    with pytest.raises(ValueError):
        loading.collate("trim", 8)


def test_host_buffer_is_written_pageable_memory():
    # h2d_bandwidth copies from it: a fresh torch.empty would be the zero page (cached), not host memory
    n = 3 * 4096 + 5
    buf = loading.host_buffer(n)
    assert buf.dtype == torch.uint8 and buf.numel() == n and buf.device.type == "cpu"
    assert bool((buf == 1).all()) and not buf.is_pinned()
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="nbytes"):
            loading.host_buffer(bad)
