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


@pytest.mark.parametrize("n, ranks", [(10, 4), (12, 4), (7, 3), (5, 8)])
def test_rank_indices_partition_the_data_set_by_pytorchs_padding_rule(n, ranks):
    parts = loading.rank_indices(n, ranks, seed=3)
    p = loading.partition(parts, n)
    per = -(-n // ranks)  # ceil: drop_last=False pads every rank to this many
    assert [len(x) for x in parts] == [per] * ranks
    assert p["missing"] == 0 and p["repeated"] == per * ranks - n and p["distinct"] == n
    cut = loading.partition(loading.rank_indices(n, ranks, seed=3, drop_last=True), n)
    assert cut["overlap"] == 0 and cut["repeated"] == 0 and cut["missing"] == n - (n // ranks) * ranks
    if n % ranks == 0:
        assert p["overlap"] == 0  # divides evenly: disjoint and covering
    e1 = loading.rank_indices(n, ranks, seed=3, epoch=1)
    assert loading.partition(e1, n)["missing"] == 0
    assert loading.rank_indices(n, ranks, seed=3) == parts  # the same epoch: the same shards on every call


def test_set_epoch_reshuffles_and_the_guards():
    e0, e1 = (loading.rank_indices(1000, 4, epoch=e) for e in (0, 1))
    assert e0 != e1 and sorted(sum(e0, [])) == sorted(sum(e1, [])) == list(range(1000))
    assert loading.rank_indices(6, 2, shuffle=False) == [[0, 2, 4], [1, 3, 5]]
    with pytest.raises(ValueError, match="num_replicas"):
        loading.rank_indices(10, 0)
    with pytest.raises(ValueError, match="n="):
        loading.rank_indices(0, 2)
