"""Notebook 05's exercises: the 1/k over-weighting, all-reduces without no_sync, the token-weighted loop.

The code exercise's reference is the gradient of ONE batch (the micro-batches concatenated): a
correct accumulation loop must reproduce it whatever the padding. Every case hands the learner's
function a model whose `.grad` still holds the previous step's gradients, so a loop that forgets
to zero them fails.
"""
from __future__ import annotations

import torch

from helpers.course.check import Case, register
from helpers.gpt.model import GPT, GPTConfig
from helpers.training.accumulation import pad_to_lengths

IGNORE_INDEX = -1  # the course GPT's cross_entropy ignore_index: padded targets count for nothing
_VOCAB, _SEQ = 32, 16


# ---------------------------------------------------------------- 05.overweight

register(
    "05.overweight", "value",
    prompt="two micro-batches of 100 and 300 counted tokens, each loss scaled by 1/k: by what factor is "
           "one token of the first over-weighted compared with the one-batch loss?",
    hint="write each token's weight in the one-batch loss (1 over all counted tokens) and under 1/k "
         "scaling (1/k times 1 over its own micro-batch's tokens), then divide",
    solution=lambda: (1 / 2 / 100) / (1 / 400),
    wrong=(0.5, 1.0, 0.75),
    rtol=1e-3,
)


# ---------------------------------------------------------------- 05.allreduces

register(
    "05.allreduces", "value",
    prompt="E = 1024 sequences per step, 32 data-parallel ranks, micro-batch 4, no no_sync(): how many "
           "backward passes per optimizer step all-reduce the gradients on each rank?",
    hint="first find k from E = b x k x R; DDP all-reduces at the end of every backward that runs outside no_sync()",
    solution=lambda: 1024 // (4 * 32),
    wrong=(1, 32, 256),
    rtol=1e-9,
)


# ---------------------------------------------------------------- 05.accumulate (code)

def one_batch_reference(model: torch.nn.Module, micro_batches) -> float:
    """Zero the gradients, then backward the micro-batches concatenated into one batch; its loss.

    micro_batches: list of (x, y), int64 (b_i, T) each, same T. The loss is the mean over every
    counted target (y != -1), the quantity a token-weighted accumulation loop must reproduce.
    """
    model.zero_grad(set_to_none=True)
    x = torch.cat([mb[0] for mb in micro_batches])  # (sum b_i, T)
    y = torch.cat([mb[1] for mb in micro_batches])  # (sum b_i, T)
    _, loss = model(x, y)
    loss.backward()
    return loss.item()


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    cfg = GPTConfig(n_layer=1, n_head=2, d_model=16, d_ff=32, vocab_size=_VOCAB, seq_len=_SEQ)
    return GPT(cfg, attn_impl="naive")


def _batch(seed: int, sizes: list[int], T: int, lengths: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Micro-batches of the given sizes; row r keeps lengths[r] counted targets, the rest is padding."""
    g = torch.Generator().manual_seed(seed)
    B = sum(sizes)
    x = torch.randint(0, _VOCAB, (B, T), generator=g)  # (B, T)
    y = pad_to_lengths(torch.randint(0, _VOCAB, (B, T), generator=g), lengths, IGNORE_INDEX)  # (B, T)
    return list(zip(x.split(sizes), y.split(sizes)))


def _cases() -> list[Case]:
    return [
        Case("4 micro-batches, unequal lengths", (_batch(1, [2, 2, 2, 2], 12, [12, 12, 3, 7, 12, 1, 9, 5]),),
             {"seed": 0}),
        Case("one micro-batch mostly padding (1 counted token)", (_batch(2, [3, 3], 10, [10, 8, 9, 1, 0, 0]),),
             {"seed": 1}),
        Case("k=1 (nothing to accumulate)", (_batch(3, [4], 8, [8, 5, 2, 8]),), {"seed": 2}),
        Case("odd sizes: T=7, last micro-batch smaller", (_batch(4, [3, 3, 1], 7, [7, 2, 5, 7, 7, 3, 6]),),
             {"seed": 3}),
        Case("one micro-batch all padding", (_batch(5, [2, 2, 2], 9, [9, 4, 0, 0, 6, 9]),), {"seed": 4}),
    ]


def _run(fn, case: Case):
    """Call fn(model, micro_batches) on a model holding stale gradients; (returned loss, gradients)."""
    model = _model(case.kwargs["seed"])
    g = torch.Generator().manual_seed(99)
    for p in model.parameters():  # what the previous optimizer step left behind
        p.grad = torch.randn(p.shape, generator=g)
    loss = fn(model, *case.args)
    if loss is None:
        raise NotImplementedError("the function returns None")
    grads = {n: (p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p))
             for n, p in model.named_parameters()}
    return float(loss), grads


def _mean_of_means(model, micro_batches):
    """Planted wrong: every micro-batch's mean loss scaled by 1/k."""
    model.zero_grad(set_to_none=True)
    total = 0.0
    for x, y in micro_batches:
        if (y != IGNORE_INDEX).any():
            _, loss = model(x, y)
            (loss / len(micro_batches)).backward()
            total += loss.item() / len(micro_batches)
    return total


def _no_zero_grad(model, micro_batches):
    """Planted wrong: token-weighted, but the previous step's gradients are never cleared."""
    n = [int((y != IGNORE_INDEX).sum()) for _, y in micro_batches]
    total = 0.0
    for (x, y), n_i in zip(micro_batches, n):
        if n_i:
            _, loss = model(x, y)
            (loss * n_i / sum(n)).backward()
            total += loss.item() * n_i / sum(n)
    return total


def _no_skip(model, micro_batches):
    """Planted wrong: token-weighted and zeroed, but an all-padding micro-batch's NaN loss is kept."""
    model.zero_grad(set_to_none=True)
    n = [int((y != IGNORE_INDEX).sum()) for _, y in micro_batches]
    total = 0.0
    for (x, y), n_i in zip(micro_batches, n):
        _, loss = model(x, y)
        (loss * n_i / sum(n)).backward()
        total += loss.item() * n_i / sum(n)
    return total


register(
    "05.accumulate", "code",
    prompt="write the token-weighted accumulation loop: zero the gradients, backward every micro-batch so "
           "that .grad ends as the one-batch gradient, return the one-batch loss",
    hint="count every micro-batch's targets that are not -1 before the first backward; each micro-batch's "
         "mean loss then needs the share of all counted tokens that it holds; a micro-batch with no counted "
         "token has a 0/0 loss; and .grad adds up across steps until something clears it",
    solution=one_batch_reference,
    cases=_cases,
    run=_run,
    outputs=("the loss you returned", "the gradients left in .grad"),
    wrong=(_mean_of_means, _no_zero_grad, _no_skip),
    rtol=1e-5, atol=1e-6,
    tolerance="rtol=1e-5, atol=1e-6: fp32, the sums only happen in another order",
)
