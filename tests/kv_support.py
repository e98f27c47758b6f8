"""What the KV-cache tests share (tests/gpt/test_gpt_generation.py and tests/decode/): a small course GPT whose
logits sit far from ties, the same GPT at its initial scale (`tiny_gpt`, for the paged cache and the
schedulers), the cache dtypes every cache must accept, and the tolerance its logits are held to against an
fp32 cache."""
from __future__ import annotations

import torch

from helpers.gpt.model import GPT, GPTConfig

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def small_gpt(n_kv_head: int, seed: int = 0) -> GPT:
    """A 2-layer, 4-head, 32-wide GPT with `n_kv_head` kv heads, eval mode, weights scaled by 3 (larger than
    the init, so that logits are far from ties)."""
    torch.manual_seed(seed)
    cfg = GPTConfig(n_layer=2, n_head=4, n_kv_head=n_kv_head, d_model=32, d_ff=64, seq_len=48)
    model = GPT(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0)
    return model


def tiny_gpt(n_kv_head: int, dtype: torch.dtype = torch.float32) -> GPT:
    """The same 2-layer, 4-head, 32-wide GPT (seed 0) at its initial scale, in `dtype`, eval mode: the model the
    paged-cache and serving tests serve."""
    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=2, n_head=4, n_kv_head=n_kv_head, d_model=32, d_ff=64, seq_len=48)
    return GPT(cfg).to(dtype).eval()


def tolerance(*dtypes) -> float:
    """The stated tolerance, relative to the largest |logit|: 4 x the machine epsilon of the narrowest dtype
    involved (bf16: 2^-7, fp16: 2^-10, fp32: 2^-23)."""
    return 4 * max(torch.finfo(d).eps for d in dtypes)


def assert_close_to_reference(got: torch.Tensor, ref: torch.Tensor, tol: float) -> None:
    """Logits within tol of the reference's scale, and the same greedy token wherever the reference's top
    two logits lie further apart than twice the error seen (a closer pair may swap within it)."""
    got, ref = got.float(), ref.float()
    err, scale = float((got - ref).abs().max()), float(ref.abs().max())
    assert err <= tol * scale
    top2 = ref.topk(2, dim=-1).values
    sure = top2[..., 0] - top2[..., 1] > 2 * err
    assert torch.equal(got.argmax(-1)[sure], ref.argmax(-1)[sure])
