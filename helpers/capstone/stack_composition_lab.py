"""Notebook 14's "where each rung's step goes": each rung's training step split by the profiler into the parts a
technique acts on (matmuls, attention, the optimizer, casts, the rest), its figure, and the sentence that says
why a technique bought more or less in the stack than alone from the share of the step it acts on; and "do the
gains multiply?": each gain alone beside its gain in the stack (`multiply_rows`), their product against the
stack's measured gain (`multiply_sentence`); and the combination guide (`GUIDE`, `guide_rows`): fit memory, reach
the batch, then raise throughput, each step read off its measured rung."""
from __future__ import annotations

import math

import torch

from helpers.capstone import stack
from helpers.capstone.stack_lab import step_ratio
from helpers.gpt.model import GPTConfig
from helpers.measure import bench, profiling, protocol
from helpers.show import plots

PARTS = ("matmul", "attention", "optimizer", "casts", "rest")
# the part of the step each technique acts on (checkpointing and the data path act on the micro-steps and on the
# host's hand-over, which a profile shows as "rest")
ACTS_ON = {"tf32": "matmul", "bf16": "matmul", "sdpa": "attention", "fused_adamw": "optimizer", "compile": "rest",
           "fp8": "matmul", "data_path": "rest", "checkpoint": "rest"}
PART_WORDS = {"matmul": "the linears' matmuls", "attention": "attention", "optimizer": "the optimizer step",
              "casts": "dtype casts", "rest": "the rest of the step (elementwise work, launches, host work)"}
_ATTENTION_WORDS = ("scaled_dot_product", "ScaledDotProduct", "softmax", "Softmax", "flash", "attention")


def step_part(names: list[str]) -> str:
    """The part of a training step an op belongs to, from its name and its callers' (innermost first):
    "optimizer" inside AdamW's step or zero_grad; "attention" for SDPA and flash kernels, the softmax, the causal
    mask and the batched matmuls (aten::bmm: only attention multiplies 4-D tensors in the course GPT); "matmul"
    for the linears' GEMMs; "casts" for dtype conversions (aten::copy_, aten::_to_copy); "rest" for everything
    else (elementwise ops, normalisation, launches, compiled fused kernels)."""
    leaf, joined = names[0], " ".join(names)
    if "Optimizer." in joined:
        return "optimizer"
    if any(w in joined for w in _ATTENTION_WORDS) or leaf in ("aten::bmm", "aten::baddbmm", "aten::masked_fill_",
                                                                "aten::masked_fill"):
        return "attention"
    if profiling.is_matmul(leaf):
        return "matmul"
    if leaf in ("aten::copy_", "aten::_to_copy", "aten::to"):
        return "casts"
    return "rest"


def composition(cfg: GPTConfig, rungs: list[stack.Rung], batch: tuple[torch.Tensor, torch.Tensor], device: str, *,
                micro_batches: int, lr: float, seed: int = 0, steps: int = 2) -> dict[str, profiling.Shares]:
    """Each rung's step split into PARTS by the profiler (`profiling.category_shares`): the rung built afresh from
    the seeded weights, one warm-up step, then `steps` profiled steps on `batch` (x, y), on `device`."""
    out = {}
    x, y = (t.to(device) for t in batch)
    with torch._dynamo.config.patch(recompile_limit=stack.RECOMPILE_LIMIT), bench.cpu_threads(device):
        for rung in rungs:
            built = stack.build(cfg, rung, device, micro_batches=micro_batches, lr=lr, seed=seed)
            out[rung.name] = profiling.category_shares(lambda b=built: b.step(x, y), step_part, steps=steps)
    return out


def composition_figure(table: list[dict], comp: dict[str, profiling.Shares], ax=None,
                       title: str = "where each rung's step goes"):
    """Stacked bars per rung: the profiled self time of one step (ms) split into PARTS."""
    fig, ax = plots.axes(ax, title)
    names = [r["rung"] for r in table]
    bottom = [0.0] * len(names)
    for j, part in enumerate(PARTS):
        ms = [comp[r["rung"]].ms_per_step * comp[r["rung"]].shares.get(part, 0.0) for r in table]
        ax.bar(names, ms, bottom=bottom, label=part, color=plots.COLORS[j % len(plots.COLORS)])
        bottom = [b + m for b, m in zip(bottom, ms)]
    ax.set(ylabel="profiled self time per step (ms)", xlabel="rung (the profiler adds its own overhead)")
    ax.tick_params(axis="x", rotation=30)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    return fig


