"""Notebook 13's exercises: the ring all-reduce's index arithmetic, ZeRO memory per rank, the pipeline bubble.

The ring exercise runs the learner's schedule through `distributed.simulate_ring` (every rank's
chunks, step by step, messages taken before any is applied), so a schedule passes only if every
rank ends with the full sum: the same schedule `ring_all_reduce` runs on real ranks.
"""
from __future__ import annotations

import torch

from helpers import distributed as D
from helpers import parallel as P
from helpers.check import Case, register


def _ring_cases() -> list[Case]:
    g = torch.Generator().manual_seed(13)
    cases = []
    for n, size, label in ((2, 6, "2 ranks"), (3, 9, "3 ranks"), (4, 10, "4 ranks, 10 elements: unequal chunks"),
                           (5, 5, "5 ranks, one element each"), (1, 3, "1 rank: nothing to send")):
        cases.append(Case(label, ([torch.randint(-9, 10, (size,), generator=g) for _ in range(n)],)))
    return cases


def _run_ring(schedule, case):
    """Every rank's result of a ring all-reduce of the case's inputs under `schedule`."""
    probe = schedule(0, 2, 0, "reduce-scatter")
    if probe is None:
        return None
    return D.simulate_ring(case.args[0], schedule)


def _wrong_direction(rank, world_size, step, phase):
    """Planted wrong: chunks travel the other way round the ring."""
    n = world_size
    return ((rank + step) % n, (rank + step + 1) % n) if phase == "reduce-scatter" else ((rank + step) % n,
                                                                                          (rank + step + 1) % n)


def _same_both_phases(rank, world_size, step, phase):
    """Planted wrong: the all-gather reuses the reduce-scatter's indices (it starts one chunk too early)."""
    return D.ring_schedule(rank, world_size, step, "reduce-scatter")


register(
    "13.ring", "code",
    prompt="write ring_schedule(rank, world_size, step, phase) -> (chunk sent to rank+1, chunk received from "
           "rank-1) for phase 'reduce-scatter' and 'all-gather'",
    hint="in the reduce-scatter a rank first sends its own chunk, then each step passes on the chunk it has just "
         "added into; after n-1 steps rank r holds the finished sum of one chunk, which the all-gather sends "
         "first; indices are taken modulo world_size",
    solution=D.ring_schedule,
    wrong=(_wrong_direction, _same_both_phases),
    cases=_ring_cases, run=_run_ring,
    rtol=0.0, atol=0.0,
    tolerance="exact: integer tensors, every rank's result",
)


def _zero_cases() -> list[Case]:
    return [Case(f"stage {s}, {psi} parameters, {n} ranks", (s, psi, n))
            for s, psi, n in ((0, 1000, 4), (1, 1000, 4), (2, 1000, 4), (3, 1000, 4), (2, 7_000_000, 8),
                              (3, 12, 1), (1, 10_000, 64))]


def _zero_reference(stage, n_params, world_size):
    return P.zero_formula(stage, n_params, world_size)["total"]


def _zero_no_grad_shard(stage, n_params, world_size):
    """Planted wrong: stage 2 forgets that gradients are sharded too."""
    return P.zero_formula(min(stage, 1) if stage == 2 else stage, n_params, world_size)["total"]


def _zero_paper_bytes(stage, n_params, world_size):
    """Planted wrong: the paper's mixed-precision bytes (2, 2, 12) instead of fp32 Adam's."""
    return P.zero_formula(stage, n_params, world_size, 2, 2, 12)["total"]


register(
    "13.zero", "code",
    prompt="write zero_bytes(stage, n_params, world_size): bytes per rank of parameters + gradients + AdamW state "
           "for fp32 training at ZeRO stage 0 (plain DDP), 1, 2 or 3",
    hint="fp32 parameters and gradients take 4 bytes each, AdamW keeps two fp32 moments; stage 1 divides the "
         "optimizer state by the number of ranks, stage 2 also the gradients, stage 3 also the parameters",
    solution=_zero_reference,
    wrong=(_zero_no_grad_shard, _zero_paper_bytes),
    cases=_zero_cases,
    rtol=1e-9,
    tolerance="relative 1e-9",
)

register(
    "13.bubble", "value",
    prompt="a GPipe schedule over 8 stages with 24 micro-batches per step: what fraction of the step is a "
           "stage idle (a number between 0 and 1)?",
    hint="the first stage starts its backward only after the last micro-batch has gone through every stage; "
         "count the idle slots against all slots",
    solution=lambda: (8 - 1) / (24 + 8 - 1),
    wrong=(7 / 24, 8 / 24, 1 / 8),
    rtol=1e-3,
)
