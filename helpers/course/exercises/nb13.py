"""Notebook 13's exercises: the ring all-reduce's index arithmetic, ZeRO memory per rank, the pipeline bubble,
DDP's bucket assignment.

The ring exercise runs the learner's schedule through `collectives.simulate_ring` (every rank's
chunks, step by step, messages taken before any is applied), so a schedule passes only if every
rank ends with the full sum: the same schedule `ring_all_reduce` runs on real ranks.

The bucket exercise checks the learner's buckets against the course's reference and against the
assignment torch's DDP computes for the same gradients (`torch.distributed._compute_bucket_assignment_by_size`,
what its Reducer calls to build its buckets), so a rule that differs from torch's FAILs with a sentence.

The code exercises refuse the course's own answer: a function that is, or calls, `ring_schedule`
(exercise 1), `zero_formula` / `zero_lab.plan` (exercise 2) or `bucket_assignment` / torch's assignment
(exercise 4) FAILs with "write it yourself".
The references below are written out here for the same reason.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from helpers.course.check import Case, register
from helpers.parallel import collectives, ddp, zero, zero_lab


def _ring_cases() -> list[Case]:
    g = torch.Generator().manual_seed(13)
    cases = []
    for n, size, label in ((2, 6, "2 ranks"), (3, 9, "3 ranks"), (4, 10, "4 ranks, 10 elements: unequal chunks"),
                           (5, 5, "5 ranks, one element each"), (1, 3, "1 rank: nothing to send")):
        cases.append(Case(label, ([torch.randint(-9, 10, (size,), generator=g) for _ in range(n)],)))
    return cases


def _names(code) -> set[str]:
    """Global and attribute names a code object (and the functions nested in it) uses."""
    out = set(code.co_names)
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            out |= _names(const)
    return out


def _refuse_course_answer(fn, course_fns, what: str) -> None:
    """Raise ValueError("write it yourself: ...") when `fn` is, or calls, one of the course's own functions."""
    fn = getattr(fn, "fn", fn)  # check.py hands runners the learner's function in a thin wrapper
    fn = getattr(fn, "func", fn)  # functools.partial
    code = getattr(fn, "__code__", None)
    if any(fn is c for c in course_fns) or (code is not None and _names(code) & {c.__name__ for c in course_fns}):
        raise ValueError(f"write it yourself: your function is or calls the course's {what}; "
                         "the exercise is to write that arithmetic")


def _ring_reference(rank, world_size, step, phase):
    """The reference schedule (the same arithmetic as collectives.ring_schedule)."""
    n = world_size
    if phase == "reduce-scatter":
        return (rank - step) % n, (rank - step - 1) % n
    return (rank + 1 - step) % n, (rank - step) % n


def _run_ring(schedule, case):
    """Every rank's result of a ring all-reduce of the case's inputs under `schedule`."""
    _refuse_course_answer(schedule, (collectives.ring_schedule,), "collectives.ring_schedule")
    probe = schedule(0, 2, 0, "reduce-scatter")
    if probe is None:
        return None
    return collectives.simulate_ring(case.args[0], schedule)


def _wrong_direction(rank, world_size, step, phase):
    """Planted wrong: chunks travel the other way round the ring."""
    n = world_size
    return ((rank + step) % n, (rank + step + 1) % n) if phase == "reduce-scatter" else ((rank + step) % n,
                                                                                          (rank + step + 1) % n)


def _same_both_phases(rank, world_size, step, phase):
    """Planted wrong: the all-gather reuses the reduce-scatter's indices (it starts one chunk too early)."""
    return _ring_reference(rank, world_size, step, "reduce-scatter")


register(
    "13.ring", "code",
    prompt="write ring_schedule(rank, world_size, step, phase) -> (chunk sent to rank+1, chunk received from "
           "rank-1) for phase 'reduce-scatter' and 'all-gather'",
    hint="follow one chunk by hand on 3 ranks: which chunk can rank r send at step 0, and which one does it hold a "
         "new partial sum of after that step? Which chunk is finished on rank r when the reduce-scatter ends? "
         "indices are taken modulo world_size",
    solution=_ring_reference,
    wrong=(_wrong_direction, _same_both_phases),
    cases=_ring_cases, run=_run_ring,
    rtol=0.0, atol=0.0,
    tolerance="exact: integer tensors, every rank's result",
    outputs=tuple(f"rank {k}'s result" for k in range(64)),
)


def _zero_cases() -> list[Case]:
    return [Case(f"stage {s}, {psi} parameters, {n} ranks", (s, psi, n))
            for s, psi, n in ((0, 1000, 4), (1, 1000, 4), (2, 1000, 4), (3, 1000, 4), (2, 7_000_000, 8),
                              (3, 12, 1), (1, 10_000, 64))]


def _zero_total(stage, n_params, world_size, b_param=4, b_grad=4, b_state=8):
    n = world_size
    return (b_param * n_params / (n if stage >= 3 else 1) + b_grad * n_params / (n if stage >= 2 else 1)
            + b_state * n_params / (n if stage >= 1 else 1))


def _zero_reference(stage, n_params, world_size):
    """The reference (the same formula as zero.zero_formula(...)["total"])."""
    return _zero_total(stage, n_params, world_size)


def _zero_no_grad_shard(stage, n_params, world_size):
    """Planted wrong: stage 2 forgets that gradients are sharded too."""
    return _zero_total(1 if stage == 2 else stage, n_params, world_size)


