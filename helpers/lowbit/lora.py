"""LoRA and QLoRA from scratch: the technique, its merges and its memory formula.

- LoRA (Hu et al., 2021, "LoRA: Low-Rank Adaptation of Large Language Models"): a frozen linear W
  plus a trainable low-rank update, y = x Wᵀ + (α/r) · dropout(x) Aᵀ Bᵀ with A (r, in) and B (out, r);
  B starts at zero, so training starts from the base model exactly. `LoRALinear.merge()` adds
  (α/r) B A into W (no extra cost at inference), `unmerge()` takes it out again.
- QLoRA (Dettmers et al., 2023, "QLoRA: Efficient Finetuning of Quantized LLMs"): the same adapters
  on a frozen base stored in 4-bit NormalFloat (NF4, bitsandbytes `Linear4bit`, blocks of 64, double
  quantisation of the block constants); only the adapters get gradients and optimizer state.

What it holds: `LoRALinear`; `nf4_linear` / `dequantize_nf4` (a bitsandbytes NF4 base and the weight it
computes with); `apply_lora` (a copy of the course GPT with adapters on every block linear, fp32 or NF4
base) and `lora_layers`; `merged_variants` (the four ways to ship QLoRA adapters); `memory_formula`, the
course's one formula for the bytes of weights, gradients and optimizer state of full fine-tuning, LoRA
and QLoRA (`quant_lab.finetune_gb` calls it for Llama-size models).

Notebook 08's measurements with these pieces (fine-tuning three ways, memory measured from the tensors)
are in `helpers.lowbit.lora_lab`, the check against peft in `helpers.lowbit.peft_parity`, the 8-bit optimizer's in
`helpers.lowbit.quant_lab`.
"""
from __future__ import annotations

import copy
import math

import torch
import torch.nn as nn

from helpers.lowbit.gptq import block_linears

KINDS = ("full", "lora", "qlora")
NF4_BLOCK = 64  # QLoRA's block size for the NF4 weights


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


# ---------------------------------------------------------------- memory formula

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
