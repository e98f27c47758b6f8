"""The course's one measurement protocol for a headline: warm up until steady, interleave, repeat until the
spread can rank the variants (or say it cannot), and quote medians with their IQR.

A headline number decides a sentence, so one slow step must not decide it. The protocol:

1. **Warm up until steady** (`warm_up`): call each variant until its last `window` calls lie within `tol`
   of their median (the first call in a process pays for allocation, autotuning and page faults; a
   compiled function for its compile), at most `max_warmup` calls.
2. **Interleave** (`compare`): one timed call of every variant per round, their order rotated each round,
   so a burst of other work on a shared machine slows every variant alike.
3. **Repeat until it can rank**: after `min_reps` rounds, stop once every pair has been separated (their
   IQRs do not overlap) for `confirm` rounds in a row, or each variant's IQR is within `target_spread` of
   its median; else go on to `max_reps` rounds or `budget_s` seconds, whichever comes first. (Stopping
   at the first separated round would favour "separated": a look at the data decides when to stop. The
   `confirm` rounds in a row keep that bias small; min_reps = max_reps gives a fixed number of rounds.)
4. **Rank only what the spread allows** (`separated`, `rank_sentence`): "A is 1.4x faster" only when
   A's q75 is below B's q25; otherwise "within the noise".

Ratios are quoted with conservative bounds from the quartiles (`Ratio`: lo = a.q25 / b.q75,
hi = a.q75 / b.q25). The timer is `bench.benchmark`'s (CUDA events on a GPU; on a CPU the thread's own CPU
clock with torch on one thread, else perf_counter: `bench.resolve_clock`); tests pass a fake `timer` with
planted slow calls.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from helpers.measure import bench, clock as clocks
from helpers.measure.bench import Timing
from helpers.measure.params import positive

Timer = Callable[[Callable[[], Any]], float]  # seconds of one call of fn


def device_timer(device: str | None = None, clock: str = "auto") -> Timer:
    """One call of fn timed by the course's timer on `device` (None: CUDA when available, else the CPU) and
    `clock` (see `bench.resolve_clock`); the clock it reads is its `clock` attribute."""
    dev = bench.resolve_device(device)
    read = bench.resolve_clock(dev, clock)

    def timer(fn: Callable[[], Any]) -> float:
        return bench.benchmark(fn, warmup=0, reps=1, device=dev, clock=read).samples[0]

    timer.clock = read
    return timer


def steady(times: list[float], window: int, tol: float) -> bool:
    """Whether the last `window` times lie within `tol` (relative) of their median."""
    if len(times) < window:
        return False
    last = times[-window:]
    med = statistics.median(last)
    return med > 0 and all(abs(t - med) <= tol * med for t in last)


def warm_up(fn: Callable[[], Any], timer: Timer, *, window: int = 3, tol: float = 0.15,
            max_warmup: int = 20) -> list[float]:
    """Call fn (timed) until its last `window` times lie within `tol` (relative) of their median, or
    `max_warmup` calls; returns the warm-up times (the first is the cold call). Raises ValueError for
    window < 1, tol <= 0 or max_warmup < window."""
    positive("window", window)
    if not tol > 0:
        raise ValueError(f"tol={tol!r} must be a positive fraction, e.g. 0.15")
    if max_warmup < window:
        raise ValueError(f"max_warmup={max_warmup!r} must be at least window={window}")
    times: list[float] = []
    while len(times) < max_warmup and not steady(times, window, tol):
        times.append(timer(fn))
    return times


def separated(a: Timing, b: Timing) -> bool:
    """Whether two timings' inter-quartile ranges do not overlap: only then may a sentence rank them."""
    return a.q75 < b.q25 or b.q75 < a.q25


@dataclass(frozen=True)
class Ratio:
    """num / den of two timings: the ratio of medians and conservative bounds from their quartiles."""

    value: float
    lo: float
    hi: float
    separated: bool  # the IQRs do not overlap

    def __str__(self) -> str:
        return f"{self.value:.2f}x (IQR-bounded {self.lo:.2f}-{self.hi:.2f}x)"


def ratio(num: Timing, den: Timing) -> Ratio:
    """num.median / den.median with bounds num.q25 / den.q75 and num.q75 / den.q25."""
    return Ratio(num.median / den.median, num.q25 / den.q75, num.q75 / den.q25 if den.q25 > 0 else float("inf"),
                 separated(num, den))


def paired_ratio(num: Timing, den: Timing) -> Ratio:
    """num / den from timings taken in the same interleaved rounds (sample i of each from round i): the median of
    the per-round ratios, with their quartiles as lo and hi. Pairing cancels what a round's load does to both
    calls alike, so the range is the ratio's own noise; separated: the range excludes 1. Raises ValueError for
    timings with different sample counts or none."""
    return paired_samples_ratio(num.samples, den.samples)


def paired_samples_ratio(num: Sequence[float], den: Sequence[float]) -> Ratio:
    """`paired_ratio` of two lists of seconds from the same interleaved rounds (a record keeps its samples, not its
    Timing). Raises ValueError for lists of different lengths or empty ones."""
    if not num or len(num) != len(den):
        raise ValueError(f"paired timings need the same rounds: {len(num)} and {len(den)} samples")
    med, q25, q75 = bench.quartiles([a / b for a, b in zip(num, den)])
    return Ratio(med, q25, q75, not q25 <= 1 <= q75)


