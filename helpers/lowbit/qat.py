"""Quantization-aware training for notebook 08: the block linears' weights fake-quantized in the forward pass
(absmax round-to-nearest, per group) with a straight-through estimator in the backward, against
post-training quantization of the same trained GPT, by held-out loss.

- `fake_quant_ste`: the core, on stage in notebook 08; forward equal to `quant.fake_quantize(w, bits,
  "absmax", group)`, gradient the identity.
- `FakeQuant`, `attach`: the parametrization that puts it on every block linear's weight during training.
- `ptq_copy`: a copy of a model with every block linear's weight replaced by its quantized value (RTN).
- `qat_compare`: the trained GPT quantized after training (PTQ), fine-tuned in fp32 then quantized (the same
  steps, so the extra training is not mistaken for QAT's effect), and fine-tuned under fake quantization then
  quantized (QAT); their held-out per-window losses.
"""
from __future__ import annotations

import copy

import torch
from torch import nn
from torch.nn.utils import parametrize

from helpers.gpt import heldout
from helpers.lowbit import gptq, lora, quant
from helpers.measure import bench
from helpers.measure.params import positive


def fake_quant_ste(w: torch.Tensor, bits: int = 4, group: int = 64) -> torch.Tensor:
    """Forward: w rounded to a symmetric `bits`-bit grid, one absmax scale per `group` consecutive inputs.
    Backward: the identity (straight-through), because round() has zero gradient almost everywhere."""
    qmax = 2 ** (bits - 1) - 1
    g = w.reshape(-1, group)
    amax = g.detach().abs().amax(1, keepdim=True)
    scale = torch.where(amax > 0, amax / qmax, torch.ones_like(amax))
    w_q = (torch.clamp(torch.round(g / scale), -qmax, qmax) * scale).reshape(w.shape)
    return w + (w_q - w).detach()  # value of w_q, gradient of w


class FakeQuant(nn.Module):
    """A parametrization: the weight the layer uses is `fake_quant_ste(latent weight, bits, group)`."""

    def __init__(self, bits: int = 4, group: int = 64):
        super().__init__()
        self.bits, self.group = bits, group

    def forward(self, w: torch.Tensor) -> torch.Tensor:
        return fake_quant_ste(w, self.bits, self.group)


def attach(model: nn.Module, bits: int = 4, group: int = 64) -> nn.Module:
    """Put `FakeQuant` on every block linear's weight of `model` (in place); returns the model."""
    for lin in gptq.block_linears(model).values():
        parametrize.register_parametrization(lin, "weight", FakeQuant(bits, group))
    return model


def detach(model: nn.Module) -> nn.Module:
    """Remove the parametrizations `attach` added, keeping the latent (unquantized) weights; returns the model."""
    for lin in gptq.block_linears(model).values():
        if parametrize.is_parametrized(lin, "weight"):
            parametrize.remove_parametrizations(lin, "weight", leave_parametrized=False)
    return model


@torch.no_grad()
def ptq_copy(model: nn.Module, bits: int = 4, group: int = 64) -> nn.Module:
    """A copy of `model` whose block linears' weights are RTN-quantized (`quant.fake_quantize`, absmax, per group)."""
    m = copy.deepcopy(model)
    for lin in gptq.block_linears(m).values():
        lin.weight.copy_(quant.fake_quantize(lin.weight, bits, "absmax", group))
    return m


def qat_compare(model: nn.Module, steps: int = 30, *, lr: float = 1e-4, bits: int = 4, group: int = 64,
                batch: int = 8, seq_len: int = 64, eval_batches: int = 2, seed: int = 0) -> dict:
    """The trained `model` at `bits` bits three ways, each judged on the same held-out windows (the second part of
    `lora.finetune_split()`, `eval_batches` batches of 8): "PTQ" (quantized as trained), "fine-tune, then PTQ"
    (`steps` AdamW steps in fp32 on the first part, then quantized) and "QAT, then PTQ" (the same steps, same
    batches and lr, with `attach`'s fake quantization in the forward pass, then the latent weights quantized the
    same way). On one CPU thread when the model is on the CPU.

    Returns {"windows": {"fp32", "PTQ", "fine-tune, then PTQ", "QAT, then PTQ": per-window losses (nats/byte)},
    "loss": {same keys: mean}, "train": {"fine-tune", "QAT": [training loss per step]}, "steps", "bits", "group"}."""
    for name, value in (("steps", steps), ("bits", bits), ("group", group), ("batch", batch), ("seq_len", seq_len),
                        ("eval_batches", eval_batches)):
        positive(name, value)
    tune, held = lora.finetune_split()
    dev = next(model.parameters()).device

    def windows(m):
        return heldout.window_losses(m, held, seq_len=min(128, m.config.seq_len), batches=eval_batches, batch=8)

    win, train = {}, {}
    with bench.cpu_threads(dev):
        win["fp32"] = windows(model)
        win["PTQ"] = windows(ptq_copy(model, bits, group))
        for label, key, fq in (("fine-tune, then PTQ", "fine-tune", False), ("QAT, then PTQ", "QAT", True)):
            m = lora.prepare(model, "full")
            if fq:
                attach(m, bits, group)
            train[key] = lora.finetune(m, steps, lr, tune, batch=batch, seq_len=seq_len, seed=seed)
            win[label] = windows(ptq_copy(detach(m), bits, group))
    return {"windows": win, "loss": {k: float(v.mean()) for k, v in win.items()}, "train": train, "steps": steps,
            "bits": bits, "group": group}


def qat_sentences(res: dict) -> list[str]:
    """Sentences from `qat_compare`'s result: QAT against fine-tuning then PTQ and against PTQ alone (ranked only
    beyond the noise, `heldout.compare_losses`), and the share of PTQ's loss increase over fp32 that QAT won back."""
    w, loss = res["windows"], res["loss"]
    qat, ft, ptq = "QAT, then PTQ", "fine-tune, then PTQ", "PTQ"
    out = [heldout.compare_losses(qat, w[qat], ft, w[ft]) + ".", heldout.compare_losses(qat, w[qat], ptq, w[ptq]) + "."]
    gap = loss[ptq] - loss["fp32"]
    if gap > 0:
        out.append(f"At {res['bits']} bits PTQ raised the held-out loss by {gap:.4f} nats/byte over fp32; after "
                   f"{res['steps']} QAT steps the quantized model sits {loss[qat] - loss['fp32']:+.4f} from fp32, "
                   f"{(loss[ptq] - loss[qat]) / gap:.0%} of PTQ's increase won back (the fp32 fine-tune, quantized, "
                   f"won back {(loss[ptq] - loss[ft]) / gap:.0%}).")
    else:
        out.append(f"At {res['bits']} bits PTQ did not raise the held-out loss over fp32 here ({gap:+.4f} nats/byte), "
                   "so there was nothing for QAT to win back.")
    return out
