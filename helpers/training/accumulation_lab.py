"""Notebook 05's measurements, figures, panel and generated sentences.

* the parameters: `resolve_parameters` validates all of them at once and fills in the profile's defaults;
* timing optimizer steps of random micro-batches: `prepared_step`, `measure_accumulation` (one
  setting), `sweep_micro_batches` (micro-batch sizes at one effective batch, by the course's protocol);
* what the sweep says: `fastest`, `sweep_summary` (a size is recommended only when it is faster than every other
  beyond the noise, judged round by round where the sizes share their rounds; differences within it are noise),
  `memory_of`;
* the source text's claim on efficiency: `efficiency_claim`;
* figures: `draw_sweep`, `plot_sweep`, and the panel `accumulation_panel`;
* `takeaway_lines`: the notebook's closing bullets, from the numbers above.

The accumulation itself (loss weights, the step, effective batch arithmetic) is in `accumulation`; the profiler's
view of a small and a large split in `accumulation_profile_lab`.
"""
from __future__ import annotations

from typing import Sequence

import torch

from helpers.gpt import footprint
from helpers.gpt.model import PRESETS, GPTConfig
from helpers.measure import params, protocol
from helpers.measure.bench import benchmark
from helpers.measure.memory import peak_cuda_memory, release_memory, saved_tensor_bytes
from helpers.show import plots
from helpers.training.accumulation import accumulation_step, effective_batch


# ---------------------------------------------------------------- the parameters

def resolve_parameters(S: params.Setup, *, PRESET, SEQ_LEN, EFFECTIVE_BATCH, MICRO_BATCHES, CHECK_MICRO_BATCH,
                       CHECK_ACCUM_STEPS, REPS) -> dict:
    """Notebook 05's parameters, validated at once and with the profile's defaults filled in: {name: value}
    (MICRO_BATCHES sorted, duplicates dropped). Raises ValueError naming the first bad parameter: SEQ_LEN
    beyond the preset's seq_len, a micro-batch that does not divide EFFECTIVE_BATCH, CHECK_ACCUM_STEPS below 2."""
    R = S.resolve
    preset = R("PRESET", PRESET, smoke="tiny", full="gpt2", check=lambda n, v: params.choose(n, v, PRESETS))
    seq_len = R("SEQ_LEN", SEQ_LEN, smoke=64, full=1024, check=params.positive)
    if seq_len > PRESETS[preset]["seq_len"]:
        raise ValueError(f"SEQ_LEN={seq_len} must be at most {preset}'s seq_len={PRESETS[preset]['seq_len']}")
    effective = R("EFFECTIVE_BATCH", EFFECTIVE_BATCH, smoke=16, full=32, check=params.positive)
    micro = sorted(set(R("MICRO_BATCHES", MICRO_BATCHES, smoke=[1, 2, 4, 8, 16], full=[1, 2, 4, 8, 16, 32],
                         check=params.positives)))  # smallest first
    for b in micro:
        if effective % b:
            raise ValueError(f"MICRO_BATCHES={micro}: entry {b} must divide EFFECTIVE_BATCH={effective}")
    params.fits("MICRO_BATCHES", micro, footprint.training_floor_bytes(GPTConfig.preset(preset, seq_len=seq_len), micro[-1]),
                S.device, f"a training step of {preset} at micro-batch {micro[-1]}")
    check_micro = R("CHECK_MICRO_BATCH", CHECK_MICRO_BATCH, smoke=2, full=2, check=params.positive)
    check_steps = R("CHECK_ACCUM_STEPS", CHECK_ACCUM_STEPS, smoke=4, full=4, check=params.positive)
    if check_steps < 2:
        raise ValueError(f"CHECK_ACCUM_STEPS={check_steps} must be at least 2 (one micro-batch accumulates nothing)")
    return {"PRESET": preset, "SEQ_LEN": seq_len, "EFFECTIVE_BATCH": effective, "MICRO_BATCHES": micro,
            "CHECK_MICRO_BATCH": check_micro, "CHECK_ACCUM_STEPS": check_steps,
            "REPS": R("REPS", REPS, smoke=7, full=7, check=params.positive)}


# ---------------------------------------------------------------- timing optimizer steps

def prepared_step(model, optimizer, micro_batch, accum_steps, seq_len, device, autocast_dtype, seed):
    """(step, micro-batches): `accum_steps` micro-batches of random token ids, inputs and targets
    (micro_batch, seq_len) int64 on `device` drawn from a generator seeded with `seed`, and the
    `accumulation_step` closure over them (one optimizer step, then zero_grad)."""
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
           "peak_bytes": peak, "saved_bytes": saved, "seconds_samples": list(timing.samples)}
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
    step, mbs = prepared_step(model, optimizer, micro_batch, accum_steps, seq_len, device, autocast_dtype, seed)
    t = benchmark(step, warmup=warmup, reps=reps, device=device)
    return _row(model, step, mbs, t, seq_len, device, autocast_dtype, flops_per_token)


