"""The course's GPU performance goals, each named after the notebook whose technique it measures, run by one command.

Each technique notebook sets goals for what its technique should buy on an H100/H200 (an FP8 matmul >= 1.6x
bf16, a fused kernel near the copy bandwidth, paged attention within 10% of a contiguous cache, ...), which
only a GPU (or, for notebook 13, the H200's 16-core host) can measure. Running the notebooks in full profile
measures them too, but only two or three notebooks fit one lent-GPU session; this module measures just the
goals, each through the same `helpers` functions the notebooks call in their full profile (never a second
implementation), so one call returns every ratio::

    python -m tools.capture.goals plan [--profile full|smoke] [GOAL ...]        # what would run, H200 estimates
    python -m tools.capture.goals run --out DIR [--budget-s 360] [--profile full|smoke] [GOAL ...]

A goal's key is "<notebook>.<what it measures>" (`07.scaled_mm`, `10.paged_decode`, `13.ring`); GOAL on the
command line is a key or a notebook number (`07`, or `7`: every goal of notebook 07).

This module holds the registry (`GOALS`, `ORDER`, `select`; the H200 estimates' basis is stated above
`GOALS`), the runner and the command line. The goal functions live in `tools.capture.goals_train`
(notebooks 07, 09, 12, 13) and `tools.capture.goals_decode` (notebooks 08, 10, 11), built on
`tools.capture.goal_base` (`Ctx`, `check`, `result`, `NotMeasurable`).

`run` takes the goals in `ORDER` (cheap and most informative first), starts one only if its estimate
fits in what is left of the budget, runs each in its own process (forked from a server that has
imported torch once) with a time limit, so a hung compile or a CUDA out-of-memory error loses only
that goal, and rewrites `DIR/goals.json` atomically after every goal. A goal records: its `notebook`,
its key (`goal`), what was measured (`measured`), the headline `ratio`, the goal's `target`, `met` (True,
False, or None when a part could not be measured), the `checks` behind it and the `sizes` used; or status
"not measurable" with a one-sentence reason (no CUDA, no FP8 tensor cores, torchao unusable), "failed"
with the error's first line, "stopped" (over its time limit) or "skipped" (budget); a failed or stopped
goal also records as "partial" what it measured before it ended (`Ctx.partial`). Trained models
are cached in `DIR/cache/` (or `--cache-dir`) and shared between the goals of one run.

SIGINT (Ctrl-C) or SIGTERM stops the running goal and every process it started, records it as
"interrupted" with its partial numbers, the goals after it as "not run", writes goals.json (with
"interrupted": the signal's name) and exits 130 or 143. A bad option value (`--budget-s nan`, an
`--out` or `--cache-dir` that cannot be written) is one line and exit status 2, before anything runs.

`--profile smoke` (the default without CUDA) uses tiny sizes, so the plumbing runs on a 2-core CPU in
about a minute; the CUDA-only goals then say "not measurable". `full` uses the goals' stated sizes.

`scripts/gpu_capture.sh` runs this on a lent GPU after the smoke pass, with what that pass left of the call
(`GOALS_BUDGET_S` sets it instead) and the model cache outside `$OUT` so that only `goals.json` comes back,
then the notebooks with what is left;
`python -m tools.capture.capture import` copies `goals.json` to `results/<gpu>/goals.json`.
"""
from __future__ import annotations

import datetime as _dt
import json
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from tools.capture.capture import gpu_facts
from tools.capture.goal_base import Ctx, NotMeasurable, error_line
from tools.capture.goals_decode import (compiled_quantized_decode_speedup, continuous_batching_speedup,
                                         decode_bandwidth, paged_decode_overhead, quantized_decode_speedup,
                                         speculative_speedup)
from tools.capture.goals_train import (bucketed_ddp_speedup, compiled_train_step_speedup, data_wait_share,
                                        float8_linear_speedup, fused_bandwidth, packing_speedup,
                                        pinned_copy_speedup, reduce_overhead_speedup, ring_all_reduce_ratio,
                                        scaled_mm_speedup, triton_softmax_speedup, zero_memory_deviation)
