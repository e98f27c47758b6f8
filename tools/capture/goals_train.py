"""The training-side performance goals: notebooks 07 (FP8), 09 (torch.compile), 12 (data loading) and 13
(distributed).

Each function measures one goal the course sets for its notebook's technique, through the same helpers
the notebook calls in its full profile, never a second implementation:

- notebook 07: `helpers.lowbit.fp8_train_lab` (`matmul_tflops`, `linear_tflops`) and `helpers.lowbit.fp8_linear`'s checks
  of what this machine's torch._scaled_mm and torchao accept;
- notebook 09: `helpers.fusion.compiler_lab` (`measure_workload`, `softmax_sweep`), `helpers.fusion.compiler_model_lab`
  (`one_token_forward`, `train_step_compare`) and `helpers.fusion.triton_softmax`;
- notebook 12: `helpers.dataload.loading_lab` (`sweep_rounds`, `h2d_bandwidth`), `helpers.dataload.loading`
  (the document store, `train_step`), `helpers.dataload.packing` and
  `helpers.measure.bench.benchmark_interleaved`;
- notebook 13: `helpers.parallel.collectives_lab.section_collectives`, `ddp_lab.measure_ddp` and
  `zero_lab.measure_memory` on gloo ranks started by `helpers.parallel.launch.run_on_ranks`, against
  `helpers.parallel.zero.zero_formula`.

Every function takes a `goal_base.Ctx` and returns `goal_base.result(...)` or raises `NotMeasurable`;
`tools.capture.goals` registers them with their targets and H200 estimates and runs each in its own process.
"""
from __future__ import annotations

import math
import os

import torch

from tools.capture.goal_base import Ctx, NotMeasurable, check, copy_gbps, error_line, need_cuda, need_fp8, result
from helpers.dataload import loading, loading_lab, packing
from helpers.fusion import compiler_lab, compiler_model_lab, triton_softmax
from helpers.gpt import data
from helpers.gpt.model import GPT, PRESETS, GPTConfig
from helpers.lowbit import fp8_linear, fp8_train_lab
from helpers.measure import bench
from helpers.parallel import collectives_lab, ddp_lab, launch, zero, zero_lab


# ---------------------------------------------------------------- notebook 07: FP8 (helpers.lowbit.fp8_train_lab)

def scaled_mm_speedup(ctx: Ctx) -> dict:
    """07.scaled_mm: raw tensorwise torch._scaled_mm against the bf16 matmul, TFLOP/s at n^3
    (fp8_train_lab.matmul_tflops).

    Notebook 07 starts from FP8 tensor cores doing twice bf16's dense FLOPs (NVIDIA H100/H200 datasheet:
    1979 against 989 TFLOP/s); a large square matmul with one scale per tensor should keep most of that
    (>= 1.6x bf16)."""
    need_fp8()
    n, reps = ctx.pick(smoke=512, full=8192), ctx.pick(smoke=3, full=20)
    bf16 = fp8_train_lab.matmul_tflops(n, "bf16", reps)
    tw = fp8_train_lab.matmul_tflops(n, "tensorwise", reps)
    return result([check("tensorwise _scaled_mm / bf16 matmul TFLOP/s", tw / bf16, ">=", 1.6)],
                  {"bf16_tflops": bf16, "tensorwise_tflops": tw}, {"n": n, "reps": reps})


