"""Notebook 08's 8-bit optimizer measurements (Dettmers et al., 2022, "8-bit Optimizers via Block-wise
Quantization"): bitsandbytes `AdamW8bit` against torch's AdamW on the course GPT.

`AdamW8bit` keeps both Adam moments as uint8 codes with one fp32 absmax per block of 256 values, except for
tensors with fewer than `min_8bit_size` (default 4096) elements, whose state stays fp32 (bitsandbytes'
Optimizer8bit.init_state: `if p.numel() < config["min_8bit_size"]`).
`compare_optimizers(model, steps=...)` measures state bytes per parameter of torch AdamW vs AdamW8bit tensor by
tensor (`threshold_probe` finds where the 32-bit threshold falls, `update_gap` how far the 8-bit state moves an
update) and the losses of a few steps of each on the same batches (`helpers.lowbit.lora`'s fine-tuning loop);
`shown_tensors` picks the table's rows and `optimizer_sentences` says what the numbers show (the notebook prints).
"""
from __future__ import annotations

import torch
from torch import nn

from helpers.lowbit.lora import finetune_split, make_optimizer, optimizer_state_bytes, prepare, train_steps, trainable
from helpers.measure import bench
from helpers.measure.params import positive


# ---------------------------------------------------------------- 8-bit optimizer state

MIN_8BIT_SIZE = 4096  # bitsandbytes' default min_8bit_size: smaller tensors keep fp32 optimizer state
BNB_STATE_BLOCK = 256  # bitsandbytes' blockwise 8-bit optimizer state: one fp32 absmax per 256 values


def threshold_probe(sizes=(MIN_8BIT_SIZE - 1, MIN_8BIT_SIZE), device: str = "cpu") -> dict[int, str]:
    """The dtype of bitsandbytes AdamW8bit's first moment after one step on a 1-D tensor of each size:
    {numel: "float32" or "uint8"}; finds where the 32-bit threshold (min_8bit_size) falls."""
    import bitsandbytes as bnb  # heavy: it imports triton, and only this section needs it

    out = {}
    for n in sizes:
        p = nn.Parameter(torch.zeros(positive("size", n), device=device))
        opt = bnb.optim.AdamW8bit([p])
        p.grad = torch.ones_like(p)
        opt.step()
        out[n] = str(opt.state[p]["state1"].dtype).replace("torch.", "")
    return out


def update_gap(steps: int = 5, shape=(64, 128), lr: float = 1e-3, seed: int = 0, device: str = "cpu") -> float:
    """||Δp(AdamW8bit) − Δp(AdamW)|| / ||Δp(AdamW)|| after `steps` steps of both optimizers on one
    tensor of `shape` with the same random gradients (no weight decay): how far 8-bit state moves the
    update."""
    import bitsandbytes as bnb  # heavy: it imports triton, and only this section needs it

    g = torch.Generator().manual_seed(seed)
    p0 = torch.randn(shape, generator=g)
    grads = [torch.randn(shape, generator=g) for _ in range(positive("steps", steps))]
    moved = {}
    for name, cls in (("adamw", torch.optim.AdamW), ("adamw8bit", bnb.optim.AdamW8bit)):
        p = nn.Parameter(p0.clone().to(device))
        opt = cls([p], lr=lr, weight_decay=0.0)
        for grad in grads:
            p.grad = grad.to(device)
            opt.step()
        moved[name] = (p.detach() - p0.to(device)).float()
    return float((moved["adamw8bit"] - moved["adamw"]).norm() / moved["adamw"].norm())


