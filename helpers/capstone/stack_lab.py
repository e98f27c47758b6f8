"""Notebook 14's parameters and measurements: the training ladder run rung by rung, its table, sentences
and waterfall. The stack itself (rungs, what each builds) is `helpers.capstone.stack`.

Timing: every rung trains the same STEPS batches from the same weights, on one thread on a CPU (a small model's
ops are too small to share between two cores, and on a busy machine a descheduled thread stalls every op), each
step read from the thread's own CPU clock (`clock.Stopwatch`, the wall time kept beside it), which other work on
leaves out the time other work holds the core; on a GPU from the wall clock after a sync. With `interleave` the rungs step
round-robin (step i of every rung, then step i + 1), so a burst of other work on the machine slows
every rung alike; otherwise one rung after the other (a large model cannot hold every rung in memory).
The first `warmup` steps of each rung pay its one-time costs (allocation, compilation) and are left out
of its step time, which is the median and IQR of the rest (`bench.Timing`); whether those were steady
is said, not assumed.
"""
from __future__ import annotations

import math
import time
from typing import Callable

import torch

from helpers.capstone import serve_stack_lab, stack
from helpers.capstone.waterfall import waterfall  # noqa: F401 - the notebook draws it from here
from helpers.cost import flops
from helpers.gpt.model import PRESETS, GPTConfig
from helpers.measure import bench, clock as clocks, hardware, params, protocol
from helpers.measure.bench import Timing
from helpers.gpt import footprint

# a rung's final loss must lie this close (relative) to the baseline's: fp32 rungs reorder sums only;
# bf16 keeps 8 mantissa bits in the matmuls; fp8 3 (e4m3) in forward and 2 (e5m2) in gradients
TOLERANCE = {"fp32": 1e-3, "bf16": 2e-2, "fp8": 5e-2}
MAX_SPREAD = 0.5  # a rung whose IQR passes half its median (+-25%) has a fragile median, and says so


def resolve_parameters(S: params.Setup, *, MODEL, BATCH, SEQ_LEN, STEPS, WARMUP, MICRO_BATCHES, LR, COMPILE,
                       LEAVE_ONE_OUT, SERVE_MODEL, DRAFT_WIDTH, PROMPTS, PROMPT_LEN, NEW_TOKENS, GAMMA, REQUESTS,
                       EVAL_BATCHES) -> dict:
    """Notebook 14's parameters, validated at once with the profile's defaults; plus "CFG" (the training model's
    config) and the serving ladder's "MAX_LEN" (`serve_stack_lab.resolve_parameters`).

    Raises ValueError naming the first bad parameter: STEPS not above WARMUP + 2 (a median and an IQR
    need three timed steps), a MICRO_BATCHES that does not divide BATCH, a non-finite LR, or a serving parameter
    `serve_stack_lab.resolve_parameters` refuses."""
    R = S.resolve
    out = {"MODEL": R("MODEL", MODEL, smoke="tiny", full="small10m", check=lambda n, v: params.choose(n, v, PRESETS)),
           "BATCH": R("BATCH", BATCH, smoke=8, full=16, check=params.positive),
           "SEQ_LEN": R("SEQ_LEN", SEQ_LEN, smoke=64, full=512, check=params.positive),
           "WARMUP": R("WARMUP", WARMUP, smoke=2, full=4, check=params.positive),
           "MICRO_BATCHES": R("MICRO_BATCHES", MICRO_BATCHES, smoke=4, full=4, check=params.positive),
           "LR": R("LR", LR, smoke=1e-3, full=6e-4, check=params.positive_number),
           "COMPILE": R("COMPILE", COMPILE, smoke=S.device == "cuda", full=True, check=params.boolean)}
    out["STEPS"] = R("STEPS", STEPS, smoke=12, full=16, check=params.positive)
    if out["STEPS"] < out["WARMUP"] + 3:
        raise ValueError(f"STEPS={out['STEPS']} leaves fewer than 3 timed steps after WARMUP={out['WARMUP']}: "
                         "a median and an IQR need three")
    if out["BATCH"] % out["MICRO_BATCHES"]:
        raise ValueError(f"MICRO_BATCHES={out['MICRO_BATCHES']} must divide BATCH={out['BATCH']} (equal micro-batches "
                         "keep every rung's tokens per step and gradient the same)")
    # smoke on CUDA too: two of its stacks (eager fp8 with checkpointing, compiled fp8 without autocast) run nowhere else
    out["LEAVE_ONE_OUT"] = R("LEAVE_ONE_OUT", LEAVE_ONE_OUT, smoke=S.device == "cuda", full=True, check=params.boolean)
    cfg = GPTConfig.preset(out["MODEL"], seq_len=out["SEQ_LEN"])
    params.fits("SEQ_LEN", out["SEQ_LEN"], footprint.training_floor_bytes(cfg, out["BATCH"]), S.device,
                f"a training step of {out['MODEL']} at BATCH={out['BATCH']}")
    serving = serve_stack_lab.resolve_parameters(S, SERVE_MODEL=SERVE_MODEL, DRAFT_WIDTH=DRAFT_WIDTH, PROMPTS=PROMPTS,
                                           PROMPT_LEN=PROMPT_LEN, NEW_TOKENS=NEW_TOKENS, GAMMA=GAMMA, REQUESTS=REQUESTS,
                                           EVAL_BATCHES=EVAL_BATCHES)
    return {**out, **serving, "CFG": cfg}