def float8_linear_speedup(ctx: Ctx) -> dict:
    """07.float8_linear: the course's rowwise Float8Linear, forward+backward, compiled, against the bf16
    linear and torchao's rowwise (fp8_train_lab.linear_tflops, as notebook 07's speed sweep).

    A linear layer trained in FP8 pays the casts and scales around each of its three matmuls, so it keeps
    less of FP8's advantage than the raw matmul (>= 1.25x bf16); the course's version should be within 5%
    of torchao's, the library notebook 07 checks it against. Where torch._scaled_mm refuses rowwise scales,
    fp8_linear.scaled_mm runs an fp32 emulation whose speed is not FP8's: both checks then say "not measured"."""
    need_fp8()
    n, reps = ctx.pick(smoke=512, full=8192), ctx.pick(smoke=3, full=20)
    compile_ = ctx.full  # notebook 07 compiles in its full profile only
    bf16 = fp8_train_lab.linear_tflops(n, "bf16", reps, compile=compile_)
    ctx.partial(bf16_tflops=bf16)  # each variant is a compile: keep what is measured in case the limit stops us
    ours = fp8_train_lab.linear_tflops(n, "ours rowwise", reps, compile=compile_)
    measured = {"bf16_tflops": bf16, "ours_rowwise_tflops": ours}
    ctx.partial(**measured)
    refused = fp8_linear.scaled_mm_refusal("cuda", rowwise=True)  # then fp8_linear.scaled_mm fell back to its fp32 emulation
    ours_why = f"torch._scaled_mm refused rowwise scales here, so ours ran its fp32 emulation: {refused}" if refused else ""
    if refused:
        measured["ours_rowwise_emulated"] = refused
    why = fp8_linear.torchao_problem("rowwise", "cuda")  # as notebook 07: torchao unusable here, in one sentence
    ratio_ao, reason = None, why or ""
    if why is None:
        try:
            measured["torchao_rowwise_tflops"] = fp8_train_lab.linear_tflops(n, "torchao rowwise", reps, compile=compile_)
            ratio_ao = ours / measured["torchao_rowwise_tflops"]
        except Exception as err:  # noqa: BLE001: torchao refusing this torch or shape is a finding, not a crash
            reason = f"torchao's rowwise linear did not run: {error_line(err)}"
    if refused:
        ratio_ao, reason = None, ours_why
    return result([check("ours rowwise / bf16 linear fwd+bwd TFLOP/s", None if refused else ours / bf16, ">=", 1.25,
                         ours_why),
                   check("ours rowwise / torchao rowwise TFLOP/s (within 5%: >= 0.95)", ratio_ao, ">=", 0.95, reason)],
                  measured, {"n": n, "reps": reps, "compiled": compile_})


# ---------------------------------------------------------------- notebook 09: torch.compile

def fused_bandwidth(ctx: Ctx) -> dict:
    """09.fused_bandwidth: a compiled pointwise chain and LayerNorm in bf16 against the copy bandwidth
    (compiler_lab.measure_workload).

    Notebook 09 teaches that fusion turns a memory-bound chain of ops into one read and one write of the
    tensor, so the fused kernel should run near the device's copy bandwidth (>= 80%)."""
    need_cuda("bf16 kernels Inductor writes in Triton")
    rows, cols = ctx.pick(smoke=(256, 1024), full=(8192, 4096))
    reps = ctx.pick(smoke=5, full=30)
    copy = copy_gbps(ctx)
    checks, measured = [], {"copy_gbps": copy}
    for name in ("pointwise", "layernorm"):
        r = compiler_lab.measure_workload(name, rows, cols, dtype=torch.bfloat16, device="cuda", reps=reps, kernels=False)
        measured[f"{name}_compiled_gbps"] = r["gbps"]["compiled"]
        ctx.partial(**measured)
        checks.append(check(f"compiled {name} GB/s / copy GB/s", r["gbps"]["compiled"] / copy, ">=", 0.8))
    return result(checks, measured, {"rows": rows, "cols": cols, "dtype": "bf16", "reps": reps})


def triton_softmax_speedup(ctx: Ctx) -> dict:
    """09.triton_softmax: the course's Triton softmax against the compiled and the eager softmax, per row
    length from 256 to 16384 (compiler_lab.softmax_sweep, as notebook 09).

    Notebook 09's hand-written kernel reads each row once and writes it once, as Inductor's generated kernel
    does, so it should match it (>= 0.9x) and beat eager PyTorch, which runs the same ops one kernel each
    (>= 1.5x)."""
    need_cuda("the Triton softmax runs only in Triton's interpreter without one, untimed")
    if triton_softmax.BROKEN:
        raise NotMeasurable(f"the Triton softmax is unavailable here ({triton_softmax.BROKEN})")
    cols_list = ctx.pick(smoke=[256, 1024], full=[256, 4096, 16384])  # notebook 09's full sweep: one compile each
    rows, reps = ctx.pick(smoke=256, full=8192), ctx.pick(smoke=5, full=20)
    sw = compiler_lab.softmax_sweep(cols_list, rows, dtype=torch.bfloat16, device="cuda", reps=reps)
    checks = []
    for i, cols in enumerate(sw["cols"]):
        t, c, e = sw["triton"][i], sw["compiled"][i], sw["eager"][i]
        checks.append(check(f"Triton / compiled GB/s, row length {cols}", t / c if t and c else None, ">=", 0.9))
        checks.append(check(f"Triton / eager GB/s, row length {cols}", t / e if t and e else None, ">=", 1.5))
    return result(checks, {k: sw[k] for k in ("cols", "eager", "compiled", "library", "triton")},
                  {"rows": rows, "row_lengths": cols_list, "dtype": "bf16", "reps": reps})