def compare_optimizers(model: nn.Module, steps: int = 5, *, lr: float = 1e-3, batch: int = 8, seq_len: int = 64,
                      seed: int = 0) -> dict:
    """Full fine-tuning of two copies of `model` on the same batches, one with torch.optim.AdamW and
    one with bitsandbytes AdamW8bit: state bytes per parameter measured tensor by tensor (tensors
    below bitsandbytes' min_8bit_size = 4096 elements keep fp32 state), and the training loss of
    each step. Returns
    {"losses": {"adamw": [...], "adamw8bit": [...]}, "bytes_per_param": {name: float},
    "tensors": [{"name", "numel", "adamw", "adamw8bit", "dtypes8"}], "state_bytes": {name: int},
    "threshold": `threshold_probe()`, "update_gap": `update_gap()`}."""
    positive("steps", steps)
    tune, _ = finetune_split()
    res = {"losses": {}, "state_bytes": {}, "bytes_per_param": {}}
    per = {}
    with bench.cpu_threads(next(model.parameters()).device):
        for name in ("adamw", "adamw8bit"):
            m = prepare(model, "full")
            params = trainable(m)
            opt = make_optimizer(name, params, lr)
            res["losses"][name] = train_steps(m, opt, steps, tune, batch, seq_len, seed)
            total, per_tensor = optimizer_state_bytes(opt)
            res["state_bytes"][name] = total
            res["bytes_per_param"][name] = total / sum(p.numel() for p in params)
            names = {id(p): n for n, p in m.named_parameters()}
            per[name] = {names[id(p)]: v for p, v in per_tensor.items()}
        res["threshold"] = threshold_probe(device=str(next(model.parameters()).device))
        res["update_gap"] = update_gap(device=str(next(model.parameters()).device))
    res["tensors"] = [{"name": n, "numel": v["numel"], "adamw": v["bytes"] / v["numel"],
                       "adamw8bit": per["adamw8bit"][n]["bytes"] / v["numel"],
                       "dtypes8": "/".join(per["adamw8bit"][n]["dtypes"])} for n, v in per["adamw"].items()]
    return res


def shown_tensors(res: dict) -> list[dict]:
    """The tensors of `compare_optimizers`' result a table shows: the four largest with 8-bit state's size class
    (at least MIN_8BIT_SIZE elements), then the three largest below it."""
    rows = res["tensors"]
    small = [t for t in rows if t["numel"] < MIN_8BIT_SIZE]
    large = [t for t in rows if t["numel"] >= MIN_8BIT_SIZE]
    return sorted(large, key=lambda t: -t["numel"])[:4] + sorted(small, key=lambda t: -t["numel"])[:3]


def optimizer_sentences(res: dict) -> list[str]:
    """Three sentences from `compare_optimizers`' numbers: which tensors got uint8 state (and whether that brackets
    bitsandbytes' threshold), the one-tensor probes, and the whole model's state and losses."""
    rows = res["tensors"]
    eight = [t for t in rows if "uint8" in t["dtypes8"]]
    smallest8 = min((t["numel"] for t in eight), default=None)
    largest32 = max((t["numel"] for t in rows if "uint8" not in t["dtypes8"]), default=None)
    out = [f"{len(eight)} of {len(rows)} tensors got uint8 state (the smallest of them has {smallest8} elements); "
           f"the largest tensor left in fp32 state has {largest32} elements, consistent with bitsandbytes' "
           f"min_8bit_size of {MIN_8BIT_SIZE}." if smallest8 and largest32 and largest32 < MIN_8BIT_SIZE <= smallest8
           else f"{len(eight)} of {len(rows)} tensors got uint8 state; the threshold {MIN_8BIT_SIZE} is not "
                f"bracketed by this model's tensor sizes (smallest uint8: {smallest8}, largest fp32: {largest32})."]
    probe = ", ".join(f"{n} elements → {d}" for n, d in res["threshold"].items())
    out.append(f"Probing one-tensor optimizers directly: {probe}. The update after 5 steps on one 64×128 tensor with "
               f"the same gradients differs from AdamW's by {res['update_gap'] * 100:.2f}% (relative norm).")
    bpp = res["bytes_per_param"]
    la, lb = res["losses"]["adamw"], res["losses"]["adamw8bit"]
    gap = max(abs(a - b) for a, b in zip(la, lb))
    out.append(f"Optimizer state over the whole model: AdamW {bpp['adamw']:.2f} bytes/param, AdamW8bit "
               f"{bpp['adamw8bit']:.2f} ({bpp['adamw'] / bpp['adamw8bit']:.1f}× less"
               + (f"; above the 2 bytes of two uint8 moments because of the fp32 small tensors and one fp32 absmax "
                  f"per {BNB_STATE_BLOCK} values" if bpp["adamw8bit"] > 2 else "") +
               f"). Training loss at each of {len(la)} steps (the loss before that step's update): the last is AdamW "
               f"{la[-1]:.5f}, AdamW8bit {lb[-1]:.5f}; the largest per-step gap is {gap:.1e} nats/byte.")
    return out
