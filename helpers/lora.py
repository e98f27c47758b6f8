"""LoRA and QLoRA from scratch on the course GPT, fine-tuning compared with full fine-tuning, memory
counted from the tensors, and bitsandbytes' 8-bit AdamW beside torch's AdamW.

- LoRA (Hu et al., 2021, "LoRA: Low-Rank Adaptation of Large Language Models"): a frozen linear W
  plus a trainable low-rank update, y = x Wᵀ + (α/r) · dropout(x) Aᵀ Bᵀ with A (r, in) and B (out, r);
  B starts at zero, so training starts from the base model exactly. `LoRALinear.merge()` adds
  (α/r) B A into W (no extra cost at inference), `unmerge()` takes it out again.
- QLoRA (Dettmers et al., 2023, "QLoRA: Efficient Finetuning of Quantized LLMs"): the same adapters
  on a frozen base stored in 4-bit NormalFloat (NF4, bitsandbytes `Linear4bit`, blocks of 64, double
  quantisation of the block constants); only the adapters get gradients and optimizer state.
- 8-bit optimizers (Dettmers et al., 2022, "8-bit Optimizers via Block-wise Quantization"):
  bitsandbytes `AdamW8bit` keeps both Adam moments as uint8 codes with one fp32 absmax per block of
  256 values, except for tensors with fewer than `min_8bit_size` (default 4096) elements, whose
  state stays fp32 (bitsandbytes' Optimizer8bit.init_state: `if p.numel() < config["min_8bit_size"]`).

What notebook 08 calls (each prints a table and sentences generated from this run's numbers and
returns the numbers):
- `finetune_section(trained, steps=..., ...)`: full fine-tuning vs LoRA vs QLoRA of the trained GPT
  on a held-out part of the corpus (loss curves on the same batches, drawn against the untuned
  model's loss on each batch; held-out loss before and after; seconds), then the QLoRA adapters
  merged four ways (unmerged; into the original 16-bit weights; into the dequantised NF4 weights
  kept in 16 bits; into those weights re-quantised to NF4) with the held-out perplexity of each. `finetune_figure(result)` draws the loss curves.
- `memory_section(model, r=...)`: bytes of weights, gradients and optimizer state of full
  fine-tuning, LoRA and QLoRA, measured from the tensors after one AdamW step, beside
  `memory_formula`'s prediction. `memory_formula(n_linear, n_other, n_lora, method, ...)` also
  serves a calculator for any model size.
- `optimizer_section(model, steps=...)`: state bytes per parameter of torch AdamW vs bitsandbytes
  AdamW8bit, measured tensor by tensor (and where the 32-bit threshold falls), and the losses of a
  few steps of each on the same batches.

Smoke cost on the "tiny" preset (measured on a 2-core CPU shared with other jobs, about 2-3× an idle
one's): `finetune_section(tm, steps=16)` 11-20 s, `memory_section(model)` under 1 s,
`optimizer_section(model, steps=4)` 1.5 s. In finetune_section, `steps` (three trainings) and
`eval_batches` (eight held-out evaluations) set the cost.

Lower-level pieces: `LoRALinear`, `nf4_linear`, `apply_lora`, `lora_layers`, `merged_variants`,
`finetune`, `finetune_split`, `batch_losses`, `tensor_bytes`, `optimizer_state_bytes`,
`threshold_probe`, `update_gap`.
"""
from __future__ import annotations

import copy
import math
import time

import torch
import torch.nn as nn

from . import data, plots, tables
from .gptq import block_linears, cpu_threads

KINDS = ("full", "lora", "qlora")
NF4_BLOCK = 64  # QLoRA's block size for the NF4 weights
MIN_8BIT_SIZE = 4096  # bitsandbytes' default min_8bit_size: smaller tensors keep fp32 optimizer state
BNB_STATE_BLOCK = 256  # bitsandbytes' blockwise 8-bit optimizer state: one fp32 absmax per 256 values


def _positive_int(name, value):
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name}={value!r} must be a positive int")
    return value


