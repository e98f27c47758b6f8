"""Notebook 13's ZeRO memory: bytes per rank measured on ranks, and the formulas' plan and figure.

`measure_memory` runs under `helpers.parallel.launch.run_on_ranks`: the bytes of parameters, gradients
and optimizer state each rank holds after one step of DDP, ZeRO-1, ZeRO-2 (`zero.ShardedOptimizer`) and
FSDP (`fsdp.FSDP`). `plan` and `plan_figure` give the same from `zero.zero_formula`, for the
notebook's table, its figure and its instructor panel.
"""
from __future__ import annotations

import torch

from helpers.gpt.footprint import storage_bytes
from helpers.gpt.model import GPT, GPTConfig
from helpers.parallel import ddp, fsdp, zero
from helpers.parallel.ddp_lab import global_batches, lm_loss, local_rows


def measure_memory(rank: int, world: int, cfg_kwargs: dict, seed: int = 0) -> list[dict]:
    """Bytes of parameters, gradients and AdamW state this rank holds after one step, per stage.

    Stages: 0 (our DDP + AdamW), 1 (ZeRO-1), 2 (ZeRO-2), 3 (our FSDP). Every rank returns its rows.
    """
    cfg = GPTConfig(**cfg_kwargs)
    rows = global_batches(cfg, 1, 2 * world, seed)[0]
    out = []
    for stage in (0, 1, 2, 3):
        torch.manual_seed(seed)
        model = GPT(cfg)
        if stage == 3:
            wrap = fsdp.FSDP(model)
            params = list(wrap.parameters())
            opt = torch.optim.AdamW(params, lr=1e-3)
            sync, state = wrap.finish_gradient_synchronization, lambda: opt.state
        else:
            wrap = ddp.DDP(model) if stage < 2 else model
            params = ddp.unique_params(model)
            if stage == 0:
                opt = torch.optim.AdamW(params, lr=1e-3)
                sync, state = wrap.finish_gradient_synchronization, lambda: opt.state
            else:
                opt = zero.ShardedOptimizer(params, torch.optim.AdamW, lr=1e-3)
                sync = wrap.finish_gradient_synchronization if stage == 1 else opt.reduce_gradients
                state = lambda: opt.optimizer.state  # noqa: E731
        lm_loss(wrap, local_rows(rows, rank, world)).backward()
        sync()
        opt.step()
        st = [t for s in state().values() for t in s.values() if torch.is_tensor(t) and t.dim() > 0]
        out.append({"stage": stage, "params": storage_bytes(params),
                    "grads": storage_bytes(p.grad for p in params),
                    "state": storage_bytes(st),
                    "n_params": sum(p.numel() for p in ddp.unique_params(GPT(cfg)))})
        out[-1]["total"] = out[-1]["params"] + out[-1]["grads"] + out[-1]["state"]
        del wrap, model, opt
    return out


def plan(ranks: int, n_params: float, stage: int) -> dict[str, float]:
    """Memory per rank (bytes, fp32 AdamW) and bytes each rank sends per step at a ZeRO stage, from formulas."""
    mem = zero.zero_formula(stage, n_params, ranks)
    ring = (ranks - 1) / ranks  # a ring moves (n-1)/n of a buffer per reduce-scatter or all-gather
    sent = {0: 2, 1: 2, 2: 2, 3: 3}[stage] * ring * 4 * n_params
    return {**mem, "sent": sent}


def plan_figure(ranks: int, n_params: float, stage: int, title: str = "", unit: str = "GiB"):
    """Bars of memory per rank for stages 0-3 at `ranks` ranks, the chosen stage marked; returns the figure.

    `unit`: "GiB" or "MiB" for the y axis (match the table beside it). Raises ValueError for another unit.
    """
    from helpers.show import plots  # heavy: matplotlib, kept out of the ranks' fork server (it preloads this module)

    if unit not in ("GiB", "MiB"):
        raise ValueError(f"unit={unit!r}; choose 'GiB' or 'MiB'")
    scale = 2 ** 30 if unit == "GiB" else 2 ** 20
    fig, ax = plots.figure()
    names = ["DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3"]
    bottom = [0.0] * 4
    for part in ("params", "grads", "state"):
        vals = [plan(ranks, n_params, s)[part] / scale for s in range(4)]
        ax.bar(names, vals, bottom=bottom, label=part)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.bar([names[stage]], [bottom[stage]], fill=False, edgecolor="black", linewidth=2)
    ax.set_ylabel(f"{unit} per rank (fp32 AdamW)")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    return fig


def takeaway(rows: list[list], worst: float, verdict: str) -> str:
    """The notebook's takeaway on ZeRO, from its memory table (rows [ranks, stage name, params, grads, state,
    total MiB, ...]), the largest deviation from the formulas (a fraction) and the ledger's verdict on them."""
    top = max(r[0] for r in rows)
    held = {r[1]: r[5] for r in rows if r[0] == top}  # stage name -> MiB held by the fullest rank
    return (f"ZeRO: memory per rank deviated at most {worst:.1%} from the paper's formulas (ledger: {verdict}); on "
            f"{top} ranks FSDP held {held['ZeRO-3 (FSDP)']:.1f} MiB against DDP's {held['DDP']:.1f} MiB, which costs "
            "1.5x DDP's communication by the paper's count.")
