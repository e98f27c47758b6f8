"""The inference-side performance goals: notebooks 08 (quantised decode), 10 (KV cache and serving) and 11
(speculative decoding).

Each function measures one goal the course sets for its notebook's technique, through the same helpers
the notebook calls in its full profile, never a second implementation:

- notebook 08: `helpers.lowbit.quant_decode_lab` (`decode_speed`, `weight_only_copy`), and `kv_decode_lab.compiled_decode`
  for the decode step compiled whole;
- notebook 10: `helpers.decode.kv_decode_lab` (`random_model`, `compiled_decode`), `helpers.decode.kv_cache_lab`
  (`compiled_layers`), `helpers.decode.paged_lab` (`decode_speed`) and `helpers.decode.serving_lab`
  (`compare_policies`);
- notebook 11: `helpers.decode.speculative` (`prompts`) and `helpers.decode.speculative_lab` (`decode_costs`,
  `speed_grid`).

`10.continuous_batching` and `11.speculative` share the trained small10m of one run (`goal_base.trained`).
Every function takes a `goal_base.Ctx` and returns `goal_base.result(...)` or raises `NotMeasurable`;
`tools.capture.goals` registers them with their targets and H200 estimates and runs each in its own process.
"""
from __future__ import annotations

from copy import deepcopy

import torch

from tools.capture.goal_base import Ctx, check, copy_gbps, error_line, need_cuda, result, trained
from helpers.decode import kv_cache_lab, kv_decode_lab, paged_lab, serving_lab, speculative, speculative_lab
from helpers.gpt import data
from helpers.gpt.model import GPT, GPTConfig
from helpers.lowbit import quant_decode_lab


# ---------------------------------------------------------------- notebook 10: KV cache and serving

def decode_bandwidth(ctx: Ctx) -> dict:
    """10.decode_bandwidth: batch-1 bf16 decode of the largest preset, static cache, compiled: its bandwidth
    against the copy bandwidth (kv_decode_lab.compiled_decode on kv_decode_lab.random_model, as notebook 10: the preset's
    width with kv_cache_lab.compiled_layers of its layers, 8 of 1.3b's 24, since the compile's time grows with the
    layers while each layer reads its weights with the same kernels).

    Notebook 10 teaches that a batch-1 decode step reads every weight and the KV cache once per token, so
    it is bound by memory bandwidth; with the step compiled under CUDA graphs (no launch overhead) it should
    reach >= 70% of the device's copy bandwidth."""
    need_cuda("compiled decode with CUDA graphs needs CUDA")
    preset, reps = ctx.pick(smoke="small10m", full="1.3b"), ctx.pick(smoke=5, full=20)
    layers = kv_cache_lab.compiled_layers(preset, kv_cache_lab.COMPILE_LAYERS_DEFAULT)
    copy = copy_gbps(ctx)
    model = kv_decode_lab.random_model(preset, torch.bfloat16, "cuda", n_layer=layers)
    context = min(ctx.pick(smoke=64, full=512), model.config.seq_len - 2)
    c = kv_decode_lab.compiled_decode(model, context, reps)
    return result([check("compiled decode GB/s / copy GB/s", c["compiled_gbps"] / copy, ">=", 0.7)],
                  {"copy_gbps": copy, "compiled_gbps": c["compiled_gbps"], "eager_gbps": c["eager_gbps"],
                   "compiled_ms": 1e3 * c["compiled_s"], "eager_ms": 1e3 * c["eager_s"]},
                  {"preset": preset, "n_layer": layers, "context": context, "batch": 1, "dtype": "bf16", "reps": reps})


