"""Notebook 09's profile of one compiled call, read: the share of its profiled time in the kernel Inductor wrote
(`fused_kernel_share`), the profiler's rows with Inductor's internal record names given a readable label
(`labelled`), and the sentence built from both numbers and the timing table's medians (`profile_sentence`).

The profiles themselves are `helpers.measure.profiling.profile`'s; nothing here times anything.
"""
from __future__ import annotations

import dataclasses
import re

from helpers.measure import profiling

# Inductor records each call of a compiled graph as "## Call CompiledFxGraph <its FX-graph cache key> ##"
# (torch/_inductor/output_code.py): a 52-character key a reader cannot use, so the table shows its first 8.
_GRAPH_CALL = re.compile(r"^## Call CompiledFxGraph (\w+) ##$")


def row_label(op: str) -> str:
    """The name a profile table shows for profiler row `op`: Inductor's record of a compiled graph's call becomes
    "Call CompiledFxGraph (FX-graph cache key <first 8 characters>…)"; any other name is returned as it is."""
    m = _GRAPH_CALL.match(op)
    return f"Call CompiledFxGraph (FX-graph cache key {m.group(1)[:8]}…)" if m else op


def labelled(profile: profiling.Profile) -> profiling.Profile:
    """A copy of `profile` whose rows carry `row_label`'s names (times, calls and shares unchanged)."""
    return dataclasses.replace(profile, rows=[(row_label(op), *rest) for op, *rest in profile.rows])


def fused_kernel_share(rows: list[tuple[str, float, float, float]]) -> float:
    """Share (0..1) of a profile's self time spent in the kernels Inductor wrote (rows named *cpp_fused* on a
    CPU, triton_* on a GPU); `profiling.Profile.rows` as input."""
    return sum(share for op, _, _, share in rows if "cpp_fused" in op or op.startswith("triton_"))


def profile_sentence(share: float, compiled_ms: float, eager_ms: float, timed: tuple[float, float] | None = None) -> str:
    """What the compiled call's profile says (`fused_kernel_share`'s share of a call's profiled time), conditional on
    the number: almost all work (>= 80% in the fused kernel), work and overhead both (30-80%), or mostly
    overhead (the wrapper: guards, the cache lookup). timed: (compiled, eager) ms of the unprofiled timing table."""
    where = ("a compiled call is almost all the fused kernel's own work: per-call overhead is not what limits it"
             if share >= 0.8 else
             f"the wrapper around the kernel (guards, the cache lookup) took the other {1 - share:.0%}, so at this size "
             "both the kernel and the per-call overhead count" if share >= 0.3 else
             "most of a compiled call is overhead around the kernel (guards, the cache lookup, the wrapper): per-call "
             "costs limit it at this size")
    text = (f"The fused kernel took {share:.0%} of the compiled call's profiled time ({compiled_ms:.3f} ms of profiled self time "
            f"per call, eager {eager_ms:.3f} ms): {where}.")
    if timed:
        r = (compiled_ms / timed[0], eager_ms / timed[1])
        text += (f" Timed without the profiler (the table above) the calls took {timed[0]:.3f} ms and {timed[1]:.3f} ms; the "
                 f"profiled self times are {r[0]:.2f}x and {r[1]:.2f}x those. They include the profiler's own cost for each op "
                 "it records, and the profiled steps ran at another moment than the timed rounds" + ("; here the two agree "
                 "within 25%." if 0.8 <= min(r) and max(r) <= 1.25 else ", so read the profile for shares, the table for times."))
    return text
