"""Notebook 05's profiler view of accumulation: one optimizer step profiled at a small and at a large micro-batch
(`profile_splits`: matmul calls and time per split) and the sentences comparing them (`split_profile_lines`).
The sweep they explain is in `accumulation_lab`."""
from __future__ import annotations

import dataclasses
from typing import Sequence

import torch

from helpers.measure import clock, profiling
from helpers.training.accumulation_lab import prepared_step


def profile_splits(model: torch.nn.Module, optimizer: torch.optim.Optimizer, splits: Sequence[tuple[int, int]],
                   seq_len: int, *, device: str = "cpu", autocast_dtype: torch.dtype | None = None,
                   seed: int = 0, warmup: int = 1) -> list[dict]:
    """Profile one optimizer step for each (micro_batch, accum_steps); where its op self time goes.

    `warmup` unprofiled steps come first (0 when these shapes already ran). Each row: micro_batch,
    accum_steps, the Profile of its top 8 ops (`.table()`, trace saved for
    Perfetto), total_ms (self time of every op in the step), matmul_ms, matmul_calls and
    matmul_share (the matrix multiplies among all ops, see `profiling.is_matmul`; attention kernels such as SDPA
    are not counted as matmuls) and ran_share (the share of the profiling's wall time the thread ran: the profiler
    times ops on the wall clock). Raises ValueError for no splits.
    """
    if not splits:
        raise ValueError("splits is empty: give at least one (micro_batch, accum_steps)")
    rows = []
    for micro_batch, accum_steps in splits:
        step, _ = prepared_step(model, optimizer, micro_batch, accum_steps, seq_len, device, autocast_dtype, seed)
        with clock.Stopwatch(tally=False) as sw:  # the profiler reads the wall clock: how much of it the thread ran
            prof = profiling.profile(step, steps=1, warmup=warmup, top=1000, name=f"accumulation_b{micro_batch}_k{accum_steps}")
        mm = [r for r in prof.rows if profiling.is_matmul(r[0])]
        rows.append({"micro_batch": micro_batch, "accum_steps": accum_steps, "device": prof.device,
                     "total_ms": prof.total_ms,
                     "matmul_ms": sum(r[1] for r in mm), "matmul_calls": sum(r[2] for r in mm),
                     "matmul_share": sum(r[3] for r in mm), "ran_share": sw.reading.share,
                     "profile": dataclasses.replace(prof, rows=prof.rows[:8])})
    return rows


def split_profile_lines(rows: Sequence[dict]) -> list[str]:
    """Sentences comparing the first and last profiled split, generated from their numbers; where the extra time
    went is withheld when either profiled step ran on a shared core (its "ran_share" below `clock.SHARED_BELOW`)."""
    small, big = rows[0], rows[-1]
    what = "GPU kernel time" if small.get("device") == "cuda" else "op self time"
    lines = [f"b={r['micro_batch']} (k={r['accum_steps']}): {r['matmul_calls']:.0f} matmul calls per step, "
             f"{r['matmul_ms']:.1f} ms in them = {r['matmul_share']:.0%} of the {r['total_ms']:.1f} ms "
             f"of {what}" for r in ((small, big) if len(rows) > 1 else (small,))]
    if len(rows) > 1 and big["matmul_calls"] > 0:
        calls = small["matmul_calls"] / big["matmul_calls"]
        mm, rest = small["matmul_ms"] / big["matmul_ms"], \
            (small["total_ms"] - small["matmul_ms"]) / max(big["total_ms"] - big["matmul_ms"], 1e-9)
        lines.append(f"the same FLOPs in x{calls:.1f} as many matmul calls: matmul time x{mm:.2f}, "
                     f"the other ops' time x{rest:.2f} at b={small['micro_batch']} against b={big['micro_batch']}")
        shared = [r["ran_share"] for r in (small, big) if r.get("ran_share") is not None and r["ran_share"] < clock.SHARED_BELOW]
        if shared:
            lines.append(f"the profiler times ops on the wall clock, and the thread ran only {min(shared):.0%} of a profiled "
                         "step's wall time (the machine was shared), so where the extra time went is not said from this "
                         "profile; the call counts hold")
        elif max(mm, rest) < 1.1:
            lines.append("neither grew by 10%: in this profile the small micro-batch paid no visible price")
        else:
            extra_mm = small["matmul_ms"] - big["matmul_ms"]
            extra_rest = (small["total_ms"] - small["matmul_ms"]) - (big["total_ms"] - big["matmul_ms"])
            where = "the matmuls themselves (small matmuls run further below the ceiling)" if extra_mm >= extra_rest else \
                "the ops around the matmuls (per-call overheads, elementwise and normalisation ops)"
            lines.append(f"most of the extra time is in {where}; one profiled step each, so read it as a sketch")
    return lines