def _gpt_config(ctx: Ctx):
    """The preset and config the compile goals time, as notebook 09's full profile: small10m cut to
    compiler_lab.full_layers (3 of its 6 layers) at 256 tokens (smoke: one layer of tiny)."""
    preset = ctx.pick(smoke="tiny", full="small10m")
    return preset, GPTConfig.preset(preset, n_layer=ctx.pick(smoke=1, full=compiler_lab.full_layers(preset)),
                                    seq_len=ctx.pick(smoke=32, full=256))


def reduce_overhead_speedup(ctx: Ctx) -> dict:
    """09.reduce_overhead: reduce-overhead (CUDA graphs) against default compile on a batch-1 one-token
    forward (compiler_model_lab.one_token_forward, as notebook 09).

    A one-token forward is bound by kernel launches; notebook 09 shows CUDA graphs replaying the step's
    kernels with one launch, which should at least halve its time."""
    need_cuda("CUDA graphs need CUDA")
    preset, cfg = _gpt_config(ctx)
    reps = ctx.pick(smoke=20, full=100)
    d = compiler_model_lab.one_token_forward(cfg, ["default", "reduce-overhead"], device="cuda", reps=reps)
    ms = {k: v["timing"].median * 1e3 for k, v in d.items()}
    return result([check("default / reduce-overhead time per one-token forward", ms["default"] / ms["reduce-overhead"],
                         ">=", 2.0)],
                  {"ms": ms, "compile_s": {k: v["compile_s"] for k, v in d.items()}},
                  {"preset": preset, "n_layer": cfg.n_layer, "batch": 1, "tokens": 1, "reps": reps,
                   "dtype": "fp32 (one_token_forward builds the model in fp32; the goal is stated for bf16)"})


def compiled_train_step_speedup(ctx: Ctx) -> dict:
    """09.train_step: the course GPT's training step, compiled against eager (compiler_model_lab.train_step_compare,
    bf16 autocast).

    Compiling the whole model fuses the pointwise work between the matmuls of forward and backward
    (notebook 09); on the course's small GPT that should make a step >= 1.3x faster."""
    need_cuda("the goal is a bf16 training step on a GPU")
    preset, cfg = _gpt_config(ctx)
    batch, reps = ctx.pick(smoke=4, full=16), ctx.pick(smoke=5, full=20)
    g = compiler_model_lab.train_step_compare(cfg, batch, device="cuda", reps=reps, autocast_dtype=torch.bfloat16)
    med, lo, hi = g["ratio"]
    return result([check("eager / compiled step time (median per round)", med, ">=", 1.3)],
                  {"eager_ms": g["timings"]["eager"].median * 1e3, "compiled_ms": g["timings"]["compiled"].median * 1e3,
                   "ratio_iqr": [lo, hi], "first_step_s": g["first_step_s"]},
                  {"preset": preset, "n_layer": cfg.n_layer, "batch": batch, "seq_len": cfg.seq_len, "reps": reps,
                   "dtype": "bf16 autocast"})


# ---------------------------------------------------------------- notebook 12: data loading

def _documents(ctx: Ctx):
    """Notebook 12's document store and model config for this profile (smoke: one layer of tiny)."""
    row_len = ctx.pick(smoke=64, full=256)
    lengths = loading.document_lengths(ctx.pick(smoke=3000, full=40000), median=ctx.pick(smoke=24, full=80),
                                       sigma=1.0, min_len=8, max_len=row_len, seed=0)
    store = loading.DocumentStore(data.load_corpus("train"), lengths, "numpy")
    preset = ctx.pick(smoke="tiny", full="small10m")
    cfg = GPTConfig.preset(preset, seq_len=row_len, n_layer=ctx.pick(smoke=1, full=PRESETS[preset]["n_layer"]))
    return store, cfg, row_len


def _maker(cfg, device: str):
    """A function that builds the GPT of `cfg` on `device`, the same weights at every call (seed 0)."""
    def make():
        torch.manual_seed(0)
        return GPT(cfg).to(device)
    return make


