"""Notebook 04's exercises: a layer's activation bytes by the paper's formula, what checkpointing every
layer saves, and a selective-recompute block written by the learner.

The code exercise hands the learner's `block_forward(block, x)` one block of the course GPT and its
input (which requires grad, as inside the model). It must compute the block, recompute some part of
it in backward with `torch.utils.checkpoint.checkpoint(..., use_reentrant=False)`, and be checked on
three things at once, each measured on the case:

* its output and every gradient (parameters and input) equal the plain block's (fp32, rtol 1e-5,
  atol 1e-6: recompute replays the same operations, so only reduction order may differ);
* it keeps fewer bytes for backward than the plain block, counted with the course's saved-tensor
  counter (`memory.saved_breakdown`, the hooks autograd calls for every tensor it saves);
* its recompute is selective: the extra backward FLOPs (FlopCounterMode) are at most a tenth of the
  block's forward FLOPs, so checkpointing the whole block does not pass.

The counter sees what autograd saves; `create_selective_checkpoint_contexts` caches op outputs
outside autograd's hooks, so this exercise asks for `checkpoint` around pieces of the block.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from helpers.course.check import Case, register
from helpers.gpt.model import GPT, Block, GPTConfig
from helpers.measure.memory import saved_breakdown
from helpers.training.checkpointing import korthikanti_bytes

RECOMPUTE_BUDGET = 0.1  # at most this share of the block's forward FLOPs may be recomputed
FEWER = "fewer than the plain block"
SELECTIVE = f"at most {RECOMPUTE_BUDGET:.0%} of the block's forward FLOPs"


# ---------------------------------------------------------------- 04.layer_gib

register(
    "04.layer_gib", "value",
    prompt="by Korthikanti et al.'s formula, GiB of activations one GPT-2-medium layer (h=1024, a=16) keeps "
           "at s=2048, b=4 in 16-bit",
    hint="the formula of the theory section gives bytes; its second term grows with s², so a·s/h matters; "
         "a GiB is 2³⁰ bytes, not 10⁹",
    solution=lambda: korthikanti_bytes(2048, 4, 1024, 16) / 2**30,
    wrong=(korthikanti_bytes(2048, 4, 1024, 16) / 1e9, 34 * 2048 * 4 * 1024 / 2**30),
    rtol=1e-2,
)


# ---------------------------------------------------------------- 04.every_factor

register(
    "04.every_factor", "value",
    prompt="same layer: checkpointing it keeps only its 16-bit input; by what factor does that shrink what "
           "the layer keeps?",
    hint="the input is one (s, b, h) tensor at 2 bytes per element; divide the formula's bytes by it",
    solution=lambda: korthikanti_bytes(2048, 4, 1024, 16) / (2 * 2048 * 4 * 1024),
    wrong=(34 / 2, 4 / 3, korthikanti_bytes(2048, 4, 1024, 16) / (4 * 2048 * 4 * 1024)),
    rtol=1e-2,
)


# ---------------------------------------------------------------- 04.selective (code)

def _gelu_down(mlp, h: torch.Tensor) -> torch.Tensor:
    return mlp.down(F.gelu(h, approximate="tanh"))  # (B, T, d_model)


def reference_block_forward(block, x: torch.Tensor) -> torch.Tensor:
    """One block, x: (B, T, d_model) -> (B, T, d_model), recomputing GELU and the down projection.

    The up projection's output h (B, T, d_ff) is the checkpoint's input and is kept; GELU(h), as
    large, is rebuilt in backward, where early stop skips re-running the down matmul.
    """
    x = x + block.attn(block.ln_1(x))  # (B, T, d_model)
    h = block.mlp.up(block.ln_2(x))  # (B, T, d_ff)
    y = checkpoint(_gelu_down, block.mlp, h, use_reentrant=False) if torch.is_grad_enabled() else _gelu_down(block.mlp, h)
    return x + block.mlp.drop(y)  # (B, T, d_model)


def _plain(block, x):
    """Planted wrong: no recomputation, so nothing is saved (bytes equal the plain block's)."""
    return block(x)


def _no_grad_mlp(block, x):
    """Planted wrong: the MLP under no_grad keeps nothing, and its weights get no gradient."""
    x = x + block.attn(block.ln_1(x))
    with torch.no_grad():
        y = block.mlp(block.ln_2(x))
    return x + y


def _whole_block(block, x):
    """Planted wrong: the whole block recomputed (fewer bytes, right gradients, not selective)."""
    return checkpoint(Block.forward, block, x, use_reentrant=False)


def _block(cfg_kwargs: dict, seed: int):
    torch.manual_seed(seed)
    cfg = GPTConfig(n_layer=1, vocab_size=32, **cfg_kwargs)
    block = GPT(cfg, attn_impl="naive").blocks[0]  # naive: FlopCounterMode sees its matmuls on every device
    return block.train(), cfg


def _cases() -> list[Case]:
    small = dict(n_head=4, d_model=32, d_ff=128, seq_len=32)
    return [
        Case("B=2, T=16, 4 heads", (2, 16), {"cfg": small, "seed": 0}),
        Case("odd sizes: B=3, T=13, d_ff=72", (3, 13), {"cfg": {**small, "d_ff": 72}, "seed": 1}),
        Case("grouped-query attention (4 query heads, 2 kv heads), T=9", (2, 9),
             {"cfg": {**small, "n_kv_head": 2}, "seed": 2}),
        Case("dropout 0.2: recompute must replay the same masks", (2, 16), {"cfg": {**small, "dropout": 0.2}, "seed": 3}),
        Case("one token per sequence (T=1)", (4, 1), {"cfg": small, "seed": 4}),
    ]


def _measure(fn, block, x):
    """(output, gradients, saved bytes, backward FLOPs) of out = fn(block, x) under a fixed RNG state."""
    from torch.utils.flop_counter import FlopCounterMode  # heavy: it imports triton (see measure.triton_mode)
    block.zero_grad(set_to_none=True)
    x = x.detach().requires_grad_()
    held = {}

    def forward():
        torch.manual_seed(1234)  # the same dropout masks for the learner's block and the plain one
        held["out"] = fn(block, x)

    saved = saved_breakdown(forward, block.parameters())["activations"]
    out = held["out"]
    if out is None:
        raise NotImplementedError("the function returns None")
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(7))  # a loss that weighs every output
    with FlopCounterMode(display=False) as counter:
        (out * w).sum().backward()
    grads = {name: (p.grad.detach().clone() if p.grad is not None else None) for name, p in block.named_parameters()}
    grads["input x"] = x.grad.detach().clone() if x.grad is not None else None
    return out.detach(), grads, saved, counter.get_total_flops()