def paged_decode_overhead(ctx: Ctx) -> dict:
    """10.paged_decode: paged decode attention (the Triton kernel, best block size) against contiguous SDPA
    at 4k tokens (paged_lab.decode_speed, as notebook 10; its timing depends on the model's shape, not
    its weights).

    A paged KV cache (Kwon et al., "Efficient Memory Management for Large Language Model Serving with
    PagedAttention", 2023) wastes no memory on reserved, unused context; notebook 10 shows that reading the
    cache through block tables costs little, within 10% of a contiguous cache."""
    need_cuda("the Triton paged kernel is only checked, not timed, without one")
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset(ctx.pick(smoke="tiny", full="small10m"))).to("cuda").float().eval()
    context, batch = ctx.pick(smoke=256, full=4096), ctx.pick(smoke=8, full=32)
    blocks, reps = ctx.pick(smoke=[16], full=[16, 64, 128]), ctx.pick(smoke=5, full=20)
    speed, _, _ = paged_lab.decode_speed(model, blocks, context=context, batch=batch, reps=reps, seed=0)
    rows = [r for r in speed if r.get("paged triton us")]
    best = min(rows, key=lambda r: r["paged triton us"] / r["contiguous us"]) if rows else None
    ratio = best["paged triton us"] / best["contiguous us"] if best else None
    return result([check("paged Triton / contiguous decode attention time (best block size)", ratio, "<=", 1.10,
                         "the Triton paged kernel did not run")],
                  {"rows": speed, "best_block_size": best and best["block size"]},
                  {"context": context, "batch": batch, "block_sizes": blocks, "reps": reps, "dtype": "fp32"})


def continuous_batching_speedup(ctx: Ctx) -> dict:
    """10.continuous_batching: continuous against static batching, same request mix and KV memory
    (serving_lab.compare_policies on the trained model notebook 10 serves, at its full profile's sizes: 48
    requests, 32 at most in a batch, each policy served five times, interleaved; notebook 10's tight-pool and
    served-alone checks, which do not enter the ratio, are left out). The ratio is the median runs'; its range over the
    repeated runs, and whether those separate, are recorded beside it.

    A static batch waits for its longest request while finished rows sit idle; admitting a new request as
    soon as one finishes (notebook 10) should serve the same mix >= 2x faster."""
    tm = trained(ctx, ctx.pick(smoke="tiny", full="small10m"))
    model = tm.model.float().eval()
    n_req, max_batch, repeats = ctx.pick(smoke=6, full=48), ctx.pick(smoke=4, full=32), ctx.pick(smoke=1, full=5)
    b = serving_lab.compare_policies(model, n_requests=n_req, max_batch=max_batch,
                                     max_new_tokens=ctx.pick(smoke=8, full=None), repeats=repeats,
                                     corpus=data.load_corpus("val"), seed=0)
    rec = b["record"]
    return result([check("continuous / static tokens/s", b["speedup"], ">=", 2.0)],
                  {"static_tokens_per_s": rec["static_tokens_per_s"],
                   "continuous_tokens_per_s": rec["continuous_tokens_per_s"], "same_tokens": rec["same_tokens"],
                   "speedup_range": list(b["speedup_range"]), "separated": b["separated"]},
                  {"preset": ctx.pick(smoke="tiny", full="small10m"), "n_requests": n_req,
                   "max_batch": max_batch, "num_blocks": rec["num_blocks"], "block_size": rec["block_size"],
                   "repeats": repeats, "device": ctx.device})


# ---------------------------------------------------------------- notebook 08: quantised decode

