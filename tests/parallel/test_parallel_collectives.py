"""The ring all-reduce's schedule (simulated in one process), the alpha-beta fit, nccl-tests' bus bandwidth,
and the ring exercise refusing the course's own schedule. The ring on real ranks is checked in
tests/parallel/test_parallel_collectives_lab.py."""
import pytest
import torch

from helpers.parallel import collectives as D


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_ring_schedule_sums_on_every_rank(n):
    g = torch.Generator().manual_seed(n)
    xs = [torch.randint(-50, 50, (11,), generator=g) for _ in range(n)]
    for out in D.simulate_ring(xs):
        assert torch.equal(out, sum(xs))


def test_a_wrong_schedule_is_caught_by_the_simulation():
    wrong = lambda r, n, s, ph: ((r + s) % n, (r + s - 1) % n)  # noqa: E731  turns the wrong way
    xs = [torch.arange(6) * (r + 1) for r in range(3)]
    assert not all(torch.equal(o, sum(xs)) for o in D.simulate_ring(xs, wrong))
    with pytest.raises(ValueError, match="phase"):
        D.ring_schedule(0, 2, 0, "broadcast")


def test_alpha_beta_fit_recovers_a_known_model():
    sizes = [2 ** k for k in range(6, 24, 2)]
    alpha, beta = 20e-6, 1 / 5e9
    fit = D.alpha_beta_fit(sizes, [alpha + s * beta for s in sizes])
    assert fit[0] == pytest.approx(alpha, rel=1e-6) and fit[1] == pytest.approx(beta, rel=1e-6)
    with pytest.raises(ValueError):
        D.alpha_beta_fit([8, 8], [1.0, 1.0])


def test_bus_bandwidth_follows_nccl_tests():
    assert D.bus_bandwidth(1e9, 1.0, 8) == pytest.approx(1.75)  # algbw 1 GB/s x 2*7/8
    assert D.bus_bandwidth(1e9, 1.0, 2) == pytest.approx(1.0)
    assert D.bus_bandwidth(1e9, 1, 2) == pytest.approx(1.0)  # whole seconds are a number of seconds too
    with pytest.raises(ValueError, match="seconds=0.0 must be a positive float"):
        D.bus_bandwidth(1e9, 0.0, 2)
    with pytest.raises(ValueError, match="world_size=0 must be a positive int"):
        D.bus_bandwidth(1e9, 1.0, 0)


def test_ring_exercise_refuses_the_course_function(capsys):
    """Passing the course's ring_schedule (or a lambda calling it) FAILs: write it yourself."""
    from helpers.course import check

    def own_ring(rank, world_size, step, phase):
        n = world_size
        if phase == "reduce-scatter":
            return (rank - step) % n, (rank - step - 1) % n
        return (rank + 1 - step) % n, (rank - step) % n

    for answer in (D.ring_schedule, lambda r, n, s, p: D.ring_schedule(r, n, s, p)):
        check.exercise("13.ring", answer)
        out = capsys.readouterr().out
        assert "FAIL" in out and "write it yourself" in out, out
    check.exercise("13.ring", own_ring)
    assert "PASS" in capsys.readouterr().out


def test_recursive_doubling_sums_on_any_world_size_and_every_rank_gets_the_same_bits():
    from helpers.parallel import in_process
    for n in (1, 2, 3, 4, 5, 6, 8):
        xs = [torch.randint(-100, 100, (7,)) for _ in range(n)]
        outs = in_process.on_threads(D.recursive_doubling_all_reduce, [(x.clone(),) for x in xs])
        assert all(torch.equal(o, sum(xs)) for o in outs), n
        fs = [torch.randn(3, 4).t() for _ in range(n)]  # non-contiguous: reduced in a copy, written back
        outs = in_process.on_threads(D.recursive_doubling_all_reduce, [(f.clone(),) for f in fs])
        torch.testing.assert_close(outs[0], sum(fs), rtol=1e-5, atol=1e-5)
        assert all(torch.equal(o, outs[0]) for o in outs), n


def test_doubling_model_and_its_crossover_with_the_ring():
    assert [D.doubling_steps(n) for n in (2, 3, 4, 5, 8)] == [1, 3, 2, 4, 3]
    assert D.ring_doubling_crossover(2, 1e-4, 1e-9) == float("inf")  # one message of N against two of N/2
    a, b = 1e-4, 1e-9
    n_star = D.ring_doubling_crossover(8, a, b)
    assert abs(D.ring_model_time(n_star, 8, a, b) - D.doubling_model_time(n_star, 8, a, b)) < 1e-12
    assert D.doubling_model_time(n_star / 2, 8, a, b) < D.ring_model_time(n_star / 2, 8, a, b)
    assert D.doubling_model_time(2 * n_star, 8, a, b) > D.ring_model_time(2 * n_star, 8, a, b)
