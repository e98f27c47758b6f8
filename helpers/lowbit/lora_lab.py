"""Notebook 08's LoRA measurements: full fine-tuning vs LoRA vs QLoRA of the trained course GPT, and their
memory measured from the tensors against `lora.memory_formula`. (Our LoRA against Hugging Face's peft:
`helpers.lowbit.peft_parity`.)

What notebook 08 calls (each prints a table and sentences generated from this run's numbers and returns
the numbers):
- `finetune_section(trained, steps=..., ...)`: full fine-tuning vs LoRA vs QLoRA of the trained GPT
  on a held-out part of the corpus (loss curves on the same batches, drawn against the untuned
  model's loss on each batch; held-out loss before and after; seconds), then the QLoRA adapters
  merged four ways (`lora.merged_variants`: unmerged; into the original 16-bit weights; into the
  dequantised NF4 weights kept in 16 bits; into those weights re-quantised to NF4) with the held-out
  perplexity of each. `finetune_figure(result)` draws the loss curves.
- `memory_section(model, r=...)`: bytes of weights, gradients and optimizer state of full
  fine-tuning, LoRA and QLoRA, measured from the tensors after one AdamW step, beside
  `lora.memory_formula`'s prediction.

Smoke cost on the "tiny" preset (measured on a 2-core CPU shared with other jobs, about 2-3× an idle
one's): `finetune_section(tm, steps=10)` 7-8 s, `memory_section(model)` under 1 s.
In finetune_section, `steps` (three trainings) and `eval_batches` (eight held-out evaluations) set the cost.

Lower-level pieces: `finetune_split`, `prepare`, `finetune`, `train_steps`, `make_optimizer`,
`batch_losses`, `trainable`, `tensor_bytes`, `optimizer_state_bytes`, `memory_rows`.
"""
from __future__ import annotations

import copy
import math
import time

import torch
import torch.nn as nn

from helpers.gpt import data
from helpers.show import plots, tables
from helpers.lowbit.gptq import block_linears, cpu_threads
from helpers.lowbit.lora import KINDS, _positive_int, apply_lora, lora_layers, memory_formula, merged_variants


# ---------------------------------------------------------------- fine-tuning

def finetune_split(frac: float = 0.8) -> tuple[torch.Tensor, torch.Tensor]:
    """The corpus's held-out split (files the trained GPT never saw) cut in two: the first `frac` of
    its bytes to fine-tune on, the rest to evaluate on. Returns (tune_tokens, eval_tokens), uint8."""
    if not 0 < frac < 1:
        raise ValueError(f"frac={frac!r} must be in (0, 1)")
    tokens = data.load_corpus("val")
    cut = int(len(tokens) * frac)
    return tokens[:cut], tokens[cut:]


def trainable(model: nn.Module) -> list[nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def prepare(model: nn.Module, kind: str, r: int = 8, alpha: float | None = None, seed: int = 0) -> nn.Module:
    """The model to fine-tune for `kind`: "full" (a copy, every parameter trainable), "lora"
    (`apply_lora` on the fp32 base) or "qlora" (`apply_lora` on an NF4 base)."""
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r}; choose one of {', '.join(map(repr, KINDS))}")
    if kind == "full":
        m = copy.deepcopy(model)
        for p in m.parameters():
            p.requires_grad_(True)
        return m
    return apply_lora(model, r, alpha, base="fp32" if kind == "lora" else "nf4", seed=seed)


def finetune(model: nn.Module, steps: int, lr: float, tokens: torch.Tensor, *, batch: int = 8,
             seq_len: int = 64, seed: int = 0, optimizer: str = "adamw") -> list[float]:
    """Train `model`'s trainable parameters in place for `steps` AdamW steps (betas 0.9/0.999, no
    weight decay, constant lr) on random windows of `tokens` drawn from a generator seeded with
    `seed` (the same batches for every model). optimizer: "adamw" (torch) or "adamw8bit"
    (bitsandbytes). Returns the training loss of each step (nats/byte). Leaves the model in eval mode."""
    _positive_int("steps", steps)
    if not (isinstance(lr, (int, float)) and lr > 0):
        raise ValueError(f"lr={lr!r} must be a positive number")
    params = trainable(model)
    if not params:
        raise ValueError("the model has no trainable parameters")
    return train_steps(model, make_optimizer(optimizer, params, lr), steps, tokens, batch, seq_len, seed)


