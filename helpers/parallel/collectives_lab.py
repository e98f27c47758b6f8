"""Notebook 13's collectives on ranks, the course's timing protocol on ranks, and the notebook's parameters.

Each function taking `(rank, world, ...)` runs under `helpers.parallel.launch.run_on_ranks` and returns
plain numbers (rank 0's; None or {} elsewhere):

* `check_collectives`: our ring all-reduce (`helpers.parallel.collectives`) against `dist.all_reduce`;
* timing on ranks: `rounds`, the course's protocol where a sentence ranks variants (warm-up, interleaved
  rotated rounds until the compared IQRs separate, the stopping decision shared by the ranks), used by
  `ddp_lab` too; `ping_pong`, `comm_sweep` (ping-pong, our ring and `dist.all_reduce`
  per message size); `section_collectives` (the check and the sweep on one process group);
* the sentences: `collectives_notes` (on the sweep), `takeaway`, and `rank_paired` (two timings on ranks ranked
  only when their round-by-round ratio agrees, used by `ddp_lab` too);
* the machine's load around a section on ranks: `on_ranks` (`launch.run_on_ranks` between two `clock.probe`s, a
  fixed loop timed on both clocks in this process) and its `Load`, which withholds a ranking the contention
  could make;
* the notebook's parameters: `resolve_parameters` (all at once), with the checks `at_least_2` and
  `message_sizes` (lists given as text are read by `helpers.measure.params.positives`).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from statistics import median
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist

from helpers.gpt.model import PRESETS
from helpers.measure import bench, clock as clocks, params, protocol
from helpers.measure.params import positive, positive_number, positives
from helpers.parallel import collectives, launch


# ---------------------------------------------------------------- timing on ranks

def _device() -> str:
    """Where this rank's buffers live: its GPU under NCCL, else the CPU."""
    return f"cuda:{torch.cuda.current_device()}" if dist.get_backend() == "nccl" else "cpu"


