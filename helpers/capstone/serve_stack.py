"""Notebook 14's serving ladder: the course's decoding techniques stacked on one trained GPT, rung by rung.

Every rung decodes the same held-out prompts greedily at batch 1. A rung adds one technique to the rung
it stands on (its `base`), and its gain is measured over that rung:

=============  ===================================================================  ===========  ========
rung           what it changes                                                      stands on    notebook
=============  ===================================================================  ===========  ========
`baseline`     fp32, eager, no KV cache: every new token reruns the whole sequence  -            10
`kv_cache`     one prefill, then one token per step against a `KVCache`             baseline     10
`bf16`         weights and cache in bf16                                            kv_cache     03, 10
`compile`      a `StaticKVCache` and `torch.compile` of the one-token step (CUDA    bf16         09, 10
               graphs on CUDA: Inductor's "reduce-overhead")
`int8`         the blocks' linears weight-only int8, one scale per output row       compile      08
`int4`         the blocks' linears weight-only int4, zero-point, groups of 64       compile      08
`speculative`  the course's draft GPT proposes `gamma` tokens, the target verifies  bf16         11
               them in one pass (exact at temperature 0)
=============  ===================================================================  ===========  ========

int8 and int4 are two alternatives on the same rung, so both stand on `compile`. Speculative decoding
stands on the eager bf16 rung: its loop keeps a dynamic `KVCache` per model and rolls it back, which the
static compiled step does not. When the compile rung is left out, int8 and int4 stand on `bf16` (each
quantised step then runs eagerly: the weight is converted in a separate op before the matmul).

Exactness: `kv_cache`, `compile` and `speculative` compute what the rung they stand on computes, so their
greedy tokens must equal its tokens (`EXACT`); a difference is allowed only where the reference's top two
logits are within rounding of each other (`tie_tolerance`), where two paths of different shapes may round
the tie apart. bf16, int8 and int4 change the numbers, so they are judged by the share of next tokens that
agree with the fp32 rung's and by their held-out loss.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Callable, Iterable

import torch

from helpers.decode import speculative
from helpers.decode.kv_cache import StaticKVCache, decode_compile_options, static_step
from helpers.gpt import footprint, generation
from helpers.gpt.model import GPT
from helpers.lowbit import quant_linear
from helpers.measure import hardware
from helpers.measure.params import positive

TECHNIQUES = ("kv_cache", "bf16", "compile", "int8", "int4", "speculative")
BASES = {"kv_cache": "baseline", "bf16": "kv_cache", "compile": "bf16", "int8": "compile", "int4": "compile",
         "speculative": "bf16"}
TITLES = {"baseline": "fp32, eager, no KV cache", "kv_cache": "KV cache", "bf16": "bf16 weights and cache",
          "compile": "static cache, torch.compile" , "int8": "int8 weight-only linears",
          "int4": "int4 weight-only linears", "speculative": "speculative decoding"}
EXACT = ("kv_cache", "compile", "speculative")  # rungs whose greedy tokens must equal their base's
GROUP_SIZE = 64  # int4's group of input features per scale and zero (notebook 08's default)


def unavailable(technique: str, device: str) -> str | None:
    """Why `device` ("cpu" or "cuda") cannot run `technique` of the serving ladder, one sentence; None when it
    can. Raises ValueError for an unknown technique."""
    if technique not in TECHNIQUES:
        raise ValueError(f"technique={technique!r}; choose one of {', '.join(TECHNIQUES)}")
    if technique == "bf16" and device == "cuda" and not hardware.capabilities()["bf16"]:
        return "this GPU has no bf16 units (a T4 or older), so bf16 decoding would be emulated"
    if technique == "bf16" and device != "cuda" and (why := hardware.emulated("bf16", device)):
        return (f"{why}; the rungs that stand on bf16 stand on the fp32 KV-cache rung instead, so that no rung "
                "times the emulation")
    return None


@dataclass(frozen=True)
class ServeRung:
    """One serving rung: its name, every technique it runs, and the rung it stands on (None: the baseline)."""

    name: str
    techniques: frozenset
    base: str | None

    def has(self, technique: str) -> bool:
        return technique in self.techniques


def ladder(device: str, techniques: Iterable[str] = TECHNIQUES) -> tuple[list[ServeRung], dict[str, str]]:
    """The baseline, then one rung per technique in `techniques` (course order) that `device` can run, each on
    the rung `BASES` names, or on that rung's base when that rung is not on the ladder; and {technique: why}
    for each left out. Raises ValueError for an unknown or repeated technique, or one whose base chain needs
    kv_cache when kv_cache is left out (no rung but the baseline decodes without a cache)."""
    techniques = list(techniques)
    if len(set(techniques)) != len(techniques):
        raise ValueError(f"techniques={techniques!r} names one twice")
    for t in techniques:
        unavailable(t, device)  # validates the name
    left = {t: why for t in techniques if (why := unavailable(t, device))}
    on = [t for t in TECHNIQUES if t in techniques and t not in left]
    if on and "kv_cache" not in on:
        raise ValueError("every serving rung but the baseline decodes against a KV cache: keep 'kv_cache'")
    rungs = {"baseline": ServeRung("baseline", frozenset(), None)}
    for t in on:
        base = BASES[t]
        while base not in rungs:
            base = BASES[base]
        rungs[t] = ServeRung(t, rungs[base].techniques | {t}, base)
    return list(rungs.values()), left


@dataclass
class Decoder:
    """What one rung decodes with: `generate(prompt (T,) int64) -> (n,) int64 tokens` on the model's device,
    greedy; `model`, the GPT the rung's numbers come from (for the exactness and held-out checks); the bytes
    one decode step reads of its weights (`weight_bytes`, by `footprint.decode_step_bytes`; None for the
    baseline, which rereads the sequence)
    and of one token's K and V (`kv_bytes_per_token`); for a speculative rung its `draft`."""

    rung: ServeRung
    model: GPT
    generate: Callable[[torch.Tensor, int], torch.Tensor]
    weight_bytes: int | None
    kv_bytes_per_token: int
    draft: GPT | None = None  # the speculative rung's draft, in the target's dtype


