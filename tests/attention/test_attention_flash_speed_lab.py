"""helpers.attention.flash_speed_lab: timing, the speed sweep and its goal, the memory wall and their figures."""
import matplotlib.pyplot as plt
import pytest
import torch

from helpers.attention import flash_speed_lab, kernels

def test_two_sizes_give_a_table_and_three_give_figures_with_error_bars(capsys):
    assert flash_speed_lab.speed_figures(_speed_rows([128, 256]), ["naive"], [128, 256], [64], "fp32") == []
    assert "a table, not a curve" in capsys.readouterr().out
    figs = flash_speed_lab.speed_figures(_speed_rows([64, 128, 256]), ["naive"], [64, 128, 256], [64], "fp32")
    assert len(figs) == 2 and figs[0].axes[0].containers  # errorbar containers
    plt.close("all")


def _speed_rows(ns):
    return [{"impl": "naive", "head_dim": 64, "causal": c, "n": n, "pass": p, "tflops": 1.0 + n / 100,
             "tflops_lo": 0.9 + n / 100, "tflops_hi": 1.2 + n / 100} for n in ns for c in (False, True) for p in ("fwd", "fwd+bwd")]


def test_memory_wall_figure_draws_the_wall_and_says_which_lines_coincide():
    rows = [{"impl": i, "n": n, "status": "ok" if (i != "naive" or n < 1024) else "exceeds budget (x)",
             "saved_bytes": (n * n if i == "naive" else n) if (i != "naive" or n < 1024) else None}
            for n in (256, 512, 1024) for i in ("naive", "sdpa", "flash_pytorch")]
    fig, notes = flash_speed_lab.memory_wall_figure(rows, ["naive", "sdpa", "flash_pytorch"], [256, 512, 1024], heads=2,
                                        head_dim=64, itemsize=4, budget_gb=0.05, device="cpu", title="t")
    labels = [line.get_label() for line in fig.axes[0].lines]
    assert "budget" in labels and any(label.startswith("naive stops") for label in labels)
    assert notes == ["flash_pytorch's line lies exactly on sdpa's (the same bytes at every N); it is drawn dashed on top"]
    plt.close("all")


def test_speed_rows_have_positive_tflops_for_every_point():
    rows = flash_speed_lab.speed("cpu", ["sdpa_math", "flash_pytorch"], head_dims=[16], seq_lens=[32, 64], tokens=64,
                           d_model=32, reps=1, warmup=0)
    assert len(rows) == 2 * 2 * 2 * 2  # causal x N x impl x pass
    assert all(r["status"] == "ok" and r["tflops"] > 0 for r in rows)
    assert {(r["n"], r["head_dim"]) for r in rows} == {(32, 16), (64, 16)}


def test_speed_times_the_implementations_in_the_same_rounds_and_records_a_refusal(monkeypatch):
    real, calls = kernels.attention, []

    def logged(q, k, v, impl="sdpa", is_causal=False):
        if impl == "sdpa_math" and q.shape[-2] == 64:
            raise RuntimeError("cuDNN Frontend error: No execution plans support the graph.")
        calls.append(impl)
        return real(q, k, v, impl, is_causal)
    monkeypatch.setattr(kernels, "attention", logged)
    rows = flash_speed_lab.speed("cpu", ["naive", "sdpa_math"], head_dims=[16], seq_lens=[32, 64], tokens=64,
                                 d_model=32, reps=3, warmup=1)
    by = {(r["impl"], r["causal"], r["n"], r["pass"]): r for r in rows}
    assert [r["impl"] for r in rows[:4]] == ["naive", "naive", "sdpa_math", "sdpa_math"]  # impl, then pass, as before
    assert by[("sdpa_math", False, 64, "fwd")]["status"].startswith("error: cuDNN Frontend")
    assert by[("sdpa_math", False, 64, "fwd")]["tflops"] is None and by[("naive", False, 64, "fwd")]["tflops"] > 0
    assert all(len(r["samples_ms"]) == 3 and r["clock"] for r in rows if r["status"] == "ok")
    # at N=32, one warm-up call of each alone, then rounds of one call of each: naive, sdpa_math, naive, ...
    first = calls[:8]
    assert first == ["naive", "sdpa_math"] + ["naive", "sdpa_math"] * 3


def test_speedup_divides_the_rounds_pairwise_and_takes_their_median_and_quartiles():
    def row(impl, samples):
        return {"impl": impl, "head_dim": 64, "causal": False, "n": 256, "pass": "fwd+bwd", "samples_ms": samples}
    # per-round ratios naive / flash: 2, 4, 3, 3, 30 (one round where naive was held up): median 3
    rows = [row("naive", [2.0, 4.0, 3.0, 3.0, 30.0]), row("flash", [1.0, 1.0, 1.0, 1.0, 1.0])]
    r = flash_speed_lab.speedup(rows, "flash", "naive", head_dim=64, causal=False, n=256)
    assert r.value == pytest.approx(3.0) and r.lo == pytest.approx(3.0) and r.hi == pytest.approx(4.0)
    assert r.separated  # the quartiles exclude 1
    assert flash_speed_lab.speedup(rows, "flash", "naive", head_dim=64, causal=False, n=512) is None
    assert flash_speed_lab.speedup(rows, "flash", "naive", head_dim=64, causal=True, n=256) is None
    with pytest.raises(ValueError, match="same rounds"):
        flash_speed_lab.speedup([rows[0], row("flash", [1.0, 1.0])], "flash", "naive", head_dim=64, causal=False, n=256)
    even = [row("naive", [1.0, 1.1, 0.9]), row("flash", [1.0, 1.0, 1.0])]
    assert not flash_speed_lab.speedup(even, "flash", "naive", head_dim=64, causal=False, n=256).separated