def train_steps(model: nn.Module, opt, steps: int, tokens: torch.Tensor, batch: int, seq_len: int,
                seed: int) -> list[float]:
    """`steps` steps of `opt` on windows of `tokens` from a generator seeded with `seed`; the losses."""
    device = next(model.parameters()).device
    g = torch.Generator().manual_seed(seed)
    losses = []
    model.train()
    for _ in range(steps):
        x, y = data.get_batch(tokens, batch, seq_len, device, generator=g)
        loss = model(x, y)[1]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    model.eval()
    return losses


@torch.no_grad()
def batch_losses(model: nn.Module, steps: int, tokens: torch.Tensor, *, batch: int = 8, seq_len: int = 64,
                 seed: int = 0) -> list[float]:
    """The loss of `model`, untrained, on the batches `finetune(..., seed=seed)` would draw at each step:
    the baseline that takes the batch-to-batch variation out of a fine-tuning curve."""
    g = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    was = model.training
    model.eval()
    out = [float(model(*data.get_batch(tokens, batch, seq_len, device, generator=g))[1]) for _ in range(steps)]
    model.train(was)
    return out


def make_optimizer(name: str, params, lr: float):
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    if name == "adamw8bit":
        import bitsandbytes as bnb

        return bnb.optim.AdamW8bit(params, lr=lr, weight_decay=0.0)
    raise ValueError(f"optimizer={name!r}; choose 'adamw' or 'adamw8bit'")


def _eval_loss(model: nn.Module, tokens: torch.Tensor, batches: int) -> float:
    from helpers.gpt.pretrained import validation_loss

    return validation_loss(model, tokens, seq_len=min(128, model.config.seq_len), batches=batches, batch=8)