from helpers.course.processes import (Descendants, OneLineParser, Stop, end_group, folder_problem, positive_argument,
                                      write_problem)
from helpers.measure.results import write_atomic
from helpers.show.tables import table as text_table

DEFAULT_BUDGET_S = 360.0
MARGIN_S = 5.0          # kept back to write goals.json after the last goal
GRACE_S = 10.0          # a stopped goal's process group gets this long after SIGTERM before SIGKILL


@dataclass
class Goal:
    """One performance goal: the notebook whose technique it measures, its key, what it claims, its function
    and an H200 estimate."""

    notebook: str           # two digits, e.g. "07"
    key: str                # "<notebook>.<what it measures>", e.g. "07.scaled_mm"
    title: str              # the goal in words: what is compared, and the bound
    fn: Callable[[Ctx], dict]
    estimate_s: float       # full profile on one H200, seconds (an estimate, see above GOALS)
    basis: str              # how that estimate was made
    smoke_s: float = 10.0   # smoke profile on a 2-core CPU

    def estimate(self, profile: str) -> float:
        """Seconds this goal is expected to take in `profile` ("full": one H200, else a 2-core CPU)."""
        return self.estimate_s if profile == "full" else self.smoke_s


# ---------------------------------------------------------------- the registry

# The H200 estimates (`Goal.estimate_s`, seconds) come from each goal's sizes against the H200's datasheet
# rates (989 TFLOP/s dense bf16, 4.8 TB/s: NVIDIA H200 datasheet), which make the timed work itself small
# (an 8192^3 bf16 matmul is ~1.1 ms, a 1 GiB copy ~0.4 ms), plus the fixed costs, which dominate and are
# counted as the notebooks' own estimates count them (`tools.capture.capture.ESTIMATES`): ~3 s per goal
# process (CUDA context, imports), Inductor's start-up ~8 s per process and ~3 s per small graph after it,
# a whole-model forward+backward compile ~8 s plus ~2 s a layer, a decode step with CUDA graphs ~21 s at 8
# layers of 1.3b's width, a Triton kernel ~1.2 s (notebook 06's H200 capture), about 25 s to train
# small10m's 2000 steps (~12 ms each: 02's H200 capture measured its launch-bound steps at 10-11 ms) and
# ~8 s for its one-layer draft, and ~1 s per gloo process group or DataLoader worker start on the 16-core
# host. Sizes are the goals' own, and where a notebook's full profile times the same thing, its sizes (09's
# compiles at 3 layers, 10's decode compile at 8 layers, its batching mix, 13's DDP rows): the goals but the
# last take about 320 s, near the ~300 s a 540 s call keeps for them after a smoke pass of about 240 s.

def _goal(notebook: str, name: str, title: str, fn: Callable[[Ctx], dict], est: float, basis: str,
          smoke: float = 10.0) -> Goal:
    return Goal(notebook, f"{notebook}.{name}", title, fn, est, basis, smoke)


