"""Sentences notebook 13 prints under its tables, generated from the run's numbers (so a table and the sentence
under it quote the same quantity in the same direction)."""
from __future__ import annotations

from helpers.measure import bench, protocol
from helpers.parallel import collectives


def speed_sentence(rows: int, speed: protocol.Ratio, compute_over_comm: float, target: float, withheld: str | None,
                   world: int, cores: int) -> str:
    """The DDP sentence at the largest batch: `speed` is after-backward time / bucketed time, round by round
    (`protocol.paired_ratio`, the table's last column), so > 1 means bucketed overlap is faster. Judged against the
    course's `target` only when nothing withholds it (`withheld`, a reason) and its IQR lies on one side of it."""
    head = (f"at {rows} rows (the largest batch, compute/comm {compute_over_comm:.2f}): after-backward time / bucketed "
            f"time, round by round, {speed.value:.2f}x (IQR {speed.lo:.2f}-{speed.hi:.2f}x)")
    if withheld:
        return f"{head}; not ranked and the course's target (>= {target:g}x) not judged by this run: {withheld}."
    if not speed.separated:
        how = "its IQR spans 1x, so this run cannot say which is faster"
    elif speed.lo > 1:
        how = f"bucketed overlap is faster: a step takes 1/{speed.value:.2f} = {1 / speed.value:.2f} of the after-backward step"
    else:
        how = (f"bucketed overlap is slower: a step takes {1 / speed.value:.2f}x the after-backward step "
               "(copying into buckets costs more than the overlap hides here)")
    if speed.lo >= target:
        verdict = "met"
    elif speed.hi < target:
        verdict = "not met"
    else:
        verdict = "undecided by its IQR"
    crowded = (f" ({world} ranks share {cores} cores, so communication and compute compete for the same cores)"
               if verdict != "met" and world * 2 > cores else "")
    return f"{head}: {how}. Course target on a 16-core machine with 8 ranks: >= {target:g}x; {verdict} in this run{crowded}."


def ring_target_sentence(largest: int, world: int, ring: protocol.Ratio, withheld: str | None, bound: float = 1.5) -> str:
    """Whether our ring met the course's target (within `bound` x dist.all_reduce's time on 8 ranks for messages of
    16 MiB or more), given the sweep's `largest` message in bytes, the world size and ring/torch at that size."""
    if largest < 2 ** 24 or world < 8:
        return (f"the course's target on 8 ranks for >= 16 MiB is within {bound:g}x; not tested by this run's sizes "
                f"({largest / 2 ** 20:g} MiB at most) or ranks ({world})")
    if withheld:
        return f"the course's target on 8 ranks for >= 16 MiB is within {bound:g}x; not judged: {withheld}"
    verdict = "met" if ring.hi <= bound else "not met" if ring.lo > bound else "undecided by its IQR"
    return f"the course's target on 8 ranks for >= 16 MiB is within {bound:g}x; {verdict} here"


def spread_sentence(sizes: list[int], iqr: list[float], load: str, withheld: str | None, noisy: float = 0.25) -> str:
    """The all-reduce sweep's spread and the contention probes in one sentence that does not contradict itself:
    which size had the widest IQR/median (`iqr`, fractions), what the probes saw (`load`), and what follows."""
    k = max(range(len(iqr)), key=lambda i: iqr[i])
    wide = [s for s, q in zip(sizes, iqr) if q > noisy]
    head = f"widest spread (IQR/median) of dist.all_reduce: {iqr[k]:.0%} at {sizes[k] / 2 ** 10:g} KiB"
    if withheld:
        return f"{head}; {load}: the machine was shared, so the rankings are withheld"
    if wide:
        return (f"{head}, and {len(wide)} of {len(sizes)} sizes above {noisy:.0%}: the probes ({load}) found the "
                "machine close to idle around the sweep, yet single rounds were disturbed (a rank waiting for a core), "
                "so those sizes' timings are ranked only where their wide spreads still do not overlap")
    return f"{head}: steady; {load}: the machine was close to idle, so separated timings are ranked"


def torchrun_node_line(node: int, returncode: int, output: str, steps: int) -> str:
    """What one torchrun launcher (one stand-in machine) did: its exit code, then the lines its ranks printed, or,
    for a node whose ranks print nothing (the script prints from rank 0), what its exit code says they did."""
    tail = [line for line in output.splitlines() if line.startswith(("step", "torchrun"))]
    if returncode != 0:
        return f"node {node}: exit code {returncode}, failed"
    if tail:
        return f"node {node}: exit code 0; its rank (global rank 0) printed:" + "".join("\n  " + line for line in tail)
    return (f"node {node}: exit code 0; its rank trained {steps} steps on its half of each batch and took part in every "
            "all-reduce (rank 0 could not have finished without it); the script prints from global rank 0 only")


def iqr_percent(t: bench.Timing) -> float:
    """A timing's IQR as a percentage of its median."""
    return 100 * (t.q75 - t.q25) / t.median if t.median else float("inf")


def _size(nbytes: float) -> str:
    return f"{nbytes / 2 ** 20:.2g} MiB" if nbytes >= 2 ** 20 else f"{nbytes / 2 ** 10:.3g} KiB"


def doubling_sentence(sizes: list[int], verdicts: list[str], world: int, alpha: float, beta: float,
                      withheld: str | None) -> str:
    """Recursive doubling against our ring: what this run measured at each size (`verdicts`, per size "faster",
    "slower" or "not separated", doubling's time against the ring's) and what the α-β model with this run's α and
    β (s, s/byte) predicts, at this world size and at 8 ranks."""
    def crossover(n: int) -> str:
        n_star = collectives.ring_doubling_crossover(n, alpha, beta)
        if n_star == float("inf"):
            return f"on {n} ranks doubling is never dearer (one message of N against the ring's two of N/2)"
        return f"on {n} ranks the ring is cheaper above {_size(n_star)}"
    model = (f"the α-β model with this run's α = {1e6 * alpha:.0f} µs and 1/β = {1e-9 / beta:.2f} GB/s: "
             f"{crossover(world)}" + ("" if world == 8 else f"; {crossover(8)}"))
    if withheld:
        return f"recursive doubling against our ring: not ranked by this run ({withheld}); {model}"
    by = {v: [_size(s) for s, w in zip(sizes, verdicts) if w == v] for v in ("faster", "slower", "not separated")}
    measured = "; ".join(f"{v} at {', '.join(s)}" for v, s in by.items() if s)
    return f"recursive doubling against our ring on {world} ranks, measured: {measured}. Predicted by {model}"
