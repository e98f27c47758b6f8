"""The course's one CPU clock: the calling thread's own CPU time, with the wall time kept beside it.

A wall clock on a machine that other work shares times the scheduler as well as the code: while another
process holds the core, the wall clock runs on and the code does not. The thread's CPU clock
(`time.thread_time_ns`, CLOCK_THREAD_CPUTIME_ID on Linux) advances only while this thread runs, in user
or kernel mode, so it measures what the code did. It counts one thread only, which is why the course
times CPU work with torch on one thread (`params.setup` sets it): work handed to other threads or
processes would be missed. Where waiting is the lesson (loader workers, ranks, queues), the wall clock
stays, and `share()` says how much of the wall time this thread actually ran.

Every CPU timing taken on this clock is tallied here, so a notebook can say at its end how shared the
machine was (`sentence()`), and the report can show it beside the notebook's headlines.
This module imports nothing heavy: the runner's worker processes read it.
"""
from __future__ import annotations

import resource
import time
from dataclasses import dataclass

THREAD, WALL, EVENTS = "thread", "wall", "cuda events"  # what a timing was read from
SHARED_BELOW = 0.9  # a thread that ran less than 90% of the wall time shared its core with other work

_tally = {"cpu_ns": 0, "wall_ns": 0, "timings": 0}


@dataclass(frozen=True)
class Reading:
    """One interval on both clocks: seconds the thread ran (plus reaped child processes' CPU time, when
    asked for) and seconds of wall time."""

    cpu: float
    wall: float

    @property
    def share(self) -> float:
        """The fraction of the wall time the thread ran (1.0 for an empty interval)."""
        return min(1.0, self.cpu / self.wall) if self.wall > 0 else 1.0


def _children_ns() -> int:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return int((usage.ru_utime + usage.ru_stime) * 1e9)


class Stopwatch:
    """Times a block on both clocks and tallies it: `with clock.Stopwatch() as sw: work()`, then `sw.cpu`,
    `sw.wall` (seconds) and `sw.reading`.

    children=True adds the CPU time of child processes that finished (and were waited for) inside the block,
    such as the C++ compiler a cold `torch.compile` runs; a pool of processes that outlive the block is not
    counted, so time those on the wall clock. tally=False keeps the block out of `share()`.
    """

    def __init__(self, *, children: bool = False, tally: bool = True):
        self.children, self.tally = children, tally
        self.cpu = self.wall = 0.0

    def __enter__(self) -> "Stopwatch":
        self._kids = _children_ns() if self.children else 0
        self._wall = time.perf_counter_ns()
        self._cpu = time.thread_time_ns()
        return self

    def __exit__(self, *exc) -> None:
        cpu = time.thread_time_ns() - self._cpu
        wall = time.perf_counter_ns() - self._wall
        if self.children:
            cpu += _children_ns() - self._kids
        self.cpu, self.wall = cpu / 1e9, wall / 1e9
        if self.tally:
            add(self.cpu, self.wall)

    @property
    def reading(self) -> Reading:
        return Reading(self.cpu, self.wall)


def probe(loops: int = 1_000_000) -> Reading:
    """The machine's contention right now, where waiting is the lesson and the wall clock stays: a fixed
    CPU-bound loop of `loops` additions in Python (about 25 ms of CPU time by default), timed on both clocks and
    left out of the tally. Its
    `share` is the fraction of the wall time this thread got; near 1.0 the core was free, 0.5 means another
    process held it half the time. Raises ValueError for loops < 1."""
    if isinstance(loops, bool) or not isinstance(loops, int) or loops < 1:
        raise ValueError(f"loops={loops!r} must be a positive int")
    with Stopwatch(tally=False) as sw:
        total = 0
        for i in range(loops):
            total += i
    return sw.reading


def add(cpu_s: float, wall_s: float) -> None:
    """Tally one interval timed on the thread's clock (seconds on each clock)."""
    _tally["cpu_ns"] += int(cpu_s * 1e9)
    _tally["wall_ns"] += int(wall_s * 1e9)
    _tally["timings"] += 1


def reset() -> None:
    """Forget every tallied interval (a test, or a notebook that starts its measurements over)."""
    _tally.update(cpu_ns=0, wall_ns=0, timings=0)


def share() -> float | None:
    """The fraction of the wall time the thread ran, over every interval tallied in this process; None if none."""
    if not _tally["timings"] or _tally["wall_ns"] <= 0:
        return None
    return min(1.0, _tally["cpu_ns"] / _tally["wall_ns"])


def tally() -> dict[str, float | int | None]:
    """What the tally holds, for a record: seconds on each clock, the number of intervals and the share."""
    return {"cpu_s": _tally["cpu_ns"] / 1e9, "wall_s": _tally["wall_ns"] / 1e9, "timings": _tally["timings"],
            "share": share()}


def describe_share(value: float | None) -> str:
    """The sentence for a share of wall time (None: no CPU timing was taken on the thread's clock)."""
    if value is None:
        return "no CPU timing was taken on the thread's clock in this run"
    verdict = ("the machine was shared, and the thread's clock left the waiting out" if value < SHARED_BELOW
               else "other work seldom interrupted the timed calls")
    return f"timed on the thread's CPU clock with torch on one thread; it ran {100 * value:.0f}% of the wall time: {verdict}"


def sentence() -> str:
    """This process's clock sentence: `describe_share(share())`."""
    return describe_share(share())