GOALS: list[Goal] = [
    _goal("07", "scaled_mm", "tensorwise _scaled_mm >= 1.6x bf16 TFLOP/s at 8192^3", scaled_mm_speedup, 10,
          "two 8192^3 matmuls x 23 calls (~1-2 ms each), casts; the goal process and CUDA start-up dominate"),
    _goal("07", "float8_linear", "rowwise Float8Linear fwd+bwd compiled >= 1.25x bf16 at 8192, within 5% of torchao",
          float8_linear_speedup, 30, "Inductor's start-up ~8 s and three compiled linears fwd+bwd (~5 s each with "
          "FP8's amax, scale and casts; torchao may refuse at once), 6 n^3 = 3.3e12 FLOPs a step x 23 steps, "
          "torchao's import ~3 s"),
    _goal("08", "quantized_decode", "int8 >= 1.4x and int4 >= 1.8x bf16 decode tok/s, each >= 60% copy BW",
          quantized_decode_speedup, 25, "1.3B init on the GPU ~2 s, Inductor's start-up ~8 s and the int8 "
          "linear's graph at batch 1 ~3 s, the Triton int4 kernels ~5 s, 3 variants x 25 eager decode steps "
          "of ~6 ms (24 launch-bound layers), copy bandwidth, the process ~3 s"),
    _goal("08", "compiled_decode", "08.quantized_decode's targets with the whole decode step compiled (CUDA graphs)",
          compiled_quantized_decode_speedup, 150, "three (or four, if the Triton int4 kernel cannot be compiled) "
          "compiles of the 24-layer 1.3B static-cache step with CUDA graphs (~40 s each, as 10.decode_bandwidth's), "
          "23 steps each"),
    _goal("09", "fused_bandwidth", "compiled pointwise chain and LayerNorm >= 80% of copy bandwidth (bf16)",
          fused_bandwidth, 20, "Inductor's start-up ~8 s and two small compiles (~3 s each), 8192x4096 bf16 "
          "(64 MiB) x 32 calls x 3 impls, the process ~3 s"),
    _goal("09", "triton_softmax", "Triton softmax >= 0.9x compiled and >= 1.5x eager, rows 256..16384",
          triton_softmax_speedup, 22, "Inductor's start-up ~8 s and three static compiles of the softmax (~3 s "
          "each, rows of 256, 4096 and 16384 as notebook 09), the Triton kernel's ~1.2 s a length, up to 256 "
          "MiB a call x 22 calls x 4 impls, the process ~3 s"),
    _goal("09", "reduce_overhead", "reduce-overhead >= 2x default compile on the batch-1 decode step",
          reduce_overhead_speedup, 18, "two compiles of small10m's one-token forward at 3 of its 6 layers "
          "(notebook 09's: ~6 s default with Inductor's start-up, ~5 s reduce-overhead), 100 one-token calls "
          "each ~2 s, the process ~3 s"),
    _goal("09", "train_step", "GPT training step compiled >= 1.3x eager", compiled_train_step_speedup, 20,
          "compile of small10m's forward and backward at 3 of its 6 layers (~8 s + ~2 s a layer, notebook 09's), "
          "20 rounds of 16x256-token steps each way (~8 ms) and warm-up ~1 s, the process ~3 s"),
    _goal("10", "decode_bandwidth", "compiled batch-1 decode of the largest preset >= 70% of copy bandwidth",
          decode_bandwidth, 28, "8 of 1.3b's 24 layers at its width on the GPU (kv_cache_lab.compiled_layers, as "
          "notebook 10), the static-cache step compiled with CUDA graphs ~21 s, 0.9 GB read a token (~0.2 ms) x "
          "25 compiled and eager steps, copy bandwidth, the process ~3 s"),
    _goal("10", "paged_decode", "paged decode attention within 10% of contiguous at 4k context", paged_decode_overhead,
          12, "the Triton paged kernel's compile per block size (3 x ~1 s), 32 x 4096 tokens x 20 calls"),
    _goal("10", "continuous_batching", "continuous batching >= 2x static tokens/s, same mix and memory",
          continuous_batching_speedup, 38, "training small10m (2000 launch-bound steps of ~12 ms, ~25 s, cached "
          "for 11.speculative and notebooks 08, 10, 11 and 14), then notebook 10's 48 requests served 5 times "
          "per policy (static ~350, continuous ~150 iterations of ~4 ms) ~10 s, the process ~3 s"),
    _goal("11", "speculative", "speedup within 15% of formula for γ 1..8 at T=0; best γ >= 1.5x, draft >= 10x cheaper",
          speculative_speedup, 25, "the one-layer draft's training (~8 s; small10m comes from "
          "10.continuous_batching's run, or ~25 s more), 3 rounds x (2 plain + 1 draft + 8 speculative) "
          "generations of 128 tokens (~3.9 s a round, from notebook 11's ~2.9 s at 96) ~12 s, the process ~3 s"),
    _goal("12", "data_wait", "data wait <= 2% of step time after tuning", data_wait_share, 15,
          "3 loader settings x 2 rounds x 31 small10m steps (~25 ms each), ~1 s per worker start-up"),
    _goal("12", "pinned", "pinned >= 2x pageable host-to-device for >= 64 MB", pinned_copy_speedup, 5,
          "64 and 256 MiB copies x 22 x 3 kinds at ~25-50 GB/s"),
    _goal("12", "packing", "packed >= 1.5x padded tokens/s on the heavy-tailed mix", packing_speedup, 6,
          "two small10m models, 21 steps each of 64-256 rows x 256 tokens"),
    _goal("13", "ring", "ring all-reduce within 1.5x of dist.all_reduce for >= 16 MB (8 gloo ranks)",
          ring_all_reduce_ratio, 15, "8 ranks' start-up (~3 s), 16 and 64 MiB x 17 calls x (ping, ring, "
          "all_reduce) at ~1-2 GB/s of gloo"),
    _goal("13", "bucketed_ddp", "bucketed DDP >= 20% faster than syncing after backward", bucketed_ddp_speedup, 22,
          "8 ranks of 2 threads, an 8-layer 1024-wide tower (8.4M params, 34 MB of gradients) at notebook 13's "
          "16 and 128 rows (0.8 and 6.4 GFLOP a step at ~100 GFLOP/s a rank), 4 modes x 3 warm-up + 5-15 rounds "
          "of ~0.26 and ~0.48 s and no_sync's rounds: notebook 13's ~17 s, the ranks' start and the process ~5 s"),
    _goal("13", "zero_memory", "memory per rank within 5% of the ZeRO formulas", zero_memory_deviation, 12,
          "small10m, one step per stage on 2 and 4 ranks, rank start-up"),
]
BY_KEY = {g.key: g for g in GOALS}

