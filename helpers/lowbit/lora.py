"""LoRA and QLoRA from scratch: the technique, its merges, the fine-tuning loop and the memory formulas.

- LoRA (Hu et al., 2021, "LoRA: Low-Rank Adaptation of Large Language Models"): a frozen linear W
  plus a trainable low-rank update, y = x Wᵀ + (α/r) · dropout(x) Aᵀ Bᵀ with A (r, in) and B (out, r);
  B starts at zero, so training starts from the base model exactly. `LoRALinear.merge()` adds
  (α/r) B A into W (no extra cost at inference), `unmerge()` takes it out again.
- QLoRA (Dettmers et al., 2023, "QLoRA: Efficient Finetuning of Quantized LLMs"): the same adapters
  on a frozen base stored in 4-bit NormalFloat (NF4, bitsandbytes `Linear4bit`, blocks of 64, double
  quantisation of the block constants); only the adapters get gradients and optimizer state.

What it holds:
- the adapters: `LoRALinear`; `nf4_linear` / `dequantize_nf4` (a bitsandbytes NF4 base and the weight
  it computes with); `apply_lora` (a copy of the course GPT with adapters on every block linear, fp32
  or NF4 base), `lora_layers`, `set_module`; `merged_variants` (the four ways to ship QLoRA adapters);
- fine-tuning: `finetune_split` (the data), `prepare` (the model for "full", "lora" or "qlora"),
  `trainable`, `make_optimizer` (AdamW or bitsandbytes' AdamW8bit), `finetune` and `train_steps`;
- memory: `memory_formula`, the course's one formula for the bytes of weights, gradients and optimizer
  state of full fine-tuning, LoRA and QLoRA; `finetune_gb`, the same in GB for Llama-size models
  (`LLAMA_SHAPES`, `lora_params`); `optimizer_state_bytes`, the bytes counted from the tensors themselves
  (with `helpers.gpt.footprint.storage_bytes`, as every byte count of a live model is).

Notebook 08's measurements with these pieces (fine-tuning three ways, memory measured against the
formula) are in `helpers.lowbit.lora_lab`, the check against peft in `helpers.lowbit.peft_lab`, the 8-bit
optimizer's in `helpers.lowbit.optim8bit_lab`.
"""
from __future__ import annotations

import copy
import math

import torch
import torch.nn as nn

from helpers.gpt import data
from helpers.gpt.footprint import storage_bytes
from helpers.lowbit.gptq import block_linears
from helpers.measure.params import positive

KINDS = ("full", "lora", "qlora")
NF4_BLOCK = 64  # QLoRA's block size for the NF4 weights
GB = 1e9


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
        positive("r", r)
        alpha = 2 * r if alpha is None else alpha
        positive("alpha", float(alpha) if type(alpha) is int else alpha, float)
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
        """y = base(x) + (alpha/r) · dropout(x) Aᵀ Bᵀ, without ever forming the (out, in) product B A: two thin
        matmuls through r columns, r (in + out) multiply-adds per token against the base's in · out."""
        y = self.base(x)  # (..., out): the frozen layer (for QLoRA, bitsandbytes dequantises NF4 inside it)
        if self.merged:
            return y  # (alpha/r) B A is already inside the base's weight
        u = self.dropout(x).to(self.lora_A.dtype) @ self.lora_A.T  # (..., r): down to rank r, in the adapters' dtype
        return y + (self.scaling * (u @ self.lora_B.T)).to(y.dtype)  # (..., out): up again, scaled, added to y

    @torch.no_grad()
    def merge(self) -> None:
        """W ← W + (alpha/r) B A; the forward then skips the adapter. Raises TypeError on a quantized base (a
        bitsandbytes Linear8bitLt or Linear4bit is an nn.Linear too): adding ΔW to int8 or NF4 codes would round
        it away or fail; `merged_variants()` dequantizes, adds and requantizes, and measures what that costs."""
        weight = getattr(self.base, "weight", None)
        quantized = (not isinstance(self.base, nn.Linear) or not isinstance(weight, torch.Tensor)
                     or not weight.is_floating_point() or type(weight) not in (nn.Parameter, torch.Tensor)
                     or type(self.base).__module__.split(".")[0] == "bitsandbytes")
        if quantized:
            raise TypeError(f"merge() needs a floating-point nn.Linear base, not {type(self.base).__name__} with "
                            f"{type(weight).__name__} weights: merging into a quantized base must dequantize, add "
                            "and requantize (merged_variants() does, and measures what requantizing costs)")
        if not self.merged:
            self.base.weight += self.delta().to(self.base.weight.dtype)
            self.merged = True

    @torch.no_grad()
    def unmerge(self) -> None:
        """W ← W − (alpha/r) B A (undoes merge(), up to rounding)."""
        if self.merged:
            self.base.weight -= self.delta().to(self.base.weight.dtype)
            self.merged = False


