"""helpers.training.accumulation: equivalence with one big batch, the unequal-token pitfall and its fix, arithmetic, panel."""
import matplotlib.pyplot as plt
import pytest
import torch

from helpers.training import accumulation as A
from helpers.gpt.model import GPT, GPTConfig

# fp32: the two ways differ only in the order of additions (~1e-7 relative on these sizes)
GRAD_TOL = dict(rtol=1e-5, atol=1e-6)


def model_and_batch(batch=8, T=24, seed=0, attn_impl="naive"):
    torch.manual_seed(seed)
    cfg = GPTConfig.preset("tiny", seq_len=32)
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (batch, T), generator=g)
    y = torch.randint(0, 256, (batch, T), generator=g)
    return GPT(cfg, attn_impl=attn_impl), x, y


def pad(y, lengths):
    y = y.clone()
    y[torch.arange(y.size(1))[None, :] >= torch.tensor(lengths)[:, None]] = A.IGNORE_INDEX
    return y


@pytest.mark.parametrize("k", [2, 4, 8])
def test_equal_micro_batches_give_the_big_batch_gradient(k):
    m, x, y = model_and_batch()
    micro = A.split_batch(x, y, k)
    ref_loss, ref = A.batch_gradients(m, micro)
    for weighting in A.WEIGHTINGS:  # with equal token counts both weightings are the same
        loss, grads = A.batch_gradients(m, micro, weighting=weighting)
        assert loss == pytest.approx(ref_loss, rel=1e-6)
        for name in ref:
            torch.testing.assert_close(grads[name], ref[name], **GRAD_TOL)
    assert all(p.grad is None for p in m.parameters())  # batch_gradients leaves no gradient behind


def test_sdpa_path_is_equivalent_too():
    m, x, y = model_and_batch(attn_impl="sdpa")
    micro = A.split_batch(x, y, 4)
    _, ref = A.batch_gradients(m, micro)
    _, grads = A.batch_gradients(m, micro, weighting="mean")
    assert A.max_gradient_error(grads, ref) < 1e-5


def test_unequal_token_counts_break_mean_of_means_and_token_weighting_fixes_it():
    m, x, y = model_and_batch()
    y_pad = pad(y, [24, 24, 3, 5, 24, 10, 1, 2])
    micro = A.split_batch(x, y_pad, 4)
    assert [A.counted_tokens(t) for _, t in micro] == [48, 8, 34, 3]
    ref_loss, ref = A.batch_gradients(m, micro)
    mean_loss, mean_grads = A.batch_gradients(m, micro, weighting="mean")
    tok_loss, tok_grads = A.batch_gradients(m, micro, weighting="tokens")
    # the pitfall: the mean of the micro-batch means is a different objective
    per_mb = []
    for xb, yb in micro:
        per_mb.append(m(xb, yb)[1].item())
    assert mean_loss == pytest.approx(sum(per_mb) / 4, rel=1e-6)
    assert tok_loss == pytest.approx(ref_loss, rel=1e-6) and mean_loss != pytest.approx(ref_loss, rel=1e-4)
    assert A.max_gradient_error(mean_grads, ref) > 1e-2
    for name in ref:
        torch.testing.assert_close(tok_grads[name], ref[name], **GRAD_TOL)


def test_loss_weights_and_empty_micro_batches():
    _, x, y = model_and_batch(batch=4, T=10)
    micro = A.split_batch(x, pad(y, [10, 10, 0, 0]), 2)
    assert A.loss_weights(micro, "mean") == [1.0, 0.0]  # the mean of the one mean that exists
    assert A.loss_weights(micro, "tokens") == [1.0, 0.0]
    assert A.loss_weights(A.split_batch(x, pad(y, [10, 0, 0, 0, ]), 4), "mean") == [1.0, 0.0, 0.0, 0.0]
    assert A.loss_weights(A.split_batch(x, pad(y, [10, 2, 0, 3]), 4), "mean") == [1 / 3, 1 / 3, 0.0, 1 / 3]
    m, _, _ = model_and_batch()
    A.accumulate_gradients(m, micro, weighting="tokens")  # the all-padding micro-batch is skipped, not NaN
    assert all(torch.isfinite(p.grad).all() for p in m.parameters() if p.grad is not None)
    with pytest.raises(ValueError, match="weighting"):
        A.loss_weights(micro, "sum")
    for weighting in A.WEIGHTINGS:
        with pytest.raises(ValueError, match="ignore_index"):
            A.loss_weights(A.split_batch(x, pad(y, [0, 0, 0, 0]), 2), weighting)
    with pytest.raises(ValueError, match="accum_steps"):
        A.split_batch(x, y, 3)


