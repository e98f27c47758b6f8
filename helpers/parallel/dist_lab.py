"""Notebook 13's and its tests' work on ranks: each function taking `(rank, world, ...)` runs under
`helpers.parallel.distributed.run_on_ranks`, does every check or measurement of one section inside that
process group, and returns plain numbers (rank 0's, or every rank's where they differ).

* checks against single-process training or the dense layers: `check_collectives`,
  `check_data_parallel`, `check_tensor_parallel`;
* timing on ranks, by the course's protocol where a sentence ranks variants (`_rounds`: warm-up,
  interleaved rotated rounds until the compared IQRs separate, the stopping decision shared by the
  ranks): `time_collective`, `ping_pong`, `comm_sweep` (ping-pong, our ring and `dist.all_reduce` per
  message size), `measure_ddp` (step times per DDP mode, the bucket copies alone, no_sync accumulation),
  `measure_overlap` (DDP's overlap with a known compute and communication time per layer, against
  `data_parallel.overlap_prediction`), `section_ddp` (both on one process group), `run_pipeline` /
  `measure_pipeline` / `pipeline_row` (a schedule executed with a fixed compute time per step, its bubble
  and where its idle time went, from timestamps carried by the messages);
* memory per rank: `measure_memory` (stages 0-3);
* the notebook's sentences, verdicts, formulas and figure: `bucketing_sentence`, `overlap_sentences`,
  `bubble_sentences`, `bubble_verdict`, `collectives_notes`, `plan`, `plan_figure`; its parameters:
  `resolve_parameters` (all at once), with the checks `at_least_2`, `positive_ints` and `message_sizes`;
* for the tests and `scripts/ddp_torchrun.py`: `small_config`, `global_batches`, `fail_on`,
  `sleep_forever`.
"""
from __future__ import annotations

import ast
import os
import time
from statistics import median
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
import torch.nn as nn

from helpers.gpt.model import GPT, PRESETS, GPTConfig
from helpers.measure import bench, params, protocol
from helpers.measure.params import positive, positive_number, positives
from helpers.parallel import data_parallel, distributed, model_parallel


def small_config(**overrides) -> GPTConfig:
    """A GPT small enough to train on every rank in a test (tied embeddings, no dropout)."""
    base = dict(n_layer=2, n_head=4, d_model=32, d_ff=128, seq_len=16, vocab_size=64)
    return GPTConfig(**{**base, **overrides})


def global_batches(cfg: GPTConfig, steps: int, batch: int, seed: int = 0) -> list[torch.Tensor]:
    """`steps` global batches of token ids (batch, seq_len + 1), the same on every rank."""
    g = torch.Generator().manual_seed(seed + 1)
    return [torch.randint(cfg.vocab_size, (batch, cfg.seq_len + 1), generator=g) for _ in range(steps)]


def _loss(model, rows):
    return model(rows[:, :-1], rows[:, 1:])[1]


def _reference(cfg, batches, opt_cls, lr, seed, micro=1):
    """Single-process training on each whole global batch: the answer every parallel version must give."""
    torch.manual_seed(seed)
    model = GPT(cfg)
    opt = opt_cls(model.parameters(), lr=lr)
    for rows in batches:
        opt.zero_grad()
        _loss(model, rows).backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _max_diff(a: dict, b: dict) -> float:
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in b)


def _local(rows, rank, world):
    return rows.chunk(world)[rank]


def _train(wrapper, params, batches, rank, world, opt, micro=1, sync=None):
    for rows in batches:
        opt.zero_grad()
        parts = _local(rows, rank, world).chunk(micro)
        for j, part in enumerate(parts):
            last = j == len(parts) - 1
            ctx = wrapper.no_sync() if (not last and hasattr(wrapper, "no_sync")) else _null()
            with ctx:
                (_loss(wrapper, part) / len(parts)).backward()
        (sync or wrapper.finish_gradient_synchronization)()
        opt.step()


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def check_data_parallel(rank: int, world: int, steps: int = 3, seed: int = 0) -> dict:
    """Largest |parameter difference| after `steps` steps against single-process training, per method.

    DDP per-parameter, bucketed and after-backward (SGD), torch DDP, no_sync accumulation, ZeRO-1 and
    ZeRO-2 (AdamW), FSDP fp32 and bf16-compute (AdamW), torch FSDP2 where it runs. Rank 0's dict.
    """
    cfg = small_config()
    batches = global_batches(cfg, steps, 4 * world, seed)
    out: dict = {}
    ref_sgd = _reference(cfg, batches, torch.optim.SGD, 0.1, seed)
    ref_adam = _reference(cfg, batches, torch.optim.AdamW, 1e-2, seed)

    def fresh():
        torch.manual_seed(seed + rank)  # different weights on each rank: construction must broadcast rank 0's
        m = GPT(cfg)
        if rank == 0:
            torch.manual_seed(seed)
            m.load_state_dict(GPT(cfg).state_dict())
        return m

    for name, kw in (("ddp per-parameter", {}), ("ddp bucketed", {"bucket_mb": 0.02}),
                     ("ddp after backward", {"overlap": False})):
        ddp = data_parallel.DDP(fresh(), **kw)
        _train(ddp, None, batches, rank, world, torch.optim.SGD(ddp.parameters(), lr=0.1))
        out[name] = _max_diff(ddp.module.state_dict(), ref_sgd)
        if name == "ddp bucketed":
            out["buckets"] = len(ddp.buckets)
    torch_ddp = nn.parallel.DistributedDataParallel(fresh())
    _train(torch_ddp, None, batches, rank, world, torch.optim.SGD(torch_ddp.parameters(), lr=0.1), sync=lambda: None)
    out["torch ddp"] = _max_diff(torch_ddp.module.state_dict(), ref_sgd)
    ddp = data_parallel.DDP(fresh(), bucket_mb=0.02)
    _train(ddp, None, batches, rank, world, torch.optim.SGD(ddp.parameters(), lr=0.1))
    out["ours vs torch ddp"] = _max_diff(ddp.module.state_dict(), torch_ddp.module.state_dict())
    acc = data_parallel.DDP(fresh())
    _train(acc, None, batches, rank, world, torch.optim.SGD(acc.parameters(), lr=0.1), micro=2)
    out["no_sync accumulation"] = _max_diff(acc.module.state_dict(), ref_sgd)

    z1 = data_parallel.DDP(fresh())
    opt = data_parallel.ShardedOptimizer(z1.parameters(), torch.optim.AdamW, lr=1e-2)
    _train(z1, None, batches, rank, world, opt)
    out["zero-1"] = _max_diff(z1.module.state_dict(), ref_adam)
    m2 = fresh()
    with torch.no_grad():
        for p in data_parallel.unique_params(m2):
            dist.broadcast(p, 0)
    opt2 = data_parallel.ShardedOptimizer(m2.parameters(), torch.optim.AdamW, lr=1e-2)
    _train(m2, None, batches, rank, world, opt2, sync=opt2.reduce_gradients)
    out["zero-2"] = _max_diff(m2.state_dict(), ref_adam)

    for name, dtype in (("fsdp fp32", None), ("fsdp bf16 compute", torch.bfloat16)):
        f = data_parallel.FSDP(fresh(), compute_dtype=dtype)
        _train(f, None, batches, rank, world, torch.optim.AdamW(f.parameters(), lr=1e-2))
        full = f.gather_full_params()
        out[name] = _max_diff(full, ref_adam)
        if dtype is None:
            out["fsdp full shapes"] = all(full[k].shape == v.shape for k, v in ref_adam.items())
            out["fsdp shard elements"] = sum(p.numel() for p in f.shards)
    out["fsdp2"] = _fsdp2(fresh, batches, rank, world, ref_adam)
    return out if rank == 0 else {}


