"""Grouped-query and multi-query attention made from a trained multi-head model, then uptrained (Ainslie et al.,
2023, "GQA: Training Generalized Multi-Query Transformer Models from Multi-Head Checkpoints", arXiv:2305.13245).

The course GPT's `kv_proj` (`helpers.gpt.model.CausalSelfAttention`) maps d_model to 2 * n_kv_head * head_dim
rows: the keys of heads 0 .. n_kv_head - 1, then their values, head_dim rows per head. A multi-head model
(n_kv_head = n_head) becomes one with G kv heads by splitting its n_head heads into G groups of n_head / G
consecutive heads (kv head g serves query heads g * n_head / G .. (g + 1) * n_head / G - 1, as the model's
`repeat_interleave` assigns them) and replacing each group's key and value weights and biases by their mean
(`pool_kv_heads`, `convert`); every other weight is copied. The paper then continues training (uptrains) for a
small share of the pre-training steps (5% in their runs) with the pre-training recipe, so that the model adapts to
its pooled heads; `uptrain` does this with `helpers.gpt.pretrained.train`'s recipe on the same training split.

Shapes: a kv_proj weight (2 * n_head * head_dim, d_model) becomes (2 * G * head_dim, d_model), its bias
(2 * n_head * head_dim,) becomes (2 * G * head_dim,). Errors: ValueError for a model that is not multi-head, a G
that is not a positive divisor of n_head, or non-positive steps or batch.
"""
from __future__ import annotations

import copy
import math
from dataclasses import replace

import torch

from helpers.gpt import data
from helpers.gpt.model import GPT
from helpers.measure.params import positive

BETAS, WEIGHT_DECAY = (0.9, 0.95), 0.1  # pretrained.train's AdamW
WARMUP_SHARE, FINAL_LR_SHARE = 0.05, 0.1  # pretrained.train's schedule: 5% warm-up, cosine down to 10% of the peak
PAPER_SHARE = 0.05  # Ainslie et al. (2023) uptrain for 5% of the pre-training steps


def check_kv_heads(n_head: int, n_kv_head: int) -> int:
    """`n_kv_head` when it is a positive int dividing `n_head` (each kv head then serves a whole group of query
    heads); raises ValueError naming both otherwise."""
    positive("n_kv_head", n_kv_head)
    if n_head % n_kv_head:
        raise ValueError(f"n_kv_head={n_kv_head} must divide n_head={n_head}: each kv head serves a whole group of "
                         f"query heads; choose one of {[d for d in range(1, n_head + 1) if n_head % d == 0]}")
    return n_kv_head


def pool_kv_heads(w: torch.Tensor, n_head: int, n_kv_head: int) -> torch.Tensor:
    """A multi-head kv_proj weight (2 * n_head * hd, d_model) or bias (2 * n_head * hd,) pooled to `n_kv_head`
    heads: each new head is the mean of the n_head // n_kv_head consecutive heads of its group."""
    group = n_head // check_kv_heads(n_head, n_kv_head)
    # the rows are [keys of heads 0 .. n_head - 1 | values of heads 0 .. n_head - 1], hd rows a head
    heads = w.reshape(2, n_head, -1, *w.shape[1:])  # (2, n_head, hd[, d_model])
    # group g holds heads g * group .. (g + 1) * group - 1: the query heads kv head g will serve
    grouped = heads.reshape(2, n_kv_head, group, *heads.shape[2:])  # (2, n_kv_head, group, hd[, d_model])
    # the mean over each group's heads: one key head and one value head per group
    return grouped.mean(2).reshape(-1, *w.shape[1:])  # (2 * n_kv_head * hd[, d_model])