def data_wait_share(ctx: Ctx) -> dict:
    """12.data_wait: the data wait as a share of step time after tuning the loader: notebook 12's sweep
    (loading_lab.sweep_rounds) over workers and prefetch, the fastest loader's idle share (fewer configurations
    than the notebook's).

    Notebook 12 teaches that enough loader workers and prefetching hide loading behind compute, so that the
    GPU waits for data at most 2% of a step."""
    store, cfg, row_len = _documents(ctx)
    workers = ctx.pick(smoke=2, full=8)
    batch, steps = ctx.pick(smoke=8, full=64), ctx.pick(smoke=2, full=30)
    ds = loading.DocumentDataset(store, latency_ms=ctx.pick(smoke=10.0, full=0.5))
    configs = [{"num_workers": 0}, {"num_workers": workers}] + ctx.pick(smoke=[], full=[{"num_workers": workers,
                                                                                      "prefetch_factor": 4}])
    rounds = ctx.pick(smoke=1, full=2)
    sweep = loading_lab.sweep_rounds(_maker(cfg, ctx.device), ds, configs, steps=steps, rounds=rounds,
                                     device=ctx.device, batch_size=batch, row_len=row_len, seed=0, kind="pad",
                                     pin_memory=ctx.device == "cuda")
    best = max(sweep, key=lambda r: r["tokens_per_s"])  # the tuned loader, as notebook 12 picks it
    return result([check("data wait / step time, fastest loader", best["wait_ms"] / best["step_ms"], "<=", 0.02)],
                  {"rows": [{k: r[k] for k in ("num_workers", "wait_ms", "copy_ms", "compute_ms", "step_ms", "idle",
                                               "tokens_per_s")
                             if k in r} | {"prefetch_factor": r.get("prefetch_factor", 2)} for r in sweep],
                   "best": {k: best.get(k) for k in ("num_workers", "prefetch_factor", "wait_ms", "step_ms", "idle",
                                                      "tokens_per_s")}},
                  {"preset": ctx.pick(smoke="tiny", full="small10m"), "row_len": row_len, "batch": batch,
                   "steps": steps, "rounds": rounds, "workers": [0, workers], "device": ctx.device})


def pinned_copy_speedup(ctx: Ctx) -> dict:
    """12.pinned: pinned against pageable host-to-device copies of >= 64 MB (loading_lab.h2d_bandwidth, as
    notebook 12).

    The driver copies a pageable buffer into a pinned staging buffer before the DMA engine can read it;
    notebook 12 shows that a pinned buffer skips that copy, which should make it >= 2x faster."""
    need_cuda("pinned memory only speeds up copies to an accelerator")
    sizes, reps = ctx.pick(smoke=[2 ** 26], full=[2 ** 26, 2 ** 28]), ctx.pick(smoke=5, full=20)
    rows = loading_lab.h2d_bandwidth(sizes, reps=reps)
    return result([check(f"pinned / pageable GB/s at {r['bytes'] // 2 ** 20} MB", r["pinned"] / r["pageable"], ">=", 2.0)
                   for r in rows], {"rows": rows}, {"bytes": sizes, "reps": reps})


def packing_speedup(ctx: Ctx) -> dict:
    """12.packing: packed against padded tokens/s on the heavy-tailed mix: notebook 12's packing cell, step
    for step (packing.pad_batch / pack_batch, loading.train_step, bench.benchmark_interleaved).

    On a heavy-tailed mix of document lengths most of a padded row is padding; packing whole documents into
    rows (block-diagonal causal mask) should raise the useful tokens per second >= 1.5x."""
    store, cfg, row_len = _documents(ctx)
    batch, reps = ctx.pick(smoke=8, full=64), ctx.pick(smoke=3, full=20)
    docs = [loading.DocumentDataset(store)[i] for i in range(4 * batch)]
    variants = {"padded": (packing.pad_batch(docs, row_len), False), "packed": (packing.pack_batch(docs, row_len), True)}
    make = _maker(cfg, ctx.device)
    models = {k: make() for k in variants}
    opts = {k: torch.optim.AdamW(models[k].parameters(), lr=1e-3) for k in variants}
    dev = {k: b.to(ctx.device) for k, (b, _) in variants.items()}
    steps = {k: (lambda k=k: loading.train_step(models[k], dev[k], opts[k], variants[k][1])) for k in variants}
    t = bench.benchmark_interleaved(steps, reps=reps, warmup=1, device=ctx.device)
    tps = {k: b.tokens / t[k].median for k, (b, _) in variants.items()}
    return result([check("packed / padded tokens/s", tps["packed"] / tps["padded"], ">=", 1.5)],
                  {"tokens_per_s": tps, "rows": {k: len(b.x) for k, (b, _) in variants.items()},
                   "padding": {k: b.padding for k, (b, _) in variants.items()}},
                  {"preset": ctx.pick(smoke="tiny", full="small10m"), "documents": len(docs), "row_len": row_len,
                   "reps": reps, "device": ctx.device})


# ---------------------------------------------------------------- notebook 13: distributed (CPU ranks)