# ---------------------------------------------------------------- LoRA

class LoRALinear(nn.Module):
    """A frozen base linear plus a trainable rank-r update: y = base(x) + (alpha/r) · dropout(x) Aᵀ Bᵀ.

    base: an `nn.Linear` or a bitsandbytes `Linear4bit` (in_features -> out_features); its
    parameters are frozen here. A (r, in) is initialised like the LoRA authors' loralib
    (Kaiming-uniform, a=√5, drawn from `generator` when given), B (out, r) to zeros.
    x (..., in) -> (..., out).
    `merge()` / `unmerge()` add / subtract (alpha/r) B A to / from an nn.Linear base's weight.
    Raises ValueError for a non-positive r or alpha, dropout outside [0, 1), or a base without
    in_features/out_features."""

    def __init__(self, base: nn.Module, r: int = 8, alpha: float | None = None, dropout: float = 0.0,
                 generator: torch.Generator | None = None):
        super().__init__()
        _positive_int("r", r)
        alpha = 2 * r if alpha is None else alpha
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or alpha <= 0:
            raise ValueError(f"alpha={alpha!r} must be a positive number")
        if not (isinstance(dropout, (int, float)) and 0.0 <= dropout < 1.0):
            raise ValueError(f"dropout={dropout!r} must be in [0, 1)")
        if not hasattr(base, "in_features") or not hasattr(base, "out_features"):
            raise ValueError(f"base {type(base).__name__} has no in_features/out_features")
        self.base = base
        for p in base.parameters():
            p.requires_grad_(False)
        self.r, self.alpha, self.scaling = r, float(alpha), float(alpha) / r
        device = next(base.parameters()).device
        self.lora_A = nn.Parameter(torch.empty(r, base.in_features, device=device))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, r, device=device))
        with torch.no_grad():  # A's init drawn on the CPU from `generator`, so a seed fixes it on any device
            a = torch.empty(r, base.in_features)
            nn.init.kaiming_uniform_(a, a=math.sqrt(5), generator=generator)
            self.lora_A.copy_(a)
        self.dropout = nn.Dropout(dropout)
        self.merged = False

    @property
    def in_features(self) -> int:
        return self.base.in_features

    @property
    def out_features(self) -> int:
        return self.base.out_features

    def delta(self) -> torch.Tensor:
        """The update (alpha/r) B A as an (out, in) fp32 tensor."""
        return self.scaling * (self.lora_B.float() @ self.lora_A.float())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)  # (..., out)
        if self.merged:
            return y
        u = self.dropout(x).to(self.lora_A.dtype) @ self.lora_A.T  # (..., r)
        return y + (self.scaling * (u @ self.lora_B.T)).to(y.dtype)  # (..., out)

    @torch.no_grad()
    def merge(self) -> None:
        """W ← W + (alpha/r) B A; the forward then skips the adapter. Raises TypeError on a 4-bit base."""
        if not isinstance(self.base, nn.Linear):
            raise TypeError("merge() needs an nn.Linear base; for a 4-bit base use merged_variants()")
        if not self.merged:
            self.base.weight += self.delta().to(self.base.weight.dtype)
            self.merged = True

    @torch.no_grad()
    def unmerge(self) -> None:
        """W ← W − (alpha/r) B A (undoes merge(), up to rounding)."""
        if self.merged:
            self.base.weight -= self.delta().to(self.base.weight.dtype)
            self.merged = False


def nf4_linear(linear: nn.Linear, *, double_quant: bool = True, blocksize: int = NF4_BLOCK) -> nn.Module:
    """A frozen bitsandbytes `Linear4bit` holding `linear`'s weight in NF4 (blocks of `blocksize`,
    double quantisation of the absmax constants when `double_quant`) and its bias as is, on the
    linear's device, computing in the weight's dtype."""
    import bitsandbytes as bnb

    W = linear.weight.detach()
    q = bnb.nn.Linear4bit(linear.in_features, linear.out_features, bias=linear.bias is not None,
                          compute_dtype=W.dtype, compress_statistics=double_quant, quant_type="nf4",
                          device="meta")
    q.weight = bnb.nn.Params4bit(W.float().cpu().clone(), requires_grad=False, compress_statistics=double_quant,
                                 quant_type="nf4", blocksize=blocksize)
    if linear.bias is not None:
        q.bias = nn.Parameter(linear.bias.detach().clone(), requires_grad=False)
    return q.to(W.device)