def rungs_for(device: str, compile: bool) -> tuple[list[stack.Rung], dict[str, str]]:
    """The ladder on `device`, without torch.compile when `compile` is False; and every technique left out
    with its reason ({technique: sentence})."""
    techniques = [t for t in stack.TECHNIQUES if compile or t != "compile"]
    rungs = stack.ladder(device, techniques)
    left = dict(rungs[-1].skipped)
    if not compile:
        left["compile"] = ("left out by COMPILE=False (the smoke profile on a CPU: one cold compile of the GPT "
                           "step costs more than this notebook's whole budget there)")
    return rungs, left


def precision_of(rung: stack.Rung) -> str:
    """The narrowest format a rung's matmuls run in: "fp8", "bf16" or "fp32" (its loss tolerance's key)."""
    return "fp8" if rung.has("fp8") else "bf16" if rung.has("bf16") else "fp32"


def run_ladder(cfg: GPTConfig, rungs: list[stack.Rung], data: list, device: str, *, micro_batches: int, lr: float,
               warmup: int, interleave: bool = True, seed: int = 0,
               progress: Callable = iter, clock: Callable[[], float] = time.perf_counter) -> dict[str, dict]:
    """Train every rung on `data` (a list of (x, y) batches, the same for all) from the same weights.

    Returns {rung name: {"times": [seconds per step], "losses": [...], "peak_bytes": int or None,
    "timing": Timing of the steps after `warmup`, "steady": bool}}. A step's time ends after its loss
    reached the host (one sync per step). On a CPU it is the thread's CPU time (`clock.Stopwatch`; the Timing keeps
    each step's wall seconds beside it); on CUDA `clock` (the wall clock; tests pass a fake) after a sync."""
    built = {r.name: stack.build(cfg, r, device, micro_batches=micro_batches, lr=lr, seed=seed) for r in rungs}
    out = {name: {"times": [], "walls": [], "losses": [], "peak_bytes": None} for name in built}
    streams = {name: stack.batches(b, data, device) for name, b in built.items()}

    def one(name: str) -> None:
        x, y = next(streams[name])
        bench.sync(device)
        if device == "cuda":
            t0 = clock()
            loss = built[name].step(x, y)  # float(): the host waits for the step
            seconds = wall = clock() - t0
        else:
            with clocks.Stopwatch() as sw:
                loss = built[name].step(x, y)
            seconds, wall = sw.cpu, sw.wall
        if not math.isfinite(loss) and name == rungs[0].name:  # the baseline diverged: no rung can be judged
            raise ValueError(f"LR={lr!r}: the baseline's loss is {loss} after {len(out[name]['losses']) + 1} step(s); "
                             "this learning rate diverges, so no rung's loss or speed could be compared")
        out[name]["times"].append(seconds)
        out[name]["walls"].append(wall)
        out[name]["losses"].append(loss)

    order = ([(i, n) for i in range(len(data)) for n in built] if interleave else
             [(i, n) for n in built for i in range(len(data))])
    per_rung_peak = device == "cuda" and not interleave  # interleaved rungs share one peak: none is theirs alone
    # every compiled rung's blocks run the one Block.forward, so each rung's dtypes, kernels and shapes add a
    # compiled entry to that one frame; past Dynamo's limit (8) a rung would silently run eagerly
    with torch._dynamo.config.patch(recompile_limit=stack.RECOMPILE_LIMIT), bench.cpu_threads(device):
        for i, name in progress(order):
            if per_rung_peak and i == 0:
                torch.cuda.reset_peak_memory_stats()
            one(name)
            if per_rung_peak and i == len(data) - 1:
                out[name]["peak_bytes"] = torch.cuda.max_memory_allocated()
    for name, r in out.items():
        r["interleaved"] = interleave
        timed = r["times"][warmup:]
        r["timing"] = Timing(*bench.quartiles(timed), timed, warmup, device,
                             clock=clocks.WALL if device == "cuda" else clocks.THREAD,
                             wall=[] if device == "cuda" else r["walls"][warmup:])
        r["steady"] = (protocol.steady(timed, 3, 0.25) if len(timed) >= 3 else False) and \
            r["timing"].spread <= MAX_SPREAD
    return out


