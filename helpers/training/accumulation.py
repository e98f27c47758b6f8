"""Gradient accumulation: k micro-batches, one optimizer step, the same gradient as one big batch.

The gradient of a mean loss over a batch is the mean of the per-token gradients. Splitting the
batch into micro-batches and calling backward on each adds their gradients into `.grad`, so each
micro-batch's loss must be weighted by its share of the batch's tokens:

* "mean"   : loss_i / k, the usual recipe. Exact only when every micro-batch has the same number
             of tokens that count (targets != ignore_index); otherwise it averages the averages.
* "tokens" : loss_i * n_i / N, with n_i the counted tokens of micro-batch i and N = sum n_i. This
             is the batch's global mean whatever the padding, because loss_i * n_i is the
             micro-batch's summed loss.

A micro-batch with no counted token has a mean loss of 0/0 (NaN): both weightings give it weight 0
and skip its backward, and "mean" divides by the number of micro-batches that have a counted token.

Under data parallelism (DDP) every backward all-reduces the gradients across ranks unless the
micro-batches before the last run inside `model.no_sync()`, which PyTorch documents as "Context
manager to disable gradient synchronizations across DDP processes" (DistributedDataParallel docs).

Dropout would draw different masks for different splits; the course presets have dropout 0.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import torch

from helpers.show import plots
from helpers.measure import profiling
from helpers.measure.bench import benchmark, benchmark_interleaved, peak_cuda_memory, release_memory, saved_tensor_bytes

IGNORE_INDEX = -1  # the course GPT's cross_entropy(ignore_index=-1): padded targets count for nothing
WEIGHTINGS = ("mean", "tokens")
MicroBatch = tuple[torch.Tensor, torch.Tensor]


def split_batch(x: torch.Tensor, y: torch.Tensor, accum_steps: int) -> list[MicroBatch]:
    """Cut a (B, T) batch of inputs and targets into `accum_steps` equal micro-batches along B."""
    if accum_steps < 1 or x.size(0) % accum_steps:
        raise ValueError(f"accum_steps={accum_steps} must be >= 1 and divide the batch size {x.size(0)}")
    return list(zip(x.chunk(accum_steps), y.chunk(accum_steps)))


def counted_tokens(targets: torch.Tensor, ignore_index: int = IGNORE_INDEX) -> int:
    """Targets that enter the loss (not equal to ignore_index)."""
    return int((targets != ignore_index).sum())


def loss_weights(micro_batches: Sequence[MicroBatch], weighting: str = "mean",
                 ignore_index: int = IGNORE_INDEX) -> list[float]:
    """The factor each micro-batch's mean loss is multiplied by before its backward.

    "mean": 1/k' for each of the k' micro-batches with a counted token; "tokens": n_i / N. A
    micro-batch without a counted token gets 0 in both (its mean loss is 0/0). Raises ValueError
    for an unknown weighting or when no target of any micro-batch counts.
    """
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting={weighting!r} is not allowed; choose one of {WEIGHTINGS}")
    counts = [counted_tokens(y, ignore_index) for _, y in micro_batches]
    total = sum(counts)
    if total == 0:
        raise ValueError("no micro-batch has a target that counts: every target is ignore_index")
    if weighting == "mean":
        k = sum(n > 0 for n in counts)
        return [1.0 / k if n else 0.0 for n in counts]
    return [n / total for n in counts]


def accumulate_gradients(model: torch.nn.Module, micro_batches: Sequence[MicroBatch], *,
                         weighting: str = "mean", autocast_dtype: torch.dtype | None = None) -> float:
    """Backward through every micro-batch with its loss weighted; gradients add up in `.grad`.

    Returns the weighted loss (what the accumulated gradient is the gradient of). Micro-batches
    with no counted token are skipped: their mean loss is 0/0 (see `loss_weights`).
    """
    total = torch.zeros(())
    for (x, y), w in zip(micro_batches, loss_weights(micro_batches, weighting)):
        if w == 0.0:
            continue
        with torch.autocast(device_type=x.device.type, dtype=autocast_dtype or torch.bfloat16,
                            enabled=autocast_dtype is not None):
            _, loss = model(x, y)
        (loss * w).backward()
        total = total.to(loss.device) + loss.detach().float() * w  # no host sync per micro-batch
    return float(total)


def gradients(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A detached copy of every parameter's gradient, by name (zeros where there is none)."""
    return {n: (p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p))
            for n, p in model.named_parameters()}