def dequantize_nf4(module: nn.Module) -> torch.Tensor:
    """The fp32 (out, in) weight a `Linear4bit` computes with (bitsandbytes' dequantize_4bit)."""
    import bitsandbytes.functional as BF

    return BF.dequantize_4bit(module.weight.data, module.weight.quant_state).float()


def _set_module(model: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, module)


def apply_lora(model: nn.Module, r: int = 8, alpha: float | None = None, dropout: float = 0.0, *,
               base: str = "fp32", double_quant: bool = True, seed: int = 0) -> nn.Module:
    """A copy of the course GPT with every block linear wrapped in `LoRALinear` and everything else
    frozen: only the adapters train. base: "fp32" (LoRA: the linear as it is) or "nf4" (QLoRA: the
    linear's weight in NF4 via `nf4_linear`). The adapters' A matrices are drawn from a generator
    seeded with `seed` (LoRA and QLoRA copies start from the same A). `model` is not changed. Raises ValueError for an
    unknown base or bad r/alpha/dropout."""
    if base not in ("fp32", "nf4"):
        raise ValueError(f"base={base!r}; choose 'fp32' (LoRA) or 'nf4' (QLoRA)")
    m = copy.deepcopy(model)
    for p in m.parameters():
        p.requires_grad_(False)
    g = torch.Generator().manual_seed(seed)
    for name, lin in block_linears(m).items():
        inner = nf4_linear(lin, double_quant=double_quant) if base == "nf4" else lin
        _set_module(m, name, LoRALinear(inner, r, alpha, dropout, generator=g))
    return m


def lora_layers(model: nn.Module) -> dict[str, LoRALinear]:
    """The LoRALinear modules of a model by qualified name."""
    return {n: m for n, m in model.named_modules() if isinstance(m, LoRALinear)}


@torch.no_grad()
def merged_variants(qlora: nn.Module, original: nn.Module) -> dict[str, nn.Module]:
    """The four ways to ship QLoRA adapters, as plain GPTs (weights fake-quantised where stated):

    - "QLoRA, unmerged": the NF4 base + adapters as trained (`qlora` itself);
    - "merged into original 16-bit W": bf16(W_original) + ΔW, rounded to bf16;
    - "merged into dequantised NF4, 16-bit": bf16(dequant(NF4) + ΔW);
    - "merged, re-quantised to NF4": NF4(dequant(NF4) + ΔW), dequantised for compute.

    ΔW = (α/r) B A of each adapter; 16-bit weights are bf16 values held in fp32 tensors (the same
    numbers as a bf16 model, computed in fp32). `original` is the model before QLoRA."""
    out = {"QLoRA, unmerged": qlora}
    adapters = lora_layers(qlora)
    for label in ("merged into original 16-bit W", "merged into dequantised NF4, 16-bit",
                  "merged, re-quantised to NF4"):
        m = copy.deepcopy(original)
        for name, lin in block_linears(m).items():
            ad = adapters[name]
            W0 = lin.weight.detach().float()
            if label == "merged into original 16-bit W":
                W = (W0.bfloat16().float() + ad.delta()).bfloat16().float()
            else:
                W = dequantize_nf4(ad.base) + ad.delta()
                if label.endswith("re-quantised to NF4"):
                    probe = nn.Linear(lin.in_features, lin.out_features, bias=False).to(W.device)
                    probe.weight.copy_(W)
                    W = dequantize_nf4(nf4_linear(probe))
                else:
                    W = W.bfloat16().float()
            lin.weight.copy_(W.to(lin.weight.dtype))
        out[label] = m.eval()
    return out


# ---------------------------------------------------------------- fine-tuning

