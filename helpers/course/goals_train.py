"""The training-side performance goals: issues 14 (FP8), 15 (torch.compile), 19 (data loading) and 20
(distributed).

Each function measures one goal of its issue's "## Performance" section through the same helpers its
notebook calls in the full profile, never a second implementation:

- issue 14, notebook 07: `helpers.lowbit.fp8_lab` (`matmul_tflops`, `linear_tflops`) and `helpers.lowbit.fp8`'s checks of
  what this machine's torch._scaled_mm and torchao accept;
- issue 15, notebook 09: `helpers.fusion.compile_lab` (`measure_workload`, `softmax_sweep`, `one_token_forward`,
  `train_step_compare`) and `helpers.fusion.triton_softmax`;
- issue 19, notebook 12: `helpers.dataload.loading` (`sweep_rounds`, `h2d_bandwidth`, `train_step`), `helpers.dataload.packing`
  and `helpers.measure.bench.benchmark_interleaved`;
- issue 20, notebook 13: `helpers.parallel.dist_lab` (`section_collectives`, `measure_ddp`, `measure_memory`) on gloo
  ranks started by `helpers.parallel.distributed.run_on_ranks`, against `helpers.parallel.data_parallel.zero_formula`.

Every function takes a `goal_base.Ctx` and returns `goal_base.result(...)` or raises `NotMeasurable`;
`helpers.course.goals` registers them with their targets and H200 estimates and runs each in its own process.
"""
from __future__ import annotations

import math
import os

from helpers.course.goal_base import Ctx, NotMeasurable, check, copy_gbps, error_line, need_cuda, need_fp8, result


# ---------------------------------------------------------------- issue 14: FP8 (notebook 07, helpers.lowbit.fp8_lab)

def g14_scaled_mm(ctx: Ctx) -> dict:
    """Raw tensorwise torch._scaled_mm against the bf16 matmul, TFLOP/s at n^3 (fp8_lab.matmul_tflops)."""
    need_fp8()
    from helpers.lowbit import fp8_lab

    n, reps = ctx.pick(smoke=512, full=8192), ctx.pick(smoke=3, full=20)
    bf16 = fp8_lab.matmul_tflops(n, "bf16", reps)
    tw = fp8_lab.matmul_tflops(n, "tensorwise", reps)
    return result([check("tensorwise _scaled_mm / bf16 matmul TFLOP/s", tw / bf16, ">=", 1.6)],
                  {"bf16_tflops": bf16, "tensorwise_tflops": tw}, {"n": n, "reps": reps})


def g14_float8_linear(ctx: Ctx) -> dict:
    """The course rowwise Float8Linear, forward+backward, compiled, against the bf16 linear and torchao's
    rowwise (fp8_lab.linear_tflops, as notebook 07's speed sweep)."""
    need_fp8()
    from helpers.lowbit import fp8, fp8_lab

    n, reps = ctx.pick(smoke=512, full=8192), ctx.pick(smoke=3, full=20)
    compile_ = ctx.full  # notebook 07 compiles in its full profile only
    bf16 = fp8_lab.linear_tflops(n, "bf16", reps, compile=compile_)
    ctx.partial(bf16_tflops=bf16)  # each variant is a compile: keep what is measured in case the limit stops us
    ours = fp8_lab.linear_tflops(n, "ours rowwise", reps, compile=compile_)
    measured = {"bf16_tflops": bf16, "ours_rowwise_tflops": ours}
    ctx.partial(**measured)
    refused = fp8.scaled_mm_refusal("cuda", rowwise=True)  # then fp8.scaled_mm fell back to its fp32 emulation
    ours_why = f"torch._scaled_mm refused rowwise scales here, so ours ran its fp32 emulation: {refused}" if refused else ""
    if refused:
        measured["ours_rowwise_emulated"] = refused
    why = fp8.torchao_problem("rowwise", "cuda")  # as notebook 07: torchao unusable here, in one sentence
    ratio_ao, reason = None, why or ""
    if why is None:
        try:
            measured["torchao_rowwise_tflops"] = fp8_lab.linear_tflops(n, "torchao rowwise", reps, compile=compile_)
            ratio_ao = ours / measured["torchao_rowwise_tflops"]
        except Exception as err:  # noqa: BLE001: torchao refusing this torch or shape is a finding, not a crash
            reason = f"torchao's rowwise linear did not run: {error_line(err)}"
    if refused:
        ratio_ao, reason = None, ours_why
    return result([check("ours rowwise / bf16 linear fwd+bwd TFLOP/s", None if refused else ours / bf16, ">=", 1.25,
                         ours_why),
                   check("ours rowwise / torchao rowwise TFLOP/s (within 5%: >= 0.95)", ratio_ao, ">=", 0.95, reason)],
                  measured, {"n": n, "reps": reps, "compiled": compile_})


