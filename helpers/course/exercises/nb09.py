"""Notebook 09's exercises: merging two online-softmax states, a function fixed to one graph, the bytes
of an unfused chain.

The merge is not printed in the notebook (the Triton kernel's first pass folds one block of x into the
state; the exercise combines two states, as split rows do); each chunk's state comes from
`helpers.fusion.triton_softmax.online_update`. The graph-break fix is checked by running the learner's function and by
`torch._dynamo.explain` on it.
"""
from __future__ import annotations

import torch

from helpers.fusion import dynamo, triton_softmax
from helpers.course.check import Case, register

# ---------------------------------------------------------------- 09.online (code)

NEG = float("-inf")


def _chunk_state(chunk: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(m, l) of one chunk of each row: its max and its sum of exp(x - max), (-inf, 0) for an all -inf chunk."""
    rows = chunk.shape[0]
    return triton_softmax.online_update(torch.full((rows,), NEG), torch.zeros(rows), chunk)


def _replay(fn, case: Case):
    """Cut each row into chunks, take every chunk's (m, l), fold them left to right with fn starting from the
    first chunk's state; return (m, l) after each merge."""
    x, width = case.args
    m, l = _chunk_state(x[:, :width])
    seen = []
    for start in range(width, x.shape[1], width):
        cm, cl = _chunk_state(x[:, start:start + width])
        out = fn(m.clone(), l.clone(), cm, cl)
        if out is None:
            raise NotImplementedError("the function returns None")
        m, l = out
        seen += [m, l]
    return tuple(seen)


def _online_cases() -> list[Case]:
    g = torch.Generator().manual_seed(9)
    masked = torch.randn(4, 40, generator=g)
    masked[1, :20] = NEG  # the first blocks of row 1 are all -inf, its last ones finite
    masked[2] = NEG  # a fully masked row: m stays -inf, l stays 0
    ragged = torch.randn(3, 37, generator=g) * 3
    return [
        Case("3 rows, blocks of 8", (torch.randn(3, 32, generator=g), 8)),
        Case("a growing max: each block larger than the last", (torch.arange(48.0).reshape(2, 24), 8)),
        Case("odd width: 37 columns in blocks of 16 (a short last block)", (ragged, 16)),
        Case("large magnitudes (exp would overflow without the max)", (torch.randn(2, 32, generator=g) * 1e3, 8)),
        Case("-inf blocks: a row masked at first, a row masked throughout", (masked, 10)),
    ]


def _merge_reference(m1, l1, m2, l2):
    m = torch.maximum(m1, m2)
    safe = torch.where(m == NEG, torch.zeros_like(m), m)
    return m, l1 * torch.exp(m1 - safe) + l2 * torch.exp(m2 - safe)


def _no_rescale(m1, l1, m2, l2):
    """Planted wrong: the two sums are added as they are, each still against its own max."""
    return torch.maximum(m1, m2), l1 + l2


def _one_side(m1, l1, m2, l2):
    """Planted wrong: only the first sum is rescaled to the common max."""
    m = torch.maximum(m1, m2)
    safe = torch.where(m == NEG, torch.zeros_like(m), m)
    return m, l1 * torch.exp(m1 - safe) + l2


def _nan_on_masked(m1, l1, m2, l2):
    """Planted wrong: no guard, so two empty states give exp(-inf - (-inf)) = NaN."""
    m = torch.maximum(m1, m2)
    return m, l1 * torch.exp(m1 - m) + l2 * torch.exp(m2 - m)


# m and l after each merge; the longest case (48 columns in blocks of 8) merges 5 times
_MERGE_OUTPUTS = tuple(f"{v} after merging chunk {k + 2}" for k in range(16) for v in ("m", "l"))

register(
    "09.online", "code",
    prompt="merge two online-softmax states (m1, l1) and (m2, l2) of two parts of the same rows into the state "
           "of the whole rows",
    hint="each sum was taken against its own max: bring both to one common reference before adding them, and "
         "keep rows whose states are both still empty (max -inf) free of NaN",
    solution=_merge_reference,
    wrong=(_no_rescale, _one_side, _nan_on_masked),
    cases=_online_cases,
    run=_replay,
    rtol=1e-5, atol=1e-6,
    tolerance="m and l after every merge, rtol 1e-5, atol 1e-6 (fp32; -inf and 0 must match exactly)",
    outputs=_MERGE_OUTPUTS,
)


# ---------------------------------------------------------------- 09.one_graph (code)


def scale_by_sign_broken(x):
    """The function the learner fixes: divide by the largest magnitude, flip the sign when the mean is negative."""
    peak = x.abs().max().item()
    if x.mean() > 0:
        return x / peak
    return -x / peak


def _one_graph_reference(x):
    return torch.where(x.mean() > 0, x, -x) / x.abs().max()


def _graphs(fn, case: Case):
    """(fn's output, the number of graphs Dynamo captures for it)."""
    (x,) = case.args
    out = fn(x.clone())
    if out is None:
        raise NotImplementedError("the function returns None")
    return out, dynamo.explain(fn, x.clone())["graphs"]


def _one_graph_cases() -> list[Case]:
    g = torch.Generator().manual_seed(3)
    return [
        Case("positive mean, 4 x 6", (torch.randn(4, 6, generator=g) + 1,)),
        Case("negative mean, 5 x 3", (torch.randn(5, 3, generator=g) - 1,)),
        Case("1-D, 7 entries", (torch.randn(7, generator=g) + 0.5,)),
        Case("a mean of exactly 0 (not positive: negated)", (torch.tensor([[-1.0, 2.0], [1.0, -2.0]]),)),
    ]


def _only_item_fixed(x):
    """Planted wrong: .item() gone, the Python branch still breaks the graph."""
    if x.mean() > 0:
        return x / x.abs().max()
    return -x / x.abs().max()


def _zero_counts_as_positive(x):
    """Planted wrong: one graph, but a mean of exactly 0 keeps the sign (>= instead of >)."""
    return torch.where(x.mean() >= 0, x, -x) / x.abs().max()


def _wrong_sign(x):
    """Planted wrong: one graph, but the sign flipped the wrong way round."""
    return torch.where(x.mean() > 0, -x, x) / x.abs().max()


register(
    "09.one_graph", "code",
    prompt="rewrite scale_by_sign_broken so that it computes the same thing in one graph (no graph breaks)",
    hint="keep the peak a tensor instead of a Python float; compute both signs and let torch.where pick one "
         "by the (tensor) condition",
    solution=_one_graph_reference,
    wrong=(scale_by_sign_broken, _only_item_fixed, _wrong_sign, _zero_counts_as_positive),
    cases=_one_graph_cases,
    run=_graphs,
    rtol=1e-6, atol=1e-6,
    tolerance="the output within 1e-6 and exactly 1 graph from torch._dynamo.explain",
    outputs=("the output", "graphs"), stated=("graphs",),
)


# ---------------------------------------------------------------- 09.residual_bytes (value)

register(
    "09.residual_bytes", "value",
    prompt="eager bias + GELU + scale + residual add on (4096, 4096) fp16 (the residual another (4096, 4096) "
           "tensor; the bias read is negligible): how many MiB does eager mode move?",
    hint="go op by op: which full-size tensors does each read, and which does it write? (the bias is too small "
         "to count); then work out how many MiB one (4096, 4096) fp16 tensor is",
    solution=lambda: (2 + 2 + 2 + 3) * 4096 * 4096 * 2 / 2**20,
    wrong=(6 * 32.0, 3 * 32.0, 8 * 32.0),
    rtol=1e-3,
)