def step_ratio(num: dict, den: dict) -> protocol.Ratio:
    """num's step time over den's (two `run_ladder` entries): the median and quartiles of the per-step ratios
    (`protocol.paired_ratio`) when both rungs stepped interleaved, so that what a moment's load does to step i of
    both cancels; else quartiles against quartiles (`protocol.ratio`)."""
    a, b = num["timing"], den["timing"]
    if num.get("interleaved") and den.get("interleaved") and len(a.samples) == len(b.samples):
        return protocol.paired_ratio(a, b)
    return protocol.ratio(a, b)


def rows(cfg: GPTConfig, rungs: list[stack.Rung], res: dict, batch: int, seq_len: int,
         peak_flops: dict[str, float | None] | None, last: int = 3) -> list[dict]:
    """One row per rung: step Timing, tokens/s, MFU (exact FLOPs of the course count over the step time,
    against `peak_flops[format]` in FLOP/s, format "fp32" or "bf16" (an fp8 rung's against bf16's); None
    without one, and None with "mfu_above_ceiling" when it passes 100%: a ceiling measured low by a disturbance), final loss (mean of the last `last`) and its gap to the
    baseline's, whether it is within the rung's TOLERANCE, and the gain over the rung before and over the
    baseline (`step_ratio`s: paired steps when the rungs stepped interleaved).

    A rung whose format the device emulates ("emulated": `hardware.emulated`'s sentence, else None) gets no MFU
    and no gain (its time measures the emulation), and the rung after it is ranked against the last rung
    before it that ran natively."""
    step_flops = flops.transformer_flops(cfg, batch, seq_len, backward=True)["total"]["total"]
    base = res[rungs[0].name]
    tail = lambda r: sum(r["losses"][-last:]) / len(r["losses"][-last:])  # noqa: E731
    out, prev = [], None
    for rung in rungs:
        r = res[rung.name]
        t = r["timing"]
        gap = (tail(r) - tail(base)) / tail(base)
        fmt = precision_of(rung)
        emulated = hardware.emulated("bf16", t.device) if fmt in ("bf16", "fp8") else None
        mfu = None if emulated else flops.mfu(step_flops / t.median, (peak_flops or {}).get("fp32" if fmt == "fp32" else "bf16"))
        out.append({"rung": rung.name, "title": stack.TITLES.get(rung.name, "baseline"), "timing": t,
                    "tokens_per_s": batch * seq_len / t.median,
                    "mfu": None if mfu is not None and mfu > 1 else mfu, "mfu_above_ceiling": mfu is not None and mfu > 1,
                    "loss": tail(r), "loss_gap": gap, "precision": fmt, "emulated": emulated,
                    "within": abs(gap) <= TOLERANCE[fmt], "steady": r["steady"],
                    "gain": None if prev is None or emulated else step_ratio(prev, r),
                    "cumulative": step_ratio(base, r), "peak_bytes": r["peak_bytes"]})
        prev = prev if emulated else r
    return out


