"""helpers.training.accumulation: equivalence with one big batch, the unequal-token pitfall and its fix,
gradient comparisons, effective batch arithmetic, and exercise 05.accumulate."""
import pytest
import torch

from helpers.course import check
from helpers.gpt.model import GPT, GPTConfig
from helpers.training import accumulation


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
    y[torch.arange(y.size(1))[None, :] >= torch.tensor(lengths)[:, None]] = accumulation.IGNORE_INDEX
    return y


@pytest.mark.parametrize("k", [2, 4, 8])
def test_equal_micro_batches_give_the_big_batch_gradient(k):
    m, x, y = model_and_batch()
    micro = accumulation.split_batch(x, y, k)
    ref_loss, ref = accumulation.batch_gradients(m, micro)
    for weighting in accumulation.WEIGHTINGS:  # with equal token counts both weightings are the same
        loss, grads = accumulation.batch_gradients(m, micro, weighting=weighting)
        assert loss == pytest.approx(ref_loss, rel=1e-6)
        for name in ref:
            torch.testing.assert_close(grads[name], ref[name], **GRAD_TOL)
    assert all(p.grad is None for p in m.parameters())  # batch_gradients leaves no gradient behind


def test_sdpa_path_is_equivalent_too():
    m, x, y = model_and_batch(attn_impl="sdpa")
    micro = accumulation.split_batch(x, y, 4)
    _, ref = accumulation.batch_gradients(m, micro)
    _, grads = accumulation.batch_gradients(m, micro, weighting="mean")
    assert accumulation.max_gradient_error(grads, ref) < 1e-5


def test_unequal_token_counts_break_mean_of_means_and_token_weighting_fixes_it():
    m, x, y = model_and_batch()
    y_pad = pad(y, [24, 24, 3, 5, 24, 10, 1, 2])
    micro = accumulation.split_batch(x, y_pad, 4)
    assert [accumulation.counted_tokens(t) for _, t in micro] == [48, 8, 34, 3]
    ref_loss, ref = accumulation.batch_gradients(m, micro)
    mean_loss, mean_grads = accumulation.batch_gradients(m, micro, weighting="mean")
    tok_loss, tok_grads = accumulation.batch_gradients(m, micro, weighting="tokens")
    # the pitfall: the mean of the micro-batch means is a different objective
    per_mb = []
    for xb, yb in micro:
        per_mb.append(m(xb, yb)[1].item())
    assert mean_loss == pytest.approx(sum(per_mb) / 4, rel=1e-6)
    assert tok_loss == pytest.approx(ref_loss, rel=1e-6) and mean_loss != pytest.approx(ref_loss, rel=1e-4)
    assert accumulation.max_gradient_error(mean_grads, ref) > 1e-2
    for name in ref:
        torch.testing.assert_close(tok_grads[name], ref[name], **GRAD_TOL)


def test_loss_weights_and_empty_micro_batches():
    _, x, y = model_and_batch(batch=4, T=10)
    micro = accumulation.split_batch(x, pad(y, [10, 10, 0, 0]), 2)
    assert accumulation.loss_weights(micro, "mean") == [1.0, 0.0]  # the mean of the one mean that exists
    assert accumulation.loss_weights(micro, "tokens") == [1.0, 0.0]
    assert accumulation.loss_weights(accumulation.split_batch(x, pad(y, [10, 0, 0, 0, ]), 4), "mean") == [1.0, 0.0, 0.0, 0.0]
    assert accumulation.loss_weights(accumulation.split_batch(x, pad(y, [10, 2, 0, 3]), 4), "mean") == [1 / 3, 1 / 3, 0.0, 1 / 3]
    m, _, _ = model_and_batch()
    accumulation.accumulate_gradients(m, micro, weighting="tokens")  # the all-padding micro-batch is skipped, not NaN
    assert all(torch.isfinite(p.grad).all() for p in m.parameters() if p.grad is not None)
    with pytest.raises(ValueError, match="weighting"):
        accumulation.loss_weights(micro, "sum")
    for weighting in accumulation.WEIGHTINGS:
        with pytest.raises(ValueError, match="ignore_index"):
            accumulation.loss_weights(accumulation.split_batch(x, pad(y, [0, 0, 0, 0]), 2), weighting)
    with pytest.raises(ValueError, match="accum_steps"):
        accumulation.split_batch(x, y, 3)


@pytest.mark.parametrize("weighting", accumulation.WEIGHTINGS)
def test_an_all_padding_micro_batch_gives_a_finite_loss_in_both_weightings(weighting):
    """An all-padding micro-batch (mean loss 0/0) is skipped: the loss and gradients stay finite in both weightings."""
    m, x, y = model_and_batch()
    micro = accumulation.split_batch(x, pad(y, [24, 24, 0, 0, 5, 24, 24, 3]), 4)
    loss, grads = accumulation.batch_gradients(m, micro, weighting=weighting)
    assert torch.isfinite(torch.tensor(loss))
    assert all(torch.isfinite(g).all() for g in grads.values())
    kept = [micro[i] for i in (0, 2, 3)]  # the same thing without the empty micro-batch
    loss_kept, grads_kept = accumulation.batch_gradients(m, kept, weighting=weighting)
    assert loss == pytest.approx(loss_kept, rel=1e-6)
    assert accumulation.gradient_error(grads, grads_kept) < 1e-6
    if weighting == "tokens":  # and token weighting still equals the one-batch gradient
        ref_loss, ref = accumulation.batch_gradients(m, micro)
        assert loss == pytest.approx(ref_loss, rel=1e-6) and accumulation.gradient_error(grads, ref) < 1e-5