def weight_only(model: GPT, bits: int, group_size: int = GROUP_SIZE) -> GPT:
    """A deep copy of `model` whose block linears are weight-only int8 or int4 (`quant_linear.WeightOnlyLinear`,
    dequantised inside the step: fused by Inductor in the compiled step). Raises ValueError for bits not 8 or 4."""
    if bits not in (8, 4):
        raise ValueError(f"bits must be 8 or 4, not {bits!r}")
    out = copy.deepcopy(model)
    quant_linear.swap_linears(out, lambda lin: quant_linear.WeightOnlyLinear.from_linear(lin, bits, group_size))
    return out


def static_decoder(model: GPT, max_len: int, *, compiled: bool) -> Callable[[torch.Tensor, int], torch.Tensor]:
    """Greedy decoding against one `StaticKVCache` of `max_len` tokens (reused by every call: its position is
    reset, stale slots are masked): an eager prefill, then one `static_step` per token, compiled with
    `decode_compile_options` when `compiled` ("reduce-overhead", CUDA graphs, on CUDA; "default" elsewhere)."""
    p = next(model.parameters())
    # one cache of fixed shape for every call: a compiled step sees the same tensors each time, so it compiles
    # once, and a CUDA graph can replay it
    cache = StaticKVCache(model.config, 1, max_len, dtype=p.dtype, device=p.device)
    graphs = compiled and p.device.type == "cuda"
    step = (torch.compile(static_step, fullgraph=True,
                          options=decode_compile_options("reduce-overhead" if graphs else "default"))
            if compiled else static_step)

    @torch.no_grad()
    def generate(prompt: torch.Tensor, n: int) -> torch.Tensor:
        if prompt.numel() + n > max_len:
            raise ValueError(f"prompt {prompt.numel()} + n {n} tokens pass the static cache's {max_len}")
        cache.pos.zero_()  # a new reply: its slots are rewritten from position 0, the stale ones masked
        # prefill, eager: the whole prompt in one pass writes its K and V into the cache; the last position's
        # logits pick the first new token
        logits = model(prompt.reshape(1, -1).to(p.device), cache=cache)[0][:, -1]
        out = []
        for i in range(n):
            out.append(logits.argmax(-1))  # greedy
            if i < n - 1:  # the last token needs no step after it
                if graphs:
                    torch.compiler.cudagraph_mark_step_begin()  # the graph's outputs may be overwritten now
                # one token in: reads the cache, appends its own K and V, returns the next logits (cloned: a
                # CUDA graph reuses its output buffer on the next replay)
                logits = step(model, out[-1], cache).clone()
        return torch.cat(out)
    return generate


