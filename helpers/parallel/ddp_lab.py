"""Notebook 13's data parallelism on ranks: DDP, ZeRO and FSDP checked against one process, DDP timed.

Each function taking `(rank, world, ...)` runs under `helpers.parallel.launch.run_on_ranks` and returns
plain numbers (rank 0's, or every rank's where they differ):

* `check_data_parallel`: `ddp.DDP` (per-parameter, bucketed, after backward, no_sync), torch's DDP,
  `zero.ShardedOptimizer` (ZeRO-1/2), `fsdp.FSDP` and torch's FSDP2 against single-process training;
* timing by the course's protocol (`collectives_lab.rounds`): `measure_ddp` (step times per DDP mode,
  the bucket copies alone, no_sync accumulation), `measure_overlap` (DDP's overlap with a known compute
  and communication time per layer, against `ddp.overlap_prediction`), `section_ddp` (both on one
  process group);
* the sentences: `bucketing_sentence`, `overlap_sentences`, `takeaway` (ranked by `collectives_lab.rank_paired`);
* what `zero_lab`, `pipeline_lab`, the tests and `scripts/ddp_torchrun.py` share: `small_config`,
  `global_batches`, `lm_loss`, `local_rows`.
"""
from __future__ import annotations

import contextlib
import time
from statistics import median

import torch
import torch.distributed as dist
import torch.nn as nn

from helpers.gpt.model import GPT, GPTConfig
from helpers.measure import bench, clock as clocks, protocol
from helpers.parallel import ddp, fsdp, zero
from helpers.parallel.collectives_lab import rank_paired, rounds


def small_config(**overrides) -> GPTConfig:
    """A GPT small enough to train on every rank in a test (tied embeddings, no dropout)."""
    base = dict(n_layer=2, n_head=4, d_model=32, d_ff=128, seq_len=16, vocab_size=64)
    return GPTConfig(**{**base, **overrides})


def global_batches(cfg: GPTConfig, steps: int, batch: int, seed: int = 0) -> list[torch.Tensor]:
    """`steps` global batches of token ids (batch, seq_len + 1), the same on every rank."""
    g = torch.Generator().manual_seed(seed + 1)
    return [torch.randint(cfg.vocab_size, (batch, cfg.seq_len + 1), generator=g) for _ in range(steps)]


def lm_loss(model, rows: torch.Tensor) -> torch.Tensor:
    """The language-model loss of `model` (or a wrapper of it) on token rows (batch, seq_len + 1): each
    position predicts the next."""
    return model(rows[:, :-1], rows[:, 1:])[1]


def _reference(cfg, batches, opt_cls, lr, seed, micro=1):
    """Single-process training on each whole global batch: the answer every parallel version must give."""
    torch.manual_seed(seed)
    model = GPT(cfg)
    opt = opt_cls(model.parameters(), lr=lr)
    for rows in batches:
        opt.zero_grad()
        lm_loss(model, rows).backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _max_diff(a: dict, b: dict) -> float:
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in b)