# cheap and most informative first: the single-ratio GPU checks, the CPU-side goals, then the compiles and
# the training (10.continuous_batching trains small10m, which 11.speculative then loads), the 1.3B decode
# compiles last
ORDER = ["07.scaled_mm", "12.pinned", "12.packing", "09.fused_bandwidth", "10.paged_decode", "12.data_wait",
         "13.ring", "13.zero_memory", "13.bucketed_ddp", "07.float8_linear", "09.triton_softmax",
         "09.reduce_overhead", "09.train_step", "08.quantized_decode", "10.continuous_batching",
         "11.speculative", "10.decode_bandwidth", "08.compiled_decode"]
assert sorted(ORDER) == sorted(BY_KEY), "ORDER must name every goal once"


def select(wanted: list[str] | None = None) -> list[Goal]:
    """Goals in ORDER, restricted to `wanted` notebook numbers ("07", or "7": every goal of notebook 07) or
    keys ("07.scaled_mm"). Raises ValueError naming what matched nothing."""
    wanted = [w.zfill(2) if w.isdigit() else w for w in map(str, wanted or [])]
    notebooks = sorted({g.notebook for g in GOALS})
    bad = [w for w in wanted if w not in BY_KEY and w not in notebooks]
    if bad:
        raise ValueError(f"no goal matches {bad}; notebooks: {', '.join(notebooks)}; keys: {', '.join(ORDER)}")
    return [BY_KEY[k] for k in ORDER if not wanted or k in wanted or BY_KEY[k].notebook in wanted]


# ---------------------------------------------------------------- running goals, each in its own process

