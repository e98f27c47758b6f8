"""helpers.dataload.packing and helpers.dataload.loading: packing keeps every token once, the mask is block-diagonal causal,
packed-with-mask losses equal unpacked ones, padding fractions are exact, and the dataset is the same for any
number of workers."""
import psutil
import pytest
import torch

from helpers.dataload import loading, packing
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


def test_memmap_batches_and_step_breakdown(tmp_path, model):
    path = loading.write_token_file(torch.arange(1000) % 256, tmp_path / "train.bin")
    batches = loading.MemmapBatches(path, batch_size=2, seq_len=16, seed=0)
    b = next(batches)
    assert b.x.shape == (2, 16) and torch.equal(b.y[:, :-1], b.x[:, 1:]) and b.padding == 0
    m = GPT(GPTConfig.preset("tiny", seq_len=32))
    bd = loading.step_breakdown(m, batches, steps=2, warmup=1)
    assert bd.tokens == 64 and 0 <= bd.idle <= 1 and bd.compute > 0 and bd.copy >= 0
    with pytest.raises(ValueError):
        loading.step_breakdown(m, iter([b]), steps=2, warmup=0)


def test_worker_memory_reports_growth_of_a_forked_reader():
    before = _children()
    tokens = torch.randint(0, 256, (200_000,), dtype=torch.uint8)
    lengths = loading.document_lengths(4000, median=40, sigma=0.5, max_len=48, seed=0)
    py = loading.worker_memory(loading.DocumentStore(tokens, lengths, "python"))
    npy = loading.worker_memory(loading.DocumentStore(tokens, lengths, "numpy"))
    assert py["uss_after"] >= py["uss_before"] > 0 and npy["uss_after"] > 0
    assert py["growth"] > npy["growth"]  # touching 4000 Python objects copies their pages; one array does not
    assert _children() <= before


def test_positions_from_doc_match_the_packer():
    b = packing.pack_batch(_docs(LENGTHS), 32)
    assert torch.equal(packing.positions_from_doc(b.doc), b.pos)
    assert packing.positions_from_doc(torch.tensor([[4, 4, 1, -1, -1]])).tolist() == [[0, 1, 0, 0, 0]]


def test_parameter_checks_and_cuda_only_paths_fail_clearly():
    assert loading.check_nonnegative("LATENCY_MS", 0) == 0.0
    for bad in (-1.0, float("inf"), "1", True):
        with pytest.raises(ValueError, match="LATENCY_MS"):
            loading.check_nonnegative("LATENCY_MS", bad)
    assert loading.check_worker_counts("WORKERS", (0, 2)) == [0, 2]
    for bad in ([], [-1], [1.5], "02", [True]):
        with pytest.raises(ValueError, match="WORKERS"):
            loading.check_worker_counts("WORKERS", bad)
    with pytest.raises(ValueError):
        loading.collate("trim", 8)
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError):
            loading.h2d_bandwidth([1024])
        with pytest.raises(RuntimeError):
            loading.copy_overlap(1024, 64)


def test_host_buffer_is_written_pageable_memory():
    # h2d_bandwidth copies from it: a fresh torch.empty would be the zero page (cached), not host memory
    n = 3 * 4096 + 5
    buf = loading.host_buffer(n)
    assert buf.dtype == torch.uint8 and buf.numel() == n and buf.device.type == "cpu"
    assert bool((buf == 1).all()) and not buf.is_pinned()
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="nbytes"):
            loading.host_buffer(bad)


def test_sweep_rounds_interleaves_and_keeps_each_configs_fastest_round(monkeypatch):
    calls = []
    speed = {(0, 1): 10.0, (0, 2): 30.0, (1, 1): 20.0, (1, 2): 5.0}

    def fake_sweep(make_model, dataset, configs, **kw):
        (cfg,) = configs
        calls.append(cfg["num_workers"])
        rnd = sum(1 for c in calls if c == cfg["num_workers"])
        return [{**cfg, "tokens_per_s": speed[(cfg["num_workers"], rnd)], "idle": 0.1 * rnd}]

    monkeypatch.setattr(loading, "sweep", fake_sweep)
    rows = loading.sweep_rounds(None, None, [{"num_workers": 0}, {"num_workers": 1}], steps=1, rounds=2)
    assert calls == [0, 1, 1, 0]  # round two runs in reverse order
    assert [r["tokens_per_s"] for r in rows] == [30.0, 20.0]
    assert rows[0]["idle"] == pytest.approx(0.2) and rows[0]["tokens_per_s_rounds"] == [10.0, 30.0]
    with pytest.raises(ValueError, match="rounds"):
        loading.sweep_rounds(None, None, [{}], steps=1, rounds=0)
