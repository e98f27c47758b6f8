"""Notebook 08's decode-speed measurements: what weight-only int8 / int4 weights do to one decode step, as
tokens/s and as achieved bandwidth (bytes read per step / step time) against the copy ceiling.

The linears are `helpers.lowbit.quant_linear`'s (and torchao's weight-only configs); every linear inside
the blocks is quantised, the embeddings and the output head stay as they are.

- On a GPU: `decode_speed`, tokens/s and achieved bandwidth of one decode step with bf16, our int8
  / int4 weight-only linears (`weight_only_copy`) and torchao's configs (`row_timing` turns a row back into
  a Timing); each prefill that fills a timed step's cache runs `uncompiled`, so the compiled int8 linear
  compiles one graph per batch size (the timed decode step's shape), not two.
- On a CPU: `cpu_decode`, batch-1 decode of fp32 against int8 weight-only (PyTorch's fused int8 kernel,
  and dequantize-then-matmul) timed by `helpers.measure.protocol`, as bytes read per token / time per token;
  `cpu_decode_table` and `cpu_decode_sentences` set it against the copy ceiling on as many threads
  (`helpers.measure.ceilings.bandwidth_ceiling("cpu", threads=...)`).
- The bytes a step reads are `helpers.gpt.footprint.decode_step_bytes`'s, the course's one count.
- `decode_claim`, the ledger's row from a measured ratio (`DECODE_CLAIM`, judged by `claims.judge_interval`);
  `gpu_decode_sentences`, the GPU speed-ups ranked only where their IQRs separate.
"""
from __future__ import annotations

import copy
from contextlib import contextmanager

import torch
from torch import nn

from helpers.gpt import footprint
from helpers.gpt.generation import KVCache, prefill, rewound_step
from helpers.gpt.model import GPT, GPTConfig
from helpers.lowbit import quant_linear, w8a8
from helpers.measure import bench, clock as clocks, protocol
from helpers.measure.params import positive
from helpers.show import tables

GB = 1e9


# ---------------------------------------------------------------- decode speed on a GPU

@contextmanager
def uncompiled(model: nn.Module):
    """Within the block, every `quant_linear.WeightOnlyLinear` of `model` on the "compile" backend computes the
    same product uncompiled (the "torch" backend); the backends are restored after. Each new input shape is
    one more graph for the compiled int8 linear to compile (a prefill of B x T tokens is a shape of its own), and
    a prefill that only fills a timed step's cache need not add one."""
    mods = [m for m in model.modules() if isinstance(m, quant_linear.WeightOnlyLinear) and m.backend == "compile"]
    for m in mods:
        m.backend = "torch"
    try:
        yield model
    finally:
        for m in mods:
            m.backend = "compile"


def _decode_step(model, batch: int, prompt: int, device: str, dtype: torch.dtype = torch.bfloat16):
    """A callable running one decode step from a `dtype` cache filled with `prompt` tokens (rewound before each
    call, so every timed step sees the same length). The prefill runs `uncompiled`: only the timed step's shape
    is compiled."""
    cfg = model.config
    cache = KVCache(cfg, batch, prompt + 1, dtype=dtype, device=device)
    with uncompiled(model):
        prefill(model, torch.randint(0, cfg.vocab_size, (batch, prompt), device=device), cache)
    return rewound_step(model, cache, torch.randint(0, cfg.vocab_size, (batch,), device=device))


def weight_only_copy(base: torch.nn.Module, bits: int, backend: str, group_size: int = 64) -> torch.nn.Module:
    """A deep copy of `base` whose block linears are our weight-only int8 / int4 linears (bits 8 or 4) running
    `backend` ("torch", "compile" for int8, "triton" for int4: see quant_linear.WeightOnlyLinear)."""
    model = copy.deepcopy(base)
    quant_linear.swap_linears(model, lambda lin: quant_linear.WeightOnlyLinear.from_linear(lin, bits, group_size))
    for m in model.modules():
        if isinstance(m, quant_linear.WeightOnlyLinear):
            m.backend = backend
    return model


CHECK_RTOL = 2e-2  # a kernel's logits against dequantize-then-matmul's on the same codes: bf16 sums in another order


