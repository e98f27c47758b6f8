"""Notebook 13's and its tests' work on ranks: each function taking `(rank, world, ...)` runs under
`helpers.parallel.distributed.run_on_ranks`, does every check or measurement of one section inside that
process group, and returns plain numbers (rank 0's, or every rank's where they differ).

* checks against single-process training or the dense layers: `check_collectives`,
  `check_data_parallel`, `check_tensor_parallel`;
* timing on ranks: `time_collective`, `ping_pong`, `comm_sweep` (ping-pong, our ring and
  `dist.all_reduce` per message size), `measure_ddp`, `run_pipeline` / `measure_pipeline` (a schedule
  executed with a fixed compute time per step, and its bubble);
* memory per rank: `measure_memory` (stages 0-3);
* the notebook's sentences, formulas and figure: `bucketing_sentence`, `collectives_notes`, `plan`,
  `plan_figure`; its parameters: `resolve_parameters` (all at once), with the checks `at_least_2`,
  `positive_ints` and `message_sizes`;
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
from helpers.measure import params
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
    """On ranks: ping-pong and all-reduce (ours and dist.all_reduce) medians for each size in bytes.

    Returns, on rank 0, {"sizes", "ping", "ring", "torch", "ring_iqr", "torch_iqr"} (seconds); None elsewhere.
    """
    rows: dict[str, list] = {k: [] for k in ("ping", "ring", "torch", "ring_iqr", "torch_iqr")}
    for nbytes in sizes:
        x = torch.ones(max(1, nbytes // 4), device=_device())
        rows["ping"].append(ping_pong(nbytes, reps))
        for name, op in (("ring", distributed.ring_all_reduce), ("torch", dist.all_reduce)):
            t = time_collective(lambda: op(x), reps)
            rows[name].append(t["median"])
            rows[name + "_iqr"].append((t["q75"] - t["q25"]) / t["median"])
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


def measure_ddp(rank: int, world: int, width: int, depth: int, rows: list[int], reps: int, bucket_mb: float,
                micro: int = 4, seed: int = 0) -> dict | None:
    """Step times of DDP after backward / overlapped / bucketed for each batch size in `rows`,
    with the compute-only time (no_sync) and the all-reduce-only time of the gradients, plus
    no_sync accumulation vs syncing every micro-step. Rank 0 returns medians (s) per row; others None.
    Also returned: "tensors" (gradient tensors), "messages" (all-reduces per step for each DDP mode),
    "largest tensor bytes" and "bucket_mb", which say how much bucketing could merge.
    """
    names = ["compute only", "after backward", "overlapped", "bucketed"]
    models = {n: _tower(width, depth, seed) for n in names}  # one model each: a wrapper's hooks fire for its own only
    modes = {"compute only": models["compute only"],
             "after backward": data_parallel.DDP(models["after backward"], overlap=False),
             "overlapped": data_parallel.DDP(models["overlapped"]),
             "bucketed": data_parallel.DDP(models["bucketed"], bucket_mb=bucket_mb)}
    grads_numel = sum(p.numel() for p in models["compute only"].parameters())
    buf = torch.zeros(grads_numel)
    res = {"rows": rows, "params": grads_numel, "comm": time_collective(lambda: dist.all_reduce(buf), reps)["median"],
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

        samples = {n: [] for n in names}
        for n in names:
            step(n)  # warm-up
        for _ in range(reps):
            for n in names:
                dist.barrier()
                t0 = time.perf_counter()
                step(n)
                samples[n].append(time.perf_counter() - t0)
        times = {n: median(samples[n]) for n in names}
        q = {n: sorted(samples[n]) for n in names}
        times["iqr"] = max((q[n][(3 * reps) // 4] - q[n][reps // 4]) / times[n] for n in names)
        res[r] = times
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

    acc = {True: [], False: []}
    before = ddp.bytes_reduced
    accumulate(True)
    sent_every = ddp.bytes_reduced - before
    before = ddp.bytes_reduced
    accumulate(False)
    sent_once = ddp.bytes_reduced - before
    for _ in range(reps):
        for every in (False, True):
            dist.barrier()
            t0 = time.perf_counter()
            accumulate(every)
            acc[every].append(time.perf_counter() - t0)
    res["accumulation"] = {"micro": micro, "no_sync": median(acc[False]), "every micro-step": median(acc[True]),
                           "bytes no_sync": sent_once, "bytes every": sent_every}
    return res if rank == 0 else None


def bucketing_sentence(ddpm: dict, row: int, alpha_s: float) -> str:
    """Why bucketing did or did not speed up `row`'s step, from measure_ddp's result and the ping-pong α (s).

    Compares the bucketed step with the per-parameter overlapped one, and prices the messages it saved
    at α each; says when every large tensor already fills a bucket on its own.
    """
    t, m = ddpm[row], ddpm["messages"]
    saved = m["overlapped"] - m["bucketed"]
    ratio = t["overlapped"] / t["bucketed"]
    big = ddpm["largest tensor bytes"] >= ddpm["bucket_mb"] * 2 ** 20
    why = (f"bucketing cut the all-reduces per step from {m['overlapped']} (one per tensor) to {m['bucketed']}"
           + (f": each {ddpm['largest tensor bytes'] / 2 ** 20:.0f} MiB weight already fills a {ddpm['bucket_mb']:g} MiB "
              "bucket, so a bucket only pairs it with its bias" if big else "")
           + f"; at α ≈ {1e6 * alpha_s:.0f} µs per message that saves about {1e3 * saved * alpha_s:.2f} ms, while "
           "filling each bucket (a copy of its gradients in) and copying the sums back costs two passes over them.")
    if ratio >= 1.05:
        return (f"At {row} rows bucketed was {ratio:.2f}x the speed of per-parameter overlap: the saved messages "
                f"likely outweighed the copies. {why[0].upper()}{why[1:]}")
    if ratio <= 1 / 1.05:
        return (f"At {row} rows bucketed was slower than per-parameter overlap ({ratio:.2f}x its speed): "
                f"likely the copies, and each bucket waiting for all its gradients before it starts, cost more than "
                f"the saved latency. {why[0].upper()}{why[1:]} Bucketing can pay with many small tensors "
                "(biases, LayerNorms), where it merges many messages into a few.")
    return (f"At {row} rows bucketed and per-parameter overlap were within 5% ({ratio:.2f}x): too close to call "
            f"on this machine. {why[0].upper()}{why[1:]}")


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
    schedule's own bubble. Returns {"busy_s", "wall_s", "bubble", "peak_in_flight"} for this stage.
    """
    steps = model_parallel.pipeline_schedule(kind, world, micro)[rank]
    w = torch.randn(width, width) / width ** 0.5
    acts: dict[int, torch.Tensor] = {}
    busy, peak, sends = 0.0, 0, []  # sends are asynchronous: 1F1B would deadlock on blocking sends
    dist.barrier()
    t0 = time.perf_counter()
    for op, i in steps:
        buf = torch.empty(8, width)
        if op == "F":
            if rank > 0:
                dist.recv(buf, rank - 1)
            else:
                buf = torch.randn(8, width)
            s = time.perf_counter()
            acts[i] = buf @ w
            time.sleep(forward_ms / 1e3)
            busy += time.perf_counter() - s
            peak = max(peak, len(acts))
            if rank < world - 1:
                sends.append(dist.isend(acts[i].clone(), rank + 1))
        else:
            if rank < world - 1:
                dist.recv(buf, rank + 1)
            else:
                buf = torch.ones(8, width)
            s = time.perf_counter()
            g = buf @ w.t()
            del acts[i]
            time.sleep(2 * forward_ms / 1e3)
            busy += time.perf_counter() - s
            if rank > 0:
                sends.append(dist.isend(g, rank - 1))
    for req in sends:
        req.wait()
    wall = time.perf_counter() - t0
    return {"busy_s": busy, "wall_s": wall, "bubble": 1 - busy / wall, "peak_in_flight": peak}