@pytest.mark.parametrize("weighting", A.WEIGHTINGS)
def test_an_all_padding_micro_batch_gives_a_finite_loss_in_both_weightings(weighting):
    """Issue 11: 'mean' returned loss NaN for an all-padding micro-batch although it is documented as skipped."""
    m, x, y = model_and_batch()
    micro = A.split_batch(x, pad(y, [24, 24, 0, 0, 5, 24, 24, 3]), 4)
    loss, grads = A.batch_gradients(m, micro, weighting=weighting)
    assert torch.isfinite(torch.tensor(loss))
    assert all(torch.isfinite(g).all() for g in grads.values())
    kept = [micro[i] for i in (0, 2, 3)]  # the same thing without the empty micro-batch
    loss_kept, grads_kept = A.batch_gradients(m, kept, weighting=weighting)
    assert loss == pytest.approx(loss_kept, rel=1e-6)
    assert A.gradient_error(grads, grads_kept) < 1e-6
    if weighting == "tokens":  # and token weighting still equals the one-batch gradient
        ref_loss, ref = A.batch_gradients(m, micro)
        assert loss == pytest.approx(ref_loss, rel=1e-6) and A.gradient_error(grads, ref) < 1e-5


def test_gradient_error_and_cosine_are_norm_based():
    ref = {"a": torch.tensor([3.0, 0.0]), "b": torch.tensor([[4.0]])}  # ||ref|| = 5
    assert A.gradient_error(ref, ref) == 0.0 and A.gradient_cosine(ref, ref) == pytest.approx(1.0)
    off = {"a": torch.tensor([3.0, 1.0]), "b": torch.tensor([[4.0]])}
    assert A.gradient_error(off, ref) == pytest.approx(1 / 5)
    assert A.gradient_error({n: 2 * g for n, g in ref.items()}, ref) == pytest.approx(1.0)
    assert A.gradient_cosine({n: 2 * g for n, g in ref.items()}, ref) == pytest.approx(1.0)  # direction only
    assert A.gradient_cosine({"a": torch.tensor([0.0, 1.0]), "b": torch.tensor([[0.0]])}, ref) == pytest.approx(0.0)
    with pytest.raises(ValueError, match="all zeros"):
        A.gradient_error(ref, {n: torch.zeros_like(g) for n, g in ref.items()})
    with pytest.raises(ValueError, match="different parameters"):
        A.gradient_error({"a": ref["a"]}, ref)
    with pytest.raises(ValueError, match="different parameters"):
        A.gradient_cosine({"a": ref["a"]}, ref)


def test_pad_to_lengths():
    y = torch.arange(12).reshape(3, 4)
    out = A.pad_to_lengths(y, [4, 1, 0])
    assert out.tolist() == [[0, 1, 2, 3], [4, -1, -1, -1], [-1, -1, -1, -1]]
    assert y[2, 0] == 8  # a copy
    assert [A.counted_tokens(r) for r in out] == [4, 1, 0]
    for bad in ([4, 1], [5, 1, 0], [-1, 1, 0]):
        with pytest.raises(ValueError, match="lengths"):
            A.pad_to_lengths(y, bad)


def test_effective_batch_arithmetic():
    e = A.effective_batch(4, 8, 64, seq_len=4096)
    assert e["sequences"] == 2048 and e["tokens"] == 2048 * 4096 and e["per_rank_sequences"] == 32
    assert "tokens" not in A.effective_batch(2, 3)
    assert A.effective_batch(2, 3)["sequences"] == 6
    assert A.accum_steps_for(1024, 4, 64) == 4
    assert A.effective_batch(4, A.accum_steps_for(1024, 4, 64), 64, 4096)["tokens"] == 4 * 2**20
    with pytest.raises(ValueError, match="multiple"):
        A.accum_steps_for(1000, 3, 2)
    with pytest.raises(ValueError, match="accum_steps"):
        A.effective_batch(4, 0)


def test_accumulation_step_matches_one_big_step():
    """One optimizer step after accumulating equals one step on the concatenated batch."""
    m1, x, y = model_and_batch()
    m2, _, _ = model_and_batch()
    o1, o2 = torch.optim.SGD(m1.parameters(), lr=0.5), torch.optim.SGD(m2.parameters(), lr=0.5)
    A.accumulation_step(m1, o1, A.split_batch(x, y, 4))()
    A.accumulation_step(m2, o2, [(x, y)])()
    for p1, p2 in zip(m1.parameters(), m2.parameters()):
        torch.testing.assert_close(p1, p2, **GRAD_TOL)