# ---------------------------------------------------------------- issue 15: torch.compile (notebook 09)

def g15_fused_bandwidth(ctx: Ctx) -> dict:
    """Compiled pointwise chain and LayerNorm against the copy bandwidth (compile_lab.measure_workload)."""
    need_cuda("bf16 kernels Inductor writes in Triton")
    import torch

    from helpers.fusion import compile_lab

    rows, cols = ctx.pick(smoke=(256, 1024), full=(8192, 4096))
    reps = ctx.pick(smoke=5, full=30)
    copy = copy_gbps(ctx)
    checks, measured = [], {"copy_gbps": copy}
    for name in ("pointwise", "layernorm"):
        r = compile_lab.measure_workload(name, rows, cols, dtype=torch.bfloat16, device="cuda", reps=reps, kernels=False)
        measured[f"{name}_compiled_gbps"] = r["gbps"]["compiled"]
        ctx.partial(**measured)
        checks.append(check(f"compiled {name} GB/s / copy GB/s", r["gbps"]["compiled"] / copy, ">=", 0.8))
    return result(checks, measured, {"rows": rows, "cols": cols, "dtype": "bf16", "reps": reps})


def g15_triton_softmax(ctx: Ctx) -> dict:
    """The course Triton softmax against the compiled and the eager softmax, per row length
    (compile_lab.softmax_sweep, as notebook 09)."""
    need_cuda("the Triton softmax runs only in Triton's interpreter without one, untimed")
    import torch

    from helpers.fusion import compile_lab, triton_softmax

    if triton_softmax.BROKEN:
        raise NotMeasurable(f"the Triton softmax is unavailable here ({triton_softmax.BROKEN})")
    cols_list = ctx.pick(smoke=[256, 1024], full=[256, 1024, 4096, 16384])
    rows, reps = ctx.pick(smoke=256, full=8192), ctx.pick(smoke=5, full=20)
    sw = compile_lab.softmax_sweep(cols_list, rows, dtype=torch.bfloat16, device="cuda", reps=reps)
    checks = []
    for i, cols in enumerate(sw["cols"]):
        t, c, e = sw["triton"][i], sw["compiled"][i], sw["eager"][i]
        checks.append(check(f"Triton / compiled GB/s, row length {cols}", t / c if t and c else None, ">=", 0.9))
        checks.append(check(f"Triton / eager GB/s, row length {cols}", t / e if t and e else None, ">=", 1.5))
    return result(checks, {k: sw[k] for k in ("cols", "eager", "compiled", "library", "triton")},
                  {"rows": rows, "row_lengths": cols_list, "dtype": "bf16", "reps": reps})


def _gpt_config(ctx: Ctx):
    from helpers.gpt.model import PRESETS, GPTConfig

    preset = ctx.pick(smoke="tiny", full="small10m")
    return preset, GPTConfig.preset(preset, n_layer=ctx.pick(smoke=1, full=PRESETS[preset]["n_layer"]),
                                    seq_len=ctx.pick(smoke=32, full=256))


def g15_reduce_overhead(ctx: Ctx) -> dict:
    """reduce-overhead (CUDA graphs) against default compile on a batch-1 one-token forward
    (compile_lab.one_token_forward, as notebook 09)."""
    need_cuda("CUDA graphs need CUDA")
    from helpers.fusion import compile_lab

    preset, cfg = _gpt_config(ctx)
    reps = ctx.pick(smoke=20, full=100)
    d = compile_lab.one_token_forward(cfg, ["default", "reduce-overhead"], device="cuda", reps=reps)
    ms = {k: v["timing"].median * 1e3 for k, v in d.items()}
    return result([check("default / reduce-overhead time per one-token forward", ms["default"] / ms["reduce-overhead"],
                         ">=", 2.0)],
                  {"ms": ms, "compile_s": {k: v["compile_s"] for k, v in d.items()}},
                  {"preset": preset, "n_layer": cfg.n_layer, "batch": 1, "tokens": 1, "reps": reps,
                   "dtype": "fp32 (one_token_forward builds the model in fp32; the issue says bf16)"})