def finetune_section(trained, steps: int = 30, *, lr_full: float = 3e-4, lr_lora: float = 3e-3, r: int = 8,
                     alpha: float | None = None, batch: int = 8, seq_len: int = 64, eval_batches: int = 2,
                     seed: int = 0) -> dict:
    """Fine-tune `trained.model` (a helpers.gpt.pretrained.Trained, or a GPT) on `finetune_split()`'s first
    part three ways (full, LoRA, QLoRA; the same batches), print the held-out loss before and after and
    the seconds of each, then the QLoRA adapters merged four ways (`merged_variants`) with the
    held-out loss and perplexity of each. LoRA's learning rate is higher than full fine-tuning's, as
    is usual for adapters (both are parameters).

    Returns {"losses": {kind: [loss per step]}, "untuned": [the untrained model's loss on each step's
    batch], "before": float, "after": {kind: float},
    "seconds": {kind: float}, "trainable": {kind: int}, "merged": {label: (loss, perplexity)}}.
    Losses are nats/byte; held-out losses on `eval_batches` fixed windows of the second part."""
    for name, value in (("steps", steps), ("r", r), ("batch", batch), ("seq_len", seq_len),
                        ("eval_batches", eval_batches)):
        _positive_int(name, value)
    for name, value in (("lr_full", lr_full), ("lr_lora", lr_lora)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ValueError(f"{name}={value!r} must be a positive number")
    model = getattr(trained, "model", trained)
    tune, held = finetune_split()
    res = {"losses": {}, "after": {}, "seconds": {}, "trainable": {}, "steps": steps}
    with cpu_threads(next(model.parameters()).device):
        res["before"] = _eval_loss(model, held, eval_batches)
        res["before_nf4"] = _eval_loss(prepare(model, "qlora", r, alpha, seed), held, eval_batches)  # B = 0: the NF4 base
        res["untuned"] = batch_losses(model, steps, tune, batch=batch, seq_len=seq_len, seed=seed)
        tuned = {}
        for kind in KINDS:
            m = prepare(model, kind, r, alpha, seed)
            res["trainable"][kind] = sum(p.numel() for p in trainable(m))
            t0 = time.perf_counter()
            res["losses"][kind] = finetune(m, steps, lr_full if kind == "full" else lr_lora, tune,
                                           batch=batch, seq_len=seq_len, seed=seed)
            res["seconds"][kind] = time.perf_counter() - t0
            res["after"][kind] = _eval_loss(m, held, eval_batches)
            tuned[kind] = m
        res["merged"] = {label: (loss := _eval_loss(m, held, eval_batches), math.exp(loss))
                         for label, m in merged_variants(tuned["qlora"], model).items()}
    res["eval_windows"] = (f" (on {eval_batches} batches of 8 windows of {min(128, model.config.seq_len)} bytes from the "
                           "second part of the held-out split, which fine-tuning does not train on)")
    _print_finetune(res)
    return res


def _gain(res: dict, kind: str, last: int) -> float:
    """Mean over the last `last` steps of (training loss − the untuned model's loss on the same batch)."""
    pairs = list(zip(res["losses"][kind], res["untuned"]))[-last:]
    return sum(a - b for a, b in pairs) / len(pairs)


def _print_finetune(res: dict) -> None:
    before = res["before"]
    last = max(1, len(res["untuned"]) // 4)
    print(tables.table(
        ["method", "trainable params", f"training loss − untuned, last {last} steps", "held-out loss after",
         "seconds"],
        [[k, res["trainable"][k], f"{_gain(res, k, last):+.4f}", f"{res['after'][k]:.4f}", f"{res['seconds'][k]:.1f}"]
         for k in KINDS]))
    start = {k: res.get("before_nf4", before) if k == "qlora" else before for k in KINDS}
    parts = ", ".join(f"{k} {res['after'][k] - before:+.4f}" for k in KINDS)
    best = min(KINDS, key=lambda k: res["after"][k] - start[k])
    worse = [k for k in KINDS if res["after"][k] > start[k]]
    windows = res.get("eval_windows", "")
    nf4 = ""
    if "before_nf4" in res:
        nf4 = (f" QLoRA starts from its NF4 base, at {res['before_nf4']:.4f} before any step ({res['before_nf4'] - before:+.4f}"
               f" against the 16-bit model): against that start its change is {res['after']['qlora'] - start['qlora']:+.4f}, "
               "and its training-loss column, measured against the untuned 16-bit model, carries the same offset.")
    print(f"Held-out loss before fine-tuning: {before:.4f} nats/byte{windows}; change after {res['steps']} steps: "
          f"{parts}.{nf4} " + _verdict(worse, best, res["steps"], {k: _gain(res, k, last) for k in KINDS}))
    merged = res["merged"]
    print(tables.table(["QLoRA adapters shipped as", "held-out loss", "perplexity"],
                       [[k, f"{v[0]:.4f}", f"{v[1]:.4f}"] for k, v in merged.items()]))
    ref = merged["QLoRA, unmerged"][0]
    diffs = {k: v[0] - ref for k, v in merged.items() if k != "QLoRA, unmerged"}
    worst = max(diffs, key=lambda k: abs(diffs[k]))
    print("Against the adapters as trained (unmerged on the NF4 base): "
          + "; ".join(f"{k} {d:+.5f} nats/byte" for k, d in diffs.items())
          + f". The largest change is '{worst}'" + _merge_reason(worst, diffs[worst]))


def _verdict(worse: list, best: str, steps: int, gains: dict) -> str:
    """One sentence on the held-out change of the fine-tuning methods (each against its own start), from
    which of them made it worse and whether their training loss on the tuning batches fell (`gains`:
    training − untuned 16-bit model, per kind)."""
    if not worse:
        return f"All three lowered it from where they started; the largest drop: {best}."
    head = (f"All three made the held-out loss worse (the least: {best})." if len(worse) == len(KINDS)
            else f"The largest drop: {best}; {', '.join(worse)} made the held-out loss worse.")
    text = head + f" At this size that can happen: {steps} steps on a tiny model move it little and noisily."
    fell = [k for k in worse if gains[k] < 0]
    flat = [k for k in worse if gains[k] >= 0 and k != "qlora"]  # QLoRA's gain includes its NF4 base's error
    if fell:
        text += (f" The training loss on the tuning batches fell for {', '.join(fell)}: the update fitted those "
                 "files without carrying over to the evaluation files.")
    if flat:
        text += (f" For {', '.join(flat)} the training loss on the tuning batches did not fall either: too few "
                 "steps, or too high a learning rate, to gain.")
    return text


def _merge_reason(worst: str, diff: float) -> str:
    """Why the largest change among the merged variants went the way it did (sign-aware)."""
    if worst != "merged into original 16-bit W":
        return "."
    if diff < 0:
        return (": lower, because the adapters are the same and only the base differs: the NF4 rounding error of "
                "the base is gone, and here that gain outweighs the mismatch with the NF4 base the adapters were "
                "trained against.")
    return (": higher, because the adapters were trained against the NF4 weights, and adding them to the original "
            "weights changes the function they were fitted to.")


def finetune_figure(res: dict, ax=None):
    """Training loss of each fine-tuning method at each step minus the untuned model's loss on the same
    batch (`finetune_section`'s result): below 0 the model has learned something about these files."""
    fig, ax = plots.axes(ax, "fine-tuning: training loss minus the untuned model's")
    for i, k in enumerate(KINDS):
        diff = [a - b for a, b in zip(res["losses"][k], res["untuned"])]
        ax.plot(range(1, len(diff) + 1), diff, color=plots.COLORS[i], label=f"{k} ({res['trainable'][k]:,} trainable)")
    ax.axhline(0, color="gray", ls="--", lw=1, label="untuned model")
    ax.set_xlabel("step")
    ax.set_ylabel("Δ loss (nats/byte)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------- memory

def tensor_bytes(tensors) -> int:
    """Bytes of distinct tensor storages among `tensors` (a tensor seen twice, or two views of one
    storage, count once)."""
    seen, total = set(), 0
    for t in tensors:
        if not torch.is_tensor(t) or t.device.type == "meta":
            continue
        key = (t.device, t.untyped_storage().data_ptr())
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
    return total


def _weight_tensors(model: nn.Module) -> list[torch.Tensor]:
    """Every tensor that holds the model's weights: parameters, buffers and 4-bit quantisation state."""
    out = list(model.parameters()) + list(model.buffers())
    for m in model.modules():
        qs = getattr(getattr(m, "weight", None), "quant_state", None)
        while qs is not None:
            out += [t for t in (qs.absmax, qs.code, getattr(qs, "offset", None)) if torch.is_tensor(t)]
            qs = qs.state2 if getattr(qs, "nested", False) else None
    return out


def _code_tables(module: nn.Module) -> list[torch.Tensor]:
    """The lookup tables (NF4's 16 levels, the 8-bit code of double quantisation) of a 4-bit module."""
    out, qs = [], getattr(getattr(module, "weight", None), "quant_state", None)
    while qs is not None:
        out.append(qs.code)
        qs = qs.state2 if getattr(qs, "nested", False) else None
    return out


def optimizer_state_bytes(opt: torch.optim.Optimizer) -> tuple[int, dict]:
    """Bytes of an optimizer's state tensors (scalar step counters left out) and, per parameter
    tensor, {param: {"numel", "bytes", "dtypes"}} (tables shared by all tensors, such as
    bitsandbytes' 256-value quantisation maps, are counted once in the total and not per tensor)."""
    per, total_tensors = {}, []
    for p, st in opt.state.items():
        tens = [v for k, v in st.items() if torch.is_tensor(v) and v.numel() > 1]
        own = [v for k, v in st.items() if torch.is_tensor(v) and v.numel() > 1 and not k.startswith("qmap")]
        per[p] = {"numel": p.numel(), "bytes": sum(v.nbytes for v in own),
                  "dtypes": sorted({str(v.dtype).replace("torch.", "") for v in own})}
        total_tensors += tens
    return tensor_bytes(total_tensors), per


def _one_step(model: nn.Module, optimizer: str = "adamw", seed: int = 0) -> torch.optim.Optimizer:
    tune, _ = finetune_split()
    params = trainable(model)
    opt = make_optimizer(optimizer, params, 1e-4)
    x, y = data.get_batch(tune, 2, 32, next(model.parameters()).device, generator=torch.Generator().manual_seed(seed))
    model.train()
    model(x, y)[1].backward()
    opt.step()
    model.eval()
    return opt


def memory_rows(model: nn.Module, r: int = 8, alpha: float | None = None) -> list[dict]:
    """Measured and predicted bytes of weights, gradients and AdamW state for full fine-tuning, LoRA and
    QLoRA of `model` (after one step on a small batch). Returns [{"method", "measured": {...},
    "formula": {...}, "trainable"}], bytes."""
    lin = block_linears(model)
    n_linear = sum(m.weight.numel() for m in lin.values())
    n_all = sum(p.numel() for p in model.parameters())
    rows = []
    with cpu_threads(next(model.parameters()).device):
        for kind in KINDS:
            m = prepare(model, kind, r, alpha)
            n_lora = sum(a.lora_A.numel() + a.lora_B.numel() for a in lora_layers(m).values())
            opt = _one_step(m)
            measured = {"weights": tensor_bytes(_weight_tensors(m)),
                        "gradients": tensor_bytes(p.grad for p in m.parameters() if p.grad is not None),
                        "optimizer": optimizer_state_bytes(opt)[0]}
            codes = tensor_bytes(t for a in lora_layers(m).values() for t in _code_tables(a.base))
            rows.append({"method": kind, "measured": measured, "trainable": sum(p.numel() for p in trainable(m)),
                         "code_tables": codes,
                         "formula": memory_formula(n_linear, n_all - n_linear, n_lora, kind)})
    return rows


def memory_section(model: nn.Module, r: int = 8, alpha: float | None = None) -> list[dict]:
    """Print `memory_rows` (KiB measured vs formula for each part) and one sentence from the numbers."""
    rows = memory_rows(model, r, alpha)
    parts = ("weights", "gradients", "optimizer")
    body = []
    for row in rows:
        for part in parts:
            meas, form = row["measured"][part], row["formula"][part]
            body.append([row["method"], part, f"{meas / 1024:.1f}", f"{form / 1024:.1f}",
                         f"{(meas - form) / max(form, 1) * 100:+.1f}%"])
    print(tables.table(["method", "part", "measured KiB", "formula KiB", "difference"], body))
    tot = {row["method"]: sum(row["measured"].values()) for row in rows}
    worst = max(((row["method"], p, abs(row["measured"][p] - row["formula"][p]) / max(row["formula"][p], 1))
                 for row in rows for p in parts), key=lambda t: t[2])
    q = next(row for row in rows if row["method"] == "qlora")
    gap = q["measured"]["weights"] - q["formula"]["weights"]
    print(f"Weights + gradients + AdamW state: full {tot['full'] / 1024:.0f} KiB, LoRA {tot['lora'] / 1024:.0f} KiB "
          f"({tot['full'] / tot['lora']:.1f}× less), QLoRA {tot['qlora'] / 1024:.0f} KiB "
          f"({tot['full'] / tot['qlora']:.1f}× less). The measured bytes differ from the formulas by at most "
          f"{worst[2] * 100:.1f}% ({worst[0]} {worst[1]}). QLoRA's weights measure {gap / 1024:+.1f} KiB against "
          f"the formula; the quantisation code tables, one set per layer, which the formula leaves out, "
          f"take {q['code_tables'] / 1024:.1f} KiB of them.")
    return rows