def finetune_split(frac: float = 0.8) -> tuple[torch.Tensor, torch.Tensor]:
    """The corpus's held-out split (files the trained GPT never saw) cut in two: the first `frac` of
    its bytes to fine-tune on, the rest to evaluate on. Returns (tune_tokens, eval_tokens), uint8."""
    if not 0 < frac < 1:
        raise ValueError(f"frac={frac!r} must be in (0, 1)")
    tokens = data.load_corpus("val")
    cut = int(len(tokens) * frac)
    return tokens[:cut], tokens[cut:]


def _trainable(model: nn.Module) -> list[nn.Parameter]:
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
    params = _trainable(model)
    if not params:
        raise ValueError("the model has no trainable parameters")
    return _train(model, _make_optimizer(optimizer, params, lr), steps, tokens, batch, seq_len, seed)


def _train(model: nn.Module, opt, steps: int, tokens: torch.Tensor, batch: int, seq_len: int, seed: int) -> list[float]:
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


def _make_optimizer(name: str, params, lr: float):
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    if name == "adamw8bit":
        import bitsandbytes as bnb

        return bnb.optim.AdamW8bit(params, lr=lr, weight_decay=0.0)
    raise ValueError(f"optimizer={name!r}; choose 'adamw' or 'adamw8bit'")


def _eval_loss(model: nn.Module, tokens: torch.Tensor, batches: int) -> float:
    from .pretrained import validation_loss

    return validation_loss(model, tokens, seq_len=min(128, model.config.seq_len), batches=batches, batch=8)