def ping_pong(nbytes: int, reps: int) -> float | None:
    """One-way time (s, median of `reps` round trips / 2) of `nbytes` between ranks 0 and 1; None elsewhere."""
    rank = dist.get_rank()
    dev = _device()
    buf = torch.zeros(max(1, nbytes // 4), dtype=torch.float32, device=dev)
    xs = []
    for i in range(reps + 2):
        bench.sync(dev)
        dist.barrier()
        with clocks.Stopwatch(tally=False) as sw:  # wall time: a round trip is waiting for the other rank
            if rank == 0:
                dist.send(buf, 1)
                dist.recv(buf, 1)
            elif rank == 1:
                dist.recv(buf, 0)
                dist.send(buf, 0)
            bench.sync(dev)
        if i >= 2:
            xs.append(sw.wall / 2)
    return median(xs) if rank == 0 else None


def comm_sweep(rank: int, world_size: int, sizes: Sequence[int], reps: int) -> dict[str, Any] | None:
    """On ranks: ping-pong and all-reduce (our ring, our recursive doubling and dist.all_reduce) for each size in
    bytes; the all-reduces by `rounds` (warm-up, interleaved rotated rounds, at least `reps` and at most 2 * reps,
    until ring and torch, and doubling and ring, separate).

    Returns, on rank 0, {"sizes", "ping", "ring", "doubling", "torch" (medians, s), "<name>_iqr" (IQR / median),
    "<name>_t" (bench.Timing per size)}; None elsewhere.
    """
    names = ("ring", "doubling", "torch")
    rows: dict[str, list] = {"ping": [], **{k + e: [] for k in names for e in ("", "_iqr", "_t")}}
    for nbytes in sizes:
        x = torch.ones(max(1, nbytes // 4), device=_device())
        rows["ping"].append(ping_pong(nbytes, reps))
        t = rounds({"ring": lambda: collectives.ring_all_reduce(x), "torch": lambda: dist.all_reduce(x),
                    "doubling": lambda: collectives.recursive_doubling_all_reduce(x)}, reps,
                   [("ring", "torch"), ("doubling", "ring")], warmup=2, max_reps=2 * reps)
        for name in names:
            rows[name].append(t[name].median)
            rows[name + "_iqr"].append(t[name].q75 / t[name].median - t[name].q25 / t[name].median)
            rows[name + "_t"].append(t[name])
    return {"sizes": list(sizes), **rows} if rank == 0 else None


def check_collectives(rank: int, world: int, seed: int = 0) -> dict:
    """Our ring and recursive-doubling all-reduces against dist.all_reduce: integer (exact) and float tensors of
    awkward sizes."""
    out = {"int exact": True, "float max err": 0.0, "doubling int exact": True, "doubling float max err": 0.0}
    g = torch.Generator().manual_seed(seed + rank)
    for n in (1, world - 1 if world > 1 else 1, 7, 1000, 4099):
        x = torch.randint(-1000, 1000, (n,), generator=g)
        ours, ref = collectives.ring_all_reduce(x.clone()), x.clone()
        dist.all_reduce(ref)
        out["int exact"] &= bool(torch.equal(ours, ref))
        ref_int = ref
        y = torch.randn(3, n, generator=g)
        ours, ref = collectives.ring_all_reduce(y.clone()), y.clone()
        dist.all_reduce(ref)
        out["float max err"] = max(out["float max err"], float((ours - ref).abs().max()))
        dbl = collectives.recursive_doubling_all_reduce(x.clone())
        out["doubling int exact"] &= bool(torch.equal(dbl, ref_int))
        dbl = collectives.recursive_doubling_all_reduce(y.clone())
        out["doubling float max err"] = max(out["doubling float max err"], float((dbl - ref).abs().max()))
    return out if rank == 0 else {}


ROUNDS_BUDGET_S = 3.0  # seconds of timed rounds one comparison on ranks may take beyond its first `reps` rounds


def rounds(fns: dict[str, Callable[[], Any]], reps: int, pairs: list[tuple[str, str]], warmup: int = 3,
           max_reps: int | None = None, target_spread: float = 0.05, budget_s: float = ROUNDS_BUDGET_S,
           clock: Callable[[], float] = time.monotonic) -> dict[str, bench.Timing]:
    """The course's protocol on ranks (`helpers.measure.protocol`, with the stopping decision shared):
    `warmup` untimed calls of each variant, then rounds of one timed call each in rotated order, each
    call between barriers; after `reps` rounds, rank 0 stops them (and tells every rank) once every pair
    in `pairs` is separated (IQRs disjoint) or every spread is within `target_spread`, or once the timed rounds,
    the first `reps` included, have taken more than `budget_s` seconds (rank 0's `clock`, the wall clock: a busy
    machine, whose spreads seldom separate, gets fewer rounds), else at `max_reps` (3 * reps). Every rank makes the same
    calls in the same order, so collectives pair up. Returns {name: bench.Timing} of this rank's seconds per call."""
    names = list(fns)
    for n in names:
        for _ in range(warmup):
            fns[n]()
    samples: dict[str, list[float]] = {n: [] for n in names}
    max_reps = max_reps or 3 * reps
    flag = torch.zeros(1)
    dev = _device()

    def timings():
        return {n: bench.Timing(*bench.quartiles(x), list(x), warmup) for n, x in samples.items()}

    start = clock()
    for k in range(max_reps):
        for n in names[k % len(names):] + names[:k % len(names)]:
            bench.sync(dev)
            dist.barrier()
            with clocks.Stopwatch(tally=False) as sw:  # wall time: the ranks wait for each other
                fns[n]()
                bench.sync(dev)
            samples[n].append(sw.wall)
        if k + 1 < reps:
            continue
        if dist.get_rank() == 0:
            t = timings()
            done = all(protocol.separated(t[a], t[b]) for a, b in pairs) or all(
                x.spread <= target_spread for x in t.values()) or clock() - start > budget_s
            flag.fill_(float(done))
        dist.broadcast(flag, 0)
        if flag.item():
            break
    return timings()


def section_collectives(rank: int, world: int, sizes: list[int], reps: int) -> dict | None:
    """Notebook 13's first section on one process group: the ring check, then the size sweep."""
    check = check_collectives(rank, world)
    sweep = comm_sweep(rank, world, sizes, reps)
    return {"check": check, "sweep": sweep} if rank == 0 else None


def collectives_notes(sweep: dict, world: int, alpha: float, beta: float) -> list[str]:
    """Sentences on the collectives sweep, generated from its numbers (its spread is `wording.spread_sentence`'s):
    dist.all_reduce's fitted slope against the ring's prediction 2(n-1)/n·β, and our ring's
    smallest-message time against the α-β model. Causes are given as likely, not as measured."""
    n, notes = world, []
    a_ar, b_ar = collectives.alpha_beta_fit(sweep["sizes"], sweep["torch"])
    pred = 2 * (n - 1) / n * beta
    slope = b_ar / pred if pred > 0 else float("inf")
    head = (f"dist.all_reduce's fitted line: intercept {1e6 * a_ar:.0f} µs (the ring predicts 2(n-1)α = "
            f"{2e6 * (n - 1) * alpha:.0f} µs), slope {1e9 * b_ar:.2f} ns/byte (the ring predicts 2(n-1)/n·β = "
            f"{1e9 * pred:.2f} ns/byte), {slope:.1f}x the prediction")
    if slope > 1.3:
        notes.append(head + ": gloo likely runs its own algorithm rather than this ring and copies buffers in "
                     "and out, and its ranks share cores with those copies, so each byte costs more than one "
                     "ping-pong transfer does (a likely cause, not measured here)")
    elif slope < 1 / 1.3:
        notes.append(head + ": faster per byte than the ring; likely gloo overlaps its transfers, which a "
                     "single ping-pong cannot (a likely cause, not measured here)")
    else:
        notes.append(head + ": within 30%, as the model says")
    floor = sweep["ring"][0] / collectives.ring_model_time(sweep["sizes"][0], n, alpha, beta)
    if floor > 2:
        notes.append(f"our ring's smallest message took {floor:.1f}x the α-β model's time: each of its 2(n-1) = "
                     f"{2 * (n - 1)} steps likely pays Python overhead (splitting the tensor, a send/recv pair, "
                     "waiting for the slowest rank) beyond the ping-pong's α (a likely cause, not measured here)")
    else:
        notes.append(f"our ring's smallest message took {floor:.1f}x the α-β model's time, within 2x of its floor "
                     f"of 2(n-1) = {2 * (n - 1)} latencies")
    return notes


# ---------------------------------------------------------------- the machine's load around a section on ranks

def rank_paired(name_a: str, a: bench.Timing, name_b: str, b: bench.Timing, what: str = "step time",
                withheld: str | None = None) -> str:
    """`protocol.rank_sentence` when the two Timings are separated and their round-by-round ratio's IQR
    (`protocol.paired_ratio`) lies on one side of 1 as well; otherwise that this run cannot rank them. Both ratios
    are quoted. withheld: why this run may not rank them at all (`Load.withheld`)."""
    r = protocol.paired_ratio(b, a)  # > 1: a is faster
    med, q25, q75 = r.value, r.lo, r.hi
    paired = f"round by round {name_b} / {name_a} {med:.2f}x (IQR {q25:.2f}-{q75:.2f}x)"
    if withheld:
        return f"{name_a} and {name_b} ({what}: {a} vs {b}; {paired}) are not ranked by this run: {withheld}"
    if protocol.separated(a, b) and (q25 > 1 or q75 < 1):
        return protocol.rank_sentence(name_a, a, name_b, b, what=what) + f"; {paired}"
    how = ("apart by their spreads but not round by round" if protocol.separated(a, b) else
           "within the noise of each other")
    return f"{name_a} and {name_b} are {how} ({what}: {a} vs {b}; {paired}); this run cannot rank them"


def takeaway(sweep: dict, alpha: float, beta: float, world: int, busbw: float, busbw_iqr: tuple[float, float],
             ring: protocol.Ratio, withheld: str | None) -> str:
    """The notebook's takeaway on collectives, from the sweep (`comm_sweep`), the α-β fit (s, s/byte), the bus
    bandwidth at the largest message (GB/s, with its IQR), our ring's time over dist.all_reduce's (a
    `protocol.ratio`) and why this run may not rank them (None: it may)."""
    return (f"Collectives: ping-pong fits α = {1e6 * alpha:.0f} µs and 1/β = {1e-9 / beta if beta else float('inf'):.2f} "
            f"GB/s between processes here; a {sweep['sizes'][-1] / 2 ** 20:g} MiB all-reduce on {world} ranks reached "
            f"{busbw:.2f} GB/s bus bandwidth (IQR {busbw_iqr[0]:.2f}-{busbw_iqr[1]:.2f}), and our send/recv ring took "
            f"{ring} dist.all_reduce's time"
            + (f" (not ranked: {withheld})" if withheld else "" if ring.separated else " (within the noise)") + ".")


@dataclass(frozen=True)
class Load:
    """The machine's load around a section on ranks: the probe right before it and right after it."""

    before: clocks.Reading
    after: clocks.Reading

    @property
    def share(self) -> float:
        """The share of their wall time the two probes ran, together."""
        return clocks.Reading(self.before.cpu + self.after.cpu, self.before.wall + self.after.wall).share

    def sentence(self) -> str:
        return (f"a fixed loop timed in the notebook's process right before and after the ranks ran "
                f"{self.before.share:.0%} and {self.after.share:.0%} of its wall time")

    def withheld(self, what: str = "ranking") -> str | None:
        """Why this section's wall-clock timings may not make a `what` ("ranking", "verdict"; None: the machine was
        close to idle): probes that ran less than `clock.SHARED_BELOW` of their wall time together mean other work
        held the cores, and ranks that wait for each other then wait for the scheduler too."""
        if self.share >= clocks.SHARED_BELOW:
            return None
        return (f"{self.sentence()}: the machine was shared, and ranks that wait for each other on a shared machine "
                f"wait for the scheduler as well, so the contention could make this {what}")


def on_ranks(fn: Callable[..., Any], world: int, *args, **kwargs) -> tuple[list, Load]:
    """`launch.run_on_ranks(fn, world, *args, **kwargs)` between two `clock.probe`s: (its results, the `Load`)."""
    before = clocks.probe()
    out = launch.run_on_ranks(fn, world, *args, **kwargs)
    return out, Load(before, clocks.probe())


def ranked(sentence: str, numbers: str, withheld: str | None) -> str:
    """`sentence` (a ranking) when nothing withholds it, else the `numbers` and why this run does not rank them."""
    return sentence if withheld is None else f"{numbers}: not ranked by this run: {withheld}"


# ---------------------------------------------------------------- the notebook's parameters

def at_least_2(name: str, value) -> int:
    """A world size: an int >= 2 (one rank has nobody to talk to). Raises ValueError naming the parameter."""
    if positive(name, value) < 2:
        raise ValueError(f"{name}={value!r} must be an int >= 2")
    return value


def message_sizes(name: str, value) -> list[int]:
    """All-reduce message sizes in bytes (`params.positives`, which reads a list given as text): each a whole
    number of fp32 elements (a multiple of 4, as the sweep's buffers hold floats), and at least two distinct
    sizes, the fewest the α-β fit takes."""
    sizes = positives(name, value)
    for n in sizes:
        if n % 4:
            raise ValueError(f"{name}={sizes!r}: entry {n} is not a whole number of fp32 elements; the sweep sends "
                             f"float32 buffers, so give multiples of 4 bytes (e.g. {max(4, n - n % 4)})")
    if len(set(sizes)) < 2:
        raise ValueError(f"{name}={sizes!r}: the α-β fit of the latency needs at least two distinct message sizes, "
                         f"e.g. [{sizes[0]}, {4 * sizes[0]}]")
    return sizes


def resolve_parameters(S: params.Setup, *, WORLD_SIZE, MEMORY_RANKS, MSG_SIZES, REPS, DDP_WIDTH, DDP_ROWS, MICROS,
                       STAGE_MS, MEMORY_MODEL, TORCHRUN) -> dict:
    """Notebook 13's parameters, validated at once and with the profile's defaults filled in: {name: value},
    plus "CORES" (the CPU cores this process may use, which size the full profile's WORLD_SIZE).

    Raises ValueError naming the first bad parameter: a world size below 2 (WORLD_SIZE or an entry of
    MEMORY_RANKS; one rank has nobody to talk to), message sizes that the sweep cannot send or fit
    (`message_sizes`), a STAGE_MS that is not a finite positive number.
    """
    cores = len(os.sched_getaffinity(0))
    R = S.resolve
    out = {"CORES": cores,
           "WORLD_SIZE": R("WORLD_SIZE", WORLD_SIZE, smoke=2, full=max(2, min(8, cores // 2)), check=at_least_2),
           "MEMORY_RANKS": R("MEMORY_RANKS", MEMORY_RANKS, smoke=[2], full=[2, 4], check=positives),
           "MSG_SIZES": R("MSG_SIZES", MSG_SIZES, smoke=[2 ** k for k in (10, 14, 18, 22)],
                          full=[2 ** k for k in range(10, 25, 2)], check=message_sizes),
           "REPS": R("REPS", REPS, smoke=5, full=5, check=params.positive),
           "DDP_WIDTH": R("DDP_WIDTH", DDP_WIDTH, smoke=1024, full=1024, check=params.positive),
           "DDP_ROWS": R("DDP_ROWS", DDP_ROWS, smoke=[4, 32], full=[16, 128], check=positives),
           "MICROS": R("MICROS", MICROS, smoke=[1, 2, 4, 8], full=[1, 4, 16], check=positives),
           "STAGE_MS": R("STAGE_MS", STAGE_MS, smoke=10.0, full=10.0, check=positive_number),
           "MEMORY_MODEL": R("MEMORY_MODEL", MEMORY_MODEL, smoke="tiny", full="small10m",
                             check=lambda n, v: params.choose(n, v, PRESETS)),
           "TORCHRUN": R("TORCHRUN", TORCHRUN, smoke=True, full=True, check=lambda n, v: params.choose(n, v, (True, False)))}
    if min(out["MEMORY_RANKS"]) < 2:
        raise ValueError(f"MEMORY_RANKS={out['MEMORY_RANKS']!r}: every world size must be >= 2")
    return out


def doubling_rows(sweep: dict, world: int, alpha: float, beta: float) -> tuple[list[list], list[str]]:
    """Per size of the sweep: our ring and recursive doubling measured, doubling / ring round by round, both α-β
    predictions (µs) and the model's pick; and per size "faster", "slower" or "not separated" (doubling against
    the ring: their IQRs apart and the round-by-round ratio's IQR on one side of 1)."""
    rows, verdicts = [], []
    for n, r, d in zip(sweep["sizes"], sweep["ring_t"], sweep["doubling_t"]):
        paired = protocol.paired_ratio(d, r)
        v = ("not separated" if not (protocol.separated(d, r) and paired.separated)
             else "faster" if paired.hi < 1 else "slower")
        ring_m = collectives.ring_model_time(n, world, alpha, beta)
        dbl_m = collectives.doubling_model_time(n, world, alpha, beta)
        rows.append([n / 2 ** 10, str(r), str(d), f"{paired.value:.2f}x (IQR {paired.lo:.2f}-{paired.hi:.2f}x)",
                     1e6 * ring_m, 1e6 * dbl_m, "doubling" if dbl_m < ring_m else "ring"])
        verdicts.append(v)
    return rows, verdicts