def build(rungs: list[ServeRung], target: GPT, draft: GPT | None, *, max_len: int, gamma: int = 4,
          group_size: int = GROUP_SIZE) -> dict[str, Decoder]:
    """A `Decoder` per rung, from the trained fp32 `target` (and `draft`, for the speculative rung), sharing
    what rungs share (one bf16 copy for bf16, compile and speculative). max_len: the longest prompt plus new
    tokens any call will ask for. Raises ValueError for a speculative rung without a draft, a draft of
    another vocabulary, or a gamma < 1."""
    positive("gamma", gamma)
    positive("max_len", max_len)
    fp32 = target.float().eval()
    bf16: GPT | None = None
    if any(r.has("bf16") for r in rungs):
        bf16 = copy.deepcopy(fp32).to(torch.bfloat16).eval()
    cfg = fp32.config
    kv = lambda m: 2 * cfg.n_layer * cfg.n_kv_head * cfg.head_dim * next(m.parameters()).element_size()  # noqa: E731
    out: dict[str, Decoder] = {}
    for r in rungs:
        model = bf16 if r.has("bf16") else fp32
        if not r.has("kv_cache"):
            if r.techniques:
                raise ValueError(f"rung {r.name!r}: every serving technique decodes against a KV cache")
            gen = lambda prompt, n, m=fp32: generation.generate(m, prompt.to(_dev(m)), n, cache=False)[0]  # noqa: E731
            out[r.name] = Decoder(r, fp32, gen, None, kv(fp32))
            continue
        if r.has("int8") or r.has("int4"):
            model = weight_only(model, 8 if r.has("int8") else 4, group_size).eval()
        if r.has("speculative"):
            if draft is None:
                raise ValueError("the speculative rung needs a draft GPT")
            if draft.config.vocab_size != cfg.vocab_size:
                raise ValueError(f"the draft's vocabulary {draft.config.vocab_size} differs from the target's "
                                 f"{cfg.vocab_size}")
            d = copy.deepcopy(draft).to(next(model.parameters()).dtype).eval()
            gen = (lambda prompt, n, m=model, d=d:
                   speculative.speculative_generate(m, d, prompt, n, gamma=gamma, temperature=0).tokens.to(_dev(m)))
        elif r.has("compile"):
            gen = static_decoder(model, max_len, compiled=True)
        else:
            gen = lambda prompt, n, m=model: generation.generate(m, prompt.to(_dev(m)), n)[0]  # noqa: E731
        out[r.name] = Decoder(r, model, gen, footprint.decode_step_bytes(model), kv(model), d if r.has("speculative") else None)
    return out


def alone(technique: str) -> ServeRung:
    """`technique` alone on the fp32 KV-cache rung: "<technique> alone", standing on kv_cache."""
    if technique not in TECHNIQUES or technique == "kv_cache":
        raise ValueError(f"technique={technique!r}; choose one of {', '.join(t for t in TECHNIQUES if t != 'kv_cache')}")
    return ServeRung(f"{technique} alone", frozenset({"kv_cache", technique}), "kv_cache")


def must_keep_tokens(rung: ServeRung, base: ServeRung) -> bool:
    """Whether `rung` must decode its base's tokens: everything it adds is in EXACT (a cache, a compiled step,
    speculative decoding compute what they stand on)."""
    return bool(rung.techniques - base.techniques) and (rung.techniques - base.techniques) <= set(EXACT)


def _dev(model: GPT) -> torch.device:
    return next(model.parameters()).device


def tie_tolerance(top: float, dtype: torch.dtype) -> float:
    """The logit gap below which two decoding paths may pick different argmaxes by rounding alone: 1e-4 in
    fp32 (two kernels' orders of summation), four bf16 ulps at the top logit's magnitude in bf16
    (4 * 2^(floor(log2 |top|) - 7): every matmul's output is rounded to 8 significant bits)."""
    if dtype == torch.float32:
        return 1e-4
    if dtype == torch.bfloat16:
        return 4 * 2.0 ** (math.floor(math.log2(max(abs(top), 1e-30))) - 7)
    raise ValueError(f"dtype={dtype}; choose torch.float32 or torch.bfloat16")


@torch.no_grad()
def first_difference(model: GPT, prompt: torch.Tensor, want: torch.Tensor, got: torch.Tensor) -> dict | None:
    """Where `got` first parts from `want` (both (n,) greedy tokens after `prompt` (T,)), and `model`'s top-1
    minus top-2 logit there (the reference's, run eagerly on prompt + want[:i]) against `tie_tolerance`:
    {"index", "gap", "tolerance", "tie"}; None when they are identical."""
    want, got = want.cpu(), got.cpu()
    same = want == got
    if bool(same.all()):
        return None
    i = int((~same).nonzero()[0])
    logits = model(torch.cat([prompt.cpu(), want[:i]])[None].to(_dev(model)))[0][0, -1].float()
    top = logits.topk(2).values
    gap = float(top[0] - top[1])
    tol = tie_tolerance(float(top[0]), next(model.parameters()).dtype)
    return {"index": i, "gap": gap, "tolerance": tol, "tie": gap <= tol}


@torch.no_grad()
def agreement(model: GPT, prompt: torch.Tensor, reference: torch.Tensor) -> float:
    """Share of the n positions where `model`'s greedy next token, given prompt + reference[:i] (the reference's
    own text, so one early difference does not decide every later one), equals reference[i]."""
    seq = torch.cat([prompt.cpu(), reference.cpu()])[None].to(_dev(model))
    T = prompt.numel()
    pred = model(seq[:, :-1])[0][0, T - 1:].argmax(-1).cpu()
    return float((pred == reference.cpu()).double().mean())