def checked_copy(base: torch.nn.Module, bits: int, backend: str, group_size: int = 64, tokens: int = 8) -> torch.nn.Module:
    """`weight_only_copy`, after its logits on a short input are checked against the same codes run the plain way
    ("torch": unpack, dequantise, matmul): a kernel that computes garbage (as Triton's interpreter does for some
    inputs) is never timed. Raises RuntimeError with the error found, relative to the logits' largest value."""
    model = weight_only_copy(base, bits, backend, group_size)
    if backend == "torch":
        return model
    device = next(base.parameters()).device
    x = torch.randint(0, base.config.vocab_size, (1, tokens), generator=torch.Generator().manual_seed(0)).to(device)
    linears = [m for m in model.modules() if isinstance(m, quant_linear.WeightOnlyLinear)]
    with torch.no_grad():
        got = model(x)[0].float()
        for m in linears:
            m.backend = "torch"
        want = model(x)[0].float()
        for m in linears:
            m.backend = backend
    err, scale = (got - want).abs().max().item(), want.abs().max().item()
    if not err <= CHECK_RTOL * max(scale, 1e-6):  # `not <=`: a NaN error fails too
        raise RuntimeError(f"int{bits} '{backend}' logits differ from dequantize-then-matmul's by {err:.3g} "
                           f"(largest logit {scale:.3g}, tolerance {CHECK_RTOL:.0%}): not timed")
    return model


def decode_speed(preset: str = "1.3b", batches=(1, 32), prompt: int = 64, reps: int = 20,
                 variants=("bf16", "int8", "int4-triton", "torchao-int8", "torchao-int4"), group_size: int = 64) -> list[dict]:
    """Tokens/s of one decode step of a randomly initialised `preset` GPT in bf16 on CUDA, its block
    linears as bf16, our int8 / int4 weight-only linears, or torchao's configs; and the achieved
    bandwidth = (bytes of all weights read once + KV cache read) / step time. Our kernels' outputs are checked
    before they are timed (`checked_copy`). A variant that cannot run, or computes wrong, gives a row with its
    reason. Raises RuntimeError without CUDA."""
    if not torch.cuda.is_available():
        raise RuntimeError("decode speed is measured on a GPU only")
    torch.manual_seed(0)
    with torch.device("cuda"):  # initialise on the GPU: a 1.3B model's init on a CPU takes longer than the timing
        base = GPT(GPTConfig.preset(preset)).to(torch.bfloat16).eval()
    rows, stored = [], {}
    for name in variants:
        model = None
        why = None
        try:
            if name == "int8":
                model = checked_copy(base, 8, "compile", group_size)
            elif name == "int4-triton":
                model = checked_copy(base, 4, "triton", group_size)
            else:
                model = copy.deepcopy(base)
            if name.startswith("torchao"):
                from torchao.quantization import (  # heavy: only the GPU comparison needs torchao
                    Int4WeightOnlyConfig, Int8WeightOnlyConfig, quantize_)
                cfg = Int8WeightOnlyConfig() if name.endswith("int8") else Int4WeightOnlyConfig(group_size=group_size)
                for blk in model.blocks:
                    quantize_(blk, cfg)
            if name.startswith("torchao"):  # its tensor subclasses hide their packed size: count ours at that width
                wbytes = stored.get(name.split("-")[1].replace("int4", "int4-triton"))
            else:
                wbytes = footprint.decode_step_bytes(model)
                stored[name] = wbytes
            for b in batches:
                step = _decode_step(model, b, prompt, "cuda")
                t = bench.benchmark(step, warmup=5, reps=reps, device="cuda")
                mc = model.config  # K and V of every layer, bf16, n_kv_head heads (d_model wide without GQA)
                kv = 2 * mc.n_layer * b * (prompt + 1) * mc.n_kv_head * mc.head_dim * 2
                rows.append({"variant": name, "batch": b, "ms": 1e3 * t.median, "iqr_ms": 1e3 * (t.q75 - t.q25),
                             "q25_ms": 1e3 * t.q25, "q75_ms": 1e3 * t.q75,
                             "tokens_per_s": b / t.median,
                             "gbps": None if wbytes is None else (wbytes + kv) / t.median / GB})
        except Exception as err:  # noqa: BLE001 - a kernel missing for this GPU or library: a row that says so
            why = f"{type(err).__name__}: {str(err)[:120]}"
        if why:
            rows.append({"variant": name, "batch": None, "ms": None, "tokens_per_s": None, "gbps": None, "why": why})
        del model
        torch.cuda.empty_cache()
    return rows


# ---------------------------------------------------------------- decode speed on a CPU, as bandwidth