def batch_gradients(model: torch.nn.Module, micro_batches: Sequence[MicroBatch], *,
                    weighting: str | None = None) -> tuple[float, dict[str, torch.Tensor]]:
    """Zero the gradients, then (loss, gradients) of one pass: the concatenated batch when weighting
    is None (the reference), else the micro-batches accumulated with that weighting."""
    model.zero_grad(set_to_none=True)
    if weighting is None:
        x = torch.cat([mb[0] for mb in micro_batches])  # (sum b_i, T)
        y = torch.cat([mb[1] for mb in micro_batches])  # (sum b_i, T)
        _, loss = model(x, y)
        loss.backward()
        value = loss.item()
    else:
        value = accumulate_gradients(model, micro_batches, weighting=weighting)
    grads = gradients(model)
    model.zero_grad(set_to_none=True)
    return value, grads


def max_gradient_error(grads: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> float:
    """Largest |g - g_ref| over all parameters, relative to the largest |g_ref| of that parameter."""
    return max(((grads[n] - r).abs().max() / r.abs().max().clamp_min(1e-30)).item() for n, r in reference.items())


def _flat_pair(grads: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Both gradients as float64 vectors, parameters in the reference's order; ValueError if the names differ."""
    if set(grads) != set(reference):
        raise ValueError(f"the gradients name different parameters: {sorted(set(grads) ^ set(reference))}")
    return tuple(torch.cat([g[n].detach().reshape(-1).double() for n in reference]) for g in (grads, reference))


def gradient_error(grads: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> float:
    """Norm-relative error ||g - g_ref|| / ||g_ref||, every parameter's gradient as one vector (float64).

    0 for identical gradients; 1 for a zero gradient or for g = 2 g_ref. Raises ValueError when the
    names differ or the reference is all zeros.
    """
    g, r = _flat_pair(grads, reference)
    norm = r.norm()
    if norm == 0:
        raise ValueError("the reference gradient is all zeros: a relative error is undefined")
    return float((g - r).norm() / norm)


def gradient_cosine(grads: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> float:
    """Cosine similarity of the two gradients as single vectors: 1 = same direction (any length)."""
    g, r = _flat_pair(grads, reference)
    return float(torch.nn.functional.cosine_similarity(g, r, dim=0))


def pad_to_lengths(y: torch.Tensor, lengths: torch.Tensor | Sequence[int],
                   ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """A copy of targets y (B, T) with every position t >= lengths[b] set to ignore_index (padding).

    Raises ValueError unless there is one length per row, each in 0..T.
    """
    lengths = torch.as_tensor(lengths, device=y.device)
    if lengths.shape != (y.size(0),) or bool((lengths < 0).any()) or bool((lengths > y.size(1)).any()):
        raise ValueError(f"lengths {lengths.tolist()} must hold one value in 0..{y.size(1)} per row of y {tuple(y.shape)}")
    out = y.clone()
    out[torch.arange(y.size(1), device=y.device)[None, :] >= lengths[:, None]] = ignore_index  # (B, T) mask
    return out


# ---------------------------------------------------------------- effective batch

def effective_batch(micro_batch: int, accum_steps: int, dp_ranks: int = 1, seq_len: int | None = None) -> dict:
    """Sequences (and tokens, given seq_len) per optimizer step: micro-batch x accumulation x ranks."""
    for name, v in (("micro_batch", micro_batch), ("accum_steps", accum_steps), ("dp_ranks", dp_ranks)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}={v!r} must be a positive int")
    sequences = micro_batch * accum_steps * dp_ranks
    out = {"micro_batch": micro_batch, "accum_steps": accum_steps, "dp_ranks": dp_ranks, "sequences": sequences,
           "per_rank_sequences": micro_batch * accum_steps}
    if seq_len is not None:
        out["tokens"] = sequences * seq_len
    return out


def accum_steps_for(target_sequences: int, micro_batch: int, dp_ranks: int = 1) -> int:
    """Accumulation steps that reach exactly `target_sequences` per optimizer step."""
    per_pass = micro_batch * dp_ranks
    if target_sequences % per_pass:
        raise ValueError(f"target_sequences={target_sequences} is not a multiple of micro_batch x dp_ranks = {per_pass}")
    return target_sequences // per_pass


# ---------------------------------------------------------------- measuring it

def accumulation_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                      micro_batches: Sequence[MicroBatch],
                      autocast_dtype: torch.dtype | None = None) -> Callable[[], None]:
    """One optimizer step over the micro-batches (equal-sized, so weighting 'mean'), then zero_grad."""
    def step() -> None:
        accumulate_gradients(model, micro_batches, weighting="mean", autocast_dtype=autocast_dtype)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step


def _prepare(model, optimizer, micro_batch, accum_steps, seq_len, device, autocast_dtype, seed):
    g = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    mbs = [(torch.randint(0, vocab, (micro_batch, seq_len), generator=g).to(device),
            torch.randint(0, vocab, (micro_batch, seq_len), generator=g).to(device)) for _ in range(accum_steps)]
    return accumulation_step(model, optimizer, mbs, autocast_dtype), mbs


def _row(model, step, mbs, timing, seq_len, device, autocast_dtype, flops_per_token) -> dict:
    """Throughput from the timed samples, then the memory of one step and of one micro-batch's forward."""
    med = timing.median
    peak = peak_cuda_memory(step) if device == "cuda" else None

    def one_forward():
        with torch.autocast(device_type=device, dtype=autocast_dtype or torch.bfloat16,
                            enabled=autocast_dtype is not None):
            return model(*mbs[0])[1]
    saved = saved_tensor_bytes(one_forward, ignore=list(model.parameters()))
    micro_batch, accum_steps = mbs[0][0].size(0), len(mbs)
    tokens = micro_batch * accum_steps * seq_len
    out = {"micro_batch": micro_batch, "accum_steps": accum_steps, "seconds": med, "spread": timing.spread,
           "seconds_q25": timing.q25, "seconds_q75": timing.q75, "tokens_per_s": tokens / med,
           "tokens_per_s_q25": tokens / timing.q75, "tokens_per_s_q75": tokens / timing.q25,  # slow step = low rate
           "peak_bytes": peak, "saved_bytes": saved}
    if flops_per_token is not None:
        out["tflops"] = flops_per_token * tokens / med / 1e12
    return out


def measure_accumulation(model: torch.nn.Module, optimizer: torch.optim.Optimizer, micro_batch: int,
                         accum_steps: int, seq_len: int, *, device: str = "cpu",
                         autocast_dtype: torch.dtype | None = None, flops_per_token: float | None = None,
                         reps: int = 3, warmup: int = 1, seed: int = 0) -> dict:
    """Time optimizer steps of micro_batch x accum_steps random sequences; tokens/s and memory.

    Memory is the CUDA peak of one step above what was allocated before it (None on a CPU) and,
    on every device, the bytes one micro-batch's forward saves for backward (parameters left out).
    """
    step, mbs = _prepare(model, optimizer, micro_batch, accum_steps, seq_len, device, autocast_dtype, seed)
    t = benchmark(step, warmup=warmup, reps=reps, device=device)
    return _row(model, step, mbs, t, seq_len, device, autocast_dtype, flops_per_token)


def sweep_micro_batches(model: torch.nn.Module, optimizer: torch.optim.Optimizer, micro_batches: Sequence[int],
                        effective_batch: int, seq_len: int, *, device: str = "cpu",
                        autocast_dtype: torch.dtype | None = None, flops_per_token: float | None = None,
                        reps: int = 3, warmup: int = 1, seed: int = 0) -> list[dict]:
    """`measure_accumulation` for each micro-batch size b at k = effective_batch / b, timed interleaved.

    One shared-timer call per (repetition, b), cycling through the sizes, so a burst of other work
    on the machine slows every size alike instead of one of them. Each size first runs one step
    alone: a size that runs out of GPU memory is left out of the rows (so compare the rows'
    micro_batch values with the sizes asked for).
    """
    for b in micro_batches:
        if effective_batch % b:
            raise ValueError(f"micro-batch {b} does not divide effective_batch={effective_batch}")
    runs = []
    for b in micro_batches:
        step, mbs = _prepare(model, optimizer, b, effective_batch // b, seq_len, device, autocast_dtype, seed)
        try:
            step()
            fits = True
        except torch.cuda.OutOfMemoryError:
            fits = False
        if fits:
            runs.append((step, mbs))
        else:  # after the except block, so the failed step's tensors are gone
            optimizer.zero_grad(set_to_none=True)
            release_memory()
    timings = benchmark_interleaved({str(i): step for i, (step, _) in enumerate(runs)}, reps=reps, warmup=warmup,
                                    device=device)
    return [_row(model, step, mbs, timings[str(i)], seq_len, device, autocast_dtype, flops_per_token)
            for i, (step, mbs) in enumerate(runs)]


def _overlap(a: dict, b: dict) -> bool:
    """True when the IQRs of tokens/s of two rows overlap (their difference is within this run's noise)."""
    return a["tokens_per_s_q25"] <= b["tokens_per_s_q75"] and b["tokens_per_s_q25"] <= a["tokens_per_s_q75"]


def sweep_summary(rows: Sequence[dict], effective_batch: int) -> tuple[dict, list[str]]:
    """The sweep's verdict from its own numbers: (numbers to record, sentences to print).

    rows: `sweep_micro_batches` rows (in any order), each with "of_ceiling" (achieved
    over the measured matmul ceiling). Differences whose IQRs overlap are called noise, not a trend.
    Raises ValueError for no rows.
    """
    if not rows:
        raise ValueError("no rows: every micro-batch size ran out of memory")
    rows = sorted(rows, key=lambda r: r["micro_batch"])
    best = max(rows, key=lambda r: r["tokens_per_s"])
    first, last = rows[0], rows[-1]
    enough = next(r for r in rows if r["tokens_per_s"] >= 0.9 * best["tokens_per_s"])
    mem_first, label = memory_of(first)
    mem_ratio, b_ratio = memory_of(last)[0] / mem_first, last["micro_batch"] / first["micro_batch"]
    out = {"best_micro_batch": best["micro_batch"], "best_tokens_per_s": best["tokens_per_s"],
           "first_fraction_of_best": first["tokens_per_s"] / best["tokens_per_s"],
           "first_vs_best_within_noise": _overlap(first, best), "smallest_b_within_10pct": enough["micro_batch"],
           "memory_ratio_last_first": mem_ratio, "micro_batch_ratio_last_first": b_ratio}
    lines = [f"b={first['micro_batch']} (k={first['accum_steps']}): {first['tokens_per_s']:.4g} tokens/s, "
             f"{out['first_fraction_of_best']:.0%} of the best ({best['tokens_per_s']:.4g} tokens/s at "
             f"b={best['micro_batch']}); {first['of_ceiling']:.1%} vs {best['of_ceiling']:.1%} of the ceiling"]
    if len(rows) == 1:
        lines.append("only one micro-batch size was measured, so there is nothing to compare it with")
    elif best is first:
        lines.append("the smallest micro-batch was the fastest: splitting cost nothing measurable in this run")
    elif out["first_vs_best_within_noise"]:
        lines.append(f"their IQRs overlap, so this run cannot tell b={first['micro_batch']} from "
                     f"b={best['micro_batch']}: the difference is within the timing noise")
    else:
        lines.append(f"their IQRs do not overlap: b={first['micro_batch']} is slower beyond this run's noise")
    lines.append(f"the smallest micro-batch within 10% of the best median: b={enough['micro_batch']}")
    if abs(mem_ratio / b_ratio - 1) < 0.1:
        shape = "in proportion to b"
    elif mem_ratio < b_ratio:
        shape = f"less than in proportion to b (x{b_ratio:g}): a part of it does not depend on b"
    else:
        shape = f"more than in proportion to b (x{b_ratio:g})"
    lines.append(f"memory from b={first['micro_batch']} to b={last['micro_batch']}: x{mem_ratio:.1f}, {shape} "
                 f"({label.split(' (')[0]}), for the same {effective_batch}-sequence update")
    above = [r["micro_batch"] for r in rows if r.get("of_ceiling", 0) > 1]
    if above:
        lines.append(f"b={above} ran above 100% of the 'ceiling': that ceiling was under-measured (too few sizes "
                     f"or repetitions, or a busier machine when it was measured), not beaten")
    return out, lines


def profile_splits(model: torch.nn.Module, optimizer: torch.optim.Optimizer, splits: Sequence[tuple[int, int]],
                   seq_len: int, *, device: str = "cpu", autocast_dtype: torch.dtype | None = None,
                   seed: int = 0, warmup: int = 1) -> list[dict]:
    """Profile one optimizer step for each (micro_batch, accum_steps); where its op self time goes.

    `warmup` unprofiled steps come first (0 when these shapes already ran). Each row: micro_batch,
    accum_steps, the Profile of its top 8 ops (`.table()`, trace saved for
    Perfetto), total_ms (self time of every op in the step), matmul_ms, matmul_calls and
    matmul_share (the matrix multiplies among all ops, see `profiling.is_matmul`; attention kernels such as SDPA
    are not counted as matmuls). Raises ValueError for no splits.
    """
    if not splits:
        raise ValueError("splits is empty: give at least one (micro_batch, accum_steps)")
    rows = []
    for micro_batch, accum_steps in splits:
        step, _ = _prepare(model, optimizer, micro_batch, accum_steps, seq_len, device, autocast_dtype, seed)
        prof = profiling.profile(step, steps=1, warmup=warmup, top=1000, name=f"accumulation_b{micro_batch}_k{accum_steps}")
        mm = [r for r in prof.rows if profiling.is_matmul(r[0])]
        rows.append({"micro_batch": micro_batch, "accum_steps": accum_steps, "device": prof.device,
                     "total_ms": prof.total_ms,
                     "matmul_ms": sum(r[1] for r in mm), "matmul_calls": sum(r[2] for r in mm),
                     "matmul_share": sum(r[3] for r in mm),
                     "profile": dataclasses.replace(prof, rows=prof.rows[:8])})
    return rows


def split_profile_lines(rows: Sequence[dict]) -> list[str]:
    """Sentences comparing the first and last profiled split, generated from their numbers."""
    small, big = rows[0], rows[-1]
    what = "GPU kernel time" if small.get("device") == "cuda" else "op self time"
    lines = [f"b={r['micro_batch']} (k={r['accum_steps']}): {r['matmul_calls']:.0f} matmul calls per step, "
             f"{r['matmul_ms']:.1f} ms in them = {r['matmul_share']:.0%} of the {r['total_ms']:.1f} ms "
             f"of {what}" for r in ((small, big) if len(rows) > 1 else (small,))]
    if len(rows) > 1 and big["matmul_calls"] > 0:
        calls = small["matmul_calls"] / big["matmul_calls"]
        mm, rest = small["matmul_ms"] / big["matmul_ms"], \
            (small["total_ms"] - small["matmul_ms"]) / max(big["total_ms"] - big["matmul_ms"], 1e-9)
        lines.append(f"the same FLOPs in x{calls:.1f} as many matmul calls: matmul time x{mm:.2f}, "
                     f"the other ops' time x{rest:.2f} at b={small['micro_batch']} against b={big['micro_batch']}")
        if max(mm, rest) < 1.1:
            lines.append("neither grew by 10%: in this profile the small micro-batch paid no visible price")
        else:
            extra_mm = small["matmul_ms"] - big["matmul_ms"]
            extra_rest = (small["total_ms"] - small["matmul_ms"]) - (big["total_ms"] - big["matmul_ms"])
            where = "the matmuls themselves (small matmuls run further below the ceiling)" if extra_mm >= extra_rest else \
                "the ops around the matmuls (per-call overheads, elementwise and normalisation ops)"
            lines.append(f"most of the extra time is in {where}; one profiled step each, so read it as a sketch")
    return lines


def memory_of(row: dict) -> tuple[float, str]:
    """The memory figure a row reports, in MiB, and what it is."""
    if row.get("peak_bytes") is not None:
        return row["peak_bytes"] / 2**20, "peak CUDA memory of a step (MiB)"
    return row["saved_bytes"] / 2**20, "activations saved per micro-batch (MiB)"


def draw_sweep(rows: Sequence[dict], ax_t, ax_m, label: str = "sweep") -> None:
    """Tokens/s (median, bars from the first to the third quartile) and memory against micro-batch size.

    Tokens/s on a log2 x-axis (the sizes double); memory on linear axes from 0, where memory that
    grows in proportion to b is a straight line through the origin.
    """
    rows = sorted(rows, key=lambda r: r["micro_batch"])
    xs = [r["micro_batch"] for r in rows]
    med = [r["tokens_per_s"] for r in rows]
    low = [m - r.get("tokens_per_s_q25", m) for m, r in zip(med, rows)]
    high = [r.get("tokens_per_s_q75", m) - m for m, r in zip(med, rows)]
    ax_t.errorbar(xs, med, yerr=[low, high], marker="o", capsize=3, color=plots.COLORS[0],
                  label=f"{label} (median, IQR bars)")
    ax_t.set_xscale("log", base=2)
    ax_t.set_ylim(bottom=0)
    ax_m.plot(xs, [memory_of(r)[0] for r in rows], marker="o", color=plots.COLORS[0], label=label)
    ax_m.set_xlim(0, max(xs) * 1.08)
    ax_m.set_ylim(bottom=0)
    for ax, ylabel in ((ax_t, "tokens/s"), (ax_m, memory_of(rows[0])[1])):
        ax.set_xlabel("micro-batch b (sequences)")
        ax.set_ylabel(ylabel)


def plot_sweep(rows: Sequence[dict], title: str):
    """Notebook 05's figure of `sweep_micro_batches` rows: tokens/s with IQR bars, and memory (see draw_sweep)."""
    if not rows:
        raise ValueError("no rows to plot: every micro-batch size ran out of memory")
    fig, (ax_t, ax_m) = plots.figure(2, figsize=(10, 4))
    draw_sweep(rows, ax_t, ax_m)
    ax_t.legend()
    ax_t.set_title("throughput")
    ax_m.set_title("memory")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def accumulation_panel(micro_batch: int, accum_steps: int, *, model: torch.nn.Module,
                       optimizer: torch.optim.Optimizer, seq_len: int, device: str = "cpu",
                       autocast_dtype: torch.dtype | None = None, background: Sequence[dict] = (),
                       reps: int = 3):
    """Notebook 05: measure one (micro-batch, accumulation steps) setting; tokens/s and memory beside the sweep."""

    row = measure_accumulation(model, optimizer, micro_batch, accum_steps, seq_len, device=device,
                               autocast_dtype=autocast_dtype, reps=reps, warmup=1)
    mem, mem_label = memory_of(row)
    eff = effective_batch(micro_batch, accum_steps, seq_len=seq_len)
    print(f"micro-batch {micro_batch} x {accum_steps} steps = {eff['sequences']} sequences ({eff['tokens']} tokens) "
          f"per optimizer step: {row['tokens_per_s']:.4g} tokens/s, {mem_label.split(' (')[0]} {mem:.4g} MiB")
    fig, (ax_t, ax_m) = plots.figure(2, figsize=(10, 4))
    if background:
        draw_sweep(background, ax_t, ax_m)
    for ax, here, label in ((ax_t, row["tokens_per_s"], "tokens/s"), (ax_m, mem, mem_label)):
        ax.scatter([micro_batch], [here], s=90, marker="*", color=plots.COLORS[1], zorder=3,
                   label=f"b={micro_batch}, k={accum_steps}")
        ax.set_xlabel("micro-batch b (sequences)")
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
        ax.legend()
    if not background:
        ax_m.set_xlim(0, micro_batch * 1.1)
    else:
        ax_m.set_xlim(0, max(micro_batch, *[b["micro_batch"] for b in background]) * 1.08)
    fig.suptitle(f"micro-batch {micro_batch} x {accum_steps} accumulation steps, T={seq_len}")
    fig.tight_layout()
    return fig