def rung_sentence(row: dict) -> str:
    """What one rung's technique bought on this run, ranked only when the step times' IQRs do not overlap."""
    g = row["gain"]
    what = f"{row['rung']} ({row['title']})"
    if row.get("emulated"):
        return (f"{what}: {row['timing']} per step, not ranked and no MFU: {row['emulated']}; the next rung is ranked "
                "against the rung before this one.")
    if g is None:
        return (f"baseline: {row['timing']} per step, {row['tokens_per_s']:.0f} tokens/s"
                + ("" if row["steady"] else "; " + unsteady(row)) + ".")
    if not g.separated:
        verdict = f"{what}: within the noise of the rung before ({g}); this run cannot say it helped"
    elif g.value > 1:
        verdict = f"{what}: {g} faster than the rung before"
    else:
        verdict = f"{what}: slower than the rung before ({g}): on this device it costs more than it saves"
    loss = (f"final loss {row['loss_gap']:+.2%} from the baseline's, within the {TOLERANCE[row['precision']]:.0e} "
            f"allowed for {row['precision']}" if row["within"] else
            f"final loss {row['loss_gap']:+.2%} from the baseline's, OUTSIDE the {TOLERANCE[row['precision']]:.0e} "
            f"allowed for {row['precision']}")
    return verdict + "; " + loss + ("" if row["steady"] else "; " + unsteady(row)) + "."


def unsteady(row: dict) -> str:
    """The warning a rung's sentence carries when its step times were widely spread or still drifting."""
    return (f"its step times were widely spread or still drifting at the end (IQR ±{50 * row['timing'].spread:.0f}%), "
            "so read its median with care")


def stack_panel(cfg: GPTConfig, batches: list, device: str, *, micro_batches: int, lr: float, warmup: int,
                seed: int = 0) -> Callable[..., dict]:
    """A panel callback: update(**{technique: bool}) trains the baseline and the ticked stack on `batches`
    (interleaved), prints their step times and draws their waterfall; returns the two rows. A technique
    this device cannot run is left out with its sentence."""
    def update(**ticked) -> dict:
        chosen = {t for t, on in ticked.items() if on}
        for t in sorted(chosen):
            if why := stack.unavailable(t, device):
                print(f"{t}: left out. {why}.")
                chosen.discard(t)
        rungs = [stack.Rung("baseline", frozenset()), stack.Rung("your stack", frozenset(chosen))]
        res = run_ladder(cfg, rungs, batches, device, micro_batches=micro_batches, lr=lr, warmup=warmup, seed=seed)
        table = rows(cfg, rungs, res, batches[0][0].shape[0], batches[0][0].shape[1], None)
        print(f"your stack ({', '.join(sorted(chosen)) or 'nothing'}): {table[1]['timing']} per step against the "
              f"baseline's {table[0]['timing']}: " + rung_sentence(table[1]).split(": ", 1)[1])
        waterfall(table, title="your stack against the baseline")
        return {"baseline": table[0], "stack": table[1]}
    return update


def leave_one_out(rungs: list[stack.Rung]) -> list[stack.Rung]:
    """The ladder's last rung (the whole stack) first, then the stack without each of its techniques in turn
    (rungs named "without <technique>")."""
    full = rungs[-1]
    return [stack.Rung("whole stack", full.techniques, full.skipped)] + [
        stack.Rung(f"without {t}", full.techniques - {t}, full.skipped) for t in stack.TECHNIQUES if full.has(t)]


def leave_one_out_rows(res: dict[str, dict]) -> list[dict]:
    """Per technique of the whole stack: what the stack loses without it, its step time without the technique over
    the whole stack's (`protocol.Ratio`: above 1, the stack is slower without it), and one sentence ranked only
    beyond both spreads."""
    whole = res["whole stack"]
    out = []
    for name, r in res.items():
        if name == "whole stack":
            continue
        t = name.removeprefix("without ")
        cost = step_ratio(r, whole)
        if not cost.separated:
            s = f"without {t} the stack's step time is within the noise of the whole stack's ({cost})"
        elif cost.value > 1:
            s = f"without {t} the stack is {cost} slower: it still pays its way at the top of the stack"
        else:
            s = (f"without {t} the stack is faster ({cost} the whole stack's step time): at the top of the stack it "
                 "costs more than it saves on this device")
        out.append({"technique": t, "cost": cost, "sentence": s})
    return out