CPU_DECODE_VARIANTS = ("fp32", "int8 weight-only, fused kernel", "int8 weight-only, dequantize then matmul", "bf16",
                       "int4 weight-only, CPU kernel")
# bf16 left out by default: CPUs without bf16 dot products emulate it; int4 where this torch has the CPU kernels
CPU_DECODE_DEFAULT = CPU_DECODE_VARIANTS[:3] + ((CPU_DECODE_VARIANTS[4],) if w8a8.int4_cpu_available() else ())
CPU_INT4_GROUP = 64  # group size of the int4 variant's zero-point scales


def _cache_bytes(cfg, batch: int, length: int, dtype: torch.dtype) -> int:
    """Bytes of K and V a decode step reads from a cache of `length` tokens in `dtype`."""
    return 2 * cfg.n_layer * batch * length * cfg.n_kv_head * cfg.head_dim * torch.empty((), dtype=dtype).element_size()


def cpu_decode(preset: str = "small10m", prompt: int = 64, *, variants=CPU_DECODE_DEFAULT, budget_s: float = 8.0,
               max_reps: int = 30, max_warmup: int = 10, threads: int = 1, seed: int = 0, timer=None) -> dict:
    """Batch-1 decode steps of a randomly initialised `preset` GPT on the CPU, its block linears in each of
    `variants` (fp32; bf16; int8 weight-only with one scale per output row, run by PyTorch's fused kernel
    `quant_linear.int8_fused_linear` or by converting the whole weight to fp32 before the matmul; int4 zero-point
    weight-only run by PyTorch's CPU int4 kernel, its logits first checked by `checked_copy`), timed by
    `helpers.measure.protocol.compare` (warm-up until steady, interleaved rounds, medians with IQR).

    Bytes read per token = `footprint.decode_step_bytes` (every weight as stored, one row of the position
    table) with the K/V cache of `prompt` + 1 tokens; bandwidth = bytes / seconds per token (GB/s = 1e9 B/s),
    with IQR bounds bytes / q75 .. bytes / q25. Timed on `threads` intra-op threads (`bench.cpu_threads`): one by
    default, read from the thread's own CPU clock (`protocol.device_timer("cpu", "thread")`), because on a CPU
    shared with other work the wall clock (and two threads waiting on each other at every operation) measures
    the scheduler; more threads are timed on the wall clock, which one thread's clock would undercount.
    Returns {"rows": [{variant, bytes, timing (bench.Timing), tokens_per_s, gbps, gbps_lo, gbps_hi}],
    "comparison": protocol.Comparison, "preset", "prompt", "threads", "clock" (what the timer read)}. `timer`
    replaces the course's timer in `compare` (tests plant one). Raises ValueError for an unknown variant."""
    bad = [v for v in variants if v not in CPU_DECODE_VARIANTS]
    if bad or not variants:
        raise ValueError(f"variants={variants!r}: choose from {CPU_DECODE_VARIANTS}")
    torch.manual_seed(seed)
    base = GPT(GPTConfig.preset(preset)).eval()
    fns, nbytes = {}, {}
    for name in variants:
        if name == "fp32":
            model, dtype = base, torch.float32
        elif name == "bf16":
            model, dtype = copy.deepcopy(base).to(torch.bfloat16), torch.bfloat16
        elif name.startswith("int4"):  # checked against dequantize-then-matmul before it is timed
            model, dtype = checked_copy(base, 4, "cpu_int4", CPU_INT4_GROUP), torch.float32
        else:
            model, dtype = weight_only_copy(base, 8, "fused" if "fused" in name else "torch"), torch.float32
        fns[name] = _decode_step(model, 1, prompt, "cpu", dtype)
        nbytes[name] = footprint.decode_step_bytes(model, _cache_bytes(model.config, 1, prompt + 1, dtype))
    with bench.cpu_threads("cpu", positive("threads", threads)):
        timer = timer or protocol.device_timer("cpu", clocks.THREAD if threads == 1 else clocks.WALL)
        comp = protocol.compare(fns, device="cpu", timer=timer, min_reps=5, max_reps=max_reps, budget_s=budget_s,
                                max_warmup=max_warmup)
    rows = []
    for name in variants:
        t = comp[name]
        rows.append({"variant": name, "bytes": nbytes[name], "timing": t, "tokens_per_s": 1 / t.median,
                     "gbps": nbytes[name] / t.median / GB, "gbps_lo": nbytes[name] / t.q75 / GB,
                     "gbps_hi": nbytes[name] / t.q25 / GB})
    return {"rows": rows, "comparison": comp, "preset": preset, "prompt": prompt, "threads": threads,
            "clock": getattr(timer, "clock", "planted")}


