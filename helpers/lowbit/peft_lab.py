"""Notebook 08's check of our LoRA and QLoRA (`helpers.lowbit.lora`) against Hugging Face's peft.

- `peft_parity(model, r, alpha, base=...)` wraps the course GPT's block linears with our `apply_lora`
  and, on a deep copy, with peft's `get_peft_model` (the same target names); copies our A and B (B
  filled from a seeded normal, so the adapters are not a no-op) into peft's lora_A / lora_B; then
  compares, as max abs differences, the logits and loss on one batch, the gradients of every A and B
  after one backward, and the merged weights (peft's `merge_and_unload` against our
  `LoRALinear.merge()`, or for an NF4 base against our "merged, re-quantised to NF4" variant). peft's
  LoRA forward is `result + lora_B(lora_A(dropout(x))) * scaling` and its delta weight
  `(B @ A) * scaling` (peft's tuners/lora/layer.py); ours runs the same ops in the same order, so fp32
  on a CPU agrees bitwise.
- `peft_init(model, r)` compares peft's default initialisation with ours in kind (B zeros; A
  Kaiming-uniform with a = √5, whose bound is 1/√in_features), through the bound, not the values.
- `parity(model, r=...)`: `peft_parity` for LoRA and QLoRA and `peft_init` (and peft's version);
  `parity_sentences` says in one sentence each what they found, with the tolerance `PEFT_ATOL`.
- `peft_missing()` is None when peft imports, else the one sentence to print.
peft is among the course's dependencies; where it is missing these functions raise ImportError, and
notebook 08 and the tests say so and skip.
"""
from __future__ import annotations

import copy
import logging
import math
import warnings

import torch
import torch.nn as nn

from helpers.gpt import data
from helpers.lowbit.gptq import block_linears
from helpers.lowbit.lora import (apply_lora, dequantize_nf4, finetune_split, lora_layers, merged_variants, nf4_linear,
                                 set_module)

PEFT_ATOL = 1e-5  # tolerance where the op order could differ (another device or backend); CPU fp32 is bitwise


def _import_peft():
    """peft, imported with torchao's and torch's import-time log lines (optional kernels not found,
    an Enum registration) silenced: transformers imports torchao when it is installed."""
    loggers = [logging.getLogger(n) for n in ("torchao", "torch.utils._pytree")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        import peft  # optional: not a course dependency, and it imports transformers
    finally:
        for lg, lv in zip(loggers, levels):
            lg.setLevel(lv)
    return peft


def peft_missing() -> str | None:
    """None when peft can be imported; otherwise one sentence saying the check is skipped and why (peft
    absent, or its import failing, e.g. on a transformers or torchao built for another torch)."""
    try:
        _import_peft()
    except ImportError as err:
        return (f"peft is not installed ({err}), so our LoRA is not compared with the library here "
                "(`pip install peft` adds it).")
    except Exception as err:  # noqa: BLE001 - a broken dependency: say so instead of a traceback
        return (f"peft is installed but its import failed ({type(err).__name__}: {str(err)[:150]}), so our LoRA "
                "is not compared with the library here.")
    return None


def _peft_layers(peft_model: nn.Module) -> dict[str, nn.Module]:
    """peft's LoRA layers of a PeftModel, by the qualified name the module has in the wrapped model."""
    inner = peft_model.base_model.model
    return {n: m for n, m in inner.named_modules() if isinstance(getattr(m, "lora_A", None), nn.ModuleDict)}


def _peft_copy(model: nn.Module, r: int, alpha: float, base: str) -> nn.Module:
    """A deep copy of `model`, frozen, its block linears in NF4 (`nf4_linear`, as `apply_lora` does)
    when base == "nf4", wrapped by peft's `get_peft_model` on the same linear names."""
    peft = _import_peft()
    ref = copy.deepcopy(model)
    for p in ref.parameters():
        p.requires_grad_(False)
    names = sorted({n.rsplit(".", 1)[-1] for n in block_linears(ref)})
    if base == "nf4":
        for n, lin in block_linears(ref).items():
            set_module(ref, n, nf4_linear(lin))
        ref.is_loaded_in_4bit = True  # what peft reads to dispatch its bitsandbytes Linear4bit wrapper
    cfg = peft.LoraConfig(r=r, lora_alpha=alpha, lora_dropout=0.0, target_modules=names)
    return peft.get_peft_model(ref, cfg)


def _maxdiff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach().float() - b.detach().float()).abs().max())


