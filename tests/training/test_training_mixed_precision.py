"""helpers.training.mixed_precision: every training variant steps, the two scalers train alike, and
the bytes each variant holds."""
import math

import pytest
import torch

from helpers.gpt.model import GPT, GPTConfig
from helpers.training import mixed_precision, mixed_precision_lab


def _tiny_model():
    torch.manual_seed(0)
    return GPT(GPTConfig.preset("tiny", n_layer=1, seq_len=16))


@pytest.mark.slow
def test_training_variants_step_and_memory():
    base = _tiny_model()
    x, y = torch.randint(0, 256, (2, 16)), torch.randint(0, 256, (2, 16))
    results = {}
    for name in mixed_precision.VARIANTS:
        run = mixed_precision.make_run(name, base, lr=1e-3, device="cpu", growth_interval=2)
        results[name] = [run.step(x, y) for _ in range(3)]
        assert all(math.isfinite(r["loss"]) for r in results[name])
        if run.scaler:
            assert [r["scale"] for r in results[name]] == [2.0**16, 2.0**16, 2.0**17]
    assert [r["loss"] for r in results["fp16 + our scaler"]] == [r["loss"] for r in results["fp16 + GradScaler"]]
    n = sum(p.numel() for p in base.parameters())
    fp32 = mixed_precision_lab.memory_breakdown(mixed_precision.make_run("fp32", base, lr=1e-3, device="cpu"), x, y)
    assert fp32["weights"] == fp32["grads"] == 4 * n and fp32["optimizer"] >= 8 * n and fp32["weight_copies"] == 0
    bf16 = mixed_precision_lab.memory_breakdown(mixed_precision.make_run("bf16 autocast", base, lr=1e-3, device="cpu"), x, y)
    assert bf16["weights"] == 4 * n and bf16["weight_copies"] > 0 and bf16["activations"] < fp32["activations"]
    master = mixed_precision_lab.memory_breakdown(mixed_precision.make_run("bf16 weights + fp32 master", base, lr=1e-3, device="cpu"), x, y)
    assert master["weights"] == 2 * n and master["master"] == 4 * n and master["grads"] == 6 * n
    with pytest.raises(ValueError, match="fp8 training"):
        mixed_precision.make_run("fp8 training", base, lr=1e-3, device="cpu")