def _run(fn, case: Case):
    """Output and gradients of fn(block, x), and verdicts on its kept bytes and recompute FLOPs."""
    from torch.utils.flop_counter import FlopCounterMode  # heavy: it imports triton (see measure.triton_mode)
    block, cfg = _block(case.kwargs["cfg"], case.kwargs["seed"])
    B, T = case.args
    x = torch.randn(B, T, cfg.d_model, generator=torch.Generator().manual_seed(case.kwargs["seed"] + 100))
    out, grads, saved, bwd = _measure(fn, block, x)
    _, _, plain_saved, plain_bwd = _measure(lambda b, t: b(t), block, x)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        block(x)
    forward_flops = counter.get_total_flops()
    share = (bwd - plain_bwd) / forward_flops
    return {
        "output": out,
        "gradients": grads,
        "bytes kept for backward": FEWER if saved < plain_saved else
        f"not fewer: {saved:,} B, plain {plain_saved:,} B",
        "recomputed FLOPs": SELECTIVE if share <= RECOMPUTE_BUDGET else
        f"recomputes {share:.0%} of forward FLOPs",
    }


register(
    "04.selective", "code",
    prompt="write block_forward(block, x): one block that recomputes a part of your choice in backward "
           "(same gradients, fewer bytes kept, recompute at most a tenth of the forward FLOPs)",
    hint="keep the block's structure (x + attn(ln_1(x)), then + mlp(ln_2(x))) and put only a piece whose "
         "output is large but cheap to rebuild under checkpoint(fn, *inputs, use_reentrant=False); its "
         "inputs are kept, everything it computes inside is rebuilt. Never use no_grad to save memory: "
         "what runs under it gets no gradient",
    solution=reference_block_forward,
    wrong=(_plain, _no_grad_mlp, _whole_block),
    cases=_cases,
    run=_run,
    rtol=1e-5,
    atol=1e-6,
    tolerance="fp32 outputs and gradients within rtol=1e-5, atol=1e-6 of the plain block's; fewer bytes "
              f"kept; recompute at most {RECOMPUTE_BUDGET:.0%} of the forward FLOPs",
)