def _fsdp2(fresh, batches, rank, world, ref):
    """PyTorch's FSDP2 `fully_shard` on the same model and batches, or why it could not run."""
    try:
        # optional: FSDP2 is not in every torch build, and on CPU/gloo it may fail to import or to run
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        m = fresh()
        with torch.no_grad():
            for p in data_parallel.unique_params(m):
                dist.broadcast(p, 0)
        mesh = init_device_mesh("cpu", (world,))
        for block in m.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(m, mesh=mesh)
        _train(m, None, batches, rank, world, torch.optim.AdamW(m.parameters(), lr=1e-2), sync=lambda: None)
        full = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v) for k, v in m.state_dict().items()}
        return _max_diff(full, ref)
    except Exception as err:  # noqa: BLE001  reported, not raised: FSDP2 on CPU/gloo is not guaranteed
        return f"{type(err).__name__}: {str(err).splitlines()[0][:160]}"


# ---------------------------------------------------------------- timing on ranks

def _device() -> str:
    """Where this rank's buffers live: its GPU under NCCL, else the CPU."""
    return f"cuda:{torch.cuda.current_device()}" if dist.get_backend() == "nccl" else "cpu"


def _sync() -> None:
    if dist.get_backend() == "nccl":
        torch.cuda.synchronize()


