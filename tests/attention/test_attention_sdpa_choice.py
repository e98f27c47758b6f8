"""helpers.attention.sdpa_choice: the backend SDPA picks, named from the profiler's operators."""
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from helpers.attention import kernels, sdpa_choice


def test_backend_of_names_the_more_specific_operator():
    assert sdpa_choice.backend_of(["aten::scaled_dot_product_attention",
                                   "aten::_scaled_dot_product_flash_attention_for_cpu"]) == "flash (C++ CPU kernel)"
    assert sdpa_choice.backend_of(["aten::_scaled_dot_product_flash_attention"]) == "flash (FlashAttention-2)"
    assert sdpa_choice.backend_of(["aten::_scaled_dot_product_efficient_attention"]).startswith("efficient")
    assert sdpa_choice.backend_of(["aten::_scaled_dot_product_attention_math"]).startswith("math")
    assert sdpa_choice.backend_of(["aten::matmul", "aten::softmax"]) is None


def test_the_probe_reads_the_backend_that_ran():
    q, k, v = kernels.make_qkv(1, 2, 32, 16, torch.float32, "cpu", seed=0)
    backends = {b for _, b in sdpa_choice.BACKEND_OPS}
    assert sdpa_choice.sdpa_backend(q, k, v, True, grad=True) in backends
    with sdpa_kernel(SDPBackend.MATH):  # forced: the probe must see the math operator run
        assert sdpa_choice.sdpa_backend(q, k, v, False).startswith("math")


def test_the_probe_handles_grouped_heads():
    q, k, v = kernels.make_qkv(1, 4, 16, 8, torch.float32, "cpu", kv_heads=2, seed=1)
    assert not sdpa_choice.sdpa_backend(q, k, v, True).startswith("unknown")


def test_choices_adds_a_backend_to_every_case():
    cases = [{"where": "a", "shape": (1, 2, 16, 8), "dtype": torch.float32, "causal": False, "grad": False},
             {"where": "b", "shape": (1, 4, 16, 8), "dtype": torch.float32, "causal": True, "grad": True, "kv_heads": 2}]
    rows = sdpa_choice.choices(cases, "cpu")
    assert [r["where"] for r in rows] == ["a", "b"]
    assert all(r["backend"] and not r["backend"].startswith("unknown") for r in rows)