def test_measure_accumulation_memory_follows_micro_batch():
    m, _, _ = model_and_batch()
    opt = torch.optim.AdamW(m.parameters())
    small = A.measure_accumulation(m, opt, 1, 4, 16, reps=1, warmup=0, flops_per_token=1e6)
    large = A.measure_accumulation(m, opt, 4, 1, 16, reps=1, warmup=0)
    assert small["peak_bytes"] is None and large["peak_bytes"] is None  # no CUDA here
    assert large["saved_bytes"] == pytest.approx(4 * small["saved_bytes"], rel=0.05)
    assert small["tokens_per_s"] == pytest.approx(64 / small["seconds"])
    assert small["tflops"] == pytest.approx(1e6 * 64 / small["seconds"] / 1e12)
    assert A.memory_of(small) == (small["saved_bytes"] / 2**20, "activations saved per micro-batch (MiB)")
    assert A.memory_of({"peak_bytes": 2**21, "saved_bytes": 1})[0] == 2.0


def test_sweep_micro_batches_keeps_the_effective_batch():
    m, _, _ = model_and_batch()
    opt = torch.optim.AdamW(m.parameters())
    rows = A.sweep_micro_batches(m, opt, [1, 2, 4], 4, 16, reps=2, warmup=0, flops_per_token=1e6)
    assert [(r["micro_batch"], r["accum_steps"]) for r in rows] == [(1, 4), (2, 2), (4, 1)]
    assert all(r["tokens_per_s"] == pytest.approx(64 / r["seconds"]) for r in rows)
    assert rows[2]["saved_bytes"] == pytest.approx(4 * rows[0]["saved_bytes"], rel=0.05)
    with pytest.raises(ValueError, match="divide"):
        A.sweep_micro_batches(m, opt, [3], 4, 16)