def test_gradient_error_and_cosine_are_norm_based():
    ref = {"a": torch.tensor([3.0, 0.0]), "b": torch.tensor([[4.0]])}  # ||ref|| = 5
    assert accumulation.gradient_error(ref, ref) == 0.0 and accumulation.gradient_cosine(ref, ref) == pytest.approx(1.0)
    off = {"a": torch.tensor([3.0, 1.0]), "b": torch.tensor([[4.0]])}
    assert accumulation.gradient_error(off, ref) == pytest.approx(1 / 5)
    assert accumulation.gradient_error({n: 2 * g for n, g in ref.items()}, ref) == pytest.approx(1.0)
    assert accumulation.gradient_cosine({n: 2 * g for n, g in ref.items()}, ref) == pytest.approx(1.0)  # direction only
    assert accumulation.gradient_cosine({"a": torch.tensor([0.0, 1.0]), "b": torch.tensor([[0.0]])}, ref) == pytest.approx(0.0)
    with pytest.raises(ValueError, match="all zeros"):
        accumulation.gradient_error(ref, {n: torch.zeros_like(g) for n, g in ref.items()})
    with pytest.raises(ValueError, match="different parameters"):
        accumulation.gradient_error({"a": ref["a"]}, ref)
    with pytest.raises(ValueError, match="different parameters"):
        accumulation.gradient_cosine({"a": ref["a"]}, ref)


def test_pad_to_lengths():
    y = torch.arange(12).reshape(3, 4)
    out = accumulation.pad_to_lengths(y, [4, 1, 0])
    assert out.tolist() == [[0, 1, 2, 3], [4, -1, -1, -1], [-1, -1, -1, -1]]
    assert y[2, 0] == 8  # a copy
    assert [accumulation.counted_tokens(r) for r in out] == [4, 1, 0]
    for bad in ([4, 1], [5, 1, 0], [-1, 1, 0]):
        with pytest.raises(ValueError, match="lengths"):
            accumulation.pad_to_lengths(y, bad)


def test_effective_batch_arithmetic():
    e = accumulation.effective_batch(4, 8, 64, seq_len=4096)
    assert e["sequences"] == 2048 and e["tokens"] == 2048 * 4096 and e["per_rank_sequences"] == 32
    assert "tokens" not in accumulation.effective_batch(2, 3)
    assert accumulation.effective_batch(2, 3)["sequences"] == 6
    assert accumulation.accum_steps_for(1024, 4, 64) == 4
    assert accumulation.effective_batch(4, accumulation.accum_steps_for(1024, 4, 64), 64, 4096)["tokens"] == 4 * 2**20
    with pytest.raises(ValueError, match="multiple"):
        accumulation.accum_steps_for(1000, 3, 2)
    with pytest.raises(ValueError, match="accum_steps"):
        accumulation.effective_batch(4, 0)


@pytest.mark.slow
def test_accumulation_step_matches_one_big_step():
    """One optimizer step after accumulating equals one step on the concatenated batch."""
    m1, x, y = model_and_batch()
    m2, _, _ = model_and_batch()
    o1, o2 = torch.optim.SGD(m1.parameters(), lr=0.5), torch.optim.SGD(m2.parameters(), lr=0.5)
    accumulation.accumulation_step(m1, o1, accumulation.split_batch(x, y, 4))()
    accumulation.accumulation_step(m2, o2, [(x, y)])()
    for p1, p2 in zip(m1.parameters(), m2.parameters()):
        torch.testing.assert_close(p1, p2, **GRAD_TOL)


@pytest.mark.slow
def test_the_notebook_solution_and_the_helper_pass_the_code_exercise(capsys):
    """The loop in the notebook's collapsed solution, and accumulate_gradients with token weights, both PASS."""
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
        return accumulation.accumulate_gradients(model, micro_batches, weighting="tokens")

    def with_mean(model, micro_batches):
        model.zero_grad(set_to_none=True)
        return accumulation.accumulate_gradients(model, micro_batches, weighting="mean")

    for fn, verdict in ((accumulate, "PASS"), (with_helper, "PASS"), (with_mean, "FAIL")):
        check.exercise("05.accumulate", fn)
        assert capsys.readouterr().out.startswith(verdict)

    def unwritten(model, micro_batches):
        ...
    check.exercise("05.accumulate", unwritten)
    assert capsys.readouterr().out.startswith("TODO")
