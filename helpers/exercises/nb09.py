"""Notebook 09's exercises: the online softmax's block update, a function fixed to one graph, the bytes
of an unfused chain.

The online update's reference is `helpers.triton_softmax.online_update`, what the Triton kernel's first
pass computes; the graph-break fix is checked by running the learner's function and by
`torch._dynamo.explain` on it.
"""
from __future__ import annotations

import torch

from helpers import compiler, triton_softmax
from helpers.check import Case, register

# ---------------------------------------------------------------- 09.online (code)

NEG = float("-inf")


def _replay(fn, case: Case):
    """Feed a row matrix block by block through fn from m=-inf, l=0; return (m, l) after each block."""
    x, width = case.args
    rows = x.shape[0]
    m, l = torch.full((rows,), NEG), torch.zeros(rows)
    seen = []
    for start in range(0, x.shape[1], width):
        out = fn(m.clone(), l.clone(), x[:, start:start + width].clone())
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


def _no_rescale(m, l, block):
    """Planted wrong: the old sum is not rescaled when the max grows."""
    m_new = torch.maximum(m, block.amax(-1))
    safe = torch.where(m_new == NEG, torch.zeros_like(m_new), m_new)
    return m_new, l + torch.exp(block - safe[:, None]).sum(-1)


def _nan_on_masked(m, l, block):
    """Planted wrong: no guard, so an all -inf prefix gives exp(-inf - (-inf)) = NaN."""
    m_new = torch.maximum(m, block.amax(-1))
    return m_new, l * torch.exp(m - m_new) + torch.exp(block - m_new[:, None]).sum(-1)


register(
    "09.online", "code",
    prompt="write the online softmax's block update: new running max and running sum of exp(x - max)",
    hint="the new max is the larger of the old one and the block's; the old sum was taken against the old max, "
         "so scale it by exp(old - new) before adding the block's exps; subtract 0 instead of the max while "
         "the max is still -inf",
    solution=triton_softmax.online_update,
    wrong=(_no_rescale, _nan_on_masked),
    cases=_online_cases,
    run=_replay,
    rtol=1e-5, atol=1e-6,
    tolerance="m and l after every block, rtol 1e-5, atol 1e-6 (fp32; -inf and 0 must match exactly)",
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
    return out, compiler.explain(fn, x.clone())["graphs"]


def _one_graph_cases() -> list[Case]:
    g = torch.Generator().manual_seed(3)
    return [
        Case("positive mean, 4 x 6", (torch.randn(4, 6, generator=g) + 1,)),
        Case("negative mean, 5 x 3", (torch.randn(5, 3, generator=g) - 1,)),
        Case("1-D, 7 entries", (torch.randn(7, generator=g) + 0.5,)),
    ]


def _only_item_fixed(x):
    """Planted wrong: .item() gone, the Python branch still breaks the graph."""
    if x.mean() > 0:
        return x / x.abs().max()
    return -x / x.abs().max()


def _wrong_sign(x):
    """Planted wrong: one graph, but the sign flipped the wrong way round."""
    return torch.where(x.mean() > 0, -x, x) / x.abs().max()


register(
    "09.one_graph", "code",
    prompt="rewrite scale_by_sign_broken so that it computes the same thing in one graph (no graph breaks)",
    hint="keep the peak a tensor instead of a Python float; compute both signs and let torch.where pick one "
         "by the (tensor) condition",
    solution=_one_graph_reference,
    wrong=(scale_by_sign_broken, _only_item_fixed, _wrong_sign),
    cases=_one_graph_cases,
    run=_graphs,
    rtol=1e-6, atol=1e-6,
    tolerance="the output within 1e-6 and exactly 1 graph from torch._dynamo.explain",
)


# ---------------------------------------------------------------- 09.residual_bytes (value)

register(
    "09.residual_bytes", "value",
    prompt="eager bias + GELU + scale + residual add on (4096, 4096) fp16 (the residual another (4096, 4096) "
           "tensor; the bias read is negligible): how many MiB does eager mode move?",
    hint="each of the four ops reads its full-size tensor inputs once and writes its output once; count how "
         "many full-size inputs the last add has; one (4096, 4096) fp16 tensor is 32 MiB",
    solution=lambda: (2 + 2 + 2 + 3) * 4096 * 4096 * 2 / 2**20,
    wrong=(6 * 32.0, 3 * 32.0, 8 * 32.0),
    rtol=1e-3,
)