def rank_sentence(name_a: str, a: Timing, name_b: str, b: Timing, what: str = "time per call",
                  better: str = "faster") -> str:
    """One sentence comparing two timings: which is `better` (the word for the smaller time: "faster", or
    "shorter" for a wait) and by how much when their IQRs do not overlap, else that the run cannot tell them
    apart. The timings in its parenthesis follow the order of the names before it (the better first)."""
    r = ratio(b, a)  # > 1: a is faster
    if not r.separated:
        return (f"{name_a} and {name_b} are within the noise of each other ({what}: {a} vs {b}); "
                "this run cannot rank them")
    if r.value > 1:
        return f"{name_a} was {r} {better} than {name_b} ({what}: {a} vs {b})"
    return f"{name_b} was {ratio(a, b)} {better} than {name_a} ({what}: {b} vs {a})"


@dataclass(frozen=True)
class Comparison:
    """What `compare` measured: a Timing per variant, the warm-up calls each took, the rounds timed, and
    why it stopped ("separated", "steady", "max_reps" or "budget")."""

    timings: dict[str, Timing]
    warmup_calls: dict[str, int]
    rounds: int
    stopped: str

    def __getitem__(self, name: str) -> Timing:
        return self.timings[name]

    def ratio(self, num: str, den: str) -> Ratio:
        return ratio(self.timings[num], self.timings[den])

    def rankable(self) -> bool:
        """Whether every pair of variants is separated."""
        names = list(self.timings)
        return all(separated(self.timings[a], self.timings[b]) for i, a in enumerate(names) for b in names[i + 1:])

    def note(self) -> str:
        """How the numbers were made, for a table's caption or a summary's noise field."""
        warm = ", ".join(f"{k} ×{v}" for k, v in self.warmup_calls.items())  # ×: a name may end in a number
        return (f"medians and IQRs of {self.rounds} interleaved rounds after warm-up until steady ({warm} calls); "
                f"stopped: {self.stopped}")


def check_rounds(min_name: str, min_value, max_name: str, max_value, budget_s) -> None:
    """The arguments every round-based comparison takes, validated alike: a positive int of rounds at least,
    no fewer at most, and a positive budget in seconds. Raises ValueError naming the bad one."""
    positive(min_name, min_value)
    if max_value < min_value:
        raise ValueError(f"{max_name}={max_value!r} must be at least {min_name}={min_value}")
    if not budget_s > 0:
        raise ValueError(f"budget_s={budget_s!r} must be a positive number of seconds")


def compare(fns: dict[str, Callable[[], Any]], *, device: str | None = None, timer: Timer | None = None,
            min_reps: int = 5, max_reps: int = 30, target_spread: float = 0.05, budget_s: float = 10.0,
            warmup_tol: float = 0.15, max_warmup: int = 20, confirm: int = 3,
            clock: Callable[[], float] = time.monotonic, timing_clock: str = "auto") -> Comparison:
    """Time every variant by the protocol in this module's docstring; a `Comparison`.

    fns: {name: zero-argument callable}, at least one. timer: seconds of one call (default
    `device_timer(device, timing_clock)`, timing_clock "wall" where waiting is what is timed); clock: the wall
    clock the budget is counted on (tests pass fakes for both).
    target_spread: stop early once each variant's IQR / median is at most this. confirm: rounds in a row
    every pair must stay separated before the comparison stops on it. budget_s: seconds of
    timed rounds after `min_reps` (warm-up is not counted). Raises ValueError for an empty fns,
    min_reps < 1, confirm < 1, max_reps < min_reps or a budget that is not positive.
    """
    if not fns:
        raise ValueError("fns is empty: give at least one {name: callable}")
    check_rounds("min_reps", min_reps, "max_reps", max_reps, budget_s)
    positive("confirm", confirm)
    timer = timer or device_timer(device, timing_clock)
    dev = bench.resolve_device(device)
    read = getattr(timer, "clock", clocks.WALL)
    warm = {name: len(warm_up(fn, timer, tol=warmup_tol, max_warmup=max_warmup)) for name, fn in fns.items()}
    names = list(fns)
    samples: dict[str, list[float]] = {n: [] for n in names}
    start, rounds, stopped, in_a_row = clock(), 0, "max_reps", 0

    def timings() -> dict[str, Timing]:
        return {n: Timing(*bench.quartiles(s), list(s), warm[n], dev, clock=read) for n, s in samples.items()}

    while rounds < max_reps:
        order = names[rounds % len(names):] + names[:rounds % len(names)]
        for n in order:
            samples[n].append(timer(fns[n]))
        rounds += 1
        t = timings()
        in_a_row = in_a_row + 1 if rounds >= 2 and len(names) > 1 and Comparison(t, warm, rounds, "").rankable() else 0
        if rounds < min_reps:
            continue
        if in_a_row >= confirm:
            stopped = "separated"
            break
        if all(x.spread <= target_spread for x in t.values()):
            stopped = "steady"
            break
        if clock() - start > budget_s:
            stopped = "budget"
            break
    return Comparison(timings(), warm, rounds, stopped)


def measure(fn: Callable[[], Any], **kwargs) -> Timing:
    """One variant by the protocol (`compare` with a single entry): its Timing."""
    return compare({"fn": fn}, **kwargs)["fn"]
