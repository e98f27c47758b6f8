"""helpers.measure.ceilings: the copy ceiling separates the per-call cost from the bytes, fits the bandwidth only
where bytes dominate, is timed on the thread's own clock on a CPU, and notebook 00's record applies only to steps
timed on as many threads."""
import random

import pytest
import torch

from helpers.measure import bench, ceilings
from helpers.measure.bench import Timing
from helpers.measure.results import record

MIB = 2 ** 20


def timing(seconds: float, spread: float = 0.0) -> Timing:
    """A Timing whose median is `seconds` and whose quartiles lie `spread` (relative) either side."""
    lo, hi = seconds * (1 - spread), seconds * (1 + spread)
    return Timing(seconds, lo, hi, [lo, seconds, hi], 0, "cpu", 0.0, "thread", [])


def planted(nbytes: int, fixed: float, gbps: float) -> float:
    return fixed + ceilings.copy_moved(nbytes) / (gbps * 1e9)


def test_fit_copy_recovers_a_planted_per_call_cost_and_bandwidth():
    moved = [8, 2 ** 16, 2 ** 20, 2 ** 24, 2 ** 28]
    fixed, gbps = ceilings.fit_copy(moved, [3e-6 + x / 25e9 for x in moved])
    assert fixed == pytest.approx(3e-6, rel=1e-6) and gbps == pytest.approx(25.0, rel=1e-6)
    rng = random.Random(0)  # 2% noise on every time: both still within 5%
    fixed, gbps = ceilings.fit_copy(moved, [(2e-5 + x / 8e9) * (1 + rng.uniform(-0.02, 0.02)) for x in moved])
    assert fixed == pytest.approx(2e-5, rel=0.05) and gbps == pytest.approx(8.0, rel=0.05)


def test_fit_copy_refits_a_negative_intercept_through_zero_and_refuses_what_it_cannot_fit():
    fixed, gbps = ceilings.fit_copy([1e6, 2e6, 4e6], [0.9e-4, 2.0e-4, 4.1e-4])  # a line that would cross below 0
    assert fixed == 0.0 and gbps == pytest.approx(10.0, rel=0.05)
    with pytest.raises(ValueError, match="two sizes"):
        ceilings.fit_copy([1e6, 1e6], [1e-4, 1e-4])
    with pytest.raises(ValueError, match="no bandwidth"):
        ceilings.fit_copy([1e3, 1e6], [2e-4, 1e-4])


def test_copy_ceiling_uses_only_copies_past_the_cache_where_bytes_dominate(monkeypatch):
    monkeypatch.setattr(ceilings, "last_level_cache", lambda device: (32 * MIB, "L3"))  # copy_size: 64 MiB
    sizes = [MIB // 4, MIB, 16 * MIB, 64 * MIB, 128 * MIB, 256 * MIB]
    # inside the cache the bytes move at 100 GB/s, past it at 20 GB/s; every call pays 2 µs
    times = [timing(planted(n, 2e-6, 100.0 if n < 64 * MIB else 20.0), 0.02) for n in sizes]
    c = ceilings.fitted_copy_ceiling(sizes, times, timing(2e-6, 0.02), "cpu")
    assert c.sizes == (64 * MIB, 128 * MIB, 256 * MIB)
    assert c.gbps == pytest.approx(20.0, rel=1e-3) and c.fixed_s == pytest.approx(2e-6, rel=0.05)
    assert c.lo < c.gbps < c.hi and c.hi / c.lo < 1.1 and c.fixed_share < 0.01 and c.clock == "thread"
    assert ceilings.fitted_copy_ceiling(sizes[:3], times[:3], timing(2e-6), "cpu") is None  # all inside the cache
    slow_call = timing(2e-3)  # a 2 ms per-call cost is over 10% of a 64 MiB copy at 20 GB/s (6.7 ms)
    only_64 = ceilings.fitted_copy_ceiling([64 * MIB], [timing(planted(64 * MIB, 2e-3, 20.0))], slow_call, "cpu")
    assert only_64 is None


def test_copy_and_matmul_timings_read_the_threads_clock_on_one_cpu_thread(monkeypatch, results_tmp):
    with bench.cpu_threads("cpu", 1):
        assert ceilings.copy_timing(MIB, "cpu", reps=3, warmup=1).clock == "thread"
        t, flops = ceilings.matmul_timing(32, "fp32", "cpu", reps=3, warmup=1)
        assert t.clock == "thread" and flops == 2 * 32 ** 3
        mid, lo, hi = ceilings.tflops_range(t, flops)
        assert lo <= mid <= hi
        seen = []
        real = ceilings.copy_timing
        monkeypatch.setattr(ceilings, "copy_size", lambda device=None: MIB)
        monkeypatch.setattr(ceilings, "copy_timing", lambda *a, **k: seen.append(real(*a, **k)) or seen[-1])
        monkeypatch.setattr(ceilings, "COPY_CEILINGS", {})
        gbps, source = ceilings.bandwidth_ceiling("cpu", reps=2)
    assert gbps > 0 and [t.clock for t in seen] == ["thread"] and "on 1 thread" in source


def test_notebook_00s_record_applies_to_steps_timed_on_as_many_threads(monkeypatch, results_tmp):
    monkeypatch.setattr(ceilings, "COPY_CEILINGS", {})
    monkeypatch.setattr(ceilings, "measure_copy_bandwidth", lambda nbytes, device, reps, warmup: 5.0)
    record(ceilings.CEILINGS_RECORD, {"matmul_tflops": {"fp32": 1.0}, "copy_gbps": 28.6, "copy_threads": 1,
                                      "copy_sizes_mb": [64.0, 128.0, 256.0]}, quiet=True)
    with bench.cpu_threads("cpu", 1):
        gbps, source = ceilings.bandwidth_ceiling("cpu", threads=1)
        assert gbps == 28.6 and "copies of 64-256 MiB past the cache on 1 thread" in source
        assert ceilings.bandwidth_ceiling("cpu")[0] == 28.6  # None: the current count, one thread
    gbps, source = ceilings.bandwidth_ceiling("cpu", threads=2)
    assert gbps == 5.0 and "on 1 thread, does not apply to a step timed on 2" in source
    assert torch.get_num_threads() >= 1