def sweep_micro_batches(model: torch.nn.Module, optimizer: torch.optim.Optimizer, micro_batches: Sequence[int],
                        effective_batch: int, seq_len: int, *, device: str = "cpu",
                        autocast_dtype: torch.dtype | None = None, flops_per_token: float | None = None,
                        reps: int = 3, max_warmup: int = 10, budget_s: float = 10.0, seed: int = 0,
                        timer: protocol.Timer | None = None) -> list[dict]:
    """`measure_accumulation` for each micro-batch size b at k = effective_batch / b, timed by the course's
    protocol (`protocol.compare`: warm-up until steady, at most `max_warmup` calls; interleaved rounds, `reps` at
    least and 3 x `reps` at most, more only while the sizes cannot be told apart and `budget_s` seconds last).

    Interleaving makes a burst of other work on the machine slow every size alike instead of one of them; on a
    CPU each step is read from the thread's own clock. Each size first runs one step alone: a size that runs out
    of GPU memory is left out of the rows (so compare the rows' micro_batch values with the sizes asked for).
    `timer` replaces the course's timer (a test plants step times with it).
    """
    for b in micro_batches:
        if effective_batch % b:
            raise ValueError(f"micro-batch {b} does not divide effective_batch={effective_batch}")
    runs = []
    for b in micro_batches:
        step, mbs = prepared_step(model, optimizer, b, effective_batch // b, seq_len, device, autocast_dtype, seed)
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
    c = protocol.compare({str(i): step for i, (step, _) in enumerate(runs)}, device=device, timer=timer,
                         min_reps=reps, max_reps=3 * reps, budget_s=budget_s, max_warmup=max(3, max_warmup))
    return [_row(model, step, mbs, c[str(i)], seq_len, device, autocast_dtype, flops_per_token) | {"rounds": c.rounds}
            for i, (step, mbs) in enumerate(runs)]


# ---------------------------------------------------------------- what the sweep says

def _shared_rounds(a: dict, b: dict) -> bool:
    """Whether rows a and b were timed in the same rounds (step-time samples of equal count), so that their times
    can be paired round by round."""
    sa, sb = a.get("seconds_samples"), b.get("seconds_samples")
    return bool(sa and sb and len(sa) == len(sb))


def _overlap(a: dict, b: dict) -> bool:
    """True when this run cannot tell the tokens/s of two rows apart. Rows timed in the same interleaved rounds
    (equal-length "seconds_samples", as `sweep_micro_batches` records them) are compared round by round: the
    quartiles of the per-round time ratio include 1 (`protocol.paired_samples_ratio`; each row's step handles the
    same tokens, so the time ratio is the tokens/s ratio inverted, and a round's load slows both alike). Otherwise
    their tokens/s IQRs overlap."""
    if _shared_rounds(a, b):
        return not protocol.paired_samples_ratio(a["seconds_samples"], b["seconds_samples"]).separated
    return a["tokens_per_s_q25"] <= b["tokens_per_s_q75"] and b["tokens_per_s_q25"] <= a["tokens_per_s_q75"]


def _noise_words(a: dict, b: dict) -> str:
    """How `_overlap` compared rows a and b, in words: a's step time over b's round by round (median and quartiles)
    where they share their rounds, else their tokens/s IQRs."""
    if _shared_rounds(a, b):
        r = protocol.paired_samples_ratio(a["seconds_samples"], b["seconds_samples"])
        return (f"b={a['micro_batch']}'s step took {r.value:.2f}x b={b['micro_batch']}'s round by round "
                f"(quartiles {r.lo:.2f}-{r.hi:.2f} over {len(a['seconds_samples'])} interleaved rounds)")
    return (f"b={a['micro_batch']}'s tokens/s IQR {a['tokens_per_s_q25']:.4g}-{a['tokens_per_s_q75']:.4g} against "
            f"b={b['micro_batch']}'s {b['tokens_per_s_q25']:.4g}-{b['tokens_per_s_q75']:.4g}")


def _faster(a: dict, b: dict) -> bool:
    """Whether row a was faster than row b beyond the noise: round by round, the lower quartile of b's step time
    over a's above 1, where they share their rounds; else a's tokens/s IQR wholly above b's."""
    if _shared_rounds(a, b):
        return protocol.paired_samples_ratio(b["seconds_samples"], a["seconds_samples"]).lo > 1
    return a["tokens_per_s_q25"] > b["tokens_per_s_q75"]


def _step_ratio(a: dict, b: dict) -> tuple[float, float, float]:
    """(value, lo, hi) of row a's step time over row b's: the paired rounds' median and quartiles where the rows share
    their rounds, else the ratio of medians bounded by the opposite quartiles of their tokens/s."""
    if _shared_rounds(a, b):
        r = protocol.paired_samples_ratio(a["seconds_samples"], b["seconds_samples"])
        return r.value, r.lo, r.hi
    return (b["tokens_per_s"] / a["tokens_per_s"], b["tokens_per_s_q25"] / a["tokens_per_s_q75"],
            b["tokens_per_s_q75"] / a["tokens_per_s_q25"])


def fastest(rows: Sequence[dict]) -> tuple[dict, list[dict]]:
    """The row with the highest median tokens/s and the other rows it was not faster than beyond the noise
    (`_faster`; empty when it beat every other size)."""
    top = max(rows, key=lambda r: r["tokens_per_s"])
    return top, [r for r in rows if r is not top and not _faster(top, r)]


def sweep_summary(rows: Sequence[dict], effective_batch: int) -> tuple[dict, list[str]]:
    """The sweep's verdict from its own numbers: (numbers to record, sentences to print).

    rows: `sweep_micro_batches` rows (in any order), each with "of_ceiling" (achieved over the measured matmul
    ceiling). A micro-batch is recommended only when it is faster than every other size beyond the noise
    ("recommended_micro_batch"; else None, and "tied_micro_batches" names the sizes that cannot be told from the
    fastest median); differences within the noise are called noise, not a trend. "step_first_over_last": the smallest
    micro-batch's step time over the largest's, (value, lo, hi), for the same update. Both are judged round by round
    where the rows share their rounds (`_faster`, `_overlap`). Raises ValueError for no rows.
    """
    if not rows:
        raise ValueError("no rows: every micro-batch size ran out of memory")
    rows = sorted(rows, key=lambda r: r["micro_batch"])
    best, tied = fastest(rows)
    first, last = rows[0], rows[-1]
    enough = next(r for r in rows if r["tokens_per_s_q75"] >= 0.9 * best["tokens_per_s"])
    mem_first, label = memory_of(first)
    mem_ratio, b_ratio = memory_of(last)[0] / mem_first, last["micro_batch"] / first["micro_batch"]
    tied_bs = sorted(r["micro_batch"] for r in [best, *tied]) if tied else []
    out = {"fastest_median_micro_batch": best["micro_batch"], "fastest_median_tokens_per_s": best["tokens_per_s"],
           "recommended_micro_batch": None if tied or len(rows) == 1 else best["micro_batch"],
           "tied_micro_batches": tied_bs, "first_fraction_of_best": first["tokens_per_s"] / best["tokens_per_s"],
           "first_vs_best_within_noise": _overlap(first, best), "smallest_b_within_10pct": enough["micro_batch"],
           "memory_ratio_last_first": mem_ratio, "micro_batch_ratio_last_first": b_ratio,
           "step_first_over_last": _step_ratio(first, last)}
    lines = [f"b={first['micro_batch']} (k={first['accum_steps']}): {first['tokens_per_s']:.4g} tokens/s, "
             f"{out['first_fraction_of_best']:.0%} of the fastest median ({best['tokens_per_s']:.4g} tokens/s at "
             f"b={best['micro_batch']}); {first['of_ceiling']:.1%} vs {best['of_ceiling']:.1%} of the ceiling"]
    if len(rows) == 1:
        lines.append("only one micro-batch size was measured, so there is nothing to compare it with")
    elif best is first:
        lines.append("the smallest micro-batch had the fastest median: splitting cost nothing measurable in this run")
    elif out["first_vs_best_within_noise"]:
        lines.append(f"this run cannot tell b={first['micro_batch']} from b={best['micro_batch']}: "
                     f"{_noise_words(first, best)}, within the timing noise")
    else:
        lines.append(f"b={first['micro_batch']} is slower beyond this run's noise: {_noise_words(first, best)}")
    if len(rows) > 1:
        runner_up = max((r for r in rows if r is not best), key=lambda r: r["tokens_per_s"])
        lines.append(f"recommended: b={best['micro_batch']}, the fastest, clear of every other size beyond the noise "
                     f"(the nearest: {_noise_words(runner_up, best)})"
                     if out["recommended_micro_batch"] is not None else
                     f"no micro-batch is recommended: this run cannot tell which is fastest, since "
                     f"b={', '.join(map(str, tied_bs))} are within the noise of each other ("
                     + "; ".join(_noise_words(r, best) for r in tied) + ")")
    lines.append(f"the smallest micro-batch whose IQR reaches within 10% of the fastest median: b={enough['micro_batch']}")
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


def efficiency_claim(rows: Sequence[dict]) -> dict:
    """`claims.verdict`'s keyword arguments for "gradient accumulation raises compute efficiency" (the second source
    text, section 4), read as: k accumulated micro-batches of b run at the efficiency of one batch of k·b. Measured
    as the tokens/s of the most-accumulated row (smallest b) over the least-accumulated one's (largest b), at the
    same effective batch: the median and quartiles of the per-round ratios where both rows hold the step times of
    the same interleaved rounds ("seconds_samples", as `sweep_micro_batches` records them; pairing cancels what a
    round's load does to both), else the ratio of medians bounded by the rows' opposite quartiles. Raises
    ValueError below two rows."""
    if len(rows) < 2:
        raise ValueError("the claim needs at least two micro-batch sizes")
    rows = sorted(rows, key=lambda r: r["micro_batch"])
    most, least = rows[0], rows[-1]
    ratio, lo, hi = _step_ratio(least, most)  # same tokens per step: that time ratio is most's tokens/s over least's
    how = (f"median of {len(most['seconds_samples'])} paired rounds" if _shared_rounds(most, least) else
           "ratio of medians, bounded by the opposite quartiles")
    curve = ", ".join(f"b={r['micro_batch']}: {r['tokens_per_s'] / least['tokens_per_s']:.2f}x" for r in rows)
    return dict(claim_id="accumulation-efficiency", notebook="05", claim="gradient accumulation raises compute "
                "efficiency when the batch cannot grow", source="the second source text, section 4", value=ratio,
                spread=(lo, hi), claimed=(1.0, None), unit="x",
                measured=f"tokens/s of b={most['micro_batch']} x k={most['accum_steps']} over b={least['micro_batch']} x "
                         f"k={least['accum_steps']}, same update: {ratio:.2f}x ({lo:.2f}-{hi:.2f}, {how}); medians of "
                         f"every size over the "
                         f"largest: {curve}",
                reason="" if hi >= 0.9 else "accumulation reaches the large batch's update, while each matmul still "
                       f"runs at the size of b={most['micro_batch']}, which sets the efficiency")


def memory_of(row: dict) -> tuple[float, str]:
    """The memory figure a row reports, in MiB, and what it is."""
    if row.get("peak_bytes") is not None:
        return row["peak_bytes"] / 2**20, "peak CUDA memory of a step (MiB)"
    return row["saved_bytes"] / 2**20, "activations saved per micro-batch (MiB)"


# ---------------------------------------------------------------- figures and the panel

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


def takeaway_lines(*, accum_steps: int, equal_error: float, counts: Sequence[int], wrong: float, wrong_cosine: float,
                   token_error: float, empty_error: float, summary: dict, sweep: Sequence[dict],
                   sweep_lines: Sequence[str], split_lines: Sequence[str]) -> list[str]:
    """Notebook 05's closing bullets, generated from its numbers: the equivalence check (`equal_error` with
    `accum_steps` equal micro-batches; with padding, `counts` counted tokens, 1/k's `wrong` error and
    `wrong_cosine`, the token-weighted `token_error` and `empty_error`), the sweep (its rows, `summary` and
    `sweep_lines` from `sweep_summary`) and the profiled splits (`split_lines`, as
    `accumulation_profile_lab.split_profile_lines` wrote them)."""
    out = [f"{accum_steps} micro-batches scaled by 1/k gave the one-batch gradient to a relative error of "
           f"{equal_error:.1e} (fp32 rounding) because each held the same number of counted tokens.",
           f"With padding (counted tokens {list(counts)}) the same 1/k scaling was off by {wrong:.1%} (cosine "
           f"{wrong_cosine:.4f}); weighting micro-batch i by n_i/N brought it to {token_error:.1e}, and to "
           f"{empty_error:.1e} with an all-padding micro-batch skipped.",
           f"Effective batch E = b x k x R. Memory followed b: x{summary['memory_ratio_last_first']:.1f} from "
           f"b={sweep[0]['micro_batch']} to b={sweep[-1]['micro_batch']} for the same update. Under DDP, without "
           f"no_sync() each of the k backwards all-reduces.",
           f"Throughput: {sweep_lines[0]}; {sweep_lines[1]}" + (f"; {sweep_lines[2]}." if len(sweep) > 1 else ".")]
    if len(split_lines) > 2:  # two splits compared
        out.append(f"Profile of one step each: {split_lines[2]}.")
    return out
