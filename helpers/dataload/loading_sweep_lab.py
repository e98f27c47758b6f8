"""Notebook 12's measurement protocol over loaders, and the verdict sentences generated from its spread.

* `sweep_protocol` (with `Source`, `loader_source`, `cycle`, `timed_block` over `loading.timed_step`,
  `LoaderTiming`, `LoaderSweep`): the course's protocol (`helpers.measure.protocol`) applied to training steps fed by
  loaders: per source a fresh loader warmed up until its steps are steady, blocks of timed steps
  interleaved in rotated rounds until every source is separated from the fastest, or the seconds budget of
  the whole sweep would be passed; medians and IQRs of wait and copy (wall clock: waiting is the lesson),
  of compute on the thread's CPU clock, and of each block's wall time per real token. The contention is
  measured in the same run (`LoaderSweep.contention`: the share of its compute's wall time the main thread ran,
  in the rows without worker processes), and `LoaderSweep.rank_sentence` withholds a ranking that the
  contention, or too few rounds, could make. `panel_row` is one block, for the instructor panel.
* `probe_sentence`: the machine's load around a wall-clock measurement, from two `clock.probe`s (a fixed loop
  timed on both clocks).
* `against_target` / `packing_sentence` / `idle_sentence`: verdicts generated from a measured ratio or
  share and its IQR bounds against the course's targets, ranking only separated timings.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Sequence

import torch

from helpers.dataload import loading, packing
from helpers.measure import bench, clock as clocks, protocol
from helpers.measure.bench import Timing
from helpers.measure.params import positive

MAX_WARMUP_STEPS = 6  # steps a block may spend warming up before its timed steps


# ---------------------------------------------------------------- one block of training steps from a source

def cycle(make_batches: Callable[[], Iterable[packing.Batch]]) -> Iterator[packing.Batch]:
    """Batches of `make_batches()` epoch after epoch (a new iteration of the loader when one runs out).
    Raises ValueError when an epoch gives no batch at all."""
    while True:
        empty = True
        for batch in make_batches():
            empty = False
            yield batch
        if empty:
            raise ValueError("the loader gave no batch at all")



@dataclass
class Source:
    """One way of feeding batches to a training step: `make()` returns a fresh iterable of `packing.Batch`
    (a DataLoader or `loading.MemmapBatches`), `close(it)` releases it (workers shut down)."""

    make: Callable[[], Iterable[packing.Batch]]
    mask: bool = False  # packed rows: train with the block-diagonal mask
    non_blocking: bool = False  # pinned batches: copy with non_blocking=True
    close: Callable[[Iterable[packing.Batch]], None] = lambda it: None
    ahead: int = 0  # batches the workers have ready before the first step asks (num_workers x prefetch_factor)
    workers: int = 0  # worker processes it runs beside the main one (they compete with it for the cores)


def loader_source(dataset, **loader_kw) -> Source:
    """A `Source` of fresh `loading.make_loader(dataset, **loader_kw)` loaders (batch_size and row_len required);
    `ahead` is what its workers prefetch (PyTorch's default prefetch_factor is 2 a worker)."""
    workers = loader_kw.get("num_workers", 0)
    ahead = workers * (loader_kw.get("prefetch_factor") or 2) if workers else 0
    return Source(lambda: loading.make_loader(dataset, **loader_kw), mask=loader_kw.get("kind", "pad") == "pack",
                  non_blocking=loader_kw.get("pin_memory", False), close=loading.shutdown, ahead=ahead,
                  workers=workers)


def timed_block(model, optimizer, source: Source, *, steps: int, device: str = "cpu", window: int = 2,
                tol: float = 0.25, max_warmup: int = MAX_WARMUP_STEPS) -> tuple[list[tuple], int]:
    """Steps from a fresh `source.make()`: warm up until steady, then time `steps` steps.

    Warm-up first takes `source.ahead` steps, the batches its workers prefetched while the loader started
    (fast steps that would time the buffer, not the loader's rate), then `protocol.warm_up` over whole steps
    (wait + copy + compute): steps are taken and discarded until the last `window` lie within `tol` of their
    median, or `max_warmup` more steps, so a loader's worker start-up and the process's first-call costs stay
    out of the timed steps. The loader is restarted
    for a new epoch when it runs out (`cycle`), and closed after. Returns ([`loading.StepTime`] per timed
    step, the warm-up steps taken). Raises ValueError for steps that is not a positive int.
    """
    positive("steps", steps)
    made = []

    def make():
        made.append(source.make())
        return made[-1]

    it = cycle(make)
    step = lambda: loading.timed_step(model, it, optimizer, device=device, mask=source.mask,  # noqa: E731
                                      non_blocking=source.non_blocking)
    try:
        drained = [step() for _ in range(source.ahead)]
        warm = protocol.warm_up(step, lambda fn: sum(fn()[:3]), window=window, tol=tol, max_warmup=max_warmup)
        return [step() for _ in range(steps)], len(drained) + len(warm)
    finally:
        for loader in made:
            source.close(loader)


# ---------------------------------------------------------------- timings pooled over rounds

@dataclass
class LoaderTiming:
    """One source measured by `sweep_protocol`: every timed step of every round (seconds; tokens per step).

    wait, copy, compute and step are `bench.Timing`s over the timed steps: wait, copy and step on the wall
    clock; compute on the thread's CPU clock on a CPU (`compute.ran_share`: the share of its wall time the
    main thread ran; compute_wall: the same steps' wall seconds, part of the step); per_token is seconds per real
    token of each timed block, its steps' total time over their total tokens (one sample a round), so
    tokens/s = 1 / per_token.median. A loader with workers delivers in bursts: single steps alternate
    between a batch at hand and a wait for one, so a median over steps can time the bursts rather than the
    rate; a block's totals time the rate. idle is the per-step share (wait + copy) / step, as (median, q25,
    q75); warmup_steps: the steps each block discarded.
    """

    wait: Timing
    copy: Timing
    compute: Timing
    step: Timing
    per_token: Timing
    idle: tuple[float, float, float]
    warmup_steps: list[int]
    compute_wall: Timing | None = None

    @property
    def ran(self) -> float | None:
        """The share of its compute's wall time the main thread ran (None off the thread's clock)."""
        return self.compute.ran_share

    @property
    def tokens_per_s(self) -> float:
        """Real tokens per second at the median time per token."""
        return 1.0 / self.per_token.median

    def tokens_per_s_text(self) -> str:
        """"12,345 tokens/s (IQR 11,000-13,000)": the median and the bounds from the quartiles."""
        return (f"{self.tokens_per_s:,.0f} tokens/s (IQR {1 / self.per_token.q75:,.0f}-"
                f"{1 / self.per_token.q25:,.0f})")

    def row(self) -> dict:
        """Plain numbers for a table or a record: (median, q25, q75) in ms, idle share, tokens/s and its IQR."""
        ms = lambda t: (1e3 * t.median, 1e3 * t.q25, 1e3 * t.q75)  # noqa: E731
        return {"wait_ms": ms(self.wait), "copy_ms": ms(self.copy), "compute_ms": ms(self.compute),
                "step_ms": ms(self.step), "idle": self.idle, "tokens_per_s": self.tokens_per_s,
                "tokens_per_s_iqr": (1 / self.per_token.q75, 1 / self.per_token.q25), "steps": len(self.step.samples),
                "warmup_steps": self.warmup_steps, "compute_clock": self.compute.clock, "ran": self.ran,
                "compute_wall_ms": ms(self.compute_wall or self.compute)}


def _timing(xs: list[float], device: str) -> Timing:
    return Timing(*bench.quartiles(xs), list(xs), 0, device)


def loader_timing(steps: list[tuple], warmup_steps: list[int], device: str = "cpu",
                  block: int | None = None) -> LoaderTiming:
    """A `LoaderTiming` from timed steps (pooled over rounds): `loading.StepTime`s, or plain (wait, copy, compute,
    tokens[, compute_cpu]) tuples. The blocks are the runs of `block` steps in order (None: all the steps are one
    block). On a CPU with compute_cpu given, `compute` is on the thread's clock; else on the wall clock. Raises
    ValueError for a block that is not a positive int or does not divide the steps."""
    block = len(steps) if block is None else block
    positive("block", block)
    if len(steps) % block:
        raise ValueError(f"block={block} does not divide the {len(steps)} timed steps into whole blocks")
    cols = [list(c) for c in zip(*steps)]
    wait, copy, compute, tokens = cols[:4]
    step = [w + c + m for w, c, m in zip(wait, copy, compute)]
    idle = [(w + c) / s if s > 0 else 0.0 for w, c, s in zip(wait, copy, step)]
    per_token = [sum(step[i:i + block]) / sum(tokens[i:i + block]) for i in range(0, len(step), block)]
    wall = _timing(compute, device)
    cpu = (Timing(*bench.quartiles(cols[4]), cols[4], 0, device, clock=clocks.THREAD, wall=compute)
           if len(cols) > 4 and not device.startswith("cuda") else wall)
    return LoaderTiming(_timing(wait, device), _timing(copy, device), cpu, _timing(step, device),
                        _timing(per_token, device), bench.quartiles(idle), warmup_steps, wall)


@dataclass
class LoaderSweep:
    """What `sweep_protocol` measured: a `LoaderTiming` per source, the rounds run and why it stopped.

    workers: each source's worker processes; min_rounds: the rounds a spread needs (fewer, and nothing is
    ranked); budget_s: the whole sweep's seconds budget; round_s: each round's wall seconds."""

    timings: dict[str, LoaderTiming]
    rounds: int
    stopped: str  # "separated" (every source from the fastest), "max_rounds" or "budget"
    steps: int
    workers: dict[str, int] = field(default_factory=dict)
    min_rounds: int = 3
    budget_s: float | None = None
    round_s: list[float] = field(default_factory=list)

    def __getitem__(self, name: str) -> LoaderTiming:
        return self.timings[name]

    def fastest(self, names: Sequence[str] | None = None) -> str:
        """The source with the most tokens/s (median), among `names` (default: all)."""
        return min(names or self.timings, key=lambda n: self.timings[n].per_token.median)

    def contention(self, names: Sequence[str] | None = None) -> float | None:
        """The share of its compute's wall time the main thread ran, over the timed steps of `names` (default: the
        sources without worker processes, so that only other work on the machine takes the core from it; all of
        them when every source has workers). None when compute was not on the thread's clock (a GPU)."""
        names = list(names or [n for n in self.timings if not self.workers.get(n)] or self.timings)
        cpu = sum(sum(self.timings[n].compute.samples) for n in names)
        wall = sum(sum(self.timings[n].compute.wall) for n in names)
        if any(self.timings[n].compute.clock != clocks.THREAD for n in names) or wall <= 0:
            return None
        return min(1.0, cpu / wall)

    def withheld(self) -> str | None:
        """Why this sweep may not rank its sources (None: it may, where their spreads separate): fewer rounds
        than `min_rounds` (the budget ran out), or a main thread that ran less than `clocks.SHARED_BELOW` of its
        compute's wall time in the rows without workers: then other work held the cores the loader's workers
        need as well, and a ranking of wall-clock rates could be the scheduler's."""
        if self.rounds < self.min_rounds:
            return (f"the {self.budget_s:g} s budget allowed {self.rounds} round(s), fewer than the {self.min_rounds} "
                    "a spread needs")
        share = self.contention()
        if share is not None and share < clocks.SHARED_BELOW:
            return (f"the main thread ran only {share:.0%} of its compute's wall time in the rows without workers, so "
                    "the machine was shared and the scheduler, which slows the workers too, could make the ranking")
        return None

    def rank_sentence(self, name_a: str, name_b: str, what: str = "time per real token", part: str = "per_token",
                      better: str = "faster") -> str:
        """`protocol.rank_sentence` on two sources' `part` ("per_token", "wait", ...), or, when `withheld()`, their
        numbers and why this run does not rank them."""
        a, b = getattr(self[name_a], part), getattr(self[name_b], part)
        why = self.withheld()
        if why is None:
            return protocol.rank_sentence(name_a, a, name_b, b, what=what, better=better)
        return f"{name_a} and {name_b} ({what}: {a} vs {b}) are not ranked by this run: {why}"

    def contention_sentence(self) -> str:
        """The contention measured in this sweep, in words: the main thread's share of its compute's wall time in
        the rows without workers (other load on the machine) and in each row with workers (its own workers too)."""
        share = self.contention()
        if share is None:
            return "compute was timed on the wall clock (a GPU), so this sweep measured no CPU contention"
        with_w = [f"{n} {self[n].ran:.0%}" for n in self.timings if self.workers.get(n) and self[n].ran is not None]
        return (f"contention measured in this sweep: the main thread ran {share:.0%} of its compute's wall time in the "
                "rows without workers (the rest went to other work on the machine)"
                + (f", and {', '.join(with_w)} in the rows with workers (their own workers share the cores)"
                   if with_w else ""))

    def note(self) -> str:
        """How the numbers were made, for a caption or a summary's noise field."""
        warm = ", ".join(f"{k} {sum(v.warmup_steps)}" for k, v in self.timings.items())
        budget = "" if self.budget_s is None else f" of at most {self.budget_s:g} s"
        return (f"medians and IQRs of {self.steps} timed steps x {self.rounds} interleaved rounds per loader "
                f"(tokens/s: of each round's {self.steps} steps together), each round a fresh loader warmed up until "
                f"its steps were steady (warm-up steps discarded: {warm}); compute on the "
                f"{next(iter(self.timings.values())).compute.clock} clock, wait and tokens/s on the wall clock; "
                f"stopped: {self.stopped} after {sum(self.round_s):.1f} s{budget}")


def sweep_protocol(model, sources: dict[str, Source], *, steps: int, device: str = "cpu", min_rounds: int = 3,
                   max_rounds: int = 8, budget_s: float = 30.0, lr: float = 1e-3,
                   clock: Callable[[], float] = time.monotonic) -> LoaderSweep:
    """The course's measurement protocol over training steps fed by each source.

    One round trains `steps` steps from a fresh loader of every source, in an order rotated each round
    (so a burst of other load on the machine slows every source alike), each block warmed up until steady
    first (`timed_block`). Blocks, not single steps, are interleaved: a loader with workers left idle
    between single steps would prefetch in the background and hide its real wait. After `min_rounds`,
    stop once every source's time per token is separated from the fastest one's (IQRs disjoint), or at
    `max_rounds`. `budget_s` bounds the whole sweep, the first rounds included: a round starts only when the
    slowest round so far would still end within it (the first round always runs), so a busy machine gets fewer
    rounds, and `LoaderSweep.withheld` says when they are fewer than `min_rounds`. clock: the wall clock the
    budget is counted on (a fake in tests). All sources train the one `model` (same shapes, same work per step);
    pass a model already on `device`. Raises ValueError for no sources, a bad round count or a budget that is
    not positive.
    """
    if not sources:
        raise ValueError("sources is empty: give at least one {name: Source}")
    protocol.check_rounds("min_rounds", min_rounds, "max_rounds", max_rounds, budget_s)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    names = list(sources)
    steps_of: dict[str, list[tuple]] = {n: [] for n in names}
    warm: dict[str, list[int]] = {n: [] for n in names}
    start, rounds, stopped, round_s = clock(), 0, "max_rounds", []
    while rounds < max_rounds:
        if round_s and clock() - start + max(round_s) > budget_s:
            stopped = "budget"
            break
        began = clock()
        for n in names[rounds % len(names):] + names[:rounds % len(names)]:
            got, w = timed_block(model, opt, sources[n], steps=steps, device=device)
            steps_of[n] += got
            warm[n].append(w)
        rounds += 1
        round_s.append(clock() - began)
        if rounds < min_rounds:
            continue
        t = {n: loader_timing(steps_of[n], warm[n], device, block=steps) for n in names}
        best = min(t, key=lambda n: t[n].per_token.median)
        if all(protocol.separated(t[n].per_token, t[best].per_token) for n in names if n != best):
            stopped = "separated"
            break
    return LoaderSweep({n: loader_timing(steps_of[n], warm[n], device, block=steps) for n in names}, rounds, stopped,
                       steps, {n: sources[n].workers for n in names}, min_rounds, budget_s, round_s)


def panel_row(model, dataset, cfg: dict, *, steps: int, device: str = "cpu", **common) -> dict:
    """One loader configuration (`loading.make_loader` keywords `cfg` over `common`) for `steps` steps after a
    steady warm-up (`timed_block`), training `model`: its `LoaderTiming.row()` (the instructor panel's bars)."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    got, warm = timed_block(model, opt, loader_source(dataset, **{**common, **cfg}), steps=steps, device=device)
    return loader_timing(got, [warm], device).row()


# ---------------------------------------------------------------- the machine's load, measured by a probe

def probe_sentence(before: clocks.Reading, after: clocks.Reading) -> tuple[float, str]:
    """(share, sentence) for two probes around a measurement: the share of their wall time they ran together."""
    share = clocks.Reading(before.cpu + after.cpu, before.wall + after.wall).share
    return share, (f"a fixed loop timed right before and after it ran {before.share:.0%} and {after.share:.0%} of "
                   f"its wall time ({share:.0%} together)")


# ---------------------------------------------------------------- sentences generated from the measured spread

PACK_TARGET = 1.5  # the course's target for packed/padded tokens/s on a GPU with about half the slots padding
IDLE_TARGET = 0.02  # the course's target for the share of a GPU step spent waiting for data


def against_target(lo: float, hi: float, target: float, *, higher_is_better: bool = True) -> str:
    """Where a measured range [lo, hi] (IQR bounds) lies against a target: "met", "not met" or "undecided"
    (the range straddles the target). Raises ValueError for lo > hi."""
    if lo > hi:
        raise ValueError(f"lo={lo} must not exceed hi={hi}")
    good, bad = (lo >= target, hi < target) if higher_is_better else (hi <= target, lo > target)
    return "met" if good else "not met" if bad else "undecided"


def packing_sentence(r: protocol.Ratio, *, cuda: bool, target: float = PACK_TARGET) -> str:
    """The packing verdict generated from the measured packed/padded tokens/s ratio and its IQR bounds.

    Ranks packed against padded only when their step times are separated; judges the target only when the
    ratio's bounds lie on one side of it; says when the target (set for a GPU) was judged on a CPU.
    """
    where = "" if cuda else " (the target is set for a GPU; this run is a CPU's)"
    if not r.separated:
        return (f"packed/padded tokens/s {r}: the two steps' IQRs overlap, so this run cannot rank packing against "
                f"padding, nor judge the course's {target:g}x target{where}")
    faster = "packed trained faster" if r.value > 1 else "padded trained faster"
    verdict = against_target(r.lo, r.hi, target)
    judged = {"met": f"above the course's {target:g}x target across its IQR bounds",
              "not met": f"below the course's {target:g}x target across its IQR bounds",
              "undecided": f"its IQR bounds straddle the course's {target:g}x target, so this run cannot say "
                           "whether it is met"}[verdict]
    return f"packed/padded tokens/s {r}: {faster}; {judged}{where}"


def idle_sentence(name: str, idle: tuple[float, float, float], *, cuda: bool, target: float = IDLE_TARGET,
                  say_device: bool = True, withheld: str | None = None) -> str:
    """The data-wait verdict of one loader from its per-step idle share (median, q25, q75) against the target;
    say_device=False leaves out the remark that a CPU run judged a GPU target (for a second sentence);
    withheld: why this run may not judge it (`LoaderSweep.withheld`), then the share is stated, not judged."""
    med, lo, hi = idle
    if withheld:
        return f"{name} was idle {med:.1%} of each step (IQR {lo:.1%}-{hi:.1%}), not judged against the course's " \
               f"{target:.0%} target: {withheld}"
    verdict = against_target(lo, hi, target, higher_is_better=False)
    where = "" if cuda or not say_device else ("; the target is set for a GPU, whose fast compute leaves a loader "
                                               "less time, and this run is a CPU's")
    judged = {"met": f"within the course's target of at most {target:.0%} across its IQR",
              "not met": f"above the course's target of at most {target:.0%} across its IQR",
              "undecided": f"its IQR straddles the course's {target:.0%} target"}[verdict]
    return f"{name} was idle {med:.1%} of each step (IQR {lo:.1%}-{hi:.1%}): {judged}{where}"