def quantized_decode_speedup(ctx: Ctx) -> dict:
    """08.quantized_decode: batch-1 decode tokens/s of int8 and int4 weight-only against bf16, and each
    one's bandwidth against copy (quant_decode_lab.decode_speed, as notebook 08).

    Batch-1 decode reads every weight once per token; notebook 08 teaches that storing weights in 8 or 4
    bits reads 2x or nearly 4x fewer bytes, so decoding should speed up (>= 1.4x for int8, >= 1.8x for int4)
    while each variant still runs at >= 60% of the copy bandwidth."""
    need_cuda("decode speed is measured on a GPU only")
    preset, reps = ctx.pick(smoke="tiny", full="1.3b"), ctx.pick(smoke=5, full=20)
    copy = copy_gbps(ctx)
    rows = quant_decode_lab.decode_speed(preset, batches=(1,), reps=reps, variants=("bf16", "int8", "int4-triton"),
                                  group_size=64)
    by = {r["variant"]: r for r in rows}
    tps = {k: by[k]["tokens_per_s"] if k in by else None for k in ("bf16", "int8", "int4-triton")}
    why = {k: by[k].get("why", "") for k in by}

    def ratio(k):
        return tps[k] / tps["bf16"] if tps[k] and tps["bf16"] else None

    def bw(k):
        return by[k]["gbps"] / copy if k in by and by[k].get("gbps") else None
    return result([check("int8 / bf16 tokens/s", ratio("int8"), ">=", 1.4, why.get("int8", "")),
                   check("int4 / bf16 tokens/s", ratio("int4-triton"), ">=", 1.8, why.get("int4-triton", "")),
                   check("int8 GB/s / copy GB/s", bw("int8"), ">=", 0.6, why.get("int8", "")),
                   check("int4 GB/s / copy GB/s", bw("int4-triton"), ">=", 0.6, why.get("int4-triton", ""))],
                  {"copy_gbps": copy, "rows": rows}, {"preset": preset, "batch": 1, "prompt": 64, "reps": reps,
                                                      "group_size": 64})


def compiled_quantized_decode_speedup(ctx: Ctx) -> dict:
    """08.compiled_decode: the comparison of `08.quantized_decode` with the whole decode step compiled
    (kv_decode_lab.compiled_decode: static cache and CUDA graphs), as gpt-fast measures it (its README: Llama-2-7B
    on an A100, 104.9 tok/s in bf16, 155.6 in int8, 196.8 in int4).

    `08.quantized_decode` times eager steps, where Python's kernel launches are paid by every variant alike
    and can hide what the weights' bytes save; compiled, the step is bound by the bytes it reads, as notebook
    08 teaches. int4 runs the course's Triton kernel inside the compiled step, or, if that cannot be
    compiled, the unpack-and-matmul that Inductor fuses (the backend used is recorded)."""
    need_cuda("CUDA graphs need CUDA")
    preset, reps, context = ctx.pick(smoke="tiny", full="1.3b"), ctx.pick(smoke=5, full=20), 64
    copy = copy_gbps(ctx)
    torch.manual_seed(0)
    with torch.device("cuda"):
        base = GPT(GPTConfig.preset(preset)).to(torch.bfloat16).eval()
    rows, why = {}, {}
    for name, bits, backends in (("bf16", None, (None,)), ("int8", 8, ("torch",)), ("int4", 4, ("triton", "torch"))):
        for backend in backends:
            model = None
            try:
                model = quant_decode_lab.checked_copy(base, bits, backend, 64) if bits else deepcopy(base)  # output checked first
                c = kv_decode_lab.compiled_decode(model, context, reps)  # its bytes count the int codes and scales
                rows[name] = {"backend": backend, "ms": 1e3 * c["compiled_s"], "tokens_per_s": 1 / c["compiled_s"],
                              "gbps": c["bytes"] / c["compiled_s"] / 1e9, "eager_gbps": c["eager_gbps"]}
                ctx.partial(copy_gbps=copy, **{f"{name}_tokens_per_s": rows[name]["tokens_per_s"],
                                               f"{name}_gbps": rows[name]["gbps"]})  # kept if the limit stops us
                why.pop(name, None)
                break
            except Exception as err:  # noqa: BLE001 - a variant that cannot be compiled: its reason, the others go on
                why[name] = f"{backend or 'bf16'}: {error_line(err)}"
            finally:
                del model
                torch.cuda.empty_cache()

    def ratio(k):
        return rows[k]["tokens_per_s"] / rows["bf16"]["tokens_per_s"] if k in rows and "bf16" in rows else None

    def bw(k):
        return rows[k]["gbps"] / copy if k in rows else None
    return result([check("compiled int8 / bf16 tokens/s", ratio("int8"), ">=", 1.4, why.get("int8", why.get("bf16", ""))),
                   check("compiled int4 / bf16 tokens/s", ratio("int4"), ">=", 1.8, why.get("int4", why.get("bf16", ""))),
                   check("compiled int8 GB/s / copy GB/s", bw("int8"), ">=", 0.6, why.get("int8", "")),
                   check("compiled int4 GB/s / copy GB/s", bw("int4"), ">=", 0.6, why.get("int4", ""))],
                  {"copy_gbps": copy, "rows": rows, "why": why},
                  {"preset": preset, "batch": 1, "context": context, "reps": reps, "group_size": 64,
                   "mode": "reduce-overhead"})