def test_accumulation_panel_reflects_the_controls(capsys):
    m, _, _ = model_and_batch()
    opt = torch.optim.AdamW(m.parameters())
    background = [A.measure_accumulation(m, opt, b, 4 // b, 16, reps=1, warmup=0) for b in (1, 2, 4)]
    fig = A.accumulation_panel(2, 3, model=m, optimizer=opt, seq_len=16, background=background, reps=1)
    ax_t, ax_m = fig.axes
    star = ax_m.collections[-1].get_offsets()[0]
    assert star[0] == 2 and star[1] == pytest.approx(background[1]["saved_bytes"] / 2**20, rel=0.05)
    assert list(ax_t.containers[0].lines[0].get_xdata()) == [1, 2, 4]  # the background sweep, with error bars
    assert ax_m.get_xscale() == "linear" and ax_m.get_yscale() == "linear"
    assert "micro-batch 2 x 3 steps = 6 sequences (96 tokens)" in capsys.readouterr().out
    fig4 = A.accumulation_panel(4, 1, model=m, optimizer=opt, seq_len=16, reps=1)
    assert fig4.axes[1].collections[-1].get_offsets()[0][1] > star[1]  # more memory at a bigger micro-batch
    plt.close("all")


def test_plot_sweep_has_iqr_bars_and_linear_memory_axes():
    """Issue 11: memory grows linearly with b, so it is drawn on linear axes from 0; tokens/s carry IQR bars."""
    rows = [{"micro_batch": b, "tokens_per_s": 100.0 * b, "tokens_per_s_q25": 90.0 * b, "tokens_per_s_q75": 120.0 * b,
             "peak_bytes": None, "saved_bytes": b * 2**20} for b in (1, 2, 4, 8)]
    fig = A.plot_sweep(rows, "t")
    ax_t, ax_m = fig.axes
    assert ax_t.get_xscale() == "log" and ax_t.get_ylim()[0] == 0
    assert ax_m.get_xscale() == "linear" and ax_m.get_yscale() == "linear"
    assert ax_m.get_xlim()[0] == 0 and ax_m.get_ylim()[0] == 0
    assert list(ax_m.lines[0].get_ydata()) == [1.0, 2.0, 4.0, 8.0]
    bars = ax_t.containers[0]
    segments = bars.lines[2][0].get_segments()  # one vertical bar per point, from q25 to q75 of tokens/s
    assert [tuple(s[:, 1]) for s in segments] == [(90.0 * b, 120.0 * b) for b in (1, 2, 4, 8)]
    with pytest.raises(ValueError, match="no rows"):
        A.plot_sweep([], "t")
    plt.close("all")


def test_rows_carry_the_quartiles_of_tokens_per_s():
    m, _, _ = model_and_batch()
    opt = torch.optim.AdamW(m.parameters())
    r = A.measure_accumulation(m, opt, 2, 2, 16, reps=4, warmup=0)
    assert r["tokens_per_s_q25"] == pytest.approx(64 / r["seconds_q75"])
    assert r["tokens_per_s_q25"] <= r["tokens_per_s"] <= r["tokens_per_s_q75"]


def test_sweep_micro_batches_leaves_out_a_size_that_runs_out_of_memory(monkeypatch):
    m, _, _ = model_and_batch()
    opt = torch.optim.AdamW(m.parameters())
    prepare = A._prepare

    def failing_at_4(model, optimizer, micro_batch, *args):
        step, mbs = prepare(model, optimizer, micro_batch, *args)
        if micro_batch < 4:
            return step, mbs

        def step_out_of_memory():
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
        return step_out_of_memory, mbs
    monkeypatch.setattr(A, "_prepare", failing_at_4)
    rows = A.sweep_micro_batches(m, opt, [1, 2, 4], 4, 16, reps=1, warmup=0)
    assert [r["micro_batch"] for r in rows] == [1, 2]


def test_the_notebook_solution_and_the_helper_pass_the_code_exercise(capsys):
    """The loop in the notebook's collapsed solution, and accumulate_gradients with token weights, both PASS."""
    from helpers.course import check

    def accumulate(model, micro_batches):  # as in the notebook's Solutions block
        model.zero_grad(set_to_none=True)
        counts = [int((y != -1).sum()) for _, y in micro_batches]
        total = 0.0
        for (x, y), n in zip(micro_batches, counts):
            if n == 0:
                continue
            _, loss = model(x, y)
            (loss * n / sum(counts)).backward()
            total += loss.item() * n / sum(counts)
        return total

    def with_helper(model, micro_batches):
        model.zero_grad(set_to_none=True)
        return A.accumulate_gradients(model, micro_batches, weighting="tokens")

    def with_mean(model, micro_batches):
        model.zero_grad(set_to_none=True)
        return A.accumulate_gradients(model, micro_batches, weighting="mean")

    for fn, verdict in ((accumulate, "PASS"), (with_helper, "PASS"), (with_mean, "FAIL")):
        check.exercise("05.accumulate", fn)
        assert capsys.readouterr().out.startswith(verdict)

    def unwritten(model, micro_batches):
        ...
    check.exercise("05.accumulate", unwritten)
    assert capsys.readouterr().out.startswith("TODO")


def _row(b, k, median, q25, q75, saved, of_ceiling=0.1):
    return {"micro_batch": b, "accum_steps": k, "tokens_per_s": median, "tokens_per_s_q25": q25,
            "tokens_per_s_q75": q75, "peak_bytes": None, "saved_bytes": saved, "of_ceiling": of_ceiling}


def test_sweep_summary_calls_overlapping_iqrs_noise_and_flags_a_ceiling_above_100_percent():
    apart = [_row(1, 4, 100, 95, 105, 2**20), _row(2, 2, 150, 140, 160, 2 * 2**20), _row(4, 1, 200, 190, 210, 4 * 2**20)]
    out, lines = A.sweep_summary(apart[::-1], 4)  # any order: the smallest micro-batch is compared with the best
    assert out["best_micro_batch"] == 4 and out["first_fraction_of_best"] == pytest.approx(0.5)
    assert not out["first_vs_best_within_noise"] and "beyond this run's noise" in lines[1]
    assert out["smallest_b_within_10pct"] == 4 and "in proportion to b" in lines[3]
    assert not any("100%" in line for line in lines)
    close = [_row(1, 4, 190, 150, 230, 2**20), _row(2, 2, 200, 160, 240, 3 * 2**20, of_ceiling=1.2)]
    out, lines = A.sweep_summary(close, 4)
    assert out["first_vs_best_within_noise"] and "cannot tell b=1 from b=2" in lines[1]
    assert out["smallest_b_within_10pct"] == 1
    assert out["memory_ratio_last_first"] == pytest.approx(3.0) and "more than in proportion to b (x2)" in lines[3]
    assert "b=[2] ran above 100%" in lines[-1] and "under-measured" in lines[-1]
    out, lines = A.sweep_summary([_row(1, 2, 300, 290, 310, 2**20), _row(2, 1, 200, 190, 210, 2**20)], 2)
    assert out["best_micro_batch"] == 1 and "smallest micro-batch was the fastest" in lines[1]
    assert "less than in proportion" in lines[3]
    out, lines = A.sweep_summary([_row(4, 1, 300, 290, 310, 2**20)], 4)
    assert "only one micro-batch size" in lines[1]
    with pytest.raises(ValueError, match="no rows"):
        A.sweep_summary([], 4)


def test_profile_splits_counts_k_times_the_matmul_calls(results_tmp):
    m, _, _ = model_and_batch()
    opt = torch.optim.AdamW(m.parameters())
    rows = A.profile_splits(m, opt, [(1, 4), (4, 1)], 16)
    small, big = rows
    assert small["matmul_calls"] == 4 * big["matmul_calls"] > 0  # the same FLOPs in k times the calls
    assert 0 < small["matmul_share"] <= 1 and small["matmul_ms"] <= small["total_ms"]
    assert len(small["profile"].rows) == 8 and small["profile"].trace_path.exists()
    assert small["profile"].trace_path.parent == results_tmp / "traces"
    with pytest.raises(ValueError, match="splits"):
        A.profile_splits(m, opt, [], 16)


def test_split_profile_lines_follow_the_numbers():
    def row(b, k, calls, mm, total):
        return {"micro_batch": b, "accum_steps": k, "matmul_calls": calls, "matmul_ms": mm, "total_ms": total,
                "matmul_share": mm / total}
    lines = A.split_profile_lines([row(1, 16, 320, 30.0, 60.0), row(16, 1, 20, 10.0, 30.0)])
    assert lines[0] == "b=1 (k=16): 320 matmul calls per step, 30.0 ms in them = 50% of the 60.0 ms of op self time"
    assert "x16.0 as many matmul calls: matmul time x3.00, the other ops' time x1.50" in lines[2]
    assert "the matmuls themselves" in lines[3]
    lines = A.split_profile_lines([row(1, 16, 320, 11.0, 60.0), row(16, 1, 20, 10.0, 30.0)])
    assert "the ops around the matmuls" in lines[3]
    lines = A.split_profile_lines([row(1, 16, 320, 10.5, 31.0), row(16, 1, 20, 10.0, 30.0)])
    assert "paid no visible price" in lines[3]
    assert len(A.split_profile_lines([row(4, 4, 80, 10.0, 30.0)])) == 1  # one split: described, not compared


def _validate(**overrides):
    """Run notebook 05's parameters cell, the overrides (as papermill would inject them), then its validation cell."""
    import json
    from pathlib import Path

    cells = json.loads((Path(__file__).resolve().parent.parent / "notebooks" / "05_grad_accumulation.ipynb").read_text())
    code = ["".join(c["source"]) for c in cells["cells"] if c["cell_type"] == "code"]
    assert code[0].startswith("PROFILE") and "S = params.setup" in code[1]
    scope = {}
    exec(code[0], scope)
    scope.update({"PROFILE": "smoke", "INTERACTIVE": False, **overrides})
    exec(code[1], scope)
    return scope


@pytest.mark.parametrize("name, value", [("REPS", 0), ("REPS", -2), ("SEQ_LEN", 0), ("EFFECTIVE_BATCH", 0),
                                         ("MICRO_BATCHES", []), ("MICRO_BATCHES", [0]), ("MICRO_BATCHES", [3]),
                                         ("CHECK_MICRO_BATCH", 0), ("CHECK_ACCUM_STEPS", 1), ("PRESET", "huge"),
                                         ("SEQ_LEN", 4096)])
def test_notebook_parameters_fail_at_once_naming_the_parameter(results_tmp, name, value):
    """Issue 11: None is the only 'use the default'; 0, [] or a bad value fails in the validation cell, by name."""
    with pytest.raises(ValueError, match=name):
        _validate(**{name: value})


def test_notebook_parameters_resolve_none_to_the_profile_default(results_tmp, capsys):
    scope = _validate()
    assert (scope["PRESET"], scope["SEQ_LEN"], scope["EFFECTIVE_BATCH"], scope["REPS"]) == ("tiny", 64, 16, 3)
    assert scope["MICRO_BATCHES"] == [1, 2, 4, 8, 16]
    assert (scope["CHECK_MICRO_BATCH"], scope["CHECK_ACCUM_STEPS"]) == (2, 4)
    assert _validate(REPS=7, MICRO_BATCHES=[8, 2])["MICRO_BATCHES"] == [2, 8]  # smallest first