def g15_train_step(ctx: Ctx) -> dict:
    """The course GPT's training step, compiled against eager (compile_lab.train_step_compare, bf16 autocast)."""
    need_cuda("the goal is a bf16 training step on a GPU")
    import torch

    from helpers.fusion import compile_lab

    preset, cfg = _gpt_config(ctx)
    batch, reps = ctx.pick(smoke=4, full=16), ctx.pick(smoke=5, full=20)
    g = compile_lab.train_step_compare(cfg, batch, device="cuda", reps=reps, autocast_dtype=torch.bfloat16)
    med, lo, hi = g["ratio"]
    return result([check("eager / compiled step time (median per round)", med, ">=", 1.3)],
                  {"eager_ms": g["timings"]["eager"].median * 1e3, "compiled_ms": g["timings"]["compiled"].median * 1e3,
                   "ratio_iqr": [lo, hi], "first_step_s": g["first_step_s"]},
                  {"preset": preset, "n_layer": cfg.n_layer, "batch": batch, "seq_len": cfg.seq_len, "reps": reps,
                   "dtype": "bf16 autocast"})



# ---------------------------------------------------------------- issue 19: data loading (notebook 12)

def _documents(ctx: Ctx):
    """Notebook 12's document store and model config for this profile (smoke: one layer of tiny)."""
    from helpers.gpt import data
    from helpers.dataload import loading
    from helpers.gpt.model import PRESETS, GPTConfig

    row_len = ctx.pick(smoke=64, full=256)
    lengths = loading.document_lengths(ctx.pick(smoke=3000, full=40000), median=ctx.pick(smoke=24, full=80),
                                       sigma=1.0, min_len=8, max_len=row_len, seed=0)
    store = loading.DocumentStore(data.load_corpus("train"), lengths, "numpy")
    preset = ctx.pick(smoke="tiny", full="small10m")
    cfg = GPTConfig.preset(preset, seq_len=row_len, n_layer=ctx.pick(smoke=1, full=PRESETS[preset]["n_layer"]))
    return store, cfg, row_len


def _maker(cfg, device: str):
    import torch

    from helpers.gpt.model import GPT

    def make():
        torch.manual_seed(0)
        return GPT(cfg).to(device)
    return make


def g19_data_wait(ctx: Ctx) -> dict:
    """Data wait as a share of step time after tuning the loader: notebook 12's sweep (loading.sweep_rounds)
    over workers and prefetch, the fastest loader's idle share (fewer configurations than the notebook's)."""
    from helpers.dataload import loading

    store, cfg, row_len = _documents(ctx)
    workers = ctx.pick(smoke=2, full=8)
    batch, steps = ctx.pick(smoke=8, full=64), ctx.pick(smoke=2, full=30)
    ds = loading.DocumentDataset(store, latency_ms=ctx.pick(smoke=10.0, full=0.5))
    configs = [{"num_workers": 0}, {"num_workers": workers}] + ctx.pick(smoke=[], full=[{"num_workers": workers,
                                                                                      "prefetch_factor": 4}])
    rounds = ctx.pick(smoke=1, full=2)
    sweep = loading.sweep_rounds(_maker(cfg, ctx.device), ds, configs, steps=steps, rounds=rounds, device=ctx.device,
                                 batch_size=batch, row_len=row_len, seed=0, kind="pad", pin_memory=ctx.device == "cuda")
    best = max(sweep, key=lambda r: r["tokens_per_s"])  # the tuned loader, as notebook 12 picks it
    return result([check("data wait / step time, fastest loader", best["wait_ms"] / best["step_ms"], "<=", 0.02)],
                  {"rows": [{k: r[k] for k in ("num_workers", "wait_ms", "copy_ms", "compute_ms", "step_ms", "idle",
                                               "tokens_per_s")
                             if k in r} | {"prefetch_factor": r.get("prefetch_factor", 2)} for r in sweep],
                   "best": {k: best.get(k) for k in ("num_workers", "prefetch_factor", "wait_ms", "step_ms", "idle",
                                                      "tokens_per_s")}},
                  {"preset": ctx.pick(smoke="tiny", full="small10m"), "row_len": row_len, "batch": batch,
                   "steps": steps, "rounds": rounds, "workers": [0, workers], "device": ctx.device})


def g19_pinned(ctx: Ctx) -> dict:
    """Pinned against pageable host-to-device copies of >= 64 MB (loading.h2d_bandwidth, as notebook 12)."""
    need_cuda("pinned memory only speeds up copies to an accelerator")
    from helpers.dataload import loading

    sizes, reps = ctx.pick(smoke=[2 ** 26], full=[2 ** 26, 2 ** 28]), ctx.pick(smoke=5, full=20)
    rows = loading.h2d_bandwidth(sizes, reps=reps)
    return result([check(f"pinned / pageable GB/s at {r['bytes'] // 2 ** 20} MB", r["pinned"] / r["pageable"], ">=", 2.0)
                   for r in rows], {"rows": rows}, {"bytes": sizes, "reps": reps})