def measure_pipeline(rank: int, world: int, micros: list[int], forward_ms: float) -> list[dict] | None:
    """GPipe and 1F1B on `world` stages for each micro-batch count; rank 0 gets every stage's numbers."""
    rows = []
    for kind in ("gpipe", "1f1b"):
        for m in micros:
            r = run_pipeline(rank, world, kind, m, forward_ms)
            stats = torch.tensor([r["busy_s"], r["wall_s"], float(r["peak_in_flight"])], dtype=torch.float64)
            every = [torch.zeros_like(stats) for _ in range(world)]
            dist.all_gather(every, stats)
            busy = [float(s[0]) for s in every]
            wall = max(float(s[1]) for s in every)
            rows.append({"kind": kind, "micro": m, "stages": world, "bubble": 1 - sum(busy) / (world * wall),
                         "formula": model_parallel.bubble_formula(world, m),
                         "peak_in_flight": [int(s[2]) for s in every],
                         "wall_s": wall})
    return rows if rank == 0 else None


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
                          full=[2 ** k for k in range(10, 27, 2)], check=message_sizes),
           "REPS": R("REPS", REPS, smoke=5, full=15, check=params.positive),
           "DDP_WIDTH": R("DDP_WIDTH", DDP_WIDTH, smoke=1024, full=1024, check=params.positive),
           "DDP_ROWS": R("DDP_ROWS", DDP_ROWS, smoke=[4, 32], full=[16, 64, 256], check=positive_ints),
           "MICROS": R("MICROS", MICROS, smoke=[1, 2, 4, 8], full=[1, 2, 4, 8, 16], check=positive_ints),
           "STAGE_MS": R("STAGE_MS", STAGE_MS, smoke=10.0, full=20.0, check=positive_number),
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

