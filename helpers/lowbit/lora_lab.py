"""Notebook 08's fine-tuning measurements: full fine-tuning vs LoRA vs QLoRA of the trained course GPT, and
their memory measured from the tensors against `lora.memory_formula`.

Each measurement returns its numbers; the notebook prints them, with the sentences these functions generate
from them:
- `finetune_compare(trained, steps=..., ...)`: full fine-tuning vs LoRA vs QLoRA of the trained GPT
  on a held-out part of the corpus (loss curves on the same batches, drawn against the untuned
  model's loss on each batch; held-out loss before and after; seconds), then the QLoRA adapters
  merged four ways (`lora.merged_variants`: unmerged; into the original 16-bit weights; into the
  dequantised NF4 weights kept in 16 bits; into those weights re-quantised to NF4) with the held-out
  perplexity of each. `finetune_figure(result)` draws the loss curves. `steps` (three trainings) and
  `eval_batches` (eight held-out evaluations) set its cost. `gain` / `last_steps` give the table's
  training-loss column, `finetune_sentence` and `merged_sentence` say what the numbers show.
- `memory_rows(model, r=...)`: bytes of weights, gradients and optimizer state of full
  fine-tuning, LoRA and QLoRA, measured from the tensors after one AdamW step, beside
  `lora.memory_formula`'s prediction; `memory_sentence` sums them up.
- `qlora_65b_claim(bits, blocksize)`: the ledger's formula verdict on QLoRA's "65B on one 48 GB GPU" from the
  bits per parameter measured in the run (activations not counted).
- `takeaways`: the notebook's takeaway bullets on fine-tuning, generated from the run's numbers.
The fine-tuning sentences rank the methods (and the merged variants) only where a gap exceeds twice the
standard error of the per-window difference (`helpers.gpt.heldout.gap_separated`).
Our LoRA and QLoRA against Hugging Face's peft are `helpers.lowbit.peft_lab`.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn

from helpers.gpt import data
from helpers.gpt.footprint import storage_bytes
from helpers.gpt.heldout import gap_separated, loss_gap, window_losses, yardstick
from helpers.gpt.pretrained import validation_loss
from helpers.lowbit.gptq import block_linears
from helpers.lowbit.lora import (FINETUNE, KINDS, finetune, finetune_gb, finetune_split, lora_layers, make_optimizer,
                                 memory_formula, merged_variants, optimizer_state_bytes, prepare,
                                 trainable)
from helpers.measure import bench, clock as clocks
from helpers.measure.params import positive
from helpers.show import plots


# ---------------------------------------------------------------- fine-tuning

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


def _eval_loss(model: nn.Module, tokens: torch.Tensor, batches: int) -> float:
    return validation_loss(model, tokens, seq_len=min(128, model.config.seq_len), batches=batches, batch=8)


def _eval_windows(model: nn.Module, tokens: torch.Tensor, batches: int) -> torch.Tensor:
    """The per-window losses whose mean is `_eval_loss` (the same windows)."""
    return window_losses(model, tokens, seq_len=min(128, model.config.seq_len), batches=batches, batch=8)


def finetune_compare(trained, steps: int = 30, *, lr_full: float = 3e-4, lr_lora: float = 3e-3, r: int = 8,
                     alpha: float | None = None, batch: int = 8, seq_len: int = 64, eval_batches: int = 2,
                     seed: int = 0) -> dict:
    """Fine-tune `trained.model` (a helpers.gpt.pretrained.Trained, or a GPT) on `finetune_split()`'s first
    part three ways (full, LoRA, QLoRA; the same batches), measuring the held-out loss before and after and
    the seconds of each, then the QLoRA adapters merged four ways (`merged_variants`) with the
    held-out loss and perplexity of each. LoRA's learning rate is higher than full fine-tuning's, as
    is usual for adapters (both are parameters).

    Returns {"losses": {kind: [loss per step]}, "untuned": [the untrained model's loss on each step's
    batch], "before": float, "after": {kind: float},
    "seconds": {kind: float} (the thread's CPU seconds with torch on one CPU thread, else wall; "clock" says
    which), "trainable": {kind: int}, "merged": {label: (loss, perplexity)}}.
    Losses are nats/byte; held-out losses on `eval_batches` fixed batches of windows of the second part;
    "windows": {"before", "before_nf4", kind, "merged: " + label: per-window losses}, from which the sentences
    rank a difference only when it exceeds twice its standard error (`heldout.gap_separated`)."""
    for name, value in (("steps", steps), ("r", r), ("batch", batch), ("seq_len", seq_len),
                        ("eval_batches", eval_batches)):
        positive(name, value)
    for name, value in (("lr_full", lr_full), ("lr_lora", lr_lora)):
        positive(name, float(value) if type(value) is int else value, float)
    model = getattr(trained, "model", trained)
    tune, held = finetune_split()
    res = {"losses": {}, "after": {}, "seconds": {}, "trainable": {}, "steps": steps}
    dev = next(model.parameters()).device
    with bench.cpu_threads(dev):
        read = bench.resolve_clock(dev.type)
        res["clock"] = read
        win = res["windows"] = {"before": _eval_windows(model, held, eval_batches),
                                "before_nf4": _eval_windows(prepare(model, "qlora", r, alpha, seed), held, eval_batches)}
        res["before"], res["before_nf4"] = float(win["before"].mean()), float(win["before_nf4"].mean())  # B = 0: NF4 base
        res["untuned"] = batch_losses(model, steps, tune, batch=batch, seq_len=seq_len, seed=seed)
        tuned = {}
        for kind in KINDS:
            m = prepare(model, kind, r, alpha, seed)
            res["trainable"][kind] = sum(p.numel() for p in trainable(m))
            with clocks.Stopwatch() as sw:  # the thread's CPU seconds on a CPU with one torch thread, else wall
                res["losses"][kind] = finetune(m, steps, lr_full if kind == "full" else lr_lora, tune,
                                               batch=batch, seq_len=seq_len, seed=seed)
                bench.sync(dev)
            res["seconds"][kind] = sw.cpu if read == clocks.THREAD else sw.wall
            win[kind] = _eval_windows(m, held, eval_batches)
            res["after"][kind] = float(win[kind].mean())
            tuned[kind] = m
        res["merged"] = {}
        for label, m in merged_variants(tuned["qlora"], model).items():
            win["merged: " + label] = _eval_windows(m, held, eval_batches)
            loss = float(win["merged: " + label].mean())
            res["merged"][label] = (loss, math.exp(loss))
    res["eval_windows"] = (f" (on {eval_batches} batches of 8 windows of {min(128, model.config.seq_len)} bytes from the "
                           "second part of the held-out split, which fine-tuning does not train on)")
    return res


def last_steps(res: dict) -> int:
    """How many final steps `gain` averages over: a quarter of the run (at least one)."""
    return max(1, len(res["untuned"]) // 4)


def gain(res: dict, kind: str, last: int) -> float:
    """Mean over the last `last` steps of (training loss − the untuned model's loss on the same batch)."""
    pairs = list(zip(res["losses"][kind], res["untuned"]))[-last:]
    return sum(a - b for a, b in pairs) / len(pairs)


def finetune_sentence(res: dict) -> str:
    """What `finetune_compare`'s numbers say about the held-out loss: the loss before, each method's change, QLoRA's
    NF4 start, and which method gained most, ranked only beyond the noise of the per-window differences."""
    before = res["before"]
    last = last_steps(res)
    start = {k: res.get("before_nf4", before) if k == "qlora" else before for k in KINDS}
    parts = ", ".join(f"{k} {res['after'][k] - before:+.4f}" for k in KINDS)
    best = min(KINDS, key=lambda k: res["after"][k] - start[k])
    worse = [k for k in KINDS if res["after"][k] > start[k]]
    win = res.get("windows")
    drops = None
    if win:  # per-window change of each method against its own start: the noise the ranking must beat
        drops = {k: win[k] - win["before_nf4" if k == "qlora" else "before"] for k in KINDS}
    windows = res.get("eval_windows", "")
    nf4 = ""
    if "before_nf4" in res:
        nf4 = (f" QLoRA starts from its NF4 base, at {res['before_nf4']:.4f} before any step ({res['before_nf4'] - before:+.4f}"
               f" against the 16-bit model): against that start its change is {res['after']['qlora'] - start['qlora']:+.4f}, "
               "and its training-loss column, measured against the untuned 16-bit model, carries the same offset.")
    return (f"Held-out loss before fine-tuning: {before:.4f} nats/byte{windows}; change after {res['steps']} steps: "
            f"{parts}.{nf4} " + _verdict(worse, best, res["steps"], {k: gain(res, k, last) for k in KINDS}, drops))


def merged_sentence(res: dict) -> str:
    """What the merged variants' held-out losses say against the adapters as trained: each one's change, and the
    largest, or the two largest when the noise cannot tell them apart."""
    merged, win = res["merged"], res.get("windows")
    ref = merged["QLoRA, unmerged"][0]
    diffs = {k: v[0] - ref for k, v in merged.items() if k != "QLoRA, unmerged"}
    order = sorted(diffs, key=lambda k: -abs(diffs[k]))
    worst = order[0]
    text = (f". The largest change is '{worst}'" + _merge_reason(worst, diffs[worst]))
    if win and len(order) > 1:
        a, b = win["merged: " + worst], win["merged: " + order[1]]
        if not gap_separated(a, b):
            text = (f". The largest changes, '{worst}' and '{order[1]}', cannot be told apart "
                    f"({abs(diffs[worst] - diffs[order[1]]):.4f} nats/byte apart; {yardstick(a, b)})"
                    + _merge_reason(worst, diffs[worst]))
    return ("Against the adapters as trained (unmerged on the NF4 base): "
            + "; ".join(f"{k} {d:+.5f} nats/byte" for k, d in diffs.items()) + text)


def _ranked_best(best: str, drops: dict | None) -> str:
    """The words for the best fine-tuning method: its name when its change beats every other's by more than the
    noise yardstick (`drops`: per-window change of each method against its own start), else who ties with it."""
    if drops is None:
        return best
    tied = [k for k in drops if k != best and not gap_separated(drops[best], drops[k])]
    if not tied:
        return best
    mean, _ = loss_gap(drops[best], drops[tied[0]])
    return (f"not named, as {', '.join([best] + tied)} cannot be told apart ({abs(mean):.4f} nats/byte apart; "
            f"{yardstick(drops[best], drops[tied[0]])})")


def _verdict(worse: list, best: str, steps: int, gains: dict, drops: dict | None = None) -> str:
    """One sentence on the held-out change of the fine-tuning methods (each against its own start), from
    which of them made it worse and whether their training loss on the tuning batches fell (`gains`:
    training − untuned 16-bit model, per kind). `drops` (per-window changes, as `_ranked_best` takes them):
    the best is named only when it beats the others by more than the noise."""
    who = _ranked_best(best, drops)
    if drops is not None:  # a change counts only beyond its noise: twice its standard error over the windows
        zero = {k: torch.zeros_like(d) for k, d in drops.items()}
        moved = {k: gap_separated(drops[k], zero[k]) for k in drops}
        worse = [k for k in worse if moved[k]]
        flat = [k for k in drops if not moved[k]]
        if flat:
            lowered = [k for k in drops if moved[k] and float(drops[k].mean()) < 0]
            text = (f"Against its own start, {', '.join(flat)} changed the held-out loss by less than the noise "
                    f"({yardstick(drops[flat[0]], zero[flat[0]])})"
                    + (f"; {', '.join(lowered)} lowered it" if lowered else "")
                    + (f"; {', '.join(worse)} raised it" if worse else "") + f"; the largest drop: {who}.")
            return text + _training_note(worse, steps, gains)
    if not worse:
        return f"All three lowered it from where they started; the largest drop: {who}."
    head = (f"All three made the held-out loss worse (the least: {who})." if len(worse) == len(KINDS)
            else f"The largest drop: {who}; {', '.join(worse)} made the held-out loss worse.")
    return head + f" At this size that can happen: {steps} steps on a tiny model move it little and noisily." \
        + _training_note(worse, steps, gains)


def _training_note(worse: list, steps: int, gains: dict) -> str:
    """Whether the training loss fell for the methods that made the held-out loss worse."""
    text = ""
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
    batch (`finetune_compare`'s result): below 0 the model has learned something about these files."""
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
    with bench.cpu_threads(next(model.parameters()).device):
        for kind in KINDS:
            m = prepare(model, kind, r, alpha)
            n_lora = sum(a.lora_A.numel() + a.lora_B.numel() for a in lora_layers(m).values())
            opt = _one_step(m)
            measured = {"weights": storage_bytes(_weight_tensors(m)),
                        "gradients": storage_bytes(p.grad for p in m.parameters() if p.grad is not None),
                        "optimizer": optimizer_state_bytes(opt)[0]}
            codes = storage_bytes(t for a in lora_layers(m).values() for t in _code_tables(a.base))
            rows.append({"method": kind, "measured": measured, "trainable": sum(p.numel() for p in trainable(m)),
                         "code_tables": codes,
                         "formula": memory_formula(n_linear, n_all - n_linear, n_lora, kind)})
    return rows


def memory_sentence(rows: list[dict]) -> str:
    """What `memory_rows` measured: each method's total, how far the measurement is from the formula at worst, and
    what QLoRA's weights hold beyond it (the code tables)."""
    parts = ("weights", "gradients", "optimizer")
    tot = {row["method"]: sum(row["measured"].values()) for row in rows}
    worst = max(((row["method"], p, abs(row["measured"][p] - row["formula"][p]) / max(row["formula"][p], 1))
                 for row in rows for p in parts), key=lambda t: t[2])
    q = next(row for row in rows if row["method"] == "qlora")
    gap = q["measured"]["weights"] - q["formula"]["weights"]
    return (f"Weights + gradients + AdamW state: full {tot['full'] / 1024:.0f} KiB, LoRA {tot['lora'] / 1024:.0f} KiB "
            f"({tot['full'] / tot['lora']:.1f}× less), QLoRA {tot['qlora'] / 1024:.0f} KiB "
            f"({tot['full'] / tot['qlora']:.1f}× less). The measured bytes differ from the formulas by at most "
            f"{worst[2] * 100:.1f}% ({worst[0]} {worst[1]}). QLoRA's weights measure {gap / 1024:+.1f} KiB against "
            f"the formula; the quantisation code tables, one set per layer, which the formula leaves out, "
            f"take {q['code_tables'] / 1024:.1f} KiB of them.")


# ---------------------------------------------------------------- the ledger's formula verdict

QLORA_GPU_GB = 48  # QLoRA's abstract: "finetune a 65B parameter model on a single 48GB GPU"


def qlora_65b_claim(bits: float, blocksize: int, rank: int = 64, params_b: int = 65) -> dict:
    """The ledger's keyword arguments (`claims.verdict(**...)`) for QLoRA's "65B on one 48 GB GPU": the total
    of `lora.finetune_gb(params_b, QLoRA, rank, base_bits=bits)` (weights, adapters, gradients and Adam state;
    activations NOT counted), with `bits` the NF4 + double quantisation bits per parameter measured in this run at
    blocks of `blocksize`; basis "formula" (nothing is trained at 65B). A ceiling claim: claimed=(None, 48) with
    above="contradicted", so `claims.judge_interval` decides (a total over the widened 48 GB contradicts it); a
    formula has no spread."""
    positive("blocksize", blocksize)
    total = sum(finetune_gb(params_b, FINETUNE[2], rank=rank, base_bits=bits).values())
    return dict(notebook="08", source="Dettmers et al., 2023, QLoRA (abstract)",
                claim="QLoRA reduces memory usage enough to finetune a 65B parameter model on a single 48GB GPU",
                measured=(f"formula total {total:.1f} GB for {params_b}B (NF4 + double quant base at the {bits:.3f} bits "
                          f"per parameter measured in this run at blocks of {blocksize}, rank-{rank} adapters with "
                          "bf16 weights and gradients and fp32 Adam moments); activations are not counted"),
                value=total, unit="GB", basis="formula", claimed=(None, QLORA_GPU_GB), above="contradicted",
                reason=(f"activations excluded: {QLORA_GPU_GB - total:.1f} GB of the {QLORA_GPU_GB} would be left for them"
                        if total < QLORA_GPU_GB else f"activations excluded; weights and optimizer state alone take "
                        f"{total:.1f} GB"))


def takeaways(merged: dict, steps: int, optimizer_bytes: dict, full_65b_gb: float, qlora_65b_gb: float,
              nf4_bits: float) -> list[str]:
    """Notebook 08's takeaway bullets on fine-tuning, from the run's numbers: the perplexity of each way to ship the
    QLoRA adapters (`finetune_compare`'s "merged"), the optimizer state per parameter (`optimizer_bytes`: {name:
    bytes/param}), and the 65B memory formulas against QLoRA's 48 GB GPU."""
    fits = "under" if qlora_65b_gb < QLORA_GPU_GB else "over"
    return [f"- QLoRA adapters after {steps} steps: "
            + "; ".join(f"{k} perplexity {v[1]:.3f}" for k, v in merged.items()) + ".",
            "- 8-bit AdamW: " + ", ".join(f"{k} {v:.2f} bytes/param" for k, v in optimizer_bytes.items())
            + " of optimizer state.",
            f"- Memory (formulas, activations not counted): 65B full fine-tuning {full_65b_gb:.0f} GB, QLoRA "
            f"{qlora_65b_gb:.1f} GB with the base at the measured {nf4_bits:.3f} bits/param, {fits} {QLORA_GPU_GB} GB "
            "(the ledger's verdict on QLoRA's claim follows below)."]