def _child(fn: Callable[[Ctx], dict], ctx: Ctx, path: str) -> None:
    """In the goal's process: a new session (so the whole group can be stopped), run, write the outcome."""
    try:
        os.setsid()
    except OSError:
        pass
    out: dict[str, Any]
    try:
        ctx.device = "cuda" if torch.cuda.is_available() else "cpu"
        ctx.partial_path = path + ".partial"
        out = {"status": "measured", "device": torch.cuda.get_device_name(0) if ctx.device == "cuda" else "cpu",
               **fn(ctx)}
    except NotMeasurable as err:
        out = {"status": "not measurable", "reason": str(err)}
    except BaseException as err:  # noqa: BLE001: any failure is this goal's, reported in one line
        out = {"status": "failed", "error": error_line(err), "traceback": traceback.format_exc()[-2000:]}
    Path(path).write_text(json.dumps(out, default=_jsonable))


def _jsonable(x):
    """A JSON-able stand-in for what json cannot write: a tensor's or numpy scalar's item, a list, else str."""
    if hasattr(x, "item"):
        return x.item()
    if isinstance(x, (set, tuple)):
        return list(x)
    return str(x)


_CTX = None


def _context():
    """A forkserver that imported torch once: each goal forks from it, fresh, cheap and CUDA-clean."""
    global _CTX
    if _CTX is None:
        _CTX = mp.get_context("forkserver")
        _CTX.set_forkserver_preload(["torch", "helpers.measure.results"])
    return _CTX


def _stop(proc, seen: Descendants | None = None) -> None:
    """Stop a goal's process and everything it started: SIGTERM to it and its session, SIGKILL to what is
    left of that session after GRACE_S (also once the goal itself has ended), and SIGKILL to every
    descendant `seen` remembers (one that left the session)."""
    seen = seen or Descendants(proc.pid)
    seen.watch()
    if proc.is_alive():
        proc.terminate()  # the goal itself, should it not lead its session yet
    end_group(proc.pid, proc.is_alive, GRACE_S)  # the goal's whole session: ranks, loader workers, compilers
    if proc.is_alive():
        proc.kill()
    proc.join(timeout=GRACE_S)
    seen.kill()


def run_one(goal: Goal, ctx: Ctx, limit_s: float, work: Path, stop: Stop | None = None) -> dict:
    """Run one goal in its own process, stopped after `limit_s` or when `stop` says a signal came; its record
    (without timing fields): "interrupted" for a goal a signal stopped, with what it measured as "partial"."""
    path = Path(work) / f"{goal.key}.json"
    partial = Path(str(path) + ".partial")  # Ctx.partial's file: what the goal measured before it ended
    path.unlink(missing_ok=True)
    partial.unlink(missing_ok=True)
    proc = _context().Process(target=_child, args=(goal.fn, ctx, str(path)), daemon=False)
    proc.start()
    seen, start, next_watch = Descendants(proc.pid), time.monotonic(), 0.0
    rec = None
    try:
        while proc.is_alive() and rec is None:
            proc.join(timeout=0.2)
            if time.monotonic() >= next_watch:  # a /proc scan, once a second
                seen.watch()
                next_watch = time.monotonic() + 1.0
            if stop is not None and stop.why:
                rec = {"status": "interrupted",
                       "reason": f"interrupted by {stop.why} after {time.monotonic() - start:.0f} s"}
            elif time.monotonic() - start > max(1.0, limit_s):
                rec = {"status": "stopped", "reason": f"stopped after its time limit of {limit_s:.0f} s"}
    finally:  # a signal, the budget, or an error in the runner itself: the goal's processes go with it
        _stop(proc, seen)
    if rec is None:
        try:
            rec = json.loads(path.read_text())
        except (OSError, ValueError):
            rec = {"status": "failed", "error": f"the goal's process ended with exit code {proc.exitcode} and no "
                                                "result (killed: out of memory, or a crash in native code)"}
    if rec["status"] != "measured":
        try:
            rec["partial"] = json.loads(partial.read_text())
        except (OSError, ValueError):
            pass
    return rec


def _limit(goal: Goal, profile: str) -> float:
    """A goal's time limit: three times its estimate, and at least a minute more than it."""
    est = goal.estimate(profile)
    return max(3 * est, est + 60)