def why_sentence(technique: str, before: str, comp: dict[str, profiling.Shares], alone, in_stack) -> str:
    """Why a technique's gain alone and in the stack differ on this run, from what it acts on (ACTS_ON): that
    part's share of the baseline's step against its share of the step of the rung it joined (`before`),
    with the two gains (`protocol.Ratio`s) ranked only beyond both spreads."""
    part = ACTS_ON[technique]
    a, b = comp["baseline"].shares.get(part, 0.0), comp[before].shares.get(part, 0.0)
    what = ("the number of micro-steps (and adds one forward per block), which a profile shows in the rest of the step"
            if technique == "checkpoint" else PART_WORDS[part])
    where = (f"{technique} acts on {what}: {a:.0%} of the baseline's step, {b:.0%} of the step of the rung it joined "
             f"({before})")
    if alone.lo > in_stack.hi:
        why = ("so it had less to act on in the stack" if b < a else
               "a share as large or larger, so what changed is how that part runs there (its dtype, its kernel, "
               "or what is fused into it), not how much of it there is")
        return f"{where}; it bought less in the stack ({in_stack.value:.2f}x against {alone.value:.2f}x alone), {why}."
    if in_stack.lo > alone.hi:
        why = ("so it had more to act on in the stack" if b > a else
               "a share no larger, so the rungs before it changed how that part runs, in its favour")
        return f"{where}; it bought more in the stack ({in_stack.value:.2f}x against {alone.value:.2f}x alone), {why}."
    return f"{where}; its gains alone and in the stack lie within each other's spread, so this run shows no interaction."


def multiply_rows(rungs: list[stack.Rung], table: list[dict], alone: dict[str, dict],
                  comp: dict[str, profiling.Shares]) -> list[dict]:
    """Per technique: its gain alone on the baseline (from `run_ladder` over the baseline and the rungs
    "<technique> alone") beside its gain where it sits in the stack (`table`'s rung-over-rung gain), and the
    sentence (`why_sentence`, from `comp`, the `composition` of the ladder's rungs) that says why they differ,
    ranked only beyond both spreads."""
    base = alone[rungs[0].name]
    out = []
    for i, (rung, row) in enumerate(zip(rungs[1:], table[1:])):
        if row["gain"] is None:  # an emulated format's rung: its time measures the emulation
            continue
        a, b = step_ratio(base, alone[f"{rung.name} alone"]), row["gain"]
        out.append({"technique": rung.name, "alone": a, "in_stack": b,
                    "sentence": why_sentence(rung.name, rungs[i].name, comp, a, b)})
    return out


def multiply_sentence(mult: list[dict], table: list[dict]) -> str:
    """The product of the gains alone (with the product of their IQR bounds) against the stack's measured
    gain over the baseline; the two are told apart only when those ranges do not overlap."""
    prod = math.prod(m["alone"].value for m in mult)
    lo, hi = math.prod(m["alone"].lo for m in mult), math.prod(m["alone"].hi for m in mult)
    cum = table[-1]["cumulative"]
    if hi > 10 * lo:
        return (f"The gains alone multiply to {prod:.2f}x, but their spreads multiply to {lo:.2f}-{hi:.2f}x: too wide on "
                f"this run to set beside the whole stack's {cum} over the baseline.")
    if hi < cum.lo:
        how = "the stack gave more than the product: together the techniques did better than alone"
    elif lo > cum.hi:
        how = "the stack gave less than the product: the gains did not multiply"
    else:
        how = "the two ranges overlap, so this run cannot tell whether the gains multiplied"
    return (f"The gains alone multiply to {prod:.2f}x (IQR-bounded {lo:.2f}-{hi:.2f}x); the whole stack measured "
            f"{cum} over the baseline: {how}.")


