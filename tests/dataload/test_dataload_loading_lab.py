"""helpers.dataload.loading_lab: the step breakdown over memory-mapped batches, a forked reader's memory growth,
notebook 12's parameter checks, the CUDA-only paths failing clearly, and the interleaved sweep rounds."""
import psutil
import pytest
import torch

from helpers.dataload import loading, loading_lab
from helpers.gpt.model import GPT, GPTConfig


def _children() -> set[int]:
    """This process's child processes now (a session's JupyterLab or browser may already be among them)."""
    return {p.pid for p in psutil.Process().children(recursive=True)}


def test_memmap_batches_and_step_breakdown(tmp_path):
    path = loading.write_token_file(torch.arange(1000) % 256, tmp_path / "train.bin")
    batches = loading.MemmapBatches(path, batch_size=2, seq_len=16, seed=0)
    b = next(batches)
    assert b.x.shape == (2, 16) and torch.equal(b.y[:, :-1], b.x[:, 1:]) and b.padding == 0
    m = GPT(GPTConfig.preset("tiny", seq_len=32))
    bd = loading_lab.step_breakdown(m, batches, steps=2, warmup=1)
    assert bd.tokens == 64 and 0 <= bd.idle <= 1 and bd.compute > 0 and bd.copy >= 0
    with pytest.raises(ValueError):
        loading_lab.step_breakdown(m, iter([b]), steps=2, warmup=0)


def test_worker_memory_reports_growth_of_a_forked_reader():
    before = _children()
    tokens = torch.randint(0, 256, (200_000,), dtype=torch.uint8)
    lengths = loading.document_lengths(4000, median=40, sigma=0.5, max_len=48, seed=0)
    py = loading_lab.worker_memory(loading.DocumentStore(tokens, lengths, "python"))
    npy = loading_lab.worker_memory(loading.DocumentStore(tokens, lengths, "numpy"))
    assert py["uss_after"] >= py["uss_before"] > 0 and npy["uss_after"] > 0
    assert py["growth"] > npy["growth"]  # touching 4000 Python objects copies their pages; one array does not
    assert _children() <= before


def test_parameter_checks_and_cuda_only_paths_fail_clearly():
    assert loading_lab.check_nonnegative("LATENCY_MS", 0) == 0.0
    for bad in (-1.0, float("inf"), "1", True):
        with pytest.raises(ValueError, match="LATENCY_MS"):
            loading_lab.check_nonnegative("LATENCY_MS", bad)
    assert loading_lab.check_worker_counts("WORKERS", (0, 2)) == [0, 2]
    for bad in ([], [-1], [1.5], "02", [True]):
        with pytest.raises(ValueError, match="WORKERS"):
            loading_lab.check_worker_counts("WORKERS", bad)
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError):
            loading_lab.h2d_bandwidth([1024])
        with pytest.raises(RuntimeError):
            loading_lab.copy_overlap(1024, 64)


def test_sweep_rounds_interleaves_and_keeps_each_configs_fastest_round(monkeypatch):
    calls = []
    speed = {(0, 1): 10.0, (0, 2): 30.0, (1, 1): 20.0, (1, 2): 5.0}

    def fake_sweep(make_model, dataset, configs, **kw):
        (cfg,) = configs
        calls.append(cfg["num_workers"])
        rnd = sum(1 for c in calls if c == cfg["num_workers"])
        return [{**cfg, "tokens_per_s": speed[(cfg["num_workers"], rnd)], "idle": 0.1 * rnd}]

    monkeypatch.setattr(loading_lab, "sweep", fake_sweep)
    rows = loading_lab.sweep_rounds(None, None, [{"num_workers": 0}, {"num_workers": 1}], steps=1, rounds=2)
    assert calls == [0, 1, 1, 0]  # round two runs in reverse order
    assert [r["tokens_per_s"] for r in rows] == [30.0, 20.0]
    assert rows[0]["idle"] == pytest.approx(0.2) and rows[0]["tokens_per_s_rounds"] == [10.0, 30.0]
    with pytest.raises(ValueError, match="rounds"):
        loading_lab.sweep_rounds(None, None, [{}], steps=1, rounds=0)


def test_breakdown_figure_draws_stacked_parts_and_the_step_iqr():
    rows = [{"wait_ms": 5.0, "copy_ms": 0.0, "compute_ms": 20.0}, {"wait_ms": 1.0, "copy_ms": 0.5, "compute_ms": 10.0}]
    fig = loading_lab.breakdown_figure(rows, ["a", "b"], step_iqr=[(20.0, 30.0), (10.0, 13.0)])
    ax = fig.axes[0]
    assert len(ax.patches) == 6  # three parts per row
    assert [list(line.get_xdata()) for line in ax.lines] == [[20.0, 30.0], [10.0, 13.0]]
    assert len(loading_lab.breakdown_figure(rows, ["a", "b"]).axes[0].lines) == 0