def nf4_linear(linear: nn.Linear, *, compress_statistics: bool = True, blocksize: int = NF4_BLOCK) -> nn.Module:
    """A frozen bitsandbytes `Linear4bit` holding `linear`'s weight in NF4 (blocks of `blocksize`, double
    quantisation of the absmax constants when `compress_statistics`, bitsandbytes' name for it) and its bias
    as is, on the linear's device, computing in the weight's dtype."""
    import bitsandbytes as bnb  # heavy: it imports triton, and only the NF4 base needs it

    W = linear.weight.detach()
    q = bnb.nn.Linear4bit(linear.in_features, linear.out_features, bias=linear.bias is not None,
                          compute_dtype=W.dtype, compress_statistics=compress_statistics, quant_type="nf4",
                          device="meta")
    q.weight = bnb.nn.Params4bit(W.float().cpu().clone(), requires_grad=False,
                                 compress_statistics=compress_statistics, quant_type="nf4", blocksize=blocksize)
    if linear.bias is not None:
        q.bias = nn.Parameter(linear.bias.detach().clone(), requires_grad=False)
    q.support_avx512bf16_for_cpu = False  # keep the NF4 layout: no CPU repacking at an eval forward (dequantize_nf4)
    return q.to(W.device)


def dequantize_nf4(module: nn.Module) -> torch.Tensor:
    """The fp32 (out, in) weight a `Linear4bit` computes with (bitsandbytes' dequantize_4bit).

    On a CPU with AVX512-BF16, bitsandbytes repacks the codes into another layout at the first forward in eval mode
    without gradients (`quant_state.packing_format_for_cpu`); dequantize_4bit cannot read that layout, so the codes
    are unpacked back, on copies (the module keeps its layout), with bitsandbytes' own inverse."""
    import bitsandbytes.functional as BF  # heavy: it imports triton, and only the NF4 base needs it

    data, state = module.weight.data, module.weight.quant_state
    if getattr(state, "packing_format_for_cpu", False):
        data, state = BF._convert_weight_packed_for_cpu_inverse(data.clone(), copy.deepcopy(state))
    return BF.dequantize_4bit(data, state).float()


def set_module(model: nn.Module, name: str, module: nn.Module) -> None:
    """Put `module` in `model` at the qualified name `name` (e.g. "blocks.0.mlp.up"), replacing what is there."""
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, module)


def apply_lora(model: nn.Module, r: int = 8, alpha: float | None = None, dropout: float = 0.0, *,
               base: str = "fp32", compress_statistics: bool = True, seed: int = 0) -> nn.Module:
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
        inner = nf4_linear(lin, compress_statistics=compress_statistics) if base == "nf4" else lin
        set_module(m, name, LoRALinear(inner, r, alpha, dropout, generator=g))
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


def trainable(model: nn.Module) -> list[nn.Parameter]:
    """The parameters of `model` that require gradients, in `model.parameters()` order."""
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


def make_optimizer(name: str, params, lr: float):
    """AdamW (torch, "adamw") or bitsandbytes' AdamW8bit ("adamw8bit") over `params` at `lr`, betas
    0.9/0.999, no weight decay. Raises ValueError for another name."""
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    if name == "adamw8bit":
        import bitsandbytes as bnb  # heavy: it imports triton, and only the 8-bit optimizer needs it

        return bnb.optim.AdamW8bit(params, lr=lr, weight_decay=0.0)
    raise ValueError(f"optimizer={name!r}; choose 'adamw' or 'adamw8bit'")


def finetune(model: nn.Module, steps: int, lr: float, tokens: torch.Tensor, *, batch: int = 8,
             seq_len: int = 64, seed: int = 0, optimizer: str = "adamw") -> list[float]:
    """Train `model`'s trainable parameters in place for `steps` AdamW steps (betas 0.9/0.999, no
    weight decay, constant lr) on random windows of `tokens` drawn from a generator seeded with
    `seed` (the same batches for every model). optimizer: "adamw" (torch) or "adamw8bit"
    (bitsandbytes). Returns the training loss of each step (nats/byte). Leaves the model in eval mode."""
    positive("steps", steps)
    positive("lr", float(lr) if type(lr) is int else lr, float)
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


# ---------------------------------------------------------------- memory