def run(goals: list[Goal], out: Path, *, profile: str, budget_s: float = DEFAULT_BUDGET_S,
        limit: Callable[[Goal, str], float] = _limit, log: Callable[[str], None] = print,
        clock: Callable[[], float] = time.monotonic, cache_dir: Path | None = None,
        stop: Stop | None = None) -> dict:
    """Run `goals` in order within `budget_s` seconds; rewrite `out/goals.json` after each. Returns its content.

    `cache_dir` (default `out/cache`) holds the trained models the goals share. Once `stop.why` names a
    signal, the running goal is stopped ("interrupted", with its partial numbers), the rest are "not run",
    and the document says "interrupted": the signal's name."""
    start = clock()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="goals-"))
    cache = Path(cache_dir) if cache_dir is not None else out / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    doc = {"started": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "profile": profile,
           "budget_s": budget_s, "machine": _facts(), "planned": [g.key for g in goals], "goals": [], "finished": False}
    _save(doc, out, log)  # there even if cut at once
    try:
        _run_goals(goals, doc, out, work, cache, profile, budget_s, limit, log, clock, start, stop)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if stop is not None and stop.why:
        doc["interrupted"] = stop.why
    else:
        doc["finished"] = True
    doc["seconds"] = round(clock() - start, 1)
    _save(doc, out, log)
    return doc


def _save(doc: dict, out: Path, log: Callable[[str], None]) -> None:
    """Rewrite `out/goals.json`; when it cannot be written (a full disk), say so once, in one line, and note it in
    the document, whose table `main` still prints."""
    try:
        write_atomic(Path(out) / "goals.json", json.dumps(doc, indent=1, default=_jsonable) + "\n")
    except OSError as err:
        if not doc.get("write_error"):
            doc["write_error"] = write_problem(err, Path(out) / "goals.json") + "; the table printed at the end is all that is kept"
            log(doc["write_error"])


def _run_goals(goals, doc, out, work, cache, profile, budget_s, limit, log, clock, start, stop) -> None:
    """The loop of `run`: each goal's record appended to `doc`, goals.json rewritten after each."""
    for goal in goals:
        est = goal.estimate(profile)
        left = budget_s - MARGIN_S - (clock() - start)
        rec = {"notebook": goal.notebook, "goal": goal.key, "title": goal.title, "estimate_s": est}
        if stop is not None and stop.why:
            rec |= {"status": "not run", "reason": f"not run ({stop.why})", "seconds": 0.0}
        elif est > left:
            rec |= {"status": "skipped", "reason": f"estimated {est:.0f} s > {max(left, 0):.0f} s left of the budget",
                    "seconds": 0.0}
        else:
            log(f"{goal.key}: running (estimate {est:.0f} s, {left:.0f} s left)")
            t0 = clock()
            rec |= run_one(goal, Ctx(profile, cache), min(limit(goal, profile), left), work, stop)
            rec["seconds"] = round(clock() - t0, 1)
        rec.setdefault("met", None)
        doc["goals"].append(rec)
        _save(doc, out, log)
        log(f"{goal.key}: {rec['status']} in {rec['seconds']:.1f} s" + _short(rec))


def _short(rec: dict) -> str:
    """The end of a goal's progress line: its headline ratio, target and verdict, or why it has none."""
    if rec["status"] == "measured":
        r = rec.get("ratio")
        return f"; {rec.get('headline')}: {'-' if r is None else f'{r:.3g}'} (target {rec.get('target')}), met {rec.get('met')}"
    return f"; {rec.get('reason') or rec.get('error', '')}"


def _facts() -> dict:
    """This machine, as goals.json records it: capture.gpu_facts and the CPU cores this process may use."""
    facts = gpu_facts()
    facts["cores"] = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return facts