def time_collective(fn: Callable[[], Any], reps: int, warmup: int = 2) -> dict[str, float]:
    """Median and quartiles (seconds) of `fn()` on this rank, each call between two barriers (and GPU syncs)."""
    for _ in range(warmup):
        fn()
    xs = []
    for _ in range(reps):
        _sync()
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        _sync()
        xs.append(time.perf_counter() - t0)
    xs.sort()
    return {"median": median(xs), "q25": xs[len(xs) // 4], "q75": xs[(3 * len(xs)) // 4]}


def ping_pong(nbytes: int, reps: int) -> float | None:
    """One-way time (s, median of `reps` round trips / 2) of `nbytes` between ranks 0 and 1; None elsewhere."""
    rank = dist.get_rank()
    buf = torch.zeros(max(1, nbytes // 4), dtype=torch.float32, device=_device())
    xs = []
    for i in range(reps + 2):
        _sync()
        dist.barrier()
        t0 = time.perf_counter()
        if rank == 0:
            dist.send(buf, 1)
            dist.recv(buf, 1)
        elif rank == 1:
            dist.recv(buf, 0)
            dist.send(buf, 0)
        _sync()
        if i >= 2:
            xs.append((time.perf_counter() - t0) / 2)
    return median(xs) if rank == 0 else None


def comm_sweep(rank: int, world_size: int, sizes: Sequence[int], reps: int) -> dict[str, Any] | None:
    """On ranks: ping-pong and all-reduce (ours and dist.all_reduce) for each size in bytes; the two
    all-reduces by `_rounds` (warm-up, interleaved rotated rounds, at least `reps` and at most 2 * reps,
    until their IQRs separate).

    Returns, on rank 0, {"sizes", "ping", "ring", "torch" (medians, s), "ring_iqr", "torch_iqr" (IQR / median),
    "ring_t", "torch_t" (bench.Timing per size)}; None elsewhere.
    """
    rows: dict[str, list] = {k: [] for k in ("ping", "ring", "torch", "ring_iqr", "torch_iqr", "ring_t", "torch_t")}
    for nbytes in sizes:
        x = torch.ones(max(1, nbytes // 4), device=_device())
        rows["ping"].append(ping_pong(nbytes, reps))
        t = _rounds({"ring": lambda: distributed.ring_all_reduce(x), "torch": lambda: dist.all_reduce(x)}, reps,
                    [("ring", "torch")], warmup=2, max_reps=2 * reps)
        for name in ("ring", "torch"):
            rows[name].append(t[name].median)
            rows[name + "_iqr"].append(t[name].q75 / t[name].median - t[name].q25 / t[name].median)
            rows[name + "_t"].append(t[name])
    return {"sizes": list(sizes), **rows} if rank == 0 else None


def check_collectives(rank: int, world: int, seed: int = 0) -> dict:
    """Our ring all-reduce against dist.all_reduce: integer (exact) and float tensors of awkward sizes."""
    out = {"int exact": True, "float max err": 0.0}
    g = torch.Generator().manual_seed(seed + rank)
    for n in (1, world - 1 if world > 1 else 1, 7, 1000, 4099):
        x = torch.randint(-1000, 1000, (n,), generator=g)
        ours, ref = distributed.ring_all_reduce(x.clone()), x.clone()
        dist.all_reduce(ref)
        out["int exact"] &= bool(torch.equal(ours, ref))
        y = torch.randn(3, n, generator=g)
        ours, ref = distributed.ring_all_reduce(y.clone()), y.clone()
        dist.all_reduce(ref)
        out["float max err"] = max(out["float max err"], float((ours - ref).abs().max()))
    return out if rank == 0 else {}


def check_tensor_parallel(rank: int, world: int, seed: int = 0) -> dict:
    """Megatron MLP and head-split attention against the dense layers: outputs and input gradients."""
    torch.manual_seed(seed)
    cfg = small_config(n_head=4, n_kv_head=2 if world <= 2 else 4)
    block = GPT(cfg).blocks[0]
    x = torch.randn(2, cfg.seq_len, cfg.d_model)
    out = {}
    for name, dense, tp in (("mlp", block.mlp, model_parallel.TPMLP(block.mlp)),
                            ("attention", block.attn, model_parallel.TPAttention(block.attn))):
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        ya, yb = dense(xa), tp(xb)
        ya.pow(2).sum().backward()
        yb.pow(2).sum().backward()
        out[name] = max(float((ya - yb).detach().abs().max()), float((xa.grad - xb.grad).abs().max()))
    return out if rank == 0 else {}


def _tower(width: int, depth: int, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.GELU()) for _ in range(depth)])


def _rounds(fns: dict[str, Callable[[], Any]], reps: int, pairs: list[tuple[str, str]], warmup: int = 3,
            max_reps: int | None = None, target_spread: float = 0.05) -> dict[str, bench.Timing]:
    """The course's protocol on ranks (`helpers.measure.protocol`, with the stopping decision shared):
    `warmup` untimed calls of each variant, then rounds of one timed call each in rotated order, each
    call between barriers; after `reps` rounds, rank 0 stops them (and tells every rank) once every pair
    in `pairs` is separated (IQRs disjoint) or every spread is within `target_spread`, else at
    `max_reps` (3 * reps). Every rank makes the same calls in the same order, so collectives pair up.
    Returns {name: bench.Timing} of this rank's seconds per call."""
    names = list(fns)
    for n in names:
        for _ in range(warmup):
            fns[n]()
    samples: dict[str, list[float]] = {n: [] for n in names}
    max_reps = max_reps or 3 * reps
    flag = torch.zeros(1)

    def timings():
        return {n: bench.Timing(*bench.quartiles(x), list(x), warmup) for n, x in samples.items()}

    for k in range(max_reps):
        for n in names[k % len(names):] + names[:k % len(names)]:
            _sync()
            dist.barrier()
            t0 = time.perf_counter()
            fns[n]()
            _sync()
            samples[n].append(time.perf_counter() - t0)
        if k + 1 < reps:
            continue
        if dist.get_rank() == 0:
            t = timings()
            done = all(protocol.separated(t[a], t[b]) for a, b in pairs) or all(
                x.spread <= target_spread for x in t.values())
            flag.fill_(float(done))
        dist.broadcast(flag, 0)
        if flag.item():
            break
    return timings()


def rank_paired(name_a: str, a: bench.Timing, name_b: str, b: bench.Timing, what: str = "step time") -> str:
    """`protocol.rank_sentence` when the two Timings are separated and their round-by-round ratio's IQR
    (`protocol.paired_ratio`) lies on one side of 1 as well; otherwise that this run cannot rank them. Both ratios
    are quoted."""
    r = protocol.paired_ratio(b, a)  # > 1: a is faster
    med, q25, q75 = r.value, r.lo, r.hi
    paired = f"round by round {name_b} / {name_a} {med:.2f}x (IQR {q25:.2f}-{q75:.2f}x)"
    if protocol.separated(a, b) and (q25 > 1 or q75 < 1):
        return protocol.rank_sentence(name_a, a, name_b, b, what=what) + f"; {paired}"
    how = ("apart by their spreads but not round by round" if protocol.separated(a, b) else
           "within the noise of each other")
    return f"{name_a} and {name_b} are {how} ({what}: {a} vs {b}; {paired}); this run cannot rank them"


def measure_ddp(rank: int, world: int, width: int, depth: int, rows: list[int], reps: int, bucket_mb: float,
                micro: int = 4, seed: int = 0) -> dict | None:
    """Step times of DDP after backward / overlapped / bucketed for each batch size in `rows`,
    with the compute-only time (no_sync) and the all-reduce-only time of the gradients, plus
    no_sync accumulation vs syncing every micro-step, all by `_rounds` (warm-up, interleaved rotated
    rounds until the compared pairs separate). Rank 0 returns, per row, {mode: median seconds,
    "timings": {mode: bench.Timing}, "iqr": the largest IQR/median}; "comm" (median s) and "comm_timing";
    "copies" (bench.Timing of the bucketed wrapper's copies alone: its gradients into one flat buffer
    per bucket and back, no communication); "tensors" (gradient tensors), "messages" (all-reduces per
    step for each DDP mode), "largest tensor bytes" and "bucket_mb", which say how much bucketing could
    merge. Others return None.
    """
    names = ["compute only", "after backward", "overlapped", "bucketed"]
    models = {n: _tower(width, depth, seed) for n in names}  # one model each: a wrapper's hooks fire for its own only
    modes = {"compute only": models["compute only"],
             "after backward": data_parallel.DDP(models["after backward"], overlap=False),
             "overlapped": data_parallel.DDP(models["overlapped"]),
             "bucketed": data_parallel.DDP(models["bucketed"], bucket_mb=bucket_mb)}
    grads_numel = sum(p.numel() for p in models["compute only"].parameters())
    buf = torch.zeros(grads_numel)
    comm = _rounds({"comm": lambda: dist.all_reduce(buf)}, reps, [])["comm"]
    res = {"rows": rows, "params": grads_numel, "comm": comm.median, "comm_timing": comm,
           "bucket_mb": bucket_mb, "tensors": len(list(models["compute only"].parameters())),
           "largest tensor bytes": max(p.numel() * p.element_size() for p in models["compute only"].parameters()),
           "messages": {n: len(modes[n].buckets) for n in names[1:]}}  # all-reduces per step, per mode
    for r in rows:
        x = torch.randn(r, width)

        def step(n):
            models[n].zero_grad(set_to_none=True)
            modes[n](x).pow(2).mean().backward()
            if n != "compute only":
                modes[n].finish_gradient_synchronization()

        t = _rounds({n: (lambda n=n: step(n)) for n in names}, reps,
                    [("after backward", "bucketed"), ("overlapped", "bucketed")])
        res[r] = {n: t[n].median for n in names} | {"timings": t, "iqr": max(t[n].spread for n in names)}
    buckets = [[p.grad for p in b] for b in modes["bucketed"].buckets]

    def copies():  # what bucketing adds to a step besides waiting: the flat buffer in, the sums back out
        for grads in buckets:
            if len(grads) > 1:
                flat = torch.cat([g.reshape(-1) for g in grads])
                offset = 0
                for g in grads:
                    g.copy_(flat[offset: offset + g.numel()].view_as(g))
                    offset += g.numel()

    res["copies"] = protocol.measure(copies, device="cpu", min_reps=reps, max_reps=3 * reps, budget_s=2.0)
    x = torch.randn(rows[0] * micro, width)  # micro-batches of the smallest rows: where communication weighs most
    ddp, model = modes["bucketed"], models["bucketed"]

    def accumulate(every: bool):
        model.zero_grad(set_to_none=True)
        for j, part in enumerate(x.chunk(micro)):
            ctx = _null() if (every or j == micro - 1) else ddp.no_sync()
            with ctx:
                (ddp(part).pow(2).mean() / micro).backward()
            if every or j == micro - 1:
                ddp.finish_gradient_synchronization()

    before = ddp.bytes_reduced
    accumulate(True)
    sent_every = ddp.bytes_reduced - before
    before = ddp.bytes_reduced
    accumulate(False)
    sent_once = ddp.bytes_reduced - before
    acc = _rounds({"no_sync": lambda: accumulate(False), "every micro-step": lambda: accumulate(True)}, reps,
                  [("no_sync", "every micro-step")], warmup=1)
    res["accumulation"] = {"micro": micro, "no_sync": acc["no_sync"].median,
                           "every micro-step": acc["every micro-step"].median, "timings": acc,
                           "bytes no_sync": sent_once, "bytes every": sent_every}
    return res if rank == 0 else None


def measure_overlap(rank: int, world: int, layers: int, compute_ms: float, comm_ms: list[float], reps: int) -> dict | None:
    """DDP's overlap made visible with timed waits: a backward of `layers` layers, each `compute_ms` of
    compute (a wait), each followed by its gradient's all-reduce (a real `dist.all_reduce` of a small
    tensor, then a wait of `comm_ms`, standing in for a link's transfer time) on one communication
    thread, as a GPU's communication stream. "sequential" runs every all-reduce after the whole backward;
    "overlapped" hands each one to the thread as soon as its layer is done. Per entry of `comm_ms`:
    the measured step Timings (`_rounds`), the median measured time of one layer's compute and of one
    all-reduce job, and `data_parallel.overlap_prediction` from those (rank 0; others None).
    """
    from concurrent.futures import ThreadPoolExecutor  # one worker: the communication stream

    grad = torch.ones(256)

    def compute():
        time.sleep(compute_ms / 1e3)

    def job(k_ms):
        dist.all_reduce(grad)
        time.sleep(k_ms / 1e3)

    out = []
    with ThreadPoolExecutor(max_workers=1) as stream:
        for k_ms in comm_ms:
            parts = {"compute": [], "comm": []}

            def timed(kind, fn):
                t0 = time.perf_counter()
                fn()
                parts[kind].append(time.perf_counter() - t0)

            def sequential():
                for _ in range(layers):
                    timed("compute", compute)
                for _ in range(layers):
                    timed("comm", lambda: job(k_ms))

            def overlapped():
                futures = []
                for _ in range(layers):
                    compute()
                    futures.append(stream.submit(job, k_ms))
                for f in futures:
                    f.result()

            t = _rounds({"sequential": sequential, "overlapped": overlapped}, reps, [("sequential", "overlapped")],
                        warmup=1)
            c, k = median(parts["compute"]), median(parts["comm"])
            pred = data_parallel.overlap_prediction([c] * layers, [k] * layers)
            out.append({"comm_ms": k_ms, "compute_ms": compute_ms, "layers": layers, "timings": t,
                        "measured compute s": c, "measured comm s": k, "predicted": pred,
                        "nominal": data_parallel.overlap_prediction([compute_ms / 1e3] * layers, [k_ms / 1e3] * layers)})
    return out if rank == 0 else None


def overlap_sentences(rows: list[dict]) -> list[str]:
    """Per `measure_overlap` row: measured sequential and overlapped step times (medians with IQR), against
    the prediction from the measured per-layer times (within 10%, or by how much not), and whether the
    overlap is a measured speedup (IQRs separated) or within the noise."""
    out = []
    for r in rows:
        t, p = r["timings"], r["predicted"]
        dev = {m: t[m].median / p[m] - 1 for m in ("sequential", "overlapped")}
        ok = all(abs(d) <= 0.10 for d in dev.values())
        sp = protocol.ratio(t["sequential"], t["overlapped"])
        out.append(f"{r['layers']} layers of {1e3 * r['measured compute s']:.1f} ms compute, all-reduce "
                   f"{1e3 * r['measured comm s']:.1f} ms each: sequential {t['sequential']}, overlapped {t['overlapped']}; "
                   f"predicted {1e3 * p['sequential']:.1f} and {1e3 * p['overlapped']:.1f} ms "
                   + ("(both within 10%)" if ok else f"(off by {dev['sequential']:+.0%} and {dev['overlapped']:+.0%})")
                   + ("; overlap ran " + str(sp) + " faster, the prediction says "
                      f"{p['sequential'] / p['overlapped']:.2f}x" if sp.separated and sp.value > 1 else
                      "; this run cannot rank the two (their IQRs overlap)" if not sp.separated else
                      f"; overlap was slower ({sp})"))
    return out


def section_ddp(rank: int, world: int, width: int, depth: int, rows: list[int], reps: int, bucket_mb: float,
                layers: int, compute_ms: float, comm_ms: list[float]) -> dict | None:
    """Notebook 13's DDP timing section on one process group: `measure_ddp`, then `measure_overlap`."""
    ddp = measure_ddp(rank, world, width, depth, rows, reps, bucket_mb)
    ov = measure_overlap(rank, world, layers, compute_ms, comm_ms, reps)
    return {"ddp": ddp, "overlap": ov} if rank == 0 else None


def bucketing_sentence(ddpm: dict, row: int, alpha_s: float) -> str:
    """Whether bucketing sped up `row`'s step, from measure_ddp's result and the ping-pong α (s): ranked
    only when the IQRs of the bucketed and per-parameter overlapped steps do not overlap and their
    round-by-round ratio (`protocol.paired_ratio`) stays on one side of 1; a measured gap
    is set against what was measured of its parts (the copies, timed alone; the saved messages at α
    each), and what they do not cover is said to be unexplained. Accepts medians (floats) in place of
    Timings for the modes (then nothing is ranked)."""
    t, m = ddpm[row], ddpm["messages"]
    tim = t.get("timings") or {k: bench.Timing(t[k], t[k], t[k], [t[k]]) for k in ("overlapped", "bucketed")}
    ov, bu = tim["overlapped"], tim["bucketed"]
    saved = m["overlapped"] - m["bucketed"]
    big = ddpm["largest tensor bytes"] >= ddpm["bucket_mb"] * 2 ** 20
    why = (f"bucketing cut the all-reduces per step from {m['overlapped']} (one per tensor) to {m['bucketed']}"
           + (f": each {ddpm['largest tensor bytes'] / 2 ** 20:.0f} MiB weight already fills a {ddpm['bucket_mb']:g} MiB "
              "bucket, so a bucket only pairs it with its bias" if big else "")
           + f"; at α ≈ {1e6 * alpha_s:.0f} µs per message that saves about {1e3 * saved * alpha_s:.2f} ms.")
    r = protocol.ratio(ov, bu)  # > 1: bucketed faster
    head = f"At {row} rows: bucketed {1e3 * bu.median:.1f} ms, per-parameter overlap {1e3 * ov.median:.1f} ms"
    copies = ddpm.get("copies")
    paired = protocol.paired_ratio(ov, bu) if t.get("timings") else None
    pq25, pq75 = (paired.lo, paired.hi) if paired else (1.0, 1.0)
    if not (t.get("timings") and r.separated and (pq25 > 1 or pq75 < 1)):
        if t.get("timings") and r.separated:  # the medians' spreads apart, the round-by-round ratios on both sides of 1
            spread = (f"apart by their medians' spreads ({r.value:.2f}x, IQR-bounded {r.lo:.2f}-{r.hi:.2f}x) but not "
                      f"round by round (the ratio's IQR {pq25:.2f}-{pq75:.2f}x straddles 1)")
        else:
            spread = f"within each other's spread ({r.value:.2f}x, IQR-bounded {r.lo:.2f}-{r.hi:.2f}x)"
        return (f"{head}, {spread}: this run cannot rank them. {why[0].upper()}{why[1:]}"
                + (f" What bucketing adds, the copies into the buckets and back, timed alone: {copies}." if copies else ""))
    gap = bu.median - ov.median
    if gap > 0:
        part = (f" The copies into the buckets and back, timed alone, take {copies}: {copies.median / gap:.0%} of the "
                f"{1e3 * gap:.1f} ms gap" if copies is not None else "")
        share = copies.median / gap if copies is not None else 0.0
        rest = ("; they account for it." if 0.75 <= share <= 1.25 else
                "; the rest of the gap is not explained by this run (not measured here: each bucket waits for all "
                "its gradients before it starts)." if share < 0.75 else
                "; more than the gap, so they can account for all of it (part of their time overlaps the step's "
                "other work).")
        return (f"{head}: bucketed was slower, {1 / r.value:.2f}x the time (IQR-bounded {1 / r.hi:.2f}-{1 / r.lo:.2f}x)."
                + part + rest + f" {why[0].upper()}{why[1:]}")
    share = saved * alpha_s / -gap
    return (f"{head}: bucketed was faster, {r}; the saved messages at α each account for {share:.0%} of the "
            f"{-1e3 * gap:.1f} ms{'' if 0.75 <= share <= 1.25 else ', the rest is not explained by this run'}. "
            f"{why[0].upper()}{why[1:]}")


def measure_memory(rank: int, world: int, cfg_kwargs: dict, seed: int = 0) -> list[dict]:
    """Bytes of parameters, gradients and AdamW state this rank holds after one step, per stage.

    Stages: 0 (our DDP + AdamW), 1 (ZeRO-1), 2 (ZeRO-2), 3 (our FSDP). Every rank returns its rows.
    """
    cfg = GPTConfig(**cfg_kwargs)
    rows = global_batches(cfg, 1, 2 * world, seed)[0]
    out = []
    for stage in (0, 1, 2, 3):
        torch.manual_seed(seed)
        model = GPT(cfg)
        if stage == 3:
            wrap = data_parallel.FSDP(model)
            params = list(wrap.parameters())
            opt = torch.optim.AdamW(params, lr=1e-3)
            sync, state = wrap.finish_gradient_synchronization, lambda: opt.state
        else:
            wrap = data_parallel.DDP(model) if stage < 2 else model
            params = data_parallel.unique_params(model)
            if stage == 0:
                opt = torch.optim.AdamW(params, lr=1e-3)
                sync, state = wrap.finish_gradient_synchronization, lambda: opt.state
            else:
                opt = data_parallel.ShardedOptimizer(params, torch.optim.AdamW, lr=1e-3)
                sync = wrap.finish_gradient_synchronization if stage == 1 else opt.reduce_gradients
                state = lambda: opt.optimizer.state  # noqa: E731
        _loss(wrap, _local(rows, rank, world)).backward()
        sync()
        opt.step()
        st = [t for s in state().values() for t in s.values() if torch.is_tensor(t) and t.dim() > 0]
        out.append({"stage": stage, "params": data_parallel.tensor_bytes(params),
                    "grads": data_parallel.tensor_bytes(p.grad for p in params),
                    "state": data_parallel.tensor_bytes(st),
                    "n_params": sum(p.numel() for p in data_parallel.unique_params(GPT(cfg)))})
        out[-1]["total"] = out[-1]["params"] + out[-1]["grads"] + out[-1]["state"]
        del wrap, model, opt
    return out


def run_pipeline(rank: int, world: int, kind: str, micro: int, forward_ms: float, width: int = 64) -> dict:
    """On ranks (one stage each): one training step of the schedule; activations and gradients really sent.

    Each step does a small real linear and then waits out `forward_ms` (forward) or 2x (backward), a
    fixed-duration stand-in for a stage's compute, so that p ranks sharing a few cores still show the
    schedule's own bubble. Every message carries its send time (perf_counter, one clock for all
    processes on a machine) in its last element, so each receive's wait splits into the part the
    schedule causes (the data was not sent yet) and the delivery (sent, not yet received). Returns this
    stage's seconds: {"busy_s", "wall_s", "bubble", "peak_in_flight", "t0", "end", "forward_s" and
    "backward_s" (median busy time of one step), "schedule_wait_s", "delivery_s" (summed over its
    receives), "messages" (received)}.
    """
    steps = model_parallel.pipeline_schedule(kind, world, micro)[rank]
    w = torch.randn(width, width, dtype=torch.float64) / width ** 0.5
    acts: dict[int, torch.Tensor] = {}
    busy, peak, sends = 0.0, 0, []  # sends are asynchronous: 1F1B would deadlock on blocking sends
    f_s, b_s, waited, delivery, received = [], [], 0.0, 0.0, 0

    def receive(src):
        nonlocal waited, delivery, received
        buf = torch.empty(8 * width + 1, dtype=torch.float64)
        posted = time.perf_counter()
        dist.recv(buf, src)
        got = time.perf_counter()
        sent = float(buf[-1])
        waited += max(0.0, min(sent, got) - posted)
        delivery += got - max(posted, sent)
        received += 1
        return buf[:-1].view(8, width)

    def send(x, dst):
        msg = torch.cat([x.reshape(-1), torch.tensor([time.perf_counter()], dtype=torch.float64)])
        sends.append(dist.isend(msg, dst))

    dist.barrier()
    t0 = time.perf_counter()
    for op, i in steps:
        if op == "F":
            x = receive(rank - 1) if rank > 0 else torch.randn(8, width, dtype=torch.float64)
            s = time.perf_counter()
            acts[i] = x @ w
            time.sleep(forward_ms / 1e3)
            f_s.append(time.perf_counter() - s)
            peak = max(peak, len(acts))
            if rank < world - 1:
                send(acts[i], rank + 1)
        else:
            g = receive(rank + 1) if rank < world - 1 else torch.ones(8, width, dtype=torch.float64)
            s = time.perf_counter()
            g = g @ w.t()
            del acts[i]
            time.sleep(2 * forward_ms / 1e3)
            b_s.append(time.perf_counter() - s)
            if rank > 0:
                send(g, rank - 1)
        busy += (f_s if op == "F" else b_s)[-1]
    for req in sends:
        req.wait()
    end = time.perf_counter()
    wall = end - t0
    return {"busy_s": busy, "wall_s": wall, "bubble": 1 - busy / wall, "peak_in_flight": peak, "t0": t0,
            "end": end, "forward_s": median(f_s), "backward_s": median(b_s), "schedule_wait_s": waited,
            "delivery_s": delivery, "messages": received}


_PIPE_KEYS = ("busy_s", "t0", "end", "forward_s", "backward_s", "schedule_wait_s", "delivery_s", "messages",
              "peak_in_flight")


def pipeline_row(kind: str, micro: int, stages: int, runs: list[list[dict]]) -> dict:
    """One (schedule, m) row from repeated runs, each a list of every stage's `run_pipeline` dict.

    The bubble of a run is 1 - sum(busy) / (p * W), W from the earliest start to the latest end over the
    stages; its idle time p * W - sum(busy) is split, from the timestamps, into the schedule's own waits
    (receives whose data was not sent yet, and each stage's time before the first start and after its
    own end), message delivery, and each stage's own time between steps (Python, allocation, being
    descheduled: the rest). The schedule's bubble, sched / (sched + busy), is the idle share the step would
    have without delivery and the stages' own time: for equal steps, exactly (p-1)/(m+p-1). Returns
    medians and quartiles over the runs, the formula, and the replay
    (`model_parallel.replay_schedule`) with the medians of the measured step times, delivery per message
    and overhead per step: {"kind", "micro", "stages", "bubble", "bubble_q25", "bubble_q75", "bubbles",
    "schedule_bubble" (and its "_q25", "_q75"),
    "formula", "replay", "replay_no_overhead", "idle_ms" {"schedule", "delivery", "own"}, "forward_ms",
    "backward_ms", "delay_ms", "overhead_ms", "peak_in_flight", "wall_s", "runs"}.
    """
    bubbles, net, walls, f, b, delay, over = [], [], [], [], [], [], []
    parts: dict[str, list[float]] = {"schedule": [], "delivery": [], "own": []}
    for stages_ in runs:
        start, end = min(r["t0"] for r in stages_), max(r["end"] for r in stages_)
        wall = end - start
        busy = sum(r["busy_s"] for r in stages_)
        idle = stages * wall - busy
        sched = sum(r["schedule_wait_s"] + (r["t0"] - start) + (end - r["end"]) for r in stages_)
        deliv = sum(r["delivery_s"] for r in stages_)
        msgs = sum(r["messages"] for r in stages_)
        bubbles.append(idle / (stages * wall))
        net.append(sched / (sched + busy))
        walls.append(wall)
        parts["schedule"].append(sched)
        parts["delivery"].append(deliv)
        parts["own"].append(idle - sched - deliv)
        f.append(median(r["forward_s"] for r in stages_))
        b.append(median(r["backward_s"] for r in stages_))
        delay.append(deliv / msgs if msgs else 0.0)
        over.append(max(0.0, idle - sched - deliv) / (stages * 2 * micro))
    med, q25, q75 = bench.quartiles(bubbles)
    args = (kind, stages, micro, median(f), median(b), median(delay))
    nmed, nq25, nq75 = bench.quartiles(net)
    return {"kind": kind, "micro": micro, "stages": stages, "bubble": med, "bubble_q25": q25, "bubble_q75": q75,
            "schedule_bubble": nmed, "schedule_bubble_q25": nq25, "schedule_bubble_q75": nq75,
            "bubbles": bubbles, "formula": model_parallel.bubble_formula(stages, micro),
            "replay": model_parallel.replay_schedule(*args, overhead_s=median(over))["bubble"],
            "replay_no_overhead": model_parallel.replay_schedule(*args)["bubble"],
            "idle_ms": {k: 1e3 * median(v) for k, v in parts.items()},
            "forward_ms": 1e3 * median(f), "backward_ms": 1e3 * median(b), "delay_ms": 1e3 * median(delay),
            "overhead_ms": 1e3 * median(over), "peak_in_flight": [r["peak_in_flight"] for r in runs[0]],
            "wall_s": median(walls), "runs": len(runs)}


def measure_pipeline(rank: int, world: int, micros: list[int], forward_ms: float, rounds: int = 5) -> list[dict] | None:
    """GPipe and 1F1B on `world` stages for each micro-batch count, `rounds` interleaved rounds (one run of
    every configuration per round, their order rotated) after one warm-up run of each schedule at the fewest
    micro-batches (its first sends set up the connections both ways between neighbours; a larger m sends the
    same messages, only more of them); rank 0 gets `pipeline_row` for each configuration."""
    configs = [(kind, m) for kind in ("gpipe", "1f1b") for m in micros]
    runs: dict[tuple, list] = {c: [] for c in configs}
    for kind in ("gpipe", "1f1b"):
        run_pipeline(rank, world, kind, min(micros), forward_ms)
    for k in range(rounds):
        for c in configs[k % len(configs):] + configs[:k % len(configs)]:
            r = run_pipeline(rank, world, c[0], c[1], forward_ms)
            stats = torch.tensor([float(r[key]) for key in _PIPE_KEYS], dtype=torch.float64)
            every = [torch.zeros_like(stats) for _ in range(world)]
            dist.all_gather(every, stats)
            runs[c].append([dict(zip(_PIPE_KEYS, (float(x) for x in s))) for s in every])
    if rank != 0:
        return None
    rows = [pipeline_row(kind, m, world, runs[(kind, m)]) for kind, m in configs]
    for row in rows:
        row["peak_in_flight"] = [int(x) for x in row["peak_in_flight"]]
    return rows


def bubble_verdict(rows: list[dict], tolerance: float = 0.15) -> dict:
    """The ledger's verdict on GPipe's bubble formula from GPipe's row at the largest m: "supported" when
    the measured schedule's bubble (`pipeline_row`: idle time that is the schedule's own waiting, from
    the timestamps) is within `tolerance` (relative) of (p-1)/(m+p-1), else "contradicted". Returns
    {"verdict", "ratio" (schedule's bubble / formula), "raw_ratio" (whole measured bubble / formula),
    "row", "measured" (a sentence), "tolerance"}."""
    top = max(r["micro"] for r in rows if r["kind"] == "gpipe")
    row = next(r for r in rows if r["kind"] == "gpipe" and r["micro"] == top)
    ratio = row["schedule_bubble"] / row["formula"]
    raw = row["bubble"] / row["formula"]
    ok = abs(ratio - 1) <= tolerance
    measured = (f"GPipe, p = {row['stages']}, m = {top}, {row['runs']} runs: the schedule's own waiting gives a bubble "
                f"of {row['schedule_bubble']:.3f} (IQR {row['schedule_bubble_q25']:.3f}-{row['schedule_bubble_q75']:.3f}), "
                f"{ratio:.2f}x the formula's {row['formula']:.3f}; with message delivery and the ranks' own time "
                f"between steps the whole bubble was {row['bubble']:.3f} ({raw:.2f}x); judged within {tolerance:.0%} "
                "of the formula on the schedule's part")
    return {"verdict": "supported" if ok else "contradicted", "ratio": ratio, "raw_ratio": raw, "row": row,
            "measured": measured, "tolerance": tolerance}


def bubble_sentences(rows: list[dict]) -> list[str]:
    """What the pipeline rows show, generated from them: each schedule at the largest m against the formula
    (ratio of medians, with the IQR), where its idle time went (the schedule's own waiting against the
    formula's (p-1)(F+B) per stage at the measured step times, message delivery, each stage's own time
    between steps), whether the replay with those measured times accounts for the gap (the replay's excess
    over the formula within 0.5-1.5x of the measured excess: the replay spreads the measured delays evenly
    over the steps, a coarse model), and
    whether GPipe and 1F1B differ beyond their spread, and by which part of the idle time."""
    out = []
    top = max(r["micro"] for r in rows)
    by = {r["kind"]: r for r in rows if r["micro"] == top}
    for kind, r in by.items():
        ratio, lo, hi = (r[k] / r["formula"] for k in ("bubble", "bubble_q25", "bubble_q75"))
        idle = r["idle_ms"]
        total = sum(idle.values())
        own_formula = r["stages"] * (r["stages"] - 1) * (r["forward_ms"] + r["backward_ms"])
        s = (f"{kind} at m = {top}: measured bubble {r['bubble']:.3f} (IQR {r['bubble_q25']:.3f}-{r['bubble_q75']:.3f}, "
             f"{r['runs']} runs), {ratio:.2f}x the formula's {r['formula']:.3f} (IQR {lo:.2f}-{hi:.2f}x)")
        s += (f"; of the stages' {total:.1f} ms idle, {idle['schedule']:.1f} ms was the schedule's own waiting "
              f"(the formula's (p-1)(F+B) per stage, over the {r['stages']} stages at the measured step times: "
              f"{own_formula:.1f} ms), "
              f"{idle['delivery']:.1f} ms message delivery ({r['delay_ms']:.2f} ms per message) and {idle['own']:.1f} ms "
              f"each stage's own time between steps ({r['overhead_ms']:.2f} ms per step: Python, allocation, "
              "waiting for a core)")
        gap, explained = r["bubble"] - r["formula"], r["replay"] - r["formula"]
        if abs(gap) < 0.02:
            s += "; no gap to explain"
        elif 0.5 <= explained / gap <= 1.5:
            s += (f"; replaying the schedule with these measured times predicts {r['replay']:.3f} "
                  f"({r['replay_no_overhead']:.3f} without the time between steps), within half the gap of the "
                  "measured bubble: they account for it")
        elif explained > gap:
            s += (f"; replaying the schedule with these times spread evenly over every step predicts {r['replay']:.3f}, "
                  f"more than the measured {r['bubble']:.3f}: the delays that were measured cover the gap, but not all "
                  "of them lay on the critical path")
        else:
            s += (f"; replaying the schedule with these measured times predicts {r['replay']:.3f}, short of the measured "
                  f"{r['bubble']:.3f}: the rest of the gap is not explained by this run")
        out.append(s + ".")
    if {"gpipe", "1f1b"} <= set(by):
        g, f = by["gpipe"], by["1f1b"]
        apart = g["bubble_q75"] < f["bubble_q25"] or f["bubble_q75"] < g["bubble_q25"]
        if not apart:
            out.append(f"GPipe and 1F1B at m = {top} are within each other's spread ({g['bubble']:.3f} vs "
                       f"{f['bubble']:.3f}), as the theory says: the same bubble; 1F1B held fewer activations.")
        else:
            d = {k: g["idle_ms"][k] - f["idle_ms"][k] for k in g["idle_ms"]}
            more, less = (("GPipe", "1F1B") if g["bubble"] > f["bubble"] else ("1F1B", "GPipe"))
            sign = 1 if more == "GPipe" else -1
            parts = ", ".join(f"{k} {sign * v:+.1f} ms" for k, v in d.items())
            total = sum(sign * v for v in d.values())
            sched = sign * d["schedule"] > 0.5 * total
            out.append(f"GPipe and 1F1B at m = {top} differ beyond their spread ({g['bubble']:.3f} vs {f['bubble']:.3f}), "
                       f"although the formula gives both the same bubble (and the replay with free messages and no "
                       f"time between steps gives both exactly the formula): {more} idled {total:.1f} ms longer "
                       f"({parts})"
                       + (": most of it the schedule's own waiting, which the formula says is equal, so this run does "
                          "not explain the difference" if sched else
                          ": most of it message delivery and the stages' own time between steps, so the difference "
                          f"comes from this machine's costs, not from the schedule (per message {g['delay_ms']:.2f} ms "
                          f"under GPipe, {f['delay_ms']:.2f} ms under 1F1B)") + ".")
    return out


def fail_on(rank: int, world: int, bad_rank: int) -> int:
    """Raises on `bad_rank` (the others wait at a barrier that never completes): for the failure tests."""
    if rank == bad_rank:
        raise ValueError(f"planted failure on rank {rank}")
    dist.barrier()
    return rank


def sleep_forever(rank: int, world: int) -> None:
    """Never returns: for the interrupt and timeout tests."""
    while True:
        time.sleep(1)


def section_collectives(rank: int, world: int, sizes: list[int], reps: int) -> dict | None:
    """Notebook 13's first section on one process group: the ring check, then the size sweep."""
    check = check_collectives(rank, world)
    sweep = comm_sweep(rank, world, sizes, reps)
    return {"check": check, "sweep": sweep} if rank == 0 else None


def plan(ranks: int, n_params: float, stage: int) -> dict[str, float]:
    """Memory per rank (bytes, fp32 AdamW) and bytes each rank sends per step at a ZeRO stage, from formulas."""
    mem = data_parallel.zero_formula(stage, n_params, ranks)
    ring = (ranks - 1) / ranks  # a ring moves (n-1)/n of a buffer per reduce-scatter or all-gather
    sent = {0: 2, 1: 2, 2: 2, 3: 3}[stage] * ring * 4 * n_params
    return {**mem, "sent": sent}


def plan_figure(ranks: int, n_params: float, stage: int, title: str = "", unit: str = "GiB"):
    """Bars of memory per rank for stages 0-3 at `ranks` ranks, the chosen stage marked; returns the figure.

    `unit`: "GiB" or "MiB" for the y axis (match the table beside it). Raises ValueError for another unit.
    """
    from helpers.show import plots  # heavy: matplotlib, kept out of the ranks' fork server (it preloads this module)

    if unit not in ("GiB", "MiB"):
        raise ValueError(f"unit={unit!r}; choose 'GiB' or 'MiB'")
    scale = 2 ** 30 if unit == "GiB" else 2 ** 20
    fig, ax = plots.figure()
    names = ["DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3"]
    bottom = [0.0] * 4
    for part in ("params", "grads", "state"):
        vals = [plan(ranks, n_params, s)[part] / scale for s in range(4)]
        ax.bar(names, vals, bottom=bottom, label=part)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.bar([names[stage]], [bottom[stage]], fill=False, edgecolor="black", linewidth=2)
    ax.set_ylabel(f"{unit} per rank (fp32 AdamW)")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    return fig


def at_least_2(name: str, value) -> int:
    """A world size: an int >= 2 (one rank has nobody to talk to). Raises ValueError naming the parameter."""
    if positive(name, value) < 2:
        raise ValueError(f"{name}={value!r} must be an int >= 2")
    return value


def positive_ints(name: str, value) -> list[int]:
    """A non-empty list of positive ints; a string such as "[1, 2]" (what papermill's `-p` passes for a
    list) is read as a Python literal first. Raises ValueError naming the parameter, and for a string
    that is not a list literal, says that a string was received and to pass lists with `-y`."""
    if isinstance(value, str):
        try:
            parsed = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            parsed = None
        if not isinstance(parsed, (list, tuple)):
            raise ValueError(f"{name}={value!r} is a string, not a list: papermill's -p passes text; pass lists "
                             f"with -y, e.g. -y '{name}: [1, 2]', or write a list literal such as \"[1, 2]\"")
        value = parsed
    return positives(name, value)


def message_sizes(name: str, value) -> list[int]:
    """All-reduce message sizes in bytes (`positive_ints`): each a whole number of fp32 elements (a multiple of
    4, as the sweep's buffers hold floats), and at least two distinct sizes, the fewest the α-β fit takes."""
    sizes = positive_ints(name, value)
    for n in sizes:
        if n % 4:
            raise ValueError(f"{name}={sizes!r}: entry {n} is not a whole number of fp32 elements; the sweep sends "
                             f"float32 buffers, so give multiples of 4 bytes (e.g. {max(4, n - n % 4)})")
    if len(set(sizes)) < 2:
        raise ValueError(f"{name}={sizes!r}: the α-β fit of the latency needs at least two distinct message sizes, "
                         f"e.g. [{sizes[0]}, {4 * sizes[0]}]")
    return sizes


def resolve_parameters(S: params.Setup, *, WORLD_SIZE, MEMORY_RANKS, MSG_SIZES, REPS, DDP_WIDTH, DDP_ROWS, MICROS,
                       STAGE_MS, MEMORY_MODEL, TORCHRUN) -> dict:
    """Notebook 13's parameters, validated at once and with the profile's defaults filled in: {name: value},
    plus "CORES" (the CPU cores this process may use, which size the full profile's WORLD_SIZE).

    Raises ValueError naming the first bad parameter: a world size below 2 (WORLD_SIZE or an entry of
    MEMORY_RANKS; one rank has nobody to talk to), message sizes that the sweep cannot send or fit
    (`message_sizes`), a STAGE_MS that is not a finite positive number.
    """
    cores = len(os.sched_getaffinity(0))
    R = S.resolve
    out = {"CORES": cores,
           "WORLD_SIZE": R("WORLD_SIZE", WORLD_SIZE, smoke=2, full=max(2, min(8, cores // 2)), check=at_least_2),
           "MEMORY_RANKS": R("MEMORY_RANKS", MEMORY_RANKS, smoke=[2], full=[2, 4], check=positive_ints),
           "MSG_SIZES": R("MSG_SIZES", MSG_SIZES, smoke=[2 ** k for k in (10, 14, 18, 22)],
                          full=[2 ** k for k in range(10, 25, 2)], check=message_sizes),
           "REPS": R("REPS", REPS, smoke=5, full=5, check=params.positive),
           "DDP_WIDTH": R("DDP_WIDTH", DDP_WIDTH, smoke=1024, full=1024, check=params.positive),
           "DDP_ROWS": R("DDP_ROWS", DDP_ROWS, smoke=[4, 32], full=[16, 128], check=positive_ints),
           "MICROS": R("MICROS", MICROS, smoke=[1, 2, 4, 8], full=[1, 4, 16], check=positive_ints),
           "STAGE_MS": R("STAGE_MS", STAGE_MS, smoke=10.0, full=10.0, check=positive_number),
           "MEMORY_MODEL": R("MEMORY_MODEL", MEMORY_MODEL, smoke="tiny", full="small10m",
                             check=lambda n, v: params.choose(n, v, PRESETS)),
           "TORCHRUN": R("TORCHRUN", TORCHRUN, smoke=True, full=True, check=lambda n, v: params.choose(n, v, (True, False)))}
    if min(out["MEMORY_RANKS"]) < 2:
        raise ValueError(f"MEMORY_RANKS={out['MEMORY_RANKS']!r}: every world size must be >= 2")
    return out


def collectives_notes(sweep: dict, world: int, alpha: float, beta: float) -> list[str]:
    """Sentences on the collectives sweep, generated from its numbers: the spread of the all-reduce
    times, dist.all_reduce's fitted slope against the ring's prediction 2(n-1)/n·β, and our ring's
    smallest-message time against the α-β model. Causes are given as likely, not as measured."""
    n, notes = world, []
    spread = max(sweep["torch_iqr"])
    notes.append(f"spread (IQR/median) of the all-reduce times up to {spread:.0%}: "
                 + ("noisy, rerun when the machine is idle before trusting small differences" if spread > 0.25
                    else "steady enough to compare the columns"))
    a_ar, b_ar = distributed.alpha_beta_fit(sweep["sizes"], sweep["torch"])
    pred = 2 * (n - 1) / n * beta
    slope = b_ar / pred if pred > 0 else float("inf")
    head = (f"dist.all_reduce's fitted line: intercept {1e6 * a_ar:.0f} µs (the ring predicts 2(n-1)α = "
            f"{2e6 * (n - 1) * alpha:.0f} µs), slope {1e9 * b_ar:.2f} ns/byte (the ring predicts 2(n-1)/n·β = "
            f"{1e9 * pred:.2f} ns/byte), {slope:.1f}x the prediction")
    if slope > 1.3:
        notes.append(head + ": gloo likely runs its own algorithm rather than this ring and copies buffers in "
                     "and out, and its ranks share cores with those copies, so each byte costs more than one "
                     "ping-pong transfer does (a likely cause, not measured here)")
    elif slope < 1 / 1.3:
        notes.append(head + ": faster per byte than the ring; likely gloo overlaps its transfers, which a "
                     "single ping-pong cannot (a likely cause, not measured here)")
    else:
        notes.append(head + ": within 30%, as the model says")
    floor = sweep["ring"][0] / distributed.ring_model_time(sweep["sizes"][0], n, alpha, beta)
    if floor > 2:
        notes.append(f"our ring's smallest message took {floor:.1f}x the α-β model's time: each of its 2(n-1) = "
                     f"{2 * (n - 1)} steps likely pays Python overhead (splitting the tensor, a send/recv pair, "
                     "waiting for the slowest rank) beyond the ping-pong's α (a likely cause, not measured here)")
    else:
        notes.append(f"our ring's smallest message took {floor:.1f}x the α-β model's time, within 2x of its floor "
                     f"of 2(n-1) = {2 * (n - 1)} latencies")
    return notes

