"""What the speculative-decoding tests share: a target and a draft, small random GPTs whose weights are scaled up
so that their distributions are sharp, far from ties (the tests take seconds and need no trained checkpoint)."""
import pytest
import torch

from helpers.gpt.model import GPT, GPTConfig


def sharp_gpt(n_layer: int, d_model: int, seed: int, scale: float = 3.0) -> GPT:
    """A random course GPT (2 heads, 96 positions) with every parameter multiplied by `scale`, in eval mode."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(n_layer=n_layer, n_head=2, d_model=d_model, d_ff=2 * d_model, seq_len=96)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(scale)
    return model


@pytest.fixture(scope="module")
def models():
    """(target, draft): a 2-layer width-32 and a 1-layer width-16 sharp GPT."""
    return sharp_gpt(2, 32, 0), sharp_gpt(1, 16, 1)
