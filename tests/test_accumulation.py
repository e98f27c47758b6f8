"""helpers.accumulation: equivalence with one big batch, the unequal-token pitfall and its fix, arithmetic, panel."""
import matplotlib.pyplot as plt
import pytest
import torch

from helpers import accumulation as A
from helpers.model import GPT, GPTConfig

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
    assert A.loss_weights(micro, "mean") == [0.5, 0.5]
    assert A.loss_weights(micro, "tokens") == [1.0, 0.0]
    m, _, _ = model_and_batch()
    A.accumulate_gradients(m, micro, weighting="tokens")  # the all-padding micro-batch is skipped, not NaN
    assert all(torch.isfinite(p.grad).all() for p in m.parameters() if p.grad is not None)
    with pytest.raises(ValueError, match="weighting"):
        A.loss_weights(micro, "sum")
    with pytest.raises(ValueError, match="ignore_index"):
        A.loss_weights(A.split_batch(x, pad(y, [0, 0, 0, 0]), 2), "tokens")
    with pytest.raises(ValueError, match="accum_steps"):
        A.split_batch(x, y, 3)


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
    assert len(ax_t.lines) == 1  # the background sweep
    assert "micro-batch 2 x 3 steps = 6 sequences (96 tokens)" in capsys.readouterr().out
    fig4 = A.accumulation_panel(4, 1, model=m, optimizer=opt, seq_len=16, reps=1)
    assert fig4.axes[1].collections[-1].get_offsets()[0][1] > star[1]  # more memory at a bigger micro-batch
    plt.close("all")


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
