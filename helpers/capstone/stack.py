"""Notebook 14's technique: the course's training techniques stacked on one training step, rung by rung.

A rung is a set of techniques. The ladder starts from a baseline (fp32, eager, naive attention that
materialises the T x T scores, torch's for-loop AdamW, each step's batch in `micro_batches` pieces with
gradient accumulation, batches handed over from pageable memory in the training process) and each rung
adds one technique to the rung before it:

=============  ============================================================  ========
technique      what it changes                                               notebook
=============  ============================================================  ========
`tf32`         fp32 matmuls on TF32 tensor cores (`torch.backends.cuda.matmul`) 01, 03
`bf16`         bf16 autocast over fp32 master weights                        03
`sdpa`         attention through `scaled_dot_product_attention` (flash/fused) 06
`fused_adamw`  AdamW with `fused=True` (one kernel for every parameter)       03
`compile`      `torch.compile` of each block (regional: one code for all)    09
`fp8`          the blocks' linears as FP8 rowwise `Float8Linear`             07
`data_path`    batches from a DataLoader worker, prefetched, pinned on CUDA  12
`checkpoint`   every block recomputed in backward, the whole batch at once   04, 05
=============  ============================================================  ========

Every rung sees the same batches in the same order and the same tokens per optimizer step: with
`micro_batches` = k the step's (B, T) batch is cut into k micro-batches whose mean losses are weighted
1/k (`training.accumulation`), which gives the gradient of the whole batch's mean loss; the checkpoint
rung spends the memory checkpointing frees on micro-batches k times larger (k = 1). `unavailable` says in
one sentence why a device cannot run a technique; the ladder then goes on without it. A format the device
only emulates counts as one it cannot run (bf16 on a CPU without bf16 units, `hardware.emulated`): its rung
would time the emulation, and every later rung, holding it too, could not be ranked.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

import torch

from helpers.fusion import compiler
from helpers.gpt.model import GPT, GPTConfig
from helpers.lowbit import fp8_linear
from helpers.measure import hardware
from helpers.measure.params import positive
from helpers.training import accumulation

RECOMPILE_LIMIT = 64  # compiled entries allowed per frame while a ladder runs (Dynamo's default is 8)
TECHNIQUES = ("tf32", "bf16", "sdpa", "fused_adamw", "compile", "fp8", "data_path", "checkpoint")
# a technique that stands in for one of the ladder's rather than adding a rung: the course's own Triton
# FlashAttention (notebook 06) in sdpa's place, as a second attention row
VARIANTS = {"triton_attention": "sdpa"}
TITLES = {"tf32": "TF32 matmuls", "bf16": "bf16 autocast", "sdpa": "fused attention (SDPA)",
          "fused_adamw": "fused AdamW", "compile": "torch.compile (each block)", "fp8": "FP8 rowwise linears",
          "data_path": "loader worker, prefetch, pinned", "checkpoint": "checkpointing, larger micro-batch",
          "triton_attention": "the course's Triton FlashAttention"}


def unavailable(technique: str, device: str) -> str | None:
    """Why `device` ("cpu" or "cuda") cannot run `technique`, in one sentence; None when it can.
    Raises ValueError for an unknown technique."""
    if technique not in TECHNIQUES and technique not in VARIANTS:
        raise ValueError(f"technique={technique!r}; choose one of {', '.join([*TECHNIQUES, *VARIANTS])}")
    if technique == "triton_attention":
        from helpers.attention import kernels  # heavy: imports Triton, and only this row needs it

        if device != "cuda":
            return "the course's Triton kernel runs on a CPU only in Triton's interpreter, far too slow to train with"
        if kernels.TRITON_MISSING:
            return f"the course's Triton kernel cannot run here: {kernels.TRITON_MISSING}"
        return None
    caps = hardware.capabilities()
    if technique == "tf32" and not (device == "cuda" and caps["tf32"]):
        return "TF32 needs an NVIDIA GPU of compute capability 8.0 or newer (A100, H100)"
    if technique == "fp8" and not (device == "cuda" and caps["fp8"]):
        return "FP8 matmuls need FP8 tensor cores (an NVIDIA GPU of compute capability 8.9 or newer)"
    if technique == "bf16" and device == "cuda" and not caps["bf16"]:
        return "this GPU has no bf16 units (a T4 or older), so bf16 autocast would be emulated"
    if technique == "bf16" and device != "cuda" and (why := hardware.emulated("bf16", device)):
        return (f"{why}; a rung's step would time the emulation, and every rung above it would hold bf16 too, so "
                "the ladder goes on in fp32 without it")
    return None


@dataclass(frozen=True)
class Rung:
    """One rung: its name (the technique it adds, "baseline" first), the techniques it runs, and those the
    ladder holds but this device cannot run ({technique: why})."""

    name: str
    techniques: frozenset
    skipped: dict = field(default_factory=dict)

    def has(self, technique: str) -> bool:
        return technique in self.techniques


def ladder(device: str, techniques: Iterable[str] = TECHNIQUES) -> list[Rung]:
    """The baseline, then one rung per technique the device can run, each holding every technique before it.

    A technique the device cannot run gets no rung; every later rung names it in `skipped`. Raises
    ValueError for an unknown or repeated technique."""
    techniques = list(techniques)
    if len(set(techniques)) != len(techniques):
        raise ValueError(f"techniques={techniques!r} names one twice")
    rungs, held, skipped = [Rung("baseline", frozenset())], set(), {}
    for t in techniques:
        why = unavailable(t, device)
        if why:
            skipped[t] = why
            continue
        held.add(t)
        rungs.append(Rung(t, frozenset(held), dict(skipped)))
    return rungs


@contextlib.contextmanager
def tf32(enabled: bool) -> Iterator[None]:
    """fp32 matmuls and convolutions on TF32 tensor cores inside the block (restored after)."""
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


@dataclass
class Built:
    """What `build` returns: the model as built (`model`, its blocks compiled in place on a compile rung),
    what the step calls (`forward`), the optimizer, the micro-batches per step and the autocast dtype
    (None: fp32)."""

    rung: Rung
    model: GPT
    forward: Callable
    optimizer: torch.optim.Optimizer
    micro_batches: int
    autocast: torch.dtype | None

    def step(self, x: torch.Tensor, y: torch.Tensor) -> float:
        """One optimizer step on the (B, T) batch: accumulation over `micro_batches`, AdamW, zero_grad; the
        batch's mean loss (a float: one host sync per step)."""
        with tf32(self.rung.has("tf32")):
            loss = accumulation.accumulate_gradients(self.forward, accumulation.split_batch(x, y, self.micro_batches),
                                                     autocast_dtype=self.autocast)
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss


def settings(techniques: Iterable[str], micro_batches: int) -> dict:
    """What a set of techniques sets on the baseline's training step (device-independent):
    {"attn_impl": "sdpa", "flash_triton" (triton_attention) or "naive", "adamw": AdamW's keyword arguments ({"fused": True} or
    {"foreach": False}), "autocast": torch.bfloat16 or None, "fp8": bool, "checkpoint": bool,
    "compile": bool, "micro_batches": `micro_batches`, or 1 with checkpointing (the whole batch at once)}.
    Raises ValueError for an unknown technique, sdpa with triton_attention (two attention kernels) or
    micro_batches < 1."""
    positive("micro_batches", micro_batches)
    techniques = set(techniques)
    bad = sorted(techniques - set(TECHNIQUES) - set(VARIANTS))
    if bad:
        raise ValueError(f"unknown technique(s) {bad}; choose from {', '.join([*TECHNIQUES, *VARIANTS])}")
    if {"sdpa", "triton_attention"} <= techniques:
        raise ValueError("sdpa and triton_attention are two attention kernels: choose one")
    return {"attn_impl": "sdpa" if "sdpa" in techniques else "flash_triton" if "triton_attention" in techniques
            else "naive",
            "adamw": {"fused": True} if "fused_adamw" in techniques else {"foreach": False},
            "autocast": torch.bfloat16 if "bf16" in techniques else None, "fp8": "fp8" in techniques,
            "checkpoint": "checkpoint" in techniques, "compile": "compile" in techniques,
            "micro_batches": 1 if "checkpoint" in techniques else micro_batches}