def g19_packing(ctx: Ctx) -> dict:
    """Packed against padded tokens/s on the heavy-tailed mix: notebook 12's packing cell, step for step
    (packing.pad_batch / pack_batch, loading.train_step, bench.benchmark_interleaved)."""
    import torch

    from helpers.measure import bench
    from helpers.dataload import loading, packing

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


# ---------------------------------------------------------------- issue 20: distributed (notebook 13; CPU ranks)

def _world(ctx: Ctx) -> tuple[int, int, str]:
    """Ranks for the goal (8 on >= 16 cores), the cores, and a note when fewer ranks than the goal's 8 run."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    world = ctx.pick(smoke=2, full=8 if cores >= 16 else max(2, min(8, cores // 2)))
    note = "" if world == 8 else f"{world} gloo ranks on {cores} cores (the goal asks for 8 on a 16-core host)"
    return world, cores, note


def g20_ring(ctx: Ctx) -> dict:
    """The course ring all-reduce against dist.all_reduce for messages >= 16 MB
    (dist_lab.section_collectives on gloo ranks, as notebook 13)."""
    from helpers.parallel import dist_lab
    from helpers.parallel import distributed as D

    world, cores, note = _world(ctx)
    sizes, reps = ctx.pick(smoke=[2 ** 14, 2 ** 18], full=[2 ** 24, 2 ** 26]), ctx.pick(smoke=1, full=5)
    coll = D.run_on_ranks(dist_lab.section_collectives, world, sizes, 3 * reps)[0]
    sw = coll["sweep"]
    size = lambda n: f"{n / 2 ** 20:g} MiB" if n >= 2 ** 20 else f"{n / 2 ** 10:g} KiB"  # noqa: E731
    checks = [check(f"ring / dist.all_reduce time at {size(n)}", r / t, "<=", 1.5)
              for n, r, t in zip(sw["sizes"], sw["ring"], sw["torch"])]
    return result(checks, {"sizes": sw["sizes"], "ring_s": sw["ring"], "torch_s": sw["torch"],
                           "int_exact": coll["check"]["int exact"]},
                  {"world": world, "cores": cores, "bytes": sizes, "reps": 3 * reps}, note=note)


def g20_bucketed_ddp(ctx: Ctx) -> dict:
    """Overlapped, bucketed DDP against synchronising after backward, at the batch whose compute is closest to
    the communication (dist_lab.measure_ddp, as notebook 13)."""
    from helpers.parallel import dist_lab
    from helpers.parallel import distributed as D

    world, cores, note = _world(ctx)
    rows, reps = ctx.pick(smoke=[8], full=[16, 64, 256]), ctx.pick(smoke=2, full=8)
    depth = ctx.pick(smoke=2, full=8)
    m = D.run_on_ranks(dist_lab.measure_ddp, world, 1024, depth, rows, reps, 1.0)[0]
    near = min(rows, key=lambda r: abs(math.log(m[r]["compute only"] / m["comm"])))
    t = m[near]
    return result([check("after-backward / bucketed step time (>= 1.2: 20% faster)", t["after backward"] / t["bucketed"],
                         ">=", 1.2)],
                  {"comm_s": m["comm"], "rows": {r: {k: m[r][k] for k in ("compute only", "after backward", "overlapped",
                                                                          "bucketed", "iqr")} for r in rows},
                   "near_row": near, "compute_over_comm": t["compute only"] / m["comm"]},
                  {"world": world, "cores": cores, "width": 1024, "depth": depth, "rows": rows, "reps": reps,
                   "bucket_mb": 1.0}, note=note)


def g20_zero_memory(ctx: Ctx) -> dict:
    """Memory per rank against the ZeRO formulas, stages 0-3 (dist_lab.measure_memory, parallel.zero_formula)."""
    from helpers.parallel import dist_lab, data_parallel as parallel
    from helpers.parallel import distributed as D
    from helpers.gpt.model import PRESETS

    _, cores, _ = _world(ctx)
    preset = ctx.pick(smoke="tiny", full="small10m")
    cfg = {**PRESETS[preset], "seq_len": 32}
    ranks = ctx.pick(smoke=[2], full=[2, 4])
    worst, rows = 0.0, []
    for n in ranks:
        got = D.run_on_ranks(dist_lab.measure_memory, n, cfg)
        psi = got[0][0]["n_params"]
        for stage in range(4):
            have = max(r[stage]["total"] for r in got)
            want = parallel.zero_formula(stage, psi, n)["total"]
            rows.append({"ranks": n, "stage": stage, "bytes": have, "formula": want, "deviation": have / want - 1})
            worst = max(worst, abs(have / want - 1))
    return result([check("largest |memory / ZeRO formula - 1| over stages 0-3", worst, "<=", 0.05)], {"rows": rows},
                  {"preset": preset, "ranks": ranks, "cores": cores})