def peft_parity(model: nn.Module, r: int = 8, alpha: float | None = None, *, base: str = "fp32", seed: int = 0,
                batch: int = 2, seq_len: int = 32) -> dict:
    """Our LoRA (base "fp32") or QLoRA (base "nf4") on `model`'s block linears against peft's on a copy,
    with identical adapter values (A from our init, B from a seeded normal × 0.02 so that B A ≠ 0).

    Compares, as max abs differences: "logits" (batch, seq_len, vocab) and "loss" on one batch of the
    fine-tuning split; "grad_A" / "grad_B", the largest over layers after one backward of that loss;
    "merged", the largest over layers between the merged weights (fp32: peft's merge_and_unload vs our
    merge(); nf4: the dequantised NF4 weights peft re-quantises vs our merged_variants' "merged,
    re-quantised to NF4"). Returns those numbers plus "layers" (adapters compared), "peft_class" (peft's
    wrapper class), "bitwise" (all five exactly 0) and "within" (all ≤ PEFT_ATOL).
    Raises ValueError for an unknown base or bad r/alpha, ImportError without peft."""
    if base not in ("fp32", "nf4"):
        raise ValueError(f"base={base!r}; choose 'fp32' (LoRA) or 'nf4' (QLoRA)")
    alpha = 2 * r if alpha is None else alpha
    ours = apply_lora(model, r, alpha, base=base, seed=seed)  # validates r and alpha
    g = torch.Generator().manual_seed(seed)
    mine = lora_layers(ours)
    with torch.no_grad():
        for ad in mine.values():
            ad.lora_B.copy_(0.02 * torch.randn(ad.lora_B.shape, generator=g))
    pm = _peft_copy(model, r, alpha, base)
    theirs = _peft_layers(pm)
    if set(theirs) != set(mine):
        raise RuntimeError(f"peft wrapped {sorted(theirs)}, ours {sorted(mine)}")
    with torch.no_grad():
        for n, m in theirs.items():
            m.lora_A["default"].weight.copy_(mine[n].lora_A)
            m.lora_B["default"].weight.copy_(mine[n].lora_B)
    device = next(model.parameters()).device
    x, y = data.get_batch(finetune_split()[0], batch, seq_len, device, generator=g)
    ours.train(), pm.train()  # dropout 0 in both: train mode only so that autograd runs as in fine-tuning
    lo, loss_o = ours(x, y)
    lp, loss_p = pm(x, y)
    loss_o.backward()
    loss_p.backward()
    out = {"layers": len(mine), "peft_class": type(next(iter(theirs.values()))).__name__,
           "logits": _maxdiff(lo, lp), "loss": _maxdiff(loss_o, loss_p),
           "grad_A": max(_maxdiff(mine[n].lora_A.grad, m.lora_A["default"].weight.grad) for n, m in theirs.items()),
           "grad_B": max(_maxdiff(mine[n].lora_B.grad, m.lora_B["default"].weight.grad) for n, m in theirs.items())}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # peft warns that merging into 4-bit weights rounds: that is what we compare
        merged = pm.merge_and_unload()
        got = block_linears(merged) if base == "fp32" else {
            n: m for n, m in merged.named_modules() if n in theirs}
        if base == "fp32":
            for ad in mine.values():
                ad.merge()
            want = {n: ad.base.weight for n, ad in mine.items()}
            out["merged"] = max(_maxdiff(got[n].weight, want[n]) for n in mine)
        else:
            want = block_linears(merged_variants(ours, model)["merged, re-quantised to NF4"])
            out["merged"] = max(_maxdiff(dequantize_nf4(got[n]), want[n].weight) for n in mine)
    keys = ("logits", "loss", "grad_A", "grad_B", "merged")
    out["bitwise"] = all(out[k] == 0 for k in keys)
    out["within"] = all(out[k] <= PEFT_ATOL for k in keys)
    return out


