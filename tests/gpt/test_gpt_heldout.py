"""helpers.gpt.heldout: per-window held-out losses and the noise yardstick a loss gap must exceed."""
import pytest
import torch

from helpers.gpt import data, heldout
from helpers.gpt.model import GPT, GPTConfig
from helpers.gpt.pretrained import validation_loss


def test_window_losses_average_to_the_validation_loss():
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("tiny")).eval()
    val = data.load_corpus("val")
    win = heldout.window_losses(model, val, batches=2, batch=4)
    assert win.shape == (8,) and win.dtype == torch.float64 and not model.training
    assert float(win.mean()) == pytest.approx(validation_loss(model, val, batches=2, batch=4), abs=1e-5)
    with pytest.raises(ValueError, match="batches"):
        heldout.window_losses(model, val, batches=0, batch=4)


def test_loss_sentences_flip_with_the_noise():
    base = torch.tensor([1.0, 1.2, 0.8, 1.1, 0.9, 1.0])
    noisy = base + torch.tensor([0.02, -0.03, 0.01, -0.02, 0.03, 0.0])  # mean gap ~0.0017, spread 0.02
    shifted = base + 0.05 + torch.tensor([0.001, -0.001, 0.0, 0.001, -0.001, 0.0])
    assert not heldout.gap_separated(noisy, base) and heldout.gap_separated(shifted, base)
    assert "cannot be told apart" in heldout.compare_losses("A", noisy, "B", base)
    said = heldout.compare_losses("A", shifted, "B", base)
    assert said.startswith("B's loss is below A's by 0.0500") and "yardstick 2 x the standard error" in said
    assert "over 6 windows" in heldout.yardstick(shifted, base)
    mean, se = heldout.loss_gap(shifted, base)
    assert mean == pytest.approx(0.05) and 0 < se < 0.001
    assert heldout.gap_separated(noisy, base, k=0.01)  # a smaller k separates the same gap
    with pytest.raises(ValueError):
        heldout.loss_gap(base, base[:3])
