"""Exercises of notebook 02 (FLOPs and MFU).

The code exercise is checked against `torch.utils.flop_counter.FlopCounterMode` itself: the
reference below builds one course `Block` of the learner's configuration and counts what PyTorch
runs, forward and forward + backward, so a formula passes only if it equals the counter to the FLOP.
"""
from __future__ import annotations

import torch

from helpers.course.check import Case, register
from helpers.gpt.model import Block, GPTConfig, naive_attention

H100_BF16_DENSE = 989.4e12  # FLOP/s, hardware.PEAKS["h100"] (NVIDIA H100 SXM datasheet, dense)
TORCHTITAN_TOKENS_PER_S = 5762  # torchtitan's Llama 3.1 8B benchmark on 8 x H100, FSDP, per GPU


def counted_block_flops_per_token(d_model: int, n_head: int, n_kv_head: int, d_ff: int,
                                  seq_len: int) -> tuple[float, float]:
    """(forward, forward + backward) FLOPs per token of one course Block, as FlopCounterMode counts them.

    One sequence of `seq_len` tokens through LN -> grouped-query attention (naive kernel, full T x T
    scores) -> LN -> MLP, every parameter and the input trainable. Raises ValueError for a shape
    GPTConfig refuses (d_model not divisible by n_head, n_head not by n_kv_head).
    """
    from torch.utils.flop_counter import FlopCounterMode  # heavy: it imports triton (see measure.triton_mode)
    cfg = GPTConfig(n_layer=1, n_head=n_head, n_kv_head=n_kv_head, d_model=d_model, d_ff=d_ff,
                    seq_len=seq_len)
    with torch.device("meta"):  # shapes only: the counter needs no data
        block = Block(cfg)
        x = torch.empty(1, seq_len, d_model, requires_grad=True)  # (B=1, T, d_model)
    block.attn.attn_fn = naive_attention
    with FlopCounterMode(display=False) as fwd:
        y = block(x)
    with FlopCounterMode(display=False) as bwd:
        y.backward(torch.ones_like(y))
    forward = fwd.get_total_flops()
    return forward / seq_len, (forward + bwd.get_total_flops()) / seq_len


def _block_cases() -> list[Case]:
    return [
        Case("MHA, d=64, 4 heads, T=16", (64, 4, 4, 256, 16)),
        Case("GQA, 8 query heads share 2 kv heads, T=32", (128, 8, 2, 512, 32)),
        Case("MQA, one kv head, T=24", (96, 6, 1, 384, 24)),
        Case("odd sizes: d=48, 6 heads, 3 kv heads, d_ff=80, T=13", (48, 6, 3, 80, 13)),
        Case("long context, narrow model: T=200 > d_ff", (32, 2, 1, 64, 200)),
        Case("one token", (40, 5, 5, 72, 1)),
    ]


def _mha_everywhere(d_model, n_head, n_kv_head, d_ff, seq_len):
    """Wrong: k and v projected as if every query head had its own kv head."""
    fwd = 2 * 4 * d_model * d_model + 4 * seq_len * d_model + 4 * d_model * d_ff
    return fwd, 3 * fwd


def _causal_half(d_model, n_head, n_kv_head, d_ff, seq_len):
    """Wrong: the masked half of the scores left out (the counter charges the full square)."""
    hd = d_model // n_head
    fwd = 2 * d_model * (n_head + 2 * n_kv_head) * hd + 2 * seq_len * d_model + 2 * d_model * d_model \
        + 4 * d_model * d_ff
    return fwd, 3 * fwd


def _backward_only(d_model, n_head, n_kv_head, d_ff, seq_len):
    """Wrong: the second number is the backward alone (2x forward), not forward + backward."""
    hd = d_model // n_head
    fwd = 2 * d_model * (n_head + 2 * n_kv_head) * hd + 4 * seq_len * d_model + 2 * d_model * d_model \
        + 4 * d_model * d_ff
    return fwd, 2 * fwd


register(
    "02.block_flops", "code",
    prompt="FLOPs per token of one GQA block, forward and forward + backward",
    hint="count every matmul of one token's trip through the block: the q projection has n_head heads, "
         "k and v have n_kv_head each; the scores and the probabilities x V each touch all T positions; "
         "each matmul costs twice as much again in backward",
    solution=counted_block_flops_per_token, cases=_block_cases, rtol=1e-9, atol=0.0,
    tolerance="exact: FlopCounterMode's integer count divided by T, rtol 1e-9",
    wrong=(_mha_everywhere, _causal_half, _backward_only),
    outputs=("forward FLOPs per token", "forward + backward FLOPs per token"),
)

register(
    "02.six_nd", "value",
    prompt="training FLOPs of a 1.3B-parameter model on 26B tokens, by 6ND",
    hint="6 x parameters x tokens, both written out in absolute units (1B = 10^9)",
    solution=lambda: 6 * 1.3e9 * 26e9, wrong=(6 * 1.3e9 * 26e6, 2 * 1.3e9 * 26e9),
)

register(
    "02.torchtitan_mfu", "value",
    prompt="MFU (a fraction) of torchtitan's Llama 3.1 8B at 5762 tokens/s per H100, counting 6N per token",
    hint="achieved FLOP/s = 6 x N x tokens per second; divide by the H100 SXM's dense bf16 peak in FLOP/s",
    solution=lambda: 6 * 8e9 * TORCHTITAN_TOKENS_PER_S / H100_BF16_DENSE, rtol=0.02,
    wrong=(2 * 8e9 * TORCHTITAN_TOKENS_PER_S / H100_BF16_DENSE, 6 * 8e9 * TORCHTITAN_TOKENS_PER_S / 1979e12,
           100 * 6 * 8e9 * TORCHTITAN_TOKENS_PER_S / H100_BF16_DENSE),
)

register(
    "02.attention_equals_mlp", "value",
    prompt="GPT-2 small (d=768, MHA, d_ff=4d): the context T at which scores + values cost as much as the MLP",
    hint="per token and layer, forward: the scores and the probabilities x V grow with T, the two MLP matmuls "
         "do not; write both in terms of d, d_ff and T and set them equal",
    solution=lambda: 4 * 768, rtol=1e-3,
    wrong=(2 * 4 * 768, 768, 4 * 768 / 2),
)