def convert(model: GPT, n_kv_head: int) -> GPT:
    """A new course GPT with `n_kv_head` kv heads made from the multi-head `model`: every layer's kv_proj weight
    and bias mean-pooled per group (`pool_kv_heads`), every other weight copied; eval mode, on the model's
    device and dtype. `model` is left as it was."""
    cfg = model.config
    if cfg.n_kv_head != cfg.n_head:
        raise ValueError(f"convert needs a multi-head model (n_kv_head == n_head); this one has n_kv_head="
                         f"{cfg.n_kv_head} of n_head={cfg.n_head}")
    check_kv_heads(cfg.n_head, n_kv_head)
    p = next(model.parameters())
    # the same architecture with fewer kv heads: only the kv_proj shapes differ
    pooled = GPT(replace(cfg, n_kv_head=n_kv_head)).to(device=p.device, dtype=p.dtype)
    state = model.state_dict()  # every weight of the trained model, by name
    for name, tensor in state.items():
        if ".kv_proj." in name:  # keys and values: each group's heads mean-pooled into one head
            state[name] = pool_kv_heads(tensor, cfg.n_head, n_kv_head)
    pooled.load_state_dict(state)  # strict: every other weight copied as it is, none missing or left over
    pooled.attn_impl = model.attn_impl
    return pooled.eval()


def uptrain_schedule(schedule: dict, share: float, batch: int | None = None) -> dict:
    """The uptraining schedule for a model pre-trained with `schedule` (`helpers.gpt.pretrained.schedule_for`):
    round(share * its steps) steps (at least one), its sequence length, `batch` windows a step (None: its own)
    and a peak learning rate of FINAL_LR_SHARE of its peak, the rate its cosine ended on, so that training goes
    on from where it stopped rather than restarting at full rate. Raises ValueError for a share outside (0, 1]
    or a non-positive batch."""
    if not (isinstance(share, (int, float)) and not isinstance(share, bool) and 0 < share <= 1):
        raise ValueError(f"share={share!r} must be a fraction of the pre-training steps in (0, 1]")
    return {**schedule, "steps": max(1, round(share * schedule["steps"])), "lr": FINAL_LR_SHARE * schedule["lr"],
            "batch": positive("batch", batch) if batch is not None else schedule["batch"]}


def warmup_steps(steps: int) -> int:
    """The steps of `uptrain`'s linear warm-up: WARMUP_SHARE of `steps`, rounded, at least one."""
    return max(1, round(WARMUP_SHARE * positive("steps", steps)))


def learning_rate(schedule: dict, step: int) -> float:
    """The rate `uptrain` sets for step `step` (0-based) of `schedule`: (step + 1) / w of the peak schedule['lr'] over
    the w = `warmup_steps` first steps (so the last of them, and the very first step when w is 1, runs at the
    peak), then a cosine from the peak toward FINAL_LR_SHARE of it, which it would reach one step after the last.
    Raises ValueError for a step outside 0 .. steps - 1."""
    steps = schedule["steps"]
    warm = warmup_steps(steps)
    if not 0 <= step < steps:
        raise ValueError(f"step={step!r} must be from 0 to steps - 1 = {steps - 1}")
    decay = 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, steps - warm)))
    share = (step + 1) / warm if step < warm else FINAL_LR_SHARE + (1 - FINAL_LR_SHARE) * decay
    return schedule["lr"] * share


def uptrain(model: GPT, schedule: dict, *, seed: int = 0) -> GPT:
    """A copy of `model` trained schedule['steps'] more steps (`uptrain_schedule`) with `helpers.gpt.pretrained.train`'s recipe: AdamW (betas
    0.9/0.95, weight decay 0.1), gradients clipped to norm 1, batches of schedule['batch'] windows of
    schedule['seq_len'] tokens from the training split, each step at `learning_rate`'s rate (a linear warm-up over 5%
    of the steps, at least one, to the peak schedule['lr'], then a cosine decay toward 10% of it); bf16 autocast on CUDA, fp32 elsewhere. The batches come from a
    generator seeded with `seed`, so every model uptrained with the same seed sees the same text. Returns the
    copy in eval mode; `model` is left as it was."""
    steps = positive("steps", schedule["steps"])
    out = copy.deepcopy(model).train()
    p = next(out.parameters())
    opt = torch.optim.AdamW(out.parameters(), lr=schedule["lr"], betas=BETAS, weight_decay=WEIGHT_DECAY)
    tokens = data.load_corpus("train")
    g = torch.Generator().manual_seed(seed)
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = learning_rate(schedule, step)
        x, y = data.get_batch(tokens, schedule["batch"], schedule["seq_len"], p.device, generator=g)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=p.device.type == "cuda"):
            loss = out(x, y)[1]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(out.parameters(), 1.0)
        opt.step()
    return out.eval()
