"""Notebook 04's two views of activation bytes beyond the course's own strategies, measured and returned as rows.

* `crossover_rows`, `crossover_claim`: the sequence length at which one layer's activations (Korthikanti et
  al.'s formula, `checkpointing.korthikanti_bytes`) outgrow its weights, per preset, and the ledger row on the
  first source text's "activations exceed the parameters at long sequences" (basis "formula");
* `hf_checkpointing`: Hugging Face's `gradient_checkpointing_enable()` on a small GPT-2 built from a config (no
  download): gradients with and without it, and the bytes autograd keeps for backward (`helpers.measure.memory`),
  set beside the course's "none" and "every" strategies, the policy it implements.

The strategies themselves and their measurements are in `checkpointing` and `checkpointing_lab`.
"""
from __future__ import annotations

import warnings
from typing import Any, Sequence

import torch

from helpers.gpt.model import PRESETS, Block, GPTConfig
from helpers.measure import memory
from helpers.training.checkpointing import activation_crossover, korthikanti_bytes


# ---------------------------------------------------------------- activations against weights

def layer_params(config: GPTConfig) -> int:
    """Parameters of one block of the course GPT of this shape (weights, biases, LayerNorms), without allocating."""
    with torch.device("meta"):
        return sum(p.numel() for p in Block(config).parameters())


def crossover_rows(presets: Sequence[str] = tuple(PRESETS), b: int = 1) -> list[dict[str, Any]]:
    """For each preset: one block's 16-bit weight bytes, the sequence length at which its 16-bit activations
    (micro-batch b) equal them, and the activations over the weights at the preset's own context length."""
    rows = []
    for name in presets:
        cfg = GPTConfig.preset(name)
        weight_bytes = 2 * layer_params(cfg)  # 16-bit weights, the precision Korthikanti et al. count activations in
        s_cross = activation_crossover(cfg.d_model, cfg.n_head, weight_bytes, b)
        rows.append({"preset": name, "d_model": cfg.d_model, "n_head": cfg.n_head, "context": cfg.seq_len,
                     "weight_bytes": weight_bytes, "crossover": s_cross,
                     "ratio_at_context": korthikanti_bytes(cfg.seq_len, b, cfg.d_model, cfg.n_head) / weight_bytes})
    return rows


def crossover_claim(rows: Sequence[dict[str, Any]], preset: str) -> dict[str, Any]:
    """`claims.verdict`'s keyword arguments for "activations exceed the parameters at long sequences" (the first
    source text, section 3.1), judged at `preset`'s row of `crossover_rows`: the crossover length against at most
    that preset's context length (a crossover beyond the context would mean the activations never exceed the
    weights at any length the model trains at). A formula with exact inputs: no spread."""
    r = next(r for r in rows if r["preset"] == preset)
    return dict(claim_id="activations-exceed-parameters", notebook="04",
                claim="at long sequences a layer's activations exceed its parameters",
                source="the first source text, section 3.1", value=r["crossover"], unit="tokens",
                claimed=(None, r["context"]), above="contradicted", basis="formula",
                measured=f"{preset}: one layer's 16-bit activations (s·b·h·(34 + 5as/h), b=1) equal its "
                         f"{r['weight_bytes']:,} weight bytes at s = {r['crossover']:.0f}; at its context of "
                         f"{r['context']} they are {r['ratio_at_context']:.2f}x the weights")


# ---------------------------------------------------------------- Hugging Face's gradient_checkpointing_enable

def hf_checkpointing(config: GPTConfig, batch: int, seq_len: int, *, device: str = "cpu",
                     autocast: torch.dtype | None = None, seed: int = 0) -> dict[str, Any]:
    """Build a transformers GPT-2 of `config`'s shape from a config (random weights, dropout 0, eager attention,
    nothing downloaded), run one forward (under autocast to `autocast`, if given) and backward on random tokens with and without
    `gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})`, and return the
    bytes autograd kept for backward in each ("saved_off", "saved_on", parameters left out), the largest
    gradient difference ("max_grad_diff"), whether every gradient is bitwise equal ("identical"), and how many of
    the "layers" decoder layers it marked ("checkpointed_layers")."""
    from transformers import GPT2Config, GPT2LMHeadModel  # heavy (seconds to import): only where this runs

    hf_cfg = GPT2Config(vocab_size=config.vocab_size, n_positions=config.seq_len, n_embd=config.d_model,
                        n_layer=config.n_layer, n_head=config.n_head, n_inner=config.d_ff, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False, bos_token_id=None, eos_token_id=None,
                        loss_type="ForCausalLM")
    hf_cfg._attn_implementation = "eager"  # plain matmuls and softmax, like the course's naive attention
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(hf_cfg).to(device).train()
    ids = torch.randint(0, config.vocab_size, (batch, seq_len), generator=torch.Generator().manual_seed(seed))
    ids = ids.to(device)  # (batch, seq_len)
    params = list(model.parameters())

    def forward():
        with torch.autocast(ids.device.type, dtype=autocast or torch.bfloat16, enabled=autocast is not None):
            return model(input_ids=ids, labels=ids).loss

    def grads():
        model.zero_grad(set_to_none=True)
        forward().backward()
        return [p.grad.detach().clone() for p in params]

    saved_off, grads_off = memory.saved_tensor_bytes(forward, ignore=params), grads()
    with warnings.catch_warnings():  # transformers 5 renames it activation_checkpointing_enable; both do the same
        warnings.simplefilter("ignore", FutureWarning)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    saved_on, grads_on = memory.saved_tensor_bytes(forward, ignore=params), grads()
    diff = max((a - b).abs().max().item() for a, b in zip(grads_off, grads_on))
    return {"saved_off": saved_off, "saved_on": saved_on, "max_grad_diff": diff,
            "identical": all(torch.equal(a, b) for a, b in zip(grads_off, grads_on)),
            "checkpointed_layers": sum(bool(getattr(b, "gradient_checkpointing", False)) for b in model.transformer.h),
            "layers": len(model.transformer.h)}


def hf_policy_rows(hf: dict[str, Any], course: dict[str, int]) -> list[list[Any]]:
    """Rows [course policy, Hugging Face setting, HF's bytes kept (MiB), the course GPT's bytes kept (MiB), kept
    over "none"] for the two policies HF offers: off ("none") and gradient_checkpointing_enable() ("every").
    course: {"none": bytes, "every": bytes} of the course GPT of the same shape."""
    mib = 2**20
    return [["none", "default (off)", hf["saved_off"] / mib, course["none"] / mib, "1.00 / 1.00"],
            ["every", "gradient_checkpointing_enable()", hf["saved_on"] / mib, course["every"] / mib,
             f"{hf['saved_on'] / hf['saved_off']:.2f} / {course['every'] / course['none']:.2f}"]]