def _world(ctx: Ctx) -> tuple[int, int, str]:
    """Ranks for the goal (8 on >= 16 cores), the cores, and a note when fewer ranks than the goal's 8 run."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    world = ctx.pick(smoke=2, full=8 if cores >= 16 else max(2, min(8, cores // 2)))
    note = "" if world == 8 else f"{world} gloo ranks on {cores} cores (the goal asks for 8 on a 16-core host)"
    return world, cores, note


def ring_all_reduce_ratio(ctx: Ctx) -> dict:
    """13.ring: the course's ring all-reduce against dist.all_reduce for messages >= 16 MB
    (collectives_lab.section_collectives on gloo ranks, as notebook 13).

    Notebook 13 builds the ring from point-to-point sends: each rank sends 2(p-1)/p of the message, the
    least any all-reduce must send, so on large messages it should be within 1.5x of the library's."""
    world, cores, note = _world(ctx)
    sizes, reps = ctx.pick(smoke=[2 ** 14, 2 ** 18], full=[2 ** 24, 2 ** 26]), ctx.pick(smoke=1, full=5)
    coll = launch.run_on_ranks(collectives_lab.section_collectives, world, sizes, 3 * reps)[0]
    sw = coll["sweep"]
    size = lambda n: f"{n / 2 ** 20:g} MiB" if n >= 2 ** 20 else f"{n / 2 ** 10:g} KiB"  # noqa: E731
    checks = [check(f"ring / dist.all_reduce time at {size(n)}", r / t, "<=", 1.5)
              for n, r, t in zip(sw["sizes"], sw["ring"], sw["torch"])]
    return result(checks, {"sizes": sw["sizes"], "ring_s": sw["ring"], "torch_s": sw["torch"],
                           "int_exact": coll["check"]["int exact"]},
                  {"world": world, "cores": cores, "bytes": sizes, "reps": 3 * reps}, note=note)


def bucketed_ddp_speedup(ctx: Ctx) -> dict:
    """13.bucketed_ddp: overlapped, bucketed DDP against synchronising after backward, at the batch whose
    compute is closest to the communication (ddp_lab.measure_ddp, as notebook 13).

    All-reducing gradient buckets while backward still runs hides the communication behind compute
    (notebook 13); where the two take similar time, that should make a step >= 20% faster."""
    world, cores, note = _world(ctx)
    rows, reps = ctx.pick(smoke=[8], full=[16, 128]), ctx.pick(smoke=2, full=5)  # notebook 13's full DDP_ROWS, REPS
    depth = ctx.pick(smoke=2, full=8)
    m = launch.run_on_ranks(ddp_lab.measure_ddp, world, 1024, depth, rows, reps, 1.0)[0]
    near = min(rows, key=lambda r: abs(math.log(m[r]["compute only"] / m["comm"])))
    t = m[near]
    return result([check("after-backward / bucketed step time (>= 1.2: 20% faster)", t["after backward"] / t["bucketed"],
                         ">=", 1.2)],
                  {"comm_s": m["comm"], "rows": {r: {k: m[r][k] for k in ("compute only", "after backward", "overlapped",
                                                                          "bucketed", "iqr")} for r in rows},
                   "near_row": near, "compute_over_comm": t["compute only"] / m["comm"]},
                  {"world": world, "cores": cores, "width": 1024, "depth": depth, "rows": rows, "reps": reps,
                   "bucket_mb": 1.0}, note=note)


def zero_memory_deviation(ctx: Ctx) -> dict:
    """13.zero_memory: memory per rank against the ZeRO formulas, stages 0-3 (zero_lab.measure_memory,
    zero.zero_formula).

    Notebook 13 derives each ZeRO stage's bytes per rank from the parameter count and the number of ranks
    (Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models", 2020); the
    measured memory should match the formula within 5%."""
    _, cores, _ = _world(ctx)
    preset = ctx.pick(smoke="tiny", full="small10m")
    cfg = {**PRESETS[preset], "seq_len": 32}
    ranks = ctx.pick(smoke=[2], full=[2, 4])
    worst, rows = 0.0, []
    for n in ranks:
        got = launch.run_on_ranks(zero_lab.measure_memory, n, cfg)
        psi = got[0][0]["n_params"]
        for stage in range(4):
            have = max(r[stage]["total"] for r in got)
            want = zero.zero_formula(stage, psi, n)["total"]
            rows.append({"ranks": n, "stage": stage, "bytes": have, "formula": want, "deviation": have / want - 1})
            worst = max(worst, abs(have / want - 1))
    return result([check("largest |memory / ZeRO formula - 1| over stages 0-3", worst, "<=", 0.05)], {"rows": rows},
                  {"preset": preset, "ranks": ranks, "cores": cores})