def local_rows(rows: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """This rank's share of a global batch: the `rank`-th of `world` equal chunks along dim 0."""
    return rows.chunk(world)[rank]


def _train(wrapper, params, batches, rank, world, opt, micro=1, sync=None):
    for rows in batches:
        opt.zero_grad()
        parts = local_rows(rows, rank, world).chunk(micro)
        for j, part in enumerate(parts):
            last = j == len(parts) - 1
            ctx = wrapper.no_sync() if (not last and hasattr(wrapper, "no_sync")) else contextlib.nullcontext()
            with ctx:
                (lm_loss(wrapper, part) / len(parts)).backward()
        (sync or wrapper.finish_gradient_synchronization)()
        opt.step()


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
        wrapped = ddp.DDP(fresh(), **kw)
        _train(wrapped, None, batches, rank, world, torch.optim.SGD(wrapped.parameters(), lr=0.1))
        out[name] = _max_diff(wrapped.module.state_dict(), ref_sgd)
        if name == "ddp bucketed":
            out["buckets"] = len(wrapped.buckets)
    torch_ddp = nn.parallel.DistributedDataParallel(fresh())
    _train(torch_ddp, None, batches, rank, world, torch.optim.SGD(torch_ddp.parameters(), lr=0.1), sync=lambda: None)
    out["torch ddp"] = _max_diff(torch_ddp.module.state_dict(), ref_sgd)
    wrapped = ddp.DDP(fresh(), bucket_mb=0.02)
    _train(wrapped, None, batches, rank, world, torch.optim.SGD(wrapped.parameters(), lr=0.1))
    out["ours vs torch ddp"] = _max_diff(wrapped.module.state_dict(), torch_ddp.module.state_dict())
    acc = ddp.DDP(fresh())
    _train(acc, None, batches, rank, world, torch.optim.SGD(acc.parameters(), lr=0.1), micro=2)
    out["no_sync accumulation"] = _max_diff(acc.module.state_dict(), ref_sgd)

    z1 = ddp.DDP(fresh())
    opt = zero.ShardedOptimizer(z1.parameters(), torch.optim.AdamW, lr=1e-2)
    _train(z1, None, batches, rank, world, opt)
    out["zero-1"] = _max_diff(z1.module.state_dict(), ref_adam)
    m2 = fresh()
    with torch.no_grad():
        for p in ddp.unique_params(m2):
            dist.broadcast(p, 0)
    opt2 = zero.ShardedOptimizer(m2.parameters(), torch.optim.AdamW, lr=1e-2)
    _train(m2, None, batches, rank, world, opt2, sync=opt2.reduce_gradients)
    out["zero-2"] = _max_diff(m2.state_dict(), ref_adam)

    for name, dtype in (("fsdp fp32", None), ("fsdp bf16 compute", torch.bfloat16)):
        f = fsdp.FSDP(fresh(), compute_dtype=dtype)
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
            for p in ddp.unique_params(m):
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


def _tower(width: int, depth: int, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.GELU()) for _ in range(depth)])


def measure_ddp(rank: int, world: int, width: int, depth: int, rows: list[int], reps: int, bucket_mb: float,
                micro: int = 4, seed: int = 0) -> dict | None:
    """Step times of DDP after backward / overlapped / bucketed for each batch size in `rows`,
    with the compute-only time (no_sync) and the all-reduce-only time of the gradients, plus
    no_sync accumulation vs syncing every micro-step, all by `rounds` (warm-up, interleaved rotated
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
             "after backward": ddp.DDP(models["after backward"], overlap=False),
             "overlapped": ddp.DDP(models["overlapped"]),
             "bucketed": ddp.DDP(models["bucketed"], bucket_mb=bucket_mb)}
    grads_numel = sum(p.numel() for p in models["compute only"].parameters())
    buf = torch.zeros(grads_numel)
    comm = rounds({"comm": lambda: dist.all_reduce(buf)}, reps, [])["comm"]
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

        t = rounds({n: (lambda n=n: step(n)) for n in names}, reps,
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
    bucketed, model = modes["bucketed"], models["bucketed"]

    def accumulate(every: bool):
        model.zero_grad(set_to_none=True)
        for j, part in enumerate(x.chunk(micro)):
            ctx = contextlib.nullcontext() if (every or j == micro - 1) else bucketed.no_sync()
            with ctx:
                (bucketed(part).pow(2).mean() / micro).backward()
            if every or j == micro - 1:
                bucketed.finish_gradient_synchronization()

    before = bucketed.bytes_reduced
    accumulate(True)
    sent_every = bucketed.bytes_reduced - before
    before = bucketed.bytes_reduced
    accumulate(False)
    sent_once = bucketed.bytes_reduced - before
    acc = rounds({"no_sync": lambda: accumulate(False), "every micro-step": lambda: accumulate(True)}, reps,
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
    the measured step Timings (`rounds`), the median measured time of one layer's compute and of one
    all-reduce job, and `ddp.overlap_prediction` from those (rank 0; others None).
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
                with clocks.Stopwatch(tally=False) as sw:  # wall time: the parts are timed waits
                    fn()
                parts[kind].append(sw.wall)

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

            t = rounds({"sequential": sequential, "overlapped": overlapped}, reps, [("sequential", "overlapped")],
                       warmup=1)
            c, k = median(parts["compute"]), median(parts["comm"])
            pred = ddp.overlap_prediction([c] * layers, [k] * layers)
            out.append({"comm_ms": k_ms, "compute_ms": compute_ms, "layers": layers, "timings": t,
                        "measured compute s": c, "measured comm s": k, "predicted": pred,
                        "nominal": ddp.overlap_prediction([compute_ms / 1e3] * layers, [k_ms / 1e3] * layers)})
    return out if rank == 0 else None


def overlap_sentences(rows: list[dict], withheld: str | None = None) -> list[str]:
    """Per `measure_overlap` row: measured sequential and overlapped step times (medians with IQR), against
    the prediction from the measured per-layer times (within 10%, or by how much not), and whether the
    overlap is a measured speedup (IQRs separated) or within the noise; withheld: why this run ranks neither."""
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
                   + (f"; not ranked by this run: {withheld}" if withheld else
                      "; overlap ran " + str(sp) + " faster, the prediction says "
                      f"{p['sequential'] / p['overlapped']:.2f}x" if sp.separated and sp.value > 1 else
                      "; this run cannot rank the two (their IQRs overlap)" if not sp.separated else
                      f"; overlap was slower ({sp})"))
    return out


def section_ddp(rank: int, world: int, width: int, depth: int, rows: list[int], reps: int, bucket_mb: float,
                layers: int, compute_ms: float, comm_ms: list[float]) -> dict | None:
    """Notebook 13's DDP timing section on one process group: `measure_ddp`, then `measure_overlap`."""
    timed = measure_ddp(rank, world, width, depth, rows, reps, bucket_mb)
    ov = measure_overlap(rank, world, layers, compute_ms, comm_ms, reps)
    return {"ddp": timed, "overlap": ov} if rank == 0 else None