def test_goal_quotes_the_paired_rounds_when_the_rows_hold_them():
    rows = [{"impl": impl, "pass": "fwd", "head_dim": 128, "causal": False, "n": 4096, "tflops": t,
             "samples_ms": s} for impl, t, s in (("flash_triton", 300.0, [1.0, 1.0, 1.0]), ("sdpa_flash", 250.0, [1.1, 1.3, 1.2]))]
    (got,) = flash_speed_lab.goal(rows)
    assert got["ratio"] == pytest.approx(1.2) and got["lo"] == pytest.approx(1.15) and got["hi"] == pytest.approx(1.25)


def test_goal_takes_d128_forward_at_n_of_2048_and_up():
    rows = [{"impl": impl, "pass": p, "head_dim": d, "causal": c, "n": n, "tflops": t}
            for impl, t in (("flash_triton", 300.0), ("sdpa_flash", 250.0))
            for p in ("fwd", "fwd+bwd") for d in (64, 128) for c in (False, True) for n in (1024, 2048, 4096)]
    got = flash_speed_lab.goal(rows)
    assert [(r["n"], r["causal"]) for r in got] == [(2048, False), (4096, False), (2048, True), (4096, True)]
    assert all(r["ratio"] == pytest.approx(1.2) and r["lo"] == r["hi"] == r["ratio"] for r in got)


def test_time_attention_times_forward_and_backward():
    q, k, v = kernels.make_qkv(1, 2, 32, 16, torch.float32, "cpu")
    fwd = flash_speed_lab.time_attention("flash_pytorch", q, k, v, reps=2, warmup=0)
    both = flash_speed_lab.time_attention("naive", q, k, v, is_causal=True, backward=True, reps=2, warmup=1)
    assert len(fwd.samples) == 2 and len(both.samples) == 2 and fwd.median > 0 and both.median > 0
    assert q.grad is None and not q.requires_grad  # the inputs are left alone


@pytest.mark.slow
def test_memory_wall_respects_the_budget_and_survives_out_of_memory(monkeypatch):
    real = kernels.attention

    def fake(q, k, v, impl, is_causal=False):
        if impl == "naive" and q.shape[-2] >= 64:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1 TiB")
        return real(q, k, v, impl, is_causal)

    monkeypatch.setattr(kernels, "attention", fake)
    rows = flash_speed_lab.memory_wall(["naive", "flash_pytorch"], [32, 64, 128], batch=1, heads=2, head_dim=16,
                                 dtype=torch.float32, device="cpu", budget_gb=0.1)
    status = {(r["impl"], r["n"]): r["status"] for r in rows}
    assert status[("naive", 32)] == "ok" and status[("flash_pytorch", 128)] == "ok"
    assert status[("naive", 64)].startswith("out of memory")
    assert status[("naive", 128)].startswith("skipped")
    ok = {(r["impl"], r["n"]): r["saved_bytes"] for r in rows if r["status"] == "ok"}
    assert ok[("naive", 32)] == kernels.saved_bytes("naive", 32, 16, 2, 4)
    tight = flash_speed_lab.memory_wall(["naive"], [4096], batch=1, heads=2, head_dim=16, dtype=torch.float32,
                                  device="cpu", budget_gb=0.1)
    assert tight[0]["status"].startswith("exceeds budget") and tight[0]["saved_bytes"] is None


@pytest.mark.slow
def test_memory_wall_records_a_library_kernel_error_and_goes_on(monkeypatch):
    real = kernels.attention

    def refusing(q, k, v, impl="sdpa", is_causal=False):
        if impl == "sdpa_math" and q.shape[-2] >= 64:
            raise RuntimeError("cuDNN Frontend error: No execution plans support the graph.")
        return real(q, k, v, impl, is_causal)
    monkeypatch.setattr(kernels, "attention", refusing)
    rows = flash_speed_lab.memory_wall(["naive", "sdpa_math"], [32, 64, 128], batch=1, heads=2, head_dim=16,
                                 dtype=torch.float32, device="cpu")
    status = {(r["impl"], r["n"]): r["status"] for r in rows}
    assert status[("sdpa_math", 32)] == "ok" and status[("sdpa_math", 64)].startswith("error: cuDNN Frontend")
    assert status[("sdpa_math", 128)].startswith("skipped") and status[("naive", 128)] == "ok"