def finetune_section(trained, steps: int = 30, *, lr_full: float = 3e-4, lr_lora: float = 3e-3, r: int = 8,
                     alpha: float | None = None, batch: int = 8, seq_len: int = 64, eval_batches: int = 2,
                     seed: int = 0) -> dict:
    """Fine-tune `trained.model` (a helpers.pretrained.Trained, or a GPT) on `finetune_split()`'s first
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
            res["trainable"][kind] = sum(p.numel() for p in _trainable(m))
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
    fig, ax = plots._axes(ax, "fine-tuning: training loss minus the untuned model's")
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
    per, shared_seen, total_tensors = {}, {}, []
    for p, st in opt.state.items():
        tens = [v for k, v in st.items() if torch.is_tensor(v) and v.numel() > 1]
        own = [v for k, v in st.items() if torch.is_tensor(v) and v.numel() > 1 and not k.startswith("qmap")]
        per[p] = {"numel": p.numel(), "bytes": sum(v.nbytes for v in own),
                  "dtypes": sorted({str(v.dtype).replace("torch.", "") for v in own})}
        total_tensors += tens
    return tensor_bytes(total_tensors), per


def memory_formula(n_linear: float, n_other: float, n_lora: float, method: str, *, weight_bytes: float = 4,
                   grad_bytes: float | None = None, optimizer_bytes: float = 8, adapter_bytes: float = 4,
                   adapter_grad_bytes: float | None = None, double_quant: bool = True, blocksize: int = NF4_BLOCK,
                   dq_block: int = 256, split_adapters: bool = False) -> dict[str, float]:
    """Predicted bytes {"weights", "gradients", "optimizer"} of fine-tuning with `method`: the course's one
    formula for fine-tuning memory (activations not counted). `quant_lab.finetune_gb` calls it for
    Llama-size models in bf16; `memory_rows` for the course GPT in fp32.

    n_linear: parameters in the weights that QLoRA quantises (the block linears' weight matrices);
    n_other: every other frozen-or-trained parameter (embeddings, norms, biases); n_lora: adapter
    parameters (Σ r·(in + out)). weight_bytes: bytes per unquantised parameter (4 fp32, 2 bf16);
    grad_bytes: per gradient (default weight_bytes); optimizer_bytes: per trained parameter (8 for
    AdamW's two fp32 moments); adapter_bytes / adapter_grad_bytes: per adapter weight / gradient
    (default 4 / adapter_bytes). NF4 costs 4 bits per weight plus its block constants: 32 bits per
    `blocksize` weights, or with `double_quant` 8 bits per block plus 32 bits per `dq_block` blocks
    (QLoRA's 4 + 0.127 bits at 64/256). full: (weights, grads, optimizer) all over n_linear + n_other;
    lora: adapters besides the frozen model; qlora: as lora with n_linear in NF4. With
    `split_adapters`, the adapter weights leave "weights" for a fourth key "adapters" (0 for full).
    Raises ValueError for an unknown method."""
    if method not in KINDS:
        raise ValueError(f"method={method!r}; choose one of {', '.join(map(repr, KINDS))}")
    grad_bytes = weight_bytes if grad_bytes is None else grad_bytes
    adapter_grad_bytes = adapter_bytes if adapter_grad_bytes is None else adapter_grad_bytes
    n_all = n_linear + n_other
    if method == "full":
        out = {"weights": weight_bytes * n_all, "gradients": grad_bytes * n_all, "optimizer": optimizer_bytes * n_all}
        return {**out, "adapters": 0.0} if split_adapters else out
    nf4_bits = 4 + (8 / blocksize + 32 / (blocksize * dq_block) if double_quant else 32 / blocksize)
    base = n_linear * (nf4_bits / 8 if method == "qlora" else weight_bytes)
    frozen, adapters = base + weight_bytes * n_other, adapter_bytes * n_lora
    out = {"weights": frozen if split_adapters else frozen + adapters, "gradients": adapter_grad_bytes * n_lora,
           "optimizer": optimizer_bytes * n_lora}
    return {**out, "adapters": adapters} if split_adapters else out


def _one_step(model: nn.Module, optimizer: str = "adamw", seed: int = 0) -> torch.optim.Optimizer:
    tune, _ = finetune_split()
    params = _trainable(model)
    opt = _make_optimizer(optimizer, params, 1e-4)
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
            rows.append({"method": kind, "measured": measured, "trainable": sum(p.numel() for p in _trainable(m)),
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


# ---------------------------------------------------------------- 8-bit optimizer

def threshold_probe(sizes=(MIN_8BIT_SIZE - 1, MIN_8BIT_SIZE), device: str = "cpu") -> dict[int, str]:
    """The dtype of bitsandbytes AdamW8bit's first moment after one step on a 1-D tensor of each size:
    {numel: "float32" or "uint8"}; finds where the 32-bit threshold (min_8bit_size) falls."""
    import bitsandbytes as bnb

    out = {}
    for n in sizes:
        p = nn.Parameter(torch.zeros(_positive_int("size", n), device=device))
        opt = bnb.optim.AdamW8bit([p])
        p.grad = torch.ones_like(p)
        opt.step()
        out[n] = str(opt.state[p]["state1"].dtype).replace("torch.", "")
    return out


def update_gap(steps: int = 5, shape=(64, 128), lr: float = 1e-3, seed: int = 0, device: str = "cpu") -> float:
    """||Δp(AdamW8bit) − Δp(AdamW)|| / ||Δp(AdamW)|| after `steps` steps of both optimizers on one
    tensor of `shape` with the same random gradients (no weight decay): how far 8-bit state moves the
    update."""
    import bitsandbytes as bnb

    g = torch.Generator().manual_seed(seed)
    p0 = torch.randn(shape, generator=g)
    grads = [torch.randn(shape, generator=g) for _ in range(_positive_int("steps", steps))]
    moved = {}
    for name, cls in (("adamw", torch.optim.AdamW), ("adamw8bit", bnb.optim.AdamW8bit)):
        p = nn.Parameter(p0.clone().to(device))
        opt = cls([p], lr=lr, weight_decay=0.0)
        for grad in grads:
            p.grad = grad.to(device)
            opt.step()
        moved[name] = (p.detach() - p0.to(device)).float()
    return float((moved["adamw8bit"] - moved["adamw"]).norm() / moved["adamw"].norm())


def optimizer_section(model: nn.Module, steps: int = 5, *, lr: float = 1e-3, batch: int = 8, seq_len: int = 64,
                      seed: int = 0) -> dict:
    """Full fine-tuning of two copies of `model` on the same batches, one with torch.optim.AdamW and
    one with bitsandbytes AdamW8bit: state bytes per parameter measured tensor by tensor (tensors
    below bitsandbytes' min_8bit_size = 4096 elements keep fp32 state), and the training loss of
    each step. Prints a table per tensor size class and sentences from the numbers. Returns
    {"losses": {"adamw": [...], "adamw8bit": [...]}, "bytes_per_param": {name: float},
    "tensors": [{"name", "numel", "adamw", "adamw8bit", "dtypes8"}], "state_bytes": {name: int},
    "threshold": `threshold_probe()`, "update_gap": `update_gap()`}."""
    _positive_int("steps", steps)
    tune, _ = finetune_split()
    res = {"losses": {}, "state_bytes": {}, "bytes_per_param": {}}
    per = {}
    with cpu_threads(next(model.parameters()).device):
        for name in ("adamw", "adamw8bit"):
            m = prepare(model, "full")
            params = _trainable(m)
            opt = _make_optimizer(name, params, lr)
            res["losses"][name] = _train(m, opt, steps, tune, batch, seq_len, seed)
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
    _print_optimizer(res)
    return res


def _print_optimizer(res: dict) -> None:
    rows = res["tensors"]
    small = [t for t in rows if t["numel"] < MIN_8BIT_SIZE]
    large = [t for t in rows if t["numel"] >= MIN_8BIT_SIZE]
    show = sorted(large, key=lambda t: -t["numel"])[:4] + sorted(small, key=lambda t: -t["numel"])[:3]
    print(tables.table(["tensor", "elements", "AdamW bytes/param", "AdamW8bit bytes/param", "8-bit state dtypes"],
                       [[t["name"], t["numel"], f"{t['adamw']:.3f}", f"{t['adamw8bit']:.3f}", t["dtypes8"]]
                        for t in show]))
    eight = [t for t in rows if "uint8" in t["dtypes8"]]
    smallest8 = min((t["numel"] for t in eight), default=None)
    largest32 = max((t["numel"] for t in rows if "uint8" not in t["dtypes8"]), default=None)
    print(f"{len(eight)} of {len(rows)} tensors got uint8 state (the smallest of them has {smallest8} elements); "
          f"the largest tensor left in fp32 state has {largest32} elements, consistent with bitsandbytes' "
          f"min_8bit_size of {MIN_8BIT_SIZE}." if smallest8 and largest32 and largest32 < MIN_8BIT_SIZE <= smallest8
          else f"{len(eight)} of {len(rows)} tensors got uint8 state; the threshold {MIN_8BIT_SIZE} is not "
               f"bracketed by this model's tensor sizes (smallest uint8: {smallest8}, largest fp32: {largest32}).")
    probe = ", ".join(f"{n} elements → {d}" for n, d in res["threshold"].items())
    print(f"Probing one-tensor optimizers directly: {probe}. The update after 5 steps on one 64×128 tensor with "
          f"the same gradients differs from AdamW's by {res['update_gap'] * 100:.2f}% (relative norm).")
    bpp = res["bytes_per_param"]
    la, lb = res["losses"]["adamw"], res["losses"]["adamw8bit"]
    gap = max(abs(a - b) for a, b in zip(la, lb))
    print(f"Optimizer state over the whole model: AdamW {bpp['adamw']:.2f} bytes/param, AdamW8bit "
          f"{bpp['adamw8bit']:.2f} ({bpp['adamw'] / bpp['adamw8bit']:.1f}× less"
          + (f"; above the 2 bytes of two uint8 moments because of the fp32 small tensors and one fp32 absmax "
             f"per {BNB_STATE_BLOCK} values" if bpp["adamw8bit"] > 2 else "") +
          f"). Training loss at each of {len(la)} steps (the loss before that step's update): the last is AdamW "
          f"{la[-1]:.5f}, AdamW8bit {lb[-1]:.5f}; the largest per-step gap is {gap:.1e} nats/byte.")