def _zero_paper_bytes(stage, n_params, world_size):
    """Planted wrong: the paper's mixed-precision bytes (2, 2, 12) instead of fp32 Adam's."""
    return _zero_total(stage, n_params, world_size, 2, 2, 12)


def _run_zero(fn, case):
    """The learner's bytes for the case, after refusing the course's own formula."""
    _refuse_course_answer(fn, (zero.zero_formula, zero_lab.plan),
                          "zero.zero_formula or zero_lab.plan")
    return fn(*case.args, **case.kwargs)


register(
    "13.zero", "code",
    prompt="write zero_bytes(stage, n_params, world_size): bytes per rank of parameters + gradients + AdamW state "
           "for fp32 training at ZeRO stage 0 (plain DDP), 1, 2 or 3",
    hint="the ZeRO section's theory counts bytes per parameter for mixed precision and says which of the three "
         "parts each stage shards; work out what one parameter, its gradient and AdamW's state take in fp32",
    solution=_zero_reference,
    wrong=(_zero_no_grad_shard, _zero_paper_bytes),
    cases=_zero_cases, run=_run_zero,
    rtol=1e-9,
    tolerance="relative 1e-9",
)

register(
    "13.bubble", "value",
    prompt="a GPipe schedule over 8 stages with 24 micro-batches per step: what fraction of the step is a "
           "stage idle (a number between 0 and 1, as a fraction a/b or to two digits)?",
    hint="a stage waits while the pipe fills before its first forward and while it drains before its first "
         "backward; the pipeline section's theory names the fraction once you have counted those slots",
    solution=lambda: (8 - 1) / (24 + 8 - 1),
    wrong=(7 / 24, 8 / 24, 1 / 8, 0.22),
    rtol=0.02,
    tolerance="relative 2%: two digits are enough",
)


def _bucket_cases() -> list[Case]:
    mib = 2 ** 20
    tower = [4096, 4 * mib] * 4  # a Linear tower's bias and weight per layer, backward order
    return [Case("a Linear tower: each 4 MiB weight fills a 1 MiB bucket", (tower, mib)),
            Case("small tensors merged into few buckets", ([400, 1200, 20, 1024, 1024, 4], 1024)),
            Case("exactly full buckets", ([256, 256, 256, 256], 512)),
            Case("a bucket bigger than everything: one bucket", ([40, 80, 120], 10 ** 6)),
            Case("one tensor", ([4 * mib], 25 * mib)),
            Case("the last bucket part full", ([300, 300, 300, 300, 300], 1000))]


def _bucket_reference(nbytes, bucket_bytes):
    """The reference (the rule of ddp.bucket_assignment and of torch DDP), written out: the checker
    refuses any answer that calls the course's own function, this one included."""
    buckets, current, size = [], [], 0
    for i, n in enumerate(nbytes):
        current.append(i)
        size += n
        if size >= bucket_bytes:
            buckets.append(current)
            current, size = [], 0
    return buckets + ([current] if current else [])


def torch_buckets(nbytes, bucket_bytes) -> list[list[int]]:
    """torch DDP's bucket assignment for float32 gradients of these sizes (bytes, multiples of 4) in this order."""
    tensors = [torch.empty(n // 4) for n in nbytes]
    return [list(b) for b in dist._compute_bucket_assignment_by_size(tensors, [int(bucket_bytes)])[0]]


def _bucket_close_late(nbytes, bucket_bytes):
    """Planted wrong: closes a bucket only once it is over the size (> instead of >=)."""
    buckets, current, size = [], [], 0
    for i, n in enumerate(nbytes):
        if current and size + n > bucket_bytes:
            buckets.append(current)
            current, size = [], 0
        current.append(i)
        size += n
    return buckets + ([current] if current else [])


def _bucket_forward_order(nbytes, bucket_bytes):
    """Planted wrong: fills buckets from the first registered parameter (the list reversed back)."""
    n = len(nbytes)
    return [[n - 1 - i for i in b] for b in reversed(_bucket_reference(list(reversed(nbytes)), bucket_bytes))]


def _run_bucket(fn, case):
    """The learner's buckets as lists of ints, refused when they differ from torch DDP's for the case."""
    _refuse_course_answer(fn, (ddp.bucket_assignment, dist._compute_bucket_assignment_by_size),
                          "ddp.bucket_assignment or torch's _compute_bucket_assignment_by_size")
    got = fn(*case.args, **case.kwargs)
    if got is None:
        return None
    got = [[int(i) for i in b] for b in got]
    want = torch_buckets(*case.args)
    if got != want:
        raise ValueError(f"your buckets {got} differ from the ones torch DDP builds for these gradients, {want}")
    return got


register(
    "13.bucket", "code",
    prompt="write assign_buckets(nbytes, bucket_bytes): nbytes lists the gradient sizes in bytes in the order "
           "backward produces them (the parameters reversed); return the buckets as lists of positions in "
           "nbytes, in order, each closed as soon as its bytes reach bucket_bytes",
    hint="walk the sizes once, adding each position to the open bucket and its bytes to a running total; close "
         "the bucket when the total reaches bucket_bytes (>=), and keep a last, part-full bucket",
    solution=_bucket_reference,
    wrong=(_bucket_close_late, _bucket_forward_order),
    cases=_bucket_cases, run=_run_bucket,
    rtol=0.0, atol=0.0,
    tolerance="exact: the same buckets as the course's reference and torch DDP's",
    outputs=tuple(f"bucket {k}" for k in range(256)),
)