def peft_init(model: nn.Module, r: int = 8, seed: int = 0) -> dict:
    """peft's default adapter initialisation against ours, in kind: {"ours": {...}, "peft": {...}} with, for
    each, "B_zero" (every B exactly 0), "A_max_over_bound" (largest max|A| · √in_features over layers: a
    uniform(−1/√in, 1/√in) draw stays ≤ 1 and comes close to it) and "A_std_over_uniform" (mean over layers
    of std(A) / (bound/√3), about 1 for a uniform draw on ±bound). Raises ImportError without peft."""
    ours = lora_layers(apply_lora(model, r, seed=seed))
    with torch.random.fork_rng(devices=[]):  # peft draws its A from the global generator: seed it, then restore it
        torch.manual_seed(seed)
        theirs = _peft_layers(_peft_copy(model, r, 2 * r, "fp32"))

    def kind(pairs):
        pairs = list(pairs)  # [(A (r, in), B (out, r))]
        bound = [1 / math.sqrt(a.shape[1]) for a, _ in pairs]
        return {"B_zero": all(bool((b == 0).all()) for _, b in pairs),
                "A_max_over_bound": max(float(a.abs().max()) / bd for (a, _), bd in zip(pairs, bound)),
                "A_std_over_uniform": sum(float(a.std()) / (bd / math.sqrt(3)) for (a, _), bd in zip(pairs, bound))
                / len(pairs)}

    return {"ours": kind((m.lora_A.detach(), m.lora_B.detach()) for m in ours.values()),
            "peft": kind((m.lora_A["default"].weight.detach(), m.lora_B["default"].weight.detach())
                         for m in theirs.values())}


PARITY_KEYS = ("logits", "loss", "grad_A", "grad_B", "merged")  # what `peft_parity` compares, as max |Δ|


def parity(model: nn.Module, r: int = 8, alpha: float | None = None, seed: int = 0) -> dict:
    """`peft_parity` for LoRA and QLoRA and `peft_init`: {"lora": ..., "qlora": ..., "init": ..., "version": peft's
    version}. Raises ImportError without peft (`peft_missing()` says so in a sentence first)."""
    peft = _import_peft()
    return {"lora": peft_parity(model, r, alpha, seed=seed), "qlora": peft_parity(model, r, alpha, base="nf4", seed=seed),
            "init": peft_init(model, r, seed), "version": peft.__version__}


def parity_sentences(res: dict) -> list[str]:
    """One sentence each on `parity`'s LoRA and QLoRA comparisons (bitwise, within `PEFT_ATOL`, or not) and on the
    initialisation (B zero in both, A drawn uniformly on ±1/√in in both, or not)."""
    out = []
    for k, what in (("lora", "LoRA"), ("qlora", "QLoRA (NF4 base, merge re-quantised to NF4)")):
        p = res[k]
        worst = max(p[c] for c in PARITY_KEYS)
        verdict = (f"bitwise equal: the same ops in the same order (the tolerance, {PEFT_ATOL:g} max abs, is not needed)"
                   if p["bitwise"] else f"{'within' if p['within'] else 'NOT within'} the tolerance of {PEFT_ATOL:g} "
                   f"max abs (largest difference {worst:.1e}): the op order differs somewhere")
        out.append(f"{what}: logits, loss, the gradients of A and B and the merged weights are {verdict}.")
    ours, theirs = res["init"]["ours"], res["init"]["peft"]
    same = ours["B_zero"] and theirs["B_zero"]
    amax = (ours["A_max_over_bound"], theirs["A_max_over_bound"])
    kind = same and 0.9 < min(amax) and max(amax) <= 1
    out.append(f"Initialisation: B is zero in {'both' if same else 'NOT both'}; max|A| · √in is {amax[0]:.3f} (ours) and "
               f"{amax[1]:.3f} (peft), and std(A) over a uniform's on ±1/√in is {ours['A_std_over_uniform']:.3f} and "
               f"{theirs['A_std_over_uniform']:.3f}: "
               + ("both draw A uniformly on ±1/√in, Kaiming-uniform with a = √5." if kind else "NOT the same kind of draw."))
    return out