# the seeds' end-to-end claims, each judged on the gain its rung measured in the stack:
# (ledger id, ladder, rung, claim lo, claim hi or None, claim, source, the isolated notebook's claim id, its notebook)
STACK_CLAIMS = (
    ("stack-mixed-precision-1-5-2x", "training", "bf16", 1.5, 2.0,
     "mixed precision gives 1.5-2x speed through tensor cores", "the first source text, section 2.4",
     "mixed-precision-speed", "03"),
    ("stack-flash-2-4x", "training", "sdpa", 2.0, 4.0, "FlashAttention is 2-4x faster (less memory I/O)",
     "the survey of training-efficiency techniques (first source text)", "flash-2-4x", "06"),
    ("stack-compile-1-5-2x", "training", "compile", 1.5, 2.0, "torch.compile gives a 1.5-2x speedup",
     "the first source text, section 6.2", "compile-1-5-2x", "09"),
    ("stack-fp8-2x", "training", "fp8", 1.7, None, "FP8 is about 2x faster than BF16",
     "the first source text, section 5.3", "fp8-2x-bf16", "07"),
    ("stack-speculative-2-3x", "serving", "speculative", 2.0, 3.0, "speculative decoding gives a 2-3x speedup",
     "the first source text, section 7.2", "speculative-decoding-t5-xxl", "11"),
)


def stack_claims(ladders: dict[str, list[dict]], isolated: dict[str, dict], device: str,
                 left_out: dict[str, dict[str, str]]) -> list[dict]:
    """`claims.verdict`'s keyword arguments (notebook "14") for each of STACK_CLAIMS: the claim judged by the one
    rule (`claims.judge_interval`, applied by `claims.verdict`) on its rung's gain over the rung before in the
    stack, with the gain's IQR bounds as its spread; "not testable" (with the claimed range still recorded) on a
    CPU (the GPU claims; speculative decoding's, whose small models' steps are per-call overhead there, as
    notebook 11 rules), when the rung is not on this device's ladder,
    or when it ran in a format the device emulates. The isolated notebook's verdict from `isolated` ({claim id:
    its ledger row}) is set beside it.

    ladders: {"training": training rows, "serving": serving rows}, each row with "rung" and "gain" (a Ratio);
    left_out: {ladder: {technique: why it is not on that ladder}}."""
    out = []
    for cid, ladder, rung, lo, hi, claim, source, iso_id, nb in STACK_CLAIMS:
        row = next((r for r in ladders.get(ladder, []) if r["rung"] == rung), None)
        iso = isolated.get(iso_id)
        alone = (f"alone (notebook {nb}): {iso['verdict']}, measured {iso['measured']}" if iso else
                 f"alone: notebook {nb} has not written its verdict into this results folder")
        kw = dict(claim_id=cid, notebook="14", claim=claim, source=source, claimed=(lo, hi), unit="x")
        if row is None or row.get("gain") is None:
            why = (row or {}).get("emulated") or left_out.get(ladder, {}).get(rung, "its rung is not on this ladder")
            out.append(dict(kw, verdict="not testable", measured=f"in the stack: not ranked; {alone}",
                            reason=f"{rung}: {why}"))
            continue
        g = row["gain"]
        kw.update(measured=f"in the stack, {rung} over the rung before: {g}; {alone}", value=g.value,
                  spread=(min(g.lo, g.value), max(g.hi, g.value)))
        if device == "cpu" and ladder == "training":
            kw.update(verdict="not testable",
                      reason="the claim is about GPU kernels (tensor cores, HBM traffic); this run has a CPU")
        elif device == "cpu":  # as notebook 11 rules: on a CPU the draft's and target's costs are per-call overhead
            kw.update(verdict="not testable",
                      reason="the claim is about a large target whose decode step is memory-bound on a GPU; on this "
                             "CPU the course's small models' step costs are per-call overhead, as notebook 11 finds")
        else:
            kw["reason"] = (f"measured over the rung {rung} joins in the stack, as a gain of the whole "
                            f"{'training step' if ladder == 'training' else 'reply'}, not of its kernel alone"
                            + (f"; on {device}, with the course's small models" if device == "cpu" else ""))
        out.append(kw)
    return out


# the capstone's performance targets on an H200 (a benchmark, not a test), each with its yardstick's source
TARGETS = (
    ("best bf16 rung's MFU against the measured bf16 matmul ceiling", 0.50,
     "PaLM reports 46.2% MFU (Chowdhery et al., 2022); picotron about 50% on 8xH100"),
    ("FP8 rung's tokens/s over the best bf16 rung's", 1.2,
     "torchao: +10% rowwise, +25% tensorwise on Llama 3 8B, 8xH100"),
    ("whole training ladder over the fp32 eager baseline", 8.0, "the course's own target"),
    ("compiled bf16 decode's bandwidth over the copy bandwidth", 0.75, "gpt-fast: about 69% of an A100's"),
    ("int4 decode's tokens/s over the compiled bf16 rung's", 2.0, "gpt-fast: 1.88x (Llama-2-7B, A100)"),
    ("speculative decoding over the rung it stands on", 1.8, "the course's own target, at temperature 0"),
    ("continuous over static batching", 2.0, "the course's own target; vLLM reports 2-4x"),
)


