"""helpers.decode.serving: the seeded request mix, and the static and continuous schedulers: every request
finishes once with the tokens it gets alone, deterministic schedules, preemption that loses nothing, and the
arguments refused."""
from __future__ import annotations

import itertools

import pytest
import torch

from helpers.decode import paged_attention, serving
from kv_support import tiny_gpt


def test_make_requests_is_seeded_and_heavy_tailed():
    a = serving.make_requests(200, seed=3, max_len=256, max_new_tokens=128, prompt_median=16, output_median=16)
    b = serving.make_requests(200, seed=3, max_len=256, max_new_tokens=128, prompt_median=16, output_median=16)
    c = serving.make_requests(200, seed=4, max_len=256, max_new_tokens=128, prompt_median=16, output_median=16)
    assert a == b and a != c
    outs = sorted(r.output_len for r in a)
    assert all(1 <= r.output_len <= 128 and 1 <= len(r.prompt) <= 128 for r in a)
    assert outs[-1] > 4 * outs[len(outs) // 2]  # a long tail: the longest is far above the median
    arrivals = [r.arrival for r in a]
    assert arrivals == sorted(arrivals) and arrivals[-1] > 0
    assert {r.arrival for r in serving.make_requests(5, arrival_rate=None)} == {0}
    with pytest.raises(ValueError):
        serving.make_requests(3, max_len=8, max_new_tokens=8)
    corpus = torch.arange(1000)
    for r in serving.make_requests(20, seed=1, corpus=corpus):  # prompts are slices of the corpus
        assert list(r.prompt) == list(range(r.prompt[0], r.prompt[0] + len(r.prompt)))


@pytest.fixture(scope="module")
def mix():
    model = tiny_gpt(2, torch.float64)  # float64: batched and solo numerics cannot flip a greedy argmax
    reqs = serving.make_requests(10, seed=1, max_len=48, prompt_median=6, output_median=6, max_new_tokens=16,
                                 arrival_rate=0.7)
    solo = {r.rid: serving.solo_tokens(model, r, block_size=4) for r in reqs}
    return model, reqs, solo


@pytest.mark.slow
@pytest.mark.parametrize("policy,num_blocks", [("static", 40), ("continuous", 40), ("continuous", 9)])
def test_every_request_finishes_once_with_its_solo_tokens(mix, policy, num_blocks):
    model, reqs, solo = mix
    run = serving.serve(model, reqs, policy=policy, num_blocks=num_blocks, block_size=4, max_batch=5,
                        max_new_tokens=16)
    assert sorted(run.finished_order) == sorted(solo)  # each exactly once
    assert run.tokens == solo
    assert all(len(run.tokens[r.rid]) == r.output_len for r in reqs)
    if num_blocks == 9:  # a pool this small forces preemptions, and they lose nothing
        assert run.preemptions > 0
    assert run.peak_blocks <= num_blocks
    assert set(run.ttft) == set(solo) and all(t >= 0 for t in run.ttft.values())


@pytest.mark.slow
def test_schedules_are_deterministic_and_static_wastes_more(mix):
    model, reqs, _ = mix
    ticks = itertools.count()
    clock = lambda: float(next(ticks))  # noqa: E731  (one tick per reading: iteration times are all 1)
    runs = {}
    for policy in ("static", "continuous"):
        a = serving.serve(model, reqs, policy=policy, num_blocks=40, block_size=4, max_batch=5, max_new_tokens=16,
                          clock=clock)
        b = serving.serve(model, reqs, policy=policy, num_blocks=40, block_size=4, max_batch=5, max_new_tokens=16,
                          clock=clock)
        assert a == b
        runs[policy] = a
    assert runs["static"].waste_fraction > runs["continuous"].waste_fraction
    # with one unit of time per iteration, TTFT counts iterations: continuous admits no later than static
    assert runs["continuous"].percentile("ttft", 50) <= runs["static"].percentile("ttft", 50)
    assert runs["continuous"].iterations < runs["static"].iterations


def test_serve_validates_its_arguments(mix):
    model, reqs, _ = mix
    with pytest.raises(ValueError, match="policy"):
        serving.serve(model, reqs, policy="fifo")
    with pytest.raises(ValueError, match="blocks alone"):
        serving.serve(model, reqs, num_blocks=2, block_size=4, max_new_tokens=16)
    with pytest.raises(ValueError, match="seq_len"):
        serving.serve(model, reqs, max_new_tokens=100)
    with pytest.raises(ValueError, match="max_batch"):
        serving.serve(model, reqs, max_batch=0)


@pytest.mark.slow
@pytest.mark.skipif(paged_attention.TRITON_MISSING is not None, reason="triton is not installed")
def test_serving_with_the_triton_decode_gives_the_same_tokens():
    model = tiny_gpt(2)
    reqs = serving.make_requests(3, seed=5, max_len=48, prompt_median=5, output_median=4, max_new_tokens=6)
    a = serving.serve(model, reqs, num_blocks=20, block_size=4, max_batch=3, impl="torch")
    b = serving.serve(model, reqs, num_blocks=20, block_size=4, max_batch=3, impl="triton")
    assert a.tokens == b.tokens


@pytest.mark.slow
def test_serve_policies_runs_each_policy_repeats_times_and_changes_no_tokens(mix):
    model, reqs, solo = mix
    tries = serving.serve_policies(model, reqs, repeats=2, num_blocks=40, block_size=4, max_batch=5,
                                   max_new_tokens=16)
    assert list(tries) == list(serving.POLICIES) and all(len(t) == 2 for t in tries.values())
    assert all(run.policy == p and run.tokens == solo for p, t in tries.items() for run in t)
    with pytest.raises(ValueError, match="repeats"):
        serving.serve_policies(model, reqs, repeats=0)


def _run(policy, wall_s):
    """A ServeRun of 10 tokens in `wall_s` seconds: 10 / wall_s tokens/s."""
    return serving.ServeRun(policy, {0: list(range(10))}, {0: 0.0}, {}, wall_s, 1, 0, 0.0, 1, [0])


def test_policy_speedup_takes_the_median_runs_and_ranks_only_disjoint_ranges():
    tries = {"static": [_run("static", 2.0), _run("static", 1.0), _run("static", 1.25)],  # 5, 10, 8 tokens/s
             "continuous": [_run("continuous", 0.5), _run("continuous", 0.4), _run("continuous", 0.625)]}  # 20, 25, 16
    said = serving.policy_speedup(tries)
    assert said["runs"]["static"] is tries["static"][2] and said["runs"]["continuous"] is tries["continuous"][0]
    assert said["speedup"] == pytest.approx(20 / 8) and said["speedup_range"] == pytest.approx((16 / 10, 25 / 5))
    assert said["separated"] and said["spread"] == pytest.approx(max((10 - 5) / 8, (25 - 16) / 20))
    close = {"static": [_run("static", 1.0), _run("static", 0.5)], "continuous": [_run("continuous", 0.6)] * 2}
    assert not serving.policy_speedup(close)["separated"]  # 16.7 tokens/s lies inside static's 10-20
    assert not serving.policy_speedup({p: t[:1] for p, t in tries.items()})["separated"]  # one run each


def test_the_server_reads_the_threads_clock_on_one_cpu_thread():
    import time

    from helpers.measure import bench
    with bench.cpu_threads("cpu", 1):
        assert serving.server_clock("cpu") is time.thread_time
    with bench.cpu_threads("cpu", 2):
        assert serving.server_clock("cpu") is time.perf_counter  # two threads: one thread's clock would miss work