def build(cfg: GPTConfig, rung: Rung, device: str, *, micro_batches: int = 4, lr: float = 1e-3,
          seed: int = 0) -> Built:
    """The model (seeded: the same weights on every rung), optimizer and step for one rung on `device`.

    micro_batches: the accumulation factor of every rung but "checkpoint" (which runs the whole batch,
    all blocks recomputed). Raises ValueError for micro_batches < 1 and RuntimeError naming a technique
    the rung holds but `device` cannot run."""
    for t in rung.techniques:
        if why := unavailable(t, device):
            raise RuntimeError(f"rung {rung.name!r} holds {t}, which {device} cannot run: {why}")
    return build_from(cfg, settings(rung.techniques, micro_batches), device, lr=lr, seed=seed, rung=rung)


def build_from(cfg: GPTConfig, s: dict, device: str, *, lr: float = 1e-3, seed: int = 0,
               rung: Rung | None = None) -> Built:
    """A model, optimizer and step made from `settings`' dict `s` (the seeded weights of every rung)."""
    if s["attn_impl"] == "flash_triton":  # the course's Triton FlashAttention (notebook 06) as an attention kernel
        from helpers.attention import kernels  # heavy: imports Triton

        kernels.register_course_kernels()
    torch.manual_seed(seed)  # the same initial weights on every rung, so that their losses can be compared
    model = GPT(cfg, attn_impl=s["attn_impl"]).to(device)  # "naive" writes the T x T scores; "sdpa" fuses them
    if s["fp8"]:  # the blocks' linears replaced by FP8 rowwise ones (notebook 07)
        fp8_linear.convert_to_float8(model, "rowwise")
    model.set_checkpointing(bool(s["checkpoint"]))  # each block's activations recomputed in backward (notebook 04)
    if s["compile"]:  # regional compilation (notebook 09): the blocks share one compiled code, so one cold
        compiler.compile_blocks(model)  # compile per rung costs about one block's, not the whole model's
    opt = torch.optim.AdamW(model.parameters(), lr=lr, **s["adamw"])  # fused=True: one kernel; foreach=False: a loop
    # autocast and the micro-batches are not on the model: `Built.step` applies them to every step
    return Built(rung or Rung("custom", frozenset()), model, model, opt, s["micro_batches"], s["autocast"])


def compiled(model: GPT) -> bool:
    """Whether every block of `model` runs compiled (`nn.Module.compile` in place)."""
    return all(getattr(b, "_compiled_call_impl", None) is not None for b in model.blocks)


def batches(built: Built, data: list[tuple[torch.Tensor, torch.Tensor]], device: str) -> Iterator[tuple]:
    """The step's batches on `device`, in the given order: copied from pageable memory in this process,
    or, on a `data_path` rung, from a DataLoader worker (prefetch 2), pinned on CUDA and copied without
    blocking."""
    if not built.rung.has("data_path"):
        for x, y in data:
            yield x.to(device), y.to(device)
        return
    pin = device == "cuda"
    loader = torch.utils.data.DataLoader(_Batches(data), batch_size=None, num_workers=1, prefetch_factor=2,
                                         pin_memory=pin, persistent_workers=False)
    for x, y in loader:
        yield x.to(device, non_blocking=pin), y.to(device, non_blocking=pin)


class _Batches(torch.utils.data.Dataset):
    """Prepared (x, y) batches as a map-style data set (a class, so that a spawned worker can pickle it)."""

    def __init__(self, data: list[tuple[torch.Tensor, torch.Tensor]]):
        self.data = data

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.data[i]