def table(doc: dict) -> str:
    """The goals of a goals.json as a table: notebook, goal, measured, target, met, seconds."""
    rows = []
    for r in doc["goals"]:
        if r["status"] == "measured":
            val = "-" if r.get("ratio") is None else f"{r['ratio']:.3g}"
            measured = f"{val} ({r.get('headline', '')})"
            missing = [c for c in r.get("checks", []) if c["met"] is None]
            if missing:
                measured += f"; {len(missing)} of {len(r['checks'])} parts not measured: {missing[0].get('reason', '')}"
            if r.get("note"):
                measured += f"; {r['note']}"
        else:
            measured = f"{r['status']}: {r.get('reason') or r.get('error', '')}"
            if r.get("partial"):
                measured += "; measured before that: " + ", ".join(
                    f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in r["partial"].items())
        met = {True: "yes", False: "no", None: "-"}[r.get("met")]
        rows.append([r["notebook"], r["goal"], measured[:160], r.get("target", "-") if r["status"] == "measured" else "-",
                     met, f"{r.get('seconds', 0):.1f}"])
    return text_table(["notebook", "goal", "measured", "target", "met", "seconds"], rows)


def plan_text(goals: list[Goal], profile: str) -> str:
    """What `run` would do: each goal's notebook, key, target, estimate and its basis, and the total."""
    where = ("one H200 (estimated from the goals' sizes and the datasheet rates)" if profile == "full"
             else "a 2-core CPU, smoke sizes")
    rows = [[g.notebook, g.key, g.title[:70], f"{g.estimate(profile):.0f}", g.basis[:90] if profile == "full" else ""]
            for g in goals]
    total = sum(g.estimate(profile) for g in goals)
    return (text_table(["notebook", "goal", "target", "est. s", "basis"], rows)
            + f"\ntotal: {total:.0f} s on {where}")


def _default_profile() -> str:
    """"full" where torch sees a CUDA GPU, else "smoke"."""
    return "full" if torch.cuda.is_available() else "smoke"


def main(argv: list[str] | None = None) -> int:
    """`plan` or `run` (see the module docstring); exit status 0, 2 for a usage error, 130 / 143 when SIGINT /
    SIGTERM stopped the run."""
    prog = "python -m tools.capture.goals"
    parser = OneLineParser(prog=prog, description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("plan", "run"):
        p = sub.add_parser(name)
        p.add_argument("goals", nargs="*", metavar="GOAL",
                       help="notebook numbers (07..13) or goal keys such as 07.scaled_mm (default: every goal)")
        p.add_argument("--profile", choices=("smoke", "full"), default=None,
                       help="full: the goals' stated sizes (default with CUDA); smoke: tiny sizes (default without)")
        if name == "run":
            p.add_argument("--out", type=Path, required=True, help="folder for goals.json")
            p.add_argument("--cache-dir", type=Path, default=None,
                           help="where trained models are shared between goals (default: OUT/cache)")
            p.add_argument("--budget-s", type=positive_argument(float), default=DEFAULT_BUDGET_S,
                           help=f"wall-clock budget in seconds, above {MARGIN_S:.0f} (default 360)")
    args = parser.parse_args(argv)
    try:
        goals = select(args.goals)
    except ValueError as err:
        print(err)
        return 2
    profile = args.profile or ("full" if args.command == "plan" else _default_profile())
    if args.command == "plan":
        print(plan_text(goals, profile))
        return 0
    if args.budget_s <= MARGIN_S:
        print(f"{prog} run: --budget-s {args.budget_s:g} must exceed the {MARGIN_S:.0f} s kept to write goals.json",
              file=sys.stderr)
        return 2
    for option, folder in (("--out", args.out), ("--cache-dir", args.cache_dir or args.out / "cache")):
        problem = folder_problem(folder)
        if problem:
            print(f"{prog} run: {option} {folder} cannot be written: {problem}", file=sys.stderr)
            return 2
    with Stop("the running goal and the processes it started") as stop:
        doc = run(goals, args.out, profile=profile, budget_s=args.budget_s, cache_dir=args.cache_dir, stop=stop)
        print(table(doc))
    return stop.code(1 if doc.get("write_error") else 0)


if __name__ == "__main__":
    sys.exit(main())