def memory_formula(n_linear: float, n_other: float, n_lora: float, method: str, *, weight_bytes: float = 4,
                   grad_bytes: float | None = None, optimizer_bytes: float = 8, adapter_bytes: float = 4,
                   adapter_grad_bytes: float | None = None, compress_statistics: bool = True,
                   blocksize: int = NF4_BLOCK, dq_block: int = 256, split_adapters: bool = False,
                   nf4_bits: float | None = None) -> dict[str, float]:
    """Predicted bytes {"weights", "gradients", "optimizer"} of fine-tuning with `method`: the course's one
    formula for fine-tuning memory (activations not counted). `finetune_gb` calls it for Llama-size
    models in bf16; `lora_lab.memory_rows` for the course GPT in fp32.

    n_linear: parameters in the weights that QLoRA quantises (the block linears' weight matrices);
    n_other: every other frozen-or-trained parameter (embeddings, norms, biases); n_lora: adapter
    parameters (Σ r·(in + out)). weight_bytes: bytes per unquantised parameter (4 fp32, 2 bf16);
    grad_bytes: per gradient (default weight_bytes); optimizer_bytes: per trained parameter (8 for
    AdamW's two fp32 moments); adapter_bytes / adapter_grad_bytes: per adapter weight / gradient
    (default 4 / adapter_bytes). NF4 costs 4 bits per weight plus its block constants: 32 bits per
    `blocksize` weights, or with `compress_statistics` 8 bits per block plus 32 bits per `dq_block` blocks
    (QLoRA's 4 + 0.127 bits at 64/256); `nf4_bits`, when given (e.g. the bits per parameter measured from a
    quantised state), replaces that formula. full: (weights, grads, optimizer) all over n_linear + n_other;
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
    if nf4_bits is None:
        nf4_bits = 4 + (8 / blocksize + 32 / (blocksize * dq_block) if compress_statistics else 32 / blocksize)
    elif not (isinstance(nf4_bits, (int, float)) and 0 < nf4_bits <= 32):
        raise ValueError(f"nf4_bits={nf4_bits!r} must be a number of bits per parameter in (0, 32]")
    base = n_linear * (nf4_bits / 8 if method == "qlora" else weight_bytes)
    frozen, adapters = base + weight_bytes * n_other, adapter_bytes * n_lora
    out = {"weights": frozen if split_adapters else frozen + adapters, "gradients": adapter_grad_bytes * n_lora,
           "optimizer": optimizer_bytes * n_lora}
    return {**out, "adapters": adapters} if split_adapters else out


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
    return storage_bytes(total_tensors), per


FINETUNE = ("full (bf16, Adam)", "LoRA (bf16 base)", "QLoRA (NF4+DQ base)")


def lora_params(d_model: int, d_ff: int, n_layer: int, rank: int) -> int:
    """LoRA parameters with rank `rank` on every linear of a Llama-style block: q, k, v, o (d x d each)
    and gate, up, down (d x d_ff): rank * (in + out) per matrix."""
    return n_layer * rank * (4 * 2 * d_model + 3 * (d_model + d_ff))


# Llama-65B's shape (Touvron et al., 2023, "LLaMA: Open and Efficient Foundation Language Models", Table 2:
# dimension 8192, 80 layers; the SwiGLU hidden size 2/3 * 4d rounded up to a multiple of 256 is 22016)
LLAMA_SHAPES = {7: (4096, 11008, 32), 13: (5120, 13824, 40), 33: (6656, 17920, 60), 65: (8192, 22016, 80)}


def finetune_gb(params_b: float, method: str, rank: int = 64, shape: tuple | None = None,
                base_bits: float | None = None) -> dict[str, float]:
    """GB (1e9 bytes) of weights, gradients and optimizer state to fine-tune a model of `params_b` billion
    parameters, activations not counted.

    full: bf16 weights and gradients (2 + 2 bytes) and Adam's two fp32 moments (8 bytes): 12 bytes a
    parameter. LoRA / QLoRA: the frozen base in bf16 / NF4 with double quantisation, plus adapters of
    `rank` (from `shape` = (d_model, d_ff, n_layer), else the nearest LLAMA_SHAPES entry) with bf16 weights
    and gradients and fp32 Adam moments (12 bytes an adapter parameter). Every parameter counts as a
    quantisable weight. `base_bits`: the QLoRA base's bits per parameter (e.g. measured from an NF4 state with
    double quantisation); None: the formula's 4 + 8/64 + 32/(64*256). Computed by `memory_formula` (the one
    formula; bytes / 1e9), adapters split out.
    Raises ValueError for an unknown method.
    """
    if method not in FINETUNE:
        raise ValueError(f"method must be one of {FINETUNE}, not {method!r}")
    n = params_b * 1e9
    if method.startswith("full"):
        a = 0
    elif shape is None:
        nearest = min(LLAMA_SHAPES, key=lambda k: abs(k - params_b))
        a = lora_params(*LLAMA_SHAPES[nearest], rank) * params_b / nearest  # scaled to this size
    else:
        a = lora_params(*shape, rank)
    kind = {"full": "full", "LoRA": "lora", "QLoRA": "qlora"}[method.split()[0]]
    parts = memory_formula(n, 0, a, kind, weight_bytes=2, optimizer_bytes=8, adapter_bytes=2, split_adapters=True,
                           nf4_bits=base_bits)
    return {k: parts[k] / GB for k in ("weights", "gradients", "optimizer", "adapters")}