def bucketing_sentence(ddpm: dict, row: int, alpha_s: float, withheld: str | None = None) -> str:
    """Whether bucketing sped up `row`'s step, from measure_ddp's result and the ping-pong α (s): ranked
    only when the IQRs of the bucketed and per-parameter overlapped steps do not overlap and their
    round-by-round ratio (`protocol.paired_ratio`) stays on one side of 1; a measured gap
    is set against what was measured of its parts (the copies, timed alone; the saved messages at α
    each), and what they do not cover is said to be unexplained. Accepts medians (floats) in place of
    Timings for the modes (then nothing is ranked); withheld: why this run may not rank them at all."""
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
    if withheld:
        return f"{head} ({r}): not ranked by this run: {withheld}. {why[0].upper()}{why[1:]}"
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


def takeaway(overlap_rows: list[dict], compute_ms: float, row: int, timings: dict, withheld: str | None) -> str:
    """The notebook's takeaway on DDP: bucketed overlap against syncing after backward at `row` rows (`timings`,
    measure_ddp's for that row), and overlap against sequential where the all-reduce equals `compute_ms`
    (`measure_overlap`'s rows); withheld: why this run may not rank them (None: it may)."""
    ov = max(overlap_rows, key=lambda o: o["comm_ms"] == compute_ms)  # the row where communication equals compute
    ratio, pred = protocol.ratio(ov["timings"]["sequential"], ov["timings"]["overlapped"]), ov["predicted"]
    return ("DDP: our per-parameter, bucketed and after-backward DDP matched single-process training and torch DDP. "
            f"At {row} rows, " + rank_paired("bucketed overlap", timings["bucketed"], "syncing after backward",
                                             timings["after backward"], withheld=withheld)
            + f"; with a known compute ({1e3 * ov['measured compute s']:.1f} ms) and all-reduce "
            f"({1e3 * ov['measured comm s']:.1f} ms) per layer, overlap "
            + ("was not ranked against sequential: the machine was shared" if withheld else
               f"ran {ratio} faster than sequential, the prediction {pred['sequential'] / pred['overlapped']:.2f}x"
               if ratio.separated and ratio.value > 1 else "could not be ranked against sequential in this run") + ".")