def takeaways(rows: list[dict], mult: list[dict], loo: list[dict] | None, serving: list[dict], batching: dict,
              left_out: dict[str, str], device: str) -> list[str]:
    """Notebook 14's takeaway sentences, generated from its numbers: the whole training ladder over the baseline,
    the rungs faster or slower than the one before beyond the noise, the loss gaps, whether the gains multiplied
    (`multiply_sentence`), leave-one-out when it ran (`loo`), the fastest serving rung and those within its
    spread, continuous over static batching, and the techniques this device left out. `rows`: `stack_lab.rows`;
    `mult`: `multiply_rows`; `serving`: `serve_stack_lab.rows`; `batching`: `serve_stack_lab.batching`."""
    out = []
    best = max((r for r in rows if not r["emulated"]), key=lambda r: r["tokens_per_s"])
    best_sep = best["cumulative"].separated and best["cumulative"].value > 1
    out.append(f"The whole ladder on {device}: {rows[-1]['cumulative']} over the fp32 eager baseline "
               f"({rows[0]['tokens_per_s']:.0f} -> {rows[-1]['tokens_per_s']:.0f} tokens/s); "
               + ("no rung's median beat the baseline's." if best is rows[0] else
                  f"the highest median was {best['rung']}'s" + (
                      ", faster than the baseline beyond the spread." if best_sep else
                      ", within the baseline's spread, so this run ranks no rung above the baseline.")))
    ranked = [r for r in rows[1:] if r["gain"] is not None]  # an emulated format's rung is never ranked
    helped = [r["rung"] for r in ranked if r["gain"].separated and r["gain"].value > 1]
    hurt = [r["rung"] for r in ranked if r["gain"].separated and r["gain"].value < 1]
    rest = len(ranked) - len(helped) - len(hurt)
    out.append(f"Rungs that were faster than the one before beyond the noise: {', '.join(helped) or 'none'}; slower: "
               f"{', '.join(hurt) or 'none'}" + ("." if not rest else "; this run could not rank the other rung."
                                                  if rest == 1 else f"; this run could not rank the other {rest}."
                                                  if helped or hurt else "; this run could rank none of them."))
    out.append("Every rung's final loss stayed within its tolerance of the baseline's (largest gap "
               f"{max(abs(r['loss_gap']) for r in rows):.2%}).")
    out.append(multiply_sentence(mult, rows))
    if loo:
        kept = [r["technique"] for r in loo if r["cost"].separated and r["cost"].value > 1]
        out.append(f"Taken out of the whole stack, these slowed it beyond the noise: {', '.join(kept) or 'none'}.")
    sbest, *others = sorted(serving, key=lambda r: -r["tokens_per_s"])
    sgain = sbest["cumulative"]
    ties = [r["rung"] for r in others if not protocol.separated(sbest["timing"], r["timing"])]  # within its spread
    out.append(f"Serving at batch 1: the highest median was {sbest['rung']}'s, {sbest['ms_per_token']:.3g} ms/token, "
               f"{sgain} over the uncached fp32 baseline"
               + ("" if sgain.separated else " (within the baseline's spread)")
               + (f"; {', '.join(ties)} within its spread, so this run cannot rank them." if ties else
                  ", faster than every other rung beyond the spread."))
    out.append(f"Continuous batching served {batching['speedup']:.2f}x static batching's tokens/s on the same KV memory"
               + ("." if batching["separated"] else ", within the runs' spread."))
    if left_out:
        out.append(f"Not on this device's ladder: {', '.join(left_out)} (each said why above).")
    return out


# The combination guide, in the order the source texts give (the first source text, section 7.5, names it; the
# second's section 4 maps the toolkit): (step, technique, what it changes, the notebook that measured it alone).
GUIDE = (
    ("1. fit memory", "bf16", "activations in 2 bytes instead of 4, fp32 master weights kept", "03"),
    ("1. fit memory", "fp8", "the blocks' linears' operands in 1 byte", "07"),
    ("2. reach the batch", "checkpoint", "activations recomputed in backward, so the whole batch runs as one "
     "micro-batch instead of accumulating several", "04, 05"),
    ("3. raise throughput", "tf32", "fp32 matmuls on TF32 tensor cores", "01, 03"),
    ("3. raise throughput", "sdpa", "attention in one fused kernel, the scores never written out", "06"),
    ("3. raise throughput", "fused_adamw", "AdamW in one kernel", "03"),
    ("3. raise throughput", "compile", "each block compiled, elementwise work fused", "09"),
    ("3. raise throughput", "data_path", "batches from a loader worker, prefetched", "12"),
)


def guide_rows(rows: list[dict], left_out: dict[str, str]) -> list[dict]:
    """GUIDE's steps, each read off its rung of the measured training ladder (`stack_lab.rows`): the rung's gain
    over the rung before it with its spread ("faster"/"slower" only when the spread excludes 1, else "cannot
    tell"), its peak memory beside the rung before's where the device measured both, or "not run here" with
    `left_out`'s reason. Raises ValueError for a step with neither a rung nor a reason: the guide never gives a
    step this run did not measure."""
    at = {r["rung"]: i for i, r in enumerate(rows)}
    out = []
    for step, technique, changes, nb in GUIDE:
        if technique in at:
            row, before = rows[at[technique]], rows[at[technique] - 1]
            g = row["gain"]
            if g is None:
                says = f"not ranked here: {row['emulated'] or 'no gain over the rung before was measured'}"
            elif not g.separated:
                says = f"cannot tell: {g}, its spread takes in 1"
            else:
                says = f"{'faster' if g.value > 1 else 'slower'} than the rung before: {g}"
            if row["peak_bytes"] and before["peak_bytes"]:
                says += f"; peak memory {before['peak_bytes'] / 2**20:.0f} -> {row['peak_bytes'] / 2**20:.0f} MiB"
            elif step.startswith(("1.", "2.")):
                says += "; peak memory not measured on this device (the CUDA allocator's peak)"
        elif technique in left_out:
            says = f"not run here: {left_out[technique]}"
        else:
            raise ValueError(f"guide step {technique!r} has no measured rung and no reason it was left out")
        out.append({"step": step, "technique": technique, "changes": changes, "notebook": nb, "says": says,
                    "measured": technique in at})
    return out
