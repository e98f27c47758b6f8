"""Notebook 06's speed and memory measurements: each attention implementation timed, the TFLOP/s sweep and its
goal, the memory wall as N grows, and their figures.

* `time_attention`, `speed`, `speedup`, `goal`: one implementation timed (forward, or forward + backward), the
  TFLOP/s sweep over sequence lengths and head dims (the implementations timed interleaved at each point), one
  implementation's speed-up over another at one point from their paired rounds (median and quartiles), and the
  Triton forward against SDPA's flash kernel.
* `memory_wall`: bytes kept for backward (and peak CUDA memory) of each implementation as N grows.
* `memory_wall_figure`, `speed_figures`: the figures, drawn so that what the run did not measure is not drawn
  as if it had (a wall where naive stopped, error bars from the IQR, no curve through two points).

Correctness, the parameters, the traffic sentence, the course GPT per kernel and the panel are `flash_lab`'s.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import torch

from helpers.attention import kernels
from helpers.measure import bench, hardware, memory, protocol
from helpers.show import plots
from helpers.show.tables import table
from helpers.show.widgets import progress


def attention_call(impl: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, is_causal: bool = False,
                   backward: bool = False):
    """A zero-argument function running one implementation's forward (no autograd graph) or forward plus backward."""
    if not backward:
        def fn():
            with torch.no_grad():
                return kernels.attention(q, k, v, impl, is_causal)
        return fn
    inputs = [t.detach().requires_grad_() for t in (q, k, v)]
    do = torch.randn_like(q)

    def fn():
        return torch.autograd.grad(kernels.attention(*inputs, impl, is_causal), inputs, do)
    return fn


def time_attention(impl: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, is_causal: bool = False,
                   backward: bool = False, reps: int = 5, warmup: int = 2) -> bench.Timing:
    """Time the forward (no autograd graph) or the forward plus backward of one implementation (`bench.benchmark`:
    CUDA events on a GPU, the thread's CPU clock on a CPU with torch on one thread)."""
    fn = attention_call(impl, q, k, v, is_causal=is_causal, backward=backward)
    return bench.benchmark(fn, warmup=warmup, reps=reps, device=q.device.type)


def _failed(row: dict, err: RuntimeError) -> None:
    """Record a recoverable failure (out of memory, a library kernel's refusal) in the row; re-raise anything else."""
    row["status"] = bench.recoverable_failure(err)
    if row["status"] is None:
        raise err


def _time_pass(fns: dict, rows: dict, *, reps: int, warmup: int, device: str) -> None:
    """Time one pass of every implementation at one point, interleaved (one call of each per round, so a burst of
    other work slows all of them alike and their per-round ratios cancel it), into their rows. Each is called
    `warmup` times first (at least once) alone, so that a refusal or an out-of-memory error is caught and recorded
    before anything is timed; should the interleaved rounds fail all the same, each is timed alone."""
    ready = {}
    for impl, fn in fns.items():
        try:
            for _ in range(max(1, warmup)):
                fn()
            ready[impl] = fn
        except RuntimeError as err:
            _failed(rows[impl], err)
    if rows and any(r["status"] != "ok" for r in rows.values()):
        memory.release_memory()
    try:
        timings = bench.benchmark_interleaved(ready, reps=reps, warmup=0, device=device) if ready else {}
    except RuntimeError as err:
        if bench.recoverable_failure(err) is None:
            raise
        memory.release_memory()
        timings = {}
        for impl, fn in ready.items():
            try:
                timings[impl] = bench.benchmark(fn, warmup=0, reps=reps, device=device)
            except RuntimeError as err_one:
                _failed(rows[impl], err_one)
    for impl, t in timings.items():
        rows[impl]["timing"] = t