def cpu_decode_table(result: dict, copy_gbps: float) -> str:
    """`cpu_decode`'s rows as a table beside the copy ceiling `copy_gbps` (GB/s, on as many threads)."""
    return tables.table(["variant", "MB read / token", "time / token (median, IQR)", "tokens/s", "GB/s (IQR)",
                         "of copy GB/s"],
                        [[r["variant"], r["bytes"] / 1e6, str(r["timing"]), r["tokens_per_s"],
                          f'{r["gbps"]:.3g} ({r["gbps_lo"]:.3g}-{r["gbps_hi"]:.3g})', f'{r["gbps"] / copy_gbps:.0%}']
                         for r in result["rows"]])


BANDWIDTH_BOUND = 0.5  # a step reaching under half the copy ceiling is not treated as bandwidth-bound


def cpu_decode_sentences(result: dict, copy_gbps: float, int8: str = CPU_DECODE_VARIANTS[1],
                         base: str = "fp32") -> list[str]:
    """Sentences from `cpu_decode`'s result: the `int8` variant against `base` in time per token (ranked only
    when their IQRs do not overlap, `protocol.rank_sentence`), each one's bandwidth as a share of the copy
    ceiling, and, where int8 is not faster, what the bandwidths say about why: int8's bandwidth below base's (IQRs
    apart) says its per-weight work, not memory traffic, sets its pace; else `base` under BANDWIDTH_BOUND of the
    ceiling even at the top of its IQR was not bandwidth-bound, so bytes saved could not show."""
    rows = {r["variant"]: r for r in result["rows"]}
    a, b = rows[int8], rows[base]
    r = protocol.ratio(b["timing"], a["timing"])  # > 1: int8 faster
    threads = result.get("threads")
    on = f" on {threads} thread{'s' if threads != 1 else ''}" if threads else ""
    out = [f"Batch-1 decode of the {result['preset']} GPT on this CPU{on}: {base} reads {b['bytes'] / 1e6:.1f} MB per token "
           f"at {b['gbps']:.3g} GB/s ({b['gbps'] / copy_gbps:.0%} of the copy ceiling, {copy_gbps:.3g} GB/s), {int8} "
           f"reads {a['bytes'] / 1e6:.1f} MB ({b['bytes'] / a['bytes']:.1f}x fewer) at {a['gbps']:.3g} GB/s "
           f"({a['gbps'] / copy_gbps:.0%}).",
           protocol.rank_sentence(int8, a["timing"], base, b["timing"], what="time per token") + "."]
    if not (r.separated and r.value > 1):
        if a["gbps_hi"] < b["gbps_lo"]:
            why = (f" Its achieved bandwidth is below {base}'s (IQRs {a['gbps_lo']:.3g}-{a['gbps_hi']:.3g} against "
                   f"{b['gbps_lo']:.3g}-{b['gbps_hi']:.3g} GB/s): it does not stream its fewer bytes as fast, so the "
                   "work per weight (converting each int8 code to a float and scaling it), not memory traffic, sets "
                   "its pace on this CPU.")
        elif b["gbps_hi"] < BANDWIDTH_BOUND * copy_gbps:
            why = (f" {base} itself reached at most {b['gbps_hi'] / copy_gbps:.0%} of the copy ceiling (the top of its "
                   f"IQR), so in this run the step was not bandwidth-bound (per-operation overhead and other work on "
                   "the cores weigh more than memory traffic), and fewer bytes had little to save.")
        else:
            why = (" Their bandwidths' IQRs overlap too, so this run cannot say whether memory traffic or the work "
                   "per weight (converting each int8 code to a float) sets int8's pace.")
        verb = "was slower" if r.separated else "did not measurably speed decode up"
        out.append(f"So on this CPU int8 weight-only {verb}, although it reads {b['bytes'] / a['bytes']:.1f}x fewer "
                   f"bytes.{why}")
    return out