# ---------------------------------------------------------------- notebook 11: speculative decoding

def speculative_speedup(ctx: Ctx) -> dict:
    """11.speculative: the measured speedup against the formula for each γ at temperature 0, and the best
    γ's speedup with the draft's cost (speculative_lab.decode_costs and speed_grid on the trained target and draft
    of notebook 11).

    Notebook 11 derives the expected speedup from the acceptance rate α, the draft length γ and the draft's
    relative cost c (Leviathan et al., "Fast Inference from Transformers via Speculative Decoding", 2023):
    the measured speedup should be within 15% of it for every γ, and the best γ should give >= 1.5x with a
    draft >= 10x cheaper than the target (c <= 0.1)."""
    if ctx.device == "cpu":
        torch.set_num_threads(1)  # as notebook 11: the small models' ops only contend across threads
    preset, width = ctx.pick(smoke="tiny", full="small10m"), ctx.pick(smoke=64, full=128)
    target = trained(ctx, preset).model.float().eval()
    draft = trained(ctx, preset, n_layer=1, d_model=width, n_head=2, d_ff=4 * width).model.float().eval()
    gammas = ctx.pick(smoke=[1, 2], full=list(range(1, 9)))
    rounds, n = ctx.pick(smoke=1, full=3), ctx.pick(smoke=16, full=128)
    prompt_len, reps = ctx.pick(smoke=32, full=64), ctx.pick(smoke=5, full=30)
    prompts = speculative.prompts(data.load_corpus("val"), rounds, prompt_len, seed=0)
    costs = speculative_lab.decode_costs(target, draft, prompts[0], gammas, reps=reps, device=ctx.device)
    name = f"gpt-1L{width}d"
    grid = speculative_lab.speed_grid(target, {name: draft}, prompts, n, gammas, [0.0], costs, device=ctx.device, seed=0)
    checks = [check(f"measured / formula speedup, γ={r['gamma']} (within 15%: >= 0.85)", r["speedup"] / r["predicted"],
                    ">=", 0.85) for r in grid]
    checks += [check(f"measured / formula speedup, γ={r['gamma']} (within 15%: <= 1.15)", r["speedup"] / r["predicted"],
                     "<=", 1.15) for r in grid]
    best = max(grid, key=lambda r: r["speedup"])
    checks.append(check(f"best speedup over plain decoding (γ={best['gamma']})", best["speedup"], ">=", 1.5))
    checks.append(check("draft cost c (draft / target decoding time; 10x cheaper: <= 0.1)", best["c"], "<=", 0.1))
    keep = ("gamma", "alpha", "tokens_per_pass", "expected", "speedup", "speedup_q25", "speedup_q75", "c", "predicted",
            "predicted_verify", "noise")
    return result(checks, {"rows": [{k: r[k] for k in keep} for r in grid], "target_ms": costs["target_ms"],
                           "draft_ms": costs["draft_ms"]},
                  {"target": preset, "draft": name, "gammas": gammas, "temperature": 0.0, "rounds": rounds,
                   "new_tokens": n, "prompt_len": prompt_len, "reps": reps, "device": ctx.device},
                  headline=len(checks) - 2)