def speed(device: str, impls, head_dims, seq_lens, *, dtype: str = "bf16", tokens: int = 16384,
          d_model: int = 2048, reps: int = 10, warmup: int = 3, max_n: dict[str, int] | None = None) -> list[dict]:
    """TFLOP/s of each implementation, forward and forward+backward, per (head dim, causal, N).

    Batch x N stays at `tokens` and heads x d at `d_model`. At each point and pass the implementations are timed
    interleaved (`_time_pass`), so each row keeps its per-round times ("samples_ms", round i of every implementation
    taken together) and `speedup` can divide them round by round. `max_n` = {impl: longest N to time} (for slow
    ones). An out-of-memory error, or a library kernel's refusal, is recorded in the row's status, and the sweep
    goes on. Each row's "clock" says what its times were read from ("thread", "cuda events"; `bench.resolve_clock`).
    """
    rows = []
    combos = [(d, causal, n) for d in head_dims for causal in (False, True) for n in seq_lens]
    for d, causal, n in progress(combos, desc="speed sweep"):
        b, h = max(1, tokens // n), max(1, d_model // d)
        q, k, v = kernels.make_qkv(b, h, n, d, hardware.torch_dtype(dtype), device)
        here = {}
        for impl in impls:
            for backward in (False, True):
                row = {"impl": impl, "dtype": dtype, "head_dim": d, "causal": causal, "n": n,
                       "pass": "fwd+bwd" if backward else "fwd", "ms": None, "tflops": None, "status": "ok"}
                rows.append(row)
                here[(impl, backward)] = row
                if n > (max_n or {}).get(impl, n):
                    row["status"] = f"not timed above N={max_n[impl]}"
        for backward in (False, True):
            timed_here = {impl: row for (impl, bwd), row in here.items() if bwd == backward and row["status"] == "ok"}
            fns = {impl: attention_call(impl, q, k, v, is_causal=causal, backward=backward) for impl in timed_here}
            _time_pass(fns, timed_here, reps=reps, warmup=warmup, device=device)
            fns = None
            for impl, row in timed_here.items():
                t = row.pop("timing", None)
                if t is None:
                    continue
                flops = kernels.attention_flops(b, h, n, d, causal, backward)
                row |= {"ms": t.ms, "spread": t.spread, "tflops": bench.tflops(flops, t.median),
                        "tflops_lo": bench.tflops(flops, t.q75), "tflops_hi": bench.tflops(flops, t.q25),  # IQR
                        "samples_ms": [s * 1e3 for s in t.samples], "clock": t.clock}
        del q, k, v
    return rows


def speedup(rows: list[dict], impl: str, base: str, *, head_dim: int, causal: bool, n: int,
            pass_: str = "fwd+bwd") -> protocol.Ratio | None:
    """`base`'s time over `impl`'s at one point of `speed`'s rows (above 1: impl is faster), from the rounds they
    were timed in together: the median of the per-round ratios, with their quartiles as lo and hi
    (`protocol.paired_ratio`). None when either was not timed there."""
    key = lambda r: (r["head_dim"], r["causal"], r["n"], r["pass"])  # noqa: E731
    pick = {r["impl"]: r for r in rows if key(r) == (head_dim, causal, n, pass_) and r.get("samples_ms")}
    if impl not in pick or base not in pick:
        return None
    mine, theirs = pick[impl]["samples_ms"], pick[base]["samples_ms"]
    if len(mine) != len(theirs):
        raise ValueError(f"{impl} and {base} at N={n} were not timed in the same rounds ({len(mine)} and {len(theirs)})")
    med, q25, q75 = bench.quartiles([b / a for a, b in zip(mine, theirs)])
    return protocol.Ratio(med, q25, q75, not q25 <= 1 <= q75)


GOAL_MIN_N, GOAL_HEAD_DIM = 2048, 128  # the goal: our forward >= SDPA flash's at d=128 and N >= 2048


def goal(rows: list[dict], ours: str = "flash_triton", theirs: str = "sdpa_flash") -> list[dict]:
    """The course kernel's performance goal, per N >= 2048 and causal flag: our forward's TFLOP/s over
    theirs at head dim 128, from `speed`'s rows: [{"n", "causal", "ours", "theirs", "ratio", "lo", "hi"}], where
    ratio, lo and hi are the median and quartiles of the per-round ratios (`speedup`) when the rows hold their
    rounds, else the ratio of the medians' TFLOP/s (lo = hi = ratio)."""
    pick = {(r["impl"], r["causal"], r["n"]): r["tflops"] for r in rows
            if r["pass"] == "fwd" and r["head_dim"] == GOAL_HEAD_DIM and r["tflops"]}
    out = []
    for (impl, c, n) in sorted(pick, key=lambda key: (key[1], key[2])):
        if impl != ours or n < GOAL_MIN_N or (theirs, c, n) not in pick:
            continue
        paired = speedup(rows, ours, theirs, head_dim=GOAL_HEAD_DIM, causal=c, n=n, pass_="fwd")
        value = pick[(ours, c, n)] / pick[(theirs, c, n)]
        out.append({"n": n, "causal": c, "ours": pick[(ours, c, n)], "theirs": pick[(theirs, c, n)],
                    "ratio": paired.value if paired else value, "lo": paired.lo if paired else value,
                    "hi": paired.hi if paired else value})
    return out


N_BY_N = ("naive", "sdpa_math")  # the implementations that materialise the N x N scores


def memory_wall(impls, seq_lens, *, batch: int, heads: int, head_dim: int, dtype: torch.dtype, device: str,
                is_causal: bool = False, budget_gb: float | None = None) -> list[dict]:
    """Saved-for-backward bytes (and peak CUDA memory of forward+backward) of each impl as N grows.

    A CUDA out-of-memory error (or a library kernel's refusal) is caught and recorded, the memory
    freed, and larger N skipped for that impl. With `budget_gb`, a size whose predicted need (3 N x N buffers alive at once for the
    N x N implementations, twice the saved bytes for the others) exceeds the budget is recorded as
    "exceeds budget" without allocating anything.
    """
    rows, failed = [], set()
    itemsize = torch.empty((), dtype=dtype).element_size()
    for n in seq_lens:
        for impl in impls:
            row = {"impl": impl, "n": n, "status": "ok", "saved_bytes": None, "peak_bytes": None}
            rows.append(row)
            need = 2 * kernels.saved_bytes("tiled", n, head_dim, batch * heads, itemsize, is_causal)
            if impl in N_BY_N:
                need = 3 * batch * heads * n * n * itemsize
            if impl in failed:
                row["status"] = "skipped (failed at a smaller N)"
                continue
            if budget_gb is not None and need > budget_gb * 2**30:
                row["status"] = f"exceeds budget ({need / 2**30:.3g} > {budget_gb:g} GiB)"
                continue
            try:
                q, k, v = kernels.make_qkv(batch, heads, n, head_dim, dtype, device, requires_grad=True)
                row["saved_bytes"] = memory.saved_tensor_bytes(lambda: kernels.attention(q, k, v, impl, is_causal))
                do = torch.randn_like(q)
                if device == "cuda":  # once unmeasured: Triton's autotuner and library set-up allocate scratch memory
                    kernels.attention(q, k, v, impl, is_causal).backward(do)
                    q.grad = k.grad = v.grad = None  # so the measured backward allocates them, as a first one does
                row["peak_bytes"] = memory.peak_cuda_memory(lambda: kernels.attention(q, k, v, impl, is_causal).backward(do))
            except RuntimeError as err:  # out of memory, or a library kernel that refuses this size
                row["status"] = bench.recoverable_failure(err)
                if row["status"] is None:
                    raise
                failed.add(impl)
            finally:
                q = k = v = do = None
                memory.release_memory()
    return rows


# ---------------------------------------------------------------- figures

STYLES = [dict(ls="-", marker="o"), dict(ls="--", marker="s"), dict(ls=":", marker="^"), dict(ls="-.", marker="D")]


def memory_wall_figure(wall: list, impls: list, seq_lens: list, *, heads: int, head_dim: int, itemsize: int,
                       budget_gb: float | None, device: str, title: str):
    """Saved-for-backward MiB per implementation against N, with the wall drawn: naive's predicted need
    (three N x N buffers) against the budget or the GPU's memory, and a vertical line where naive stopped.
    Identical lines get different dashes and markers, and a printed note says which lie on top of which."""
    fig, ax = plots.figure(1, figsize=(8, 4.5))
    mib = 2**20
    series = {impl: [r["saved_bytes"] and r["saved_bytes"] / mib for r in wall if r["impl"] == impl] for impl in impls}
    for (impl, ys), style in zip(series.items(), STYLES):
        pts = [(n, y) for n, y in zip(seq_lens, ys) if y]
        if pts:
            ax.plot(*zip(*pts), label=f"{impl}: kept for backward", **style)
    need = [3 * heads * n * n * itemsize / mib for n in seq_lens]
    ax.plot(seq_lens, need, color="#444444", lw=1, ls=(0, (1, 2)), label="naive: 3 N x N buffers (predicted need)")
    limit = budget_gb * 2**30 / mib if budget_gb else None
    if device == "cuda":
        limit = torch.cuda.get_device_properties(0).total_memory / mib
    if limit:
        ax.axhline(limit, color="#d1495b", lw=1.5, label="budget" if device == "cpu" else "GPU memory")
    stop = next((r for r in wall if r["impl"] == "naive" and r["status"] != "ok"), None)
    if stop:
        ax.axvline(stop["n"], color="#d1495b", ls="--", lw=1.5, label=f"naive stops: {stop['status'].split('(')[0].strip()}")
    ax.set(xscale="log", yscale="log", xlabel="sequence length N", ylabel="MiB", title=title)
    ax.set_xscale("log", base=2)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    notes = [f"{b}'s line lies exactly on {a}'s (the same bytes at every N); it is drawn dashed on top"
             for i, a in enumerate(series) for b in list(series)[i + 1:] if series[a] == series[b] and any(series[a])]
    return fig, notes


def speed_figures(speed: list, impls: list, seq_lens: list, head_dims: list, dtype: str, min_points: int = 3):
    """TFLOP/s against N, one panel per (head dim, causal) and one figure per pass, with IQR error bars.

    With fewer than `min_points` sequence lengths a line would invent a trend between two points, so
    the numbers are printed as a table instead and no figure is drawn (returns [])."""
    index = {}
    for r in speed:  # the first row of each (impl, head dim, causal, N, pass), looked up in one step
        index.setdefault((r["impl"], r["head_dim"], r["causal"], r["n"], r["pass"]), r)
    pick = lambda impl, d, c, p: [index.get((impl, d, c, n, p)) for n in seq_lens]  # noqa: E731
    if len(seq_lens) < min_points:
        print(f"only {len(seq_lens)} sequence lengths: a table, not a curve (TFLOP/s, median, IQR in brackets)")
        rows = [[p, d, c, impl] + [f"{r['tflops']:.3g} [{r['tflops_lo']:.3g}-{r['tflops_hi']:.3g}]" if r and r["tflops"]
                                   else "-" for r in pick(impl, d, c, p)]
                for p in ("fwd", "fwd+bwd") for d in head_dims for c in (False, True) for impl in impls]
        print(table(["pass", "d", "causal", "impl", *[f"N={n}" for n in seq_lens]], rows))
        return []
    figs = []
    for p in ("fwd", "fwd+bwd"):
        fig, axes = plt.subplots(len(head_dims), 2, figsize=(12, 3.6 * len(head_dims)), squeeze=False)
        for i, d in enumerate(head_dims):
            for j, c in enumerate((False, True)):
                ax = axes[i][j]
                for impl, style in zip(impls, STYLES * 3):
                    pts = [(n, r) for n, r in zip(seq_lens, pick(impl, d, c, p)) if r and r["tflops"]]
                    if pts:
                        ns, rs = zip(*pts)
                        ys = [r["tflops"] for r in rs]
                        err = [[max(0.0, y - r["tflops_lo"]) for y, r in zip(ys, rs)], [max(0.0, r["tflops_hi"] - y) for y, r in zip(ys, rs)]]
                        ax.errorbar(ns, ys, yerr=err, capsize=3, label=impl, **style)
                ax.set_xscale("log", base=2)
                ax.set(xlabel="sequence length N", ylabel="TFLOP/s (median, IQR bars)", ylim=(0, None),
                       title=f"{p}, d={d}, {'causal' if c else 'not causal'}, {dtype}")
                ax.legend(fontsize=7)
        fig.tight_layout()
        figs.append(fig)
    return figs