def cpu_int4_sentence(result: dict, base: str = "fp32", int8: str = CPU_DECODE_VARIANTS[1]) -> str:
    """One sentence on the int4 variant of `cpu_decode`'s result beside `base` and `int8` (ranked only where IQRs
    separate), or why there is none: this torch build lacks the CPU int4 kernels, or the variant was not run."""
    rows = {r["variant"]: r for r in result["rows"]}
    name = CPU_DECODE_VARIANTS[4]
    if name not in rows:
        return ("This torch build has no CPU int4 kernels (torch.ops.aten._weight_int4pack_mm_for_cpu), so int4 is not "
                "timed here." if not w8a8.int4_cpu_available() else f"The {name} variant was not run.")
    a = rows[name]
    parts = [protocol.rank_sentence(name, a["timing"], other, rows[other]["timing"], what="time per token")
             for other in (base, int8) if other in rows]
    return (f"int4 ({a['bytes'] / 1e6:.1f} MB read per token, {a['tokens_per_s']:.0f} tokens/s): " + "; ".join(parts)
            + ". Its logits were checked against dequantize-then-matmul on the same codes before it was timed.")


# ---------------------------------------------------------------- the ledger's verdict

DECODE_CLAIM = dict(notebook="08", source="the first source text (quantization: 'memory reduction, faster compute'); "
                                          "gpt-fast README (Llama-2-7B, A100: int8 1.48x, int4 1.88x bf16's tokens/s)",
                    claim="INT8/INT4 weights reduce memory and speed up inference: gpt-fast decodes at 1.48x (int8) "
                          "and 1.88x (int4) the tokens/s of bf16")
CLAIMED_SPEEDUP = {8: 1.48, 4: 1.88}  # gpt-fast's measured speed-ups: what "faster" is held to here


def row_timing(row: dict) -> "protocol.Timing":
    """A `decode_speed` row's step time as a `bench.Timing` (median and quartiles, seconds; no samples)."""
    return protocol.Timing(row["ms"] / 1e3, row["q25_ms"] / 1e3, row["q75_ms"] / 1e3, [])


def decode_claim(ratio: "protocol.Ratio", what: str, bits: int = 8) -> dict:
    """The ledger's keyword arguments (`claims.verdict(**...)`) for the decode speed-up claim from a measured
    tokens/s ratio (quantised over 16/32-bit, `protocol.Ratio`: median and IQR bounds) of `bits`-bit weights:
    value the median, spread the IQR bounds, claimed "at least" gpt-fast's speed-up at those bits
    (`CLAIMED_SPEEDUP`), and `claims.judge_interval` decides: a spread wider than half the ratio that reaches
    across the (widened) claim is "not testable", a median below it "contradicted", else "supported". `what` names the
    measurement ("batch-1 decode of the small10m GPT on this CPU: int8 weight-only over fp32"). Raises
    ValueError for bits other than 8 or 4."""
    if bits not in CLAIMED_SPEEDUP:
        raise ValueError(f"bits={bits!r}: choose 8 or 4")
    return dict(DECODE_CLAIM, measured=f"{what}: {ratio} tokens/s" + ("" if ratio.separated else ", within the noise"),
                value=ratio.value, spread=(ratio.lo, ratio.hi), claimed=(CLAIMED_SPEEDUP[bits], None), unit="x")


def gpu_decode_sentences(rows: list[dict], base: str = "bf16") -> list[str]:
    """Sentences from `decode_speed`'s rows: at each batch, every other variant's tokens/s over `base`'s with the
    IQR-bounded ratio, "(within the noise)" where the IQRs overlap, and int8 against int4 (Triton) ranked only
    when their IQRs do not overlap (`protocol.rank_sentence`)."""
    ok = {(r["variant"], r["batch"]): row_timing(r) for r in rows if r.get("batch") is not None}
    out = []
    for b in sorted({b for _, b in ok}):
        if (base, b) not in ok:
            continue
        parts = []
        for v in [v for v, bb in ok if bb == b and v != base]:
            r = protocol.ratio(ok[(base, b)], ok[(v, b)])  # > 1: v makes more tokens/s
            parts.append(f"{v} {r}" + ("" if r.separated else " (within the noise)"))
        if parts:
            out.append(f"Decode batch {b}, tokens/s over {base}'s: " + "; ".join(parts) + ".")
        if ("int8", b) in ok and ("int4-triton", b) in ok:
            out.append(f"Batch {b}: " + protocol.rank_sentence("int8", ok[("int8", b)], "int4 (Triton)",
                                                               ok[("int4-triton", b)], what="step time") + ".")
    return out
