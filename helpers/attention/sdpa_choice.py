"""Which backend PyTorch's scaled_dot_product_attention picks by itself, read from the profiler (notebook 06).

SDPA (`F.scaled_dot_product_attention` without an `sdpa_kernel` context) chooses its kernel per call from the
device, the dtype, the head dim, the causal flag, grouped heads and whether gradients are wanted.
`sdpa_backend` runs one such call under `torch.profiler` and names the backend by the operator it dispatched
to (`BACKEND_OPS`); `backend_of` does the naming from a list of operator names.
"""
from __future__ import annotations

import torch
from torch.profiler import ProfilerActivity, profile

from helpers.attention import kernels
from helpers.measure.profiling import quiet_stderr

BACKEND_OPS = (  # (part of the aten operator's name, the backend), the more specific name first
    ("_scaled_dot_product_flash_attention_for_cpu", "flash (C++ CPU kernel)"),
    ("_scaled_dot_product_flash_attention", "flash (FlashAttention-2)"),
    ("_scaled_dot_product_efficient_attention", "efficient (memory-efficient)"),
    ("_scaled_dot_product_cudnn_attention", "cudnn"),
    ("_scaled_dot_product_fused_attention_overrideable", "fused (the device's own)"),
    ("_scaled_dot_product_attention_math", "math (composite, N x N)"),
)


def backend_of(op_names) -> str | None:
    """The SDPA backend named by the first operator of `op_names` that one of BACKEND_OPS matches; None if none does."""
    for name in op_names:
        for part, backend in BACKEND_OPS:
            if part in name:
                return backend
    return None


def sdpa_backend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False,
                 grad: bool = False) -> str:
    """The backend SDPA picks for one forward call on q (..., H, N, d) and k, v (..., H_kv, N, d), as the course
    calls it (`kernels.attention(..., "sdpa")`, grouped heads included), with inputs that require gradients
    when `grad`. Runs the call once under the profiler; returns "unknown: <ops>" if no operator matched."""
    inputs = [t.detach().requires_grad_(grad) for t in (q, k, v)]
    with quiet_stderr():  # the profiler's C++ side announces its start and stop on file descriptor 2
        with profile(activities=[ProfilerActivity.CPU]) as prof, torch.set_grad_enabled(grad):
            kernels.attention(*inputs, "sdpa", is_causal)
    names = [e.name for e in prof.events()]
    return backend_of(names) or "unknown: " + ", ".join(sorted({n for n in names if "attention" in n}) or ["no op"])


def choices(cases: list[dict], device: str) -> list[dict]:
    """Each case {"where", "shape": (B, H, N, d), "dtype": a torch dtype, "causal", "grad", "kv_heads": None or the
    key/value heads} with "backend" added: what SDPA picks for it on `device`, on inputs from `kernels.make_qkv`."""
    rows = []
    for case in cases:
        b, h, n, d = case["shape"]
        q, k, v = kernels.make_qkv(b, h, n, d, case["dtype"], device, kv_heads=case.get("kv_heads"))
        rows.append({**case, "backend": sdpa_backend(q, k, v, case["causal"], case["grad"])})
    return rows