def target_rows(train: list[dict], serve: list[dict], batching: dict | None, judged: bool = True) -> list[dict]:
    """Each of TARGETS with this run's measured value (None with the reason when its rung is not on this
    device's ladders), its range where it has one, and whether it was met: {"target", "goal", "source", "value",
    "range" ((lo, hi) or None), "met", "why"}. met: True when the whole range is at or above the goal, False when
    it is below, None when the range straddles the goal, nothing was measured, or `judged` is False (the targets
    are the H200's)."""
    rows = {r["rung"]: r for r in train}
    srows = {r["rung"]: r for r in serve}
    bf16 = [r for r in train if r["precision"] == "bf16" and not r.get("emulated")]
    best = max(bf16, key=lambda r: r["tokens_per_s"]) if bf16 else None
    rr = lambda x: (x.value, (x.lo, x.hi))  # noqa: E731 - a Ratio as (value, range)
    got: list[tuple[tuple | None, str]] = [
        ((best["mfu"], None), "") if best and best["mfu"] is not None else
        (None, "no bf16 rung" if not best else "no MFU: no measured bf16 matmul ceiling, or one measured low"),
        (rr(protocol.ratio(best["timing"], rows["fp8"]["timing"])), "") if "fp8" in rows and best else
        (None, "no FP8 rung on this device" if "fp8" not in rows else "no bf16 rung"),
        (rr(train[-1]["cumulative"]), ""),
        ((srows["compile"]["copy_share"], None), "") if "compile" in srows and srows["compile"]["copy_share"] is not None
        else (None, "no compiled decode rung on this ladder"),
        (rr(srows["int4"]["gain"]), "") if "int4" in srows and srows["int4"]["base"] == "compile" else
        (None, "int4 does not stand on a compiled bf16 rung here"),
        (rr(srows["speculative"]["gain"]), "") if "speculative" in srows else (None, "no speculative rung"),
        ((batching["speedup"], tuple(batching["speedup_range"])), "") if batching else (None, "batching not measured"),
    ]
    out = []
    for (name, goal, src), (m, why) in zip(TARGETS, got):
        value, span = m if m else (None, None)
        lo, hi = span if span else (value, value)
        met = None if value is None or not judged else True if lo >= goal else False if hi < goal else None
        out.append({"target": name, "goal": goal, "source": src, "value": value, "range": span, "met": met,
                    "why": why})
    return out


def attention_rows(cfg: GPTConfig, rungs: list[stack.Rung], data: list, device: str, *, micro_batches: int, lr: float,
                   warmup: int, interleave: bool = True, seed: int = 0,
                   progress: Callable = iter) -> tuple[list[dict] | None, str]:
    """The ladder's sdpa rung beside the same rung with the course's Triton FlashAttention (notebook 06) in SDPA's
    place, trained on the same batches from the same weights: (their `rows`, the sentence ranking their step
    times), or (None, why not) where the kernel cannot run or the ladder has no sdpa rung."""
    why = stack.unavailable("triton_attention", device)
    sdpa = next((r for r in rungs if r.name == "sdpa"), None)
    if why or sdpa is None:
        return None, (f"The course's Triton FlashAttention as a second attention row: not run, because "
                      f"{why or 'the ladder has no sdpa rung'}.")
    tri = stack.Rung("triton_attention", (sdpa.techniques - {"sdpa"}) | {"triton_attention"}, sdpa.skipped)
    from helpers.attention import flash_triton  # heavy: Triton, on CUDA only

    flash_triton.use_configs("shortlist")  # the tiles an H200's autotuner picked: 4 kernels to compile, not 10
    res = run_ladder(cfg, [sdpa, tri], data, device, micro_batches=micro_batches, lr=lr, warmup=warmup,
                     interleave=interleave, seed=seed, progress=progress)
    x = data[0][0]
    table = rows(cfg, [sdpa, tri], res, x.shape[0], x.shape[1], None)
    return table, ("In the stack: " + protocol.rank_sentence("the course's Triton FlashAttention", table[1]["timing"],
                                                             "SDPA", table[0]["timing"], "step time") + ".")
