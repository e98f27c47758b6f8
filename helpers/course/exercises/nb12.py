"""Notebook 12's exercises: the block-diagonal causal mask, per-document positions, the padding fraction, workers.

References are `helpers.dataload.packing`'s own functions, so a learner who passes has written what the
notebook's packed training runs.
"""
from __future__ import annotations

import math

import torch

from helpers.dataload import packing
from helpers.course.check import Case, register


def _doc_cases() -> list[Case]:
    return [
        Case("two documents then padding", (torch.tensor([[0, 0, 0, 1, 1, -1, -1]]),)),
        Case("one document fills the row", (torch.tensor([[5, 5, 5, 5]]),)),
        Case("a row of padding only", (torch.tensor([[-1, -1, -1]]),)),
        Case("ids in any order, three rows, odd length 7",
             (torch.tensor([[3, 3, 0, 0, 0, 7, 7], [2, 1, 1, 1, 1, 1, -1], [9, 9, 9, 9, 9, 9, 9]]),)),
        Case("documents of one token", (torch.tensor([[0, 1, 2, 3, -1]]),)),
    ]


def _causal_only(doc):
    """Planted wrong: plain causal attention over the whole row (documents see each other)."""
    T = doc.size(-1)
    return torch.ones(T, T, dtype=torch.bool).tril().expand(doc.size(0), T, T)


def _blocks_only(doc):
    """Planted wrong: same document, but no causal triangle (a token sees its document's future)."""
    return doc[..., :, None] == doc[..., None, :]


def _padding_empty(doc):
    """Planted wrong: padding attends to nothing (its softmax rows are empty and become NaN)."""
    return packing.block_causal_mask(doc) & (doc[..., :, None] >= 0)


def _with_dtype(fn, case):
    """Runs the function on a case; returns (its output, its dtype's name) so a wrong dtype FAILs by name."""
    out = fn(*case.args, **case.kwargs)
    if out is None:
        return None
    return out, str(getattr(out, "dtype", type(out).__name__)).replace("torch.", "")


register(
    "12.mask", "code",
    prompt="write block_causal_mask(doc): (R, T) document ids (-1 = padding) -> (R, T, T) bool, True where "
           "query i may attend to key j",
    hint="two conditions, combined with &: the key holds the same document id as the query (compare doc with "
         "itself along two new axes), and the key is not in the query's future (a lower triangle); padding's -1 "
         "is treated like any other id",
    solution=packing.block_causal_mask,
    wrong=(_causal_only, _blocks_only, _padding_empty),
    cases=_doc_cases,
    run=_with_dtype, outputs=("mask", "dtype (bool expected)"),
    rtol=0.0, atol=0.0,
    tolerance="exact: every entry of the mask, and its dtype",
)


def _no_restart(doc):
    """Planted wrong: positions 0..T-1 along the row, as an unpacked sequence would have."""
    return torch.arange(doc.size(-1)).expand_as(doc).clone()


def _off_by_one(doc):
    """Planted wrong: positions restart at 1."""
    return torch.where(doc >= 0, packing.positions_from_doc(doc) + 1, torch.zeros_like(doc))


def _float_positions(doc):
    """Planted wrong: the right values as float32 (an embedding table cannot be indexed with them)."""
    return packing.positions_from_doc(doc).float()


register(
    "12.positions", "code",
    prompt="write positions_from_doc(doc): (R, T) document ids -> (R, T) int64 position ids that restart at 0 "
           "at each document's first slot (0 on padding)",
    hint="a document starts at slot 0 and wherever the id changes from the slot before; a running maximum "
         "(cummax) of the start slots gives each slot its document's start; subtract it from the slot index",
    solution=packing.positions_from_doc,
    wrong=(_no_restart, _off_by_one, _float_positions),
    cases=_doc_cases,
    run=_with_dtype, outputs=("positions", "dtype (int64 expected)"),
    rtol=0.0, atol=0.0,
    tolerance="exact: every position id, and the dtype int64",
)

EX_LENGTHS = (100, 20, 60, 12, 128, 36)  # the exercise's documents; rows of 128 tokens

register(
    "12.pad_fraction", "value",
    prompt="six documents of 100, 20, 60, 12, 128 and 36 tokens, one per row, padded to rows of 128: what share "
           "of the slots is padding (a fraction between 0 and 1)?",
    hint="count the slots (rows x row length) and the tokens; the rest is padding",
    solution=lambda: 1 - sum(EX_LENGTHS) / (len(EX_LENGTHS) * 128),
    wrong=(sum(EX_LENGTHS) / (len(EX_LENGTHS) * 128), 1 - sum(EX_LENGTHS) / (3 * 128), 0.5),
    rtol=1e-3,
)

register(
    "12.workers", "value",
    prompt="each item takes 4 ms to produce, a batch holds 32 items and the device computes a step in 40 ms: "
           "how many workers, at the fewest, keep the device from waiting for data?",
    hint="one worker builds a whole batch by itself; several workers build different batches at the same time, "
         "so they must together finish one batch per step",
    solution=lambda: math.ceil(32 * 4 / 40),
    wrong=(32 * 4 / 40, 32, 1, 10),
    rtol=1e-9,
)
