"""Notebook 00's exercises: a correct timer (code), a ridge-point size and a throughput (numbers).

The timer exercise runs the learner's function against a *fake asynchronous device* whose clock
is simulated, so the check is exact and never depends on how fast or noisy this machine is:

* `fn()` costs `launch` seconds of host time and enqueues work of a scripted duration; it returns
  before that work is done, as a CUDA kernel launch does;
* `sync()` waits (advances the clock) until every enqueued piece of work has finished;
* `clock()` reads the simulated time in seconds.

The first calls of each case are slow (one-off costs: handles, autotuning, page faults) and some
cases contain one slow outlier (another process took the core), so a timer without warm-up,
without synchronisation, or reporting the mean instead of the median gives a different number.
"""
from __future__ import annotations

import statistics

from helpers.course import check
from helpers.measure import hardware
from helpers.measure.params import positive, positives


class FakeDevice:
    """A simulated asynchronous device: `fn` enqueues, `sync` waits, `clock` reads the time.

    `durations[k]` is the device time (seconds) of the k-th call of `fn`; calls past the end of the
    list repeat its last entry. `launch` is the host time each call of `fn` costs. Raises ValueError
    unless `durations` is a non-empty list of positive floats and `launch` a positive float.
    """

    def __init__(self, durations: list[float], launch: float = 5e-6):
        self.durations, self.launch = positives("durations", durations, float), positive("launch", launch, float)
        self.now = 0.0          # the host's clock, seconds
        self.busy_until = 0.0   # when the device finishes what is queued
        self.calls = 0

    def fn(self) -> None:
        """Launch one call: the host pays `launch`, the device queues the work and returns at once."""
        self.now += self.launch
        work = self.durations[min(self.calls, len(self.durations) - 1)]
        self.busy_until = max(self.busy_until, self.now) + work
        self.calls += 1

    def sync(self) -> None:
        """Block the host until the device has finished everything queued."""
        self.now = max(self.now, self.busy_until)

    def clock(self) -> float:
        """The host's clock in seconds (like `time.perf_counter`)."""
        return self.now


def reference_timer(fn, sync, clock, warmup: int, reps: int) -> float:
    """Median seconds per call of `fn()`: `warmup` untimed calls, then `reps` calls each synchronised."""
    for _ in range(warmup):
        fn()
    sync()                      # the warm-up's queued work must not leak into the first sample
    samples = []
    for _ in range(reps):
        t0 = clock()
        fn()
        sync()                  # wait for the work, not just the launch
        samples.append(clock() - t0)
    return statistics.median(samples)


def _no_warmup(fn, sync, clock, warmup, reps):
    samples = []
    for _ in range(reps):
        t0 = clock()
        fn()
        sync()
        samples.append(clock() - t0)
    return statistics.median(samples)


def _no_sync(fn, sync, clock, warmup, reps):
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(reps):
        t0 = clock()
        fn()
        samples.append(clock() - t0)
    return statistics.median(samples)


def _mean(fn, sync, clock, warmup, reps):
    for _ in range(warmup):
        fn()
    sync()
    t0 = clock()
    for _ in range(reps):
        fn()
    sync()
    return (clock() - t0) / reps


def _timer_cases() -> list[check.Case]:
    ms = 1e-3
    cold, steady = [50 * ms, 20 * ms, 8 * ms], 2 * ms
    return [
        check.Case("3 slow first calls, steady 2 ms", (cold + [steady] * 10, 3, 5)),
        check.Case("one outlier among 7 timed calls", (cold + [steady, 3.1 * ms, 80 * ms, steady, 2.2 * ms,
                                                             1.9 * ms, steady], 3, 7)),
        check.Case("a 10 µs op, 2 warm-up calls, 1 timed", ([3 * ms, 1 * ms, 10e-6], 2, 1)),
        check.Case("odd count with two outliers", ([30 * ms, 4 * ms, 4.2 * ms, 40 * ms, 3.9 * ms, 35 * ms,
                                                   4.1 * ms, 4 * ms], 1, 7)),
    ]


def _run_timer(timer, case: check.Case):
    durations, warmup, reps = case.args
    dev = FakeDevice(durations)
    out = timer(dev.fn, dev.sync, dev.clock, warmup, reps)
    if out is None:
        raise NotImplementedError  # a stub whose body is still `...`: TODO, not FAIL
    return out


check.register(
    "00.timer", "code",
    prompt="write time_it(fn, sync, clock, warmup, reps): median seconds per call",
    hint="three things: untimed calls first, wait for the device before reading the clock (also before the "
         "first sample), and a statistic that one slow call cannot move",
    solution=reference_timer, wrong=(_no_warmup, _no_sync, _mean),
    cases=_timer_cases, run=_run_timer, rtol=1e-9, atol=1e-12,
    tolerance="exact up to float rounding (the device is simulated)")


def _ridge_size() -> float:
    h100 = hardware.PEAKS["h100"]
    itemsize = 2  # bf16
    # intensity of a square matmul: 2n³ / (3n²·s) = 2n / (3s); equal to the ridge P/W when n = 1.5·s·P/W
    return 1.5 * itemsize * h100.ridge_point("bf16")


check.register(
    "00.ridge_n", "value",
    prompt="smallest n at which a bf16 n×n×n matmul reaches the H100 SXM's datasheet ridge point",
    hint="write the square matmul's intensity as a function of n (FLOPs over the bytes of A, B and C), "
         "set it equal to the ridge point from hardware.PEAKS['h100'] and solve for n",
    solution=_ridge_size, wrong=(_ridge_size() / 2, _ridge_size() * 3), rtol=0.02)


def _tflops_8192() -> float:
    return 2 * 8192**3 / 1.45e-3 / 1e12


check.register(
    "00.tflops", "value",
    prompt="TFLOP/s of an 8192×8192×8192 matmul that takes 1.45 ms",
    hint="count the FLOPs of an m×k by k×n product (a multiply-add is two FLOPs), divide by seconds, then by 10^12",
    solution=_tflops_8192, wrong=(_tflops_8192() / 2, _tflops_8192() * 1e3), rtol=0.01)
