"""Capture reference results on a briefly lent GPU, then import them into `results/<gpu>/`.

The course is measured on a GPU that is lent now and then for minutes (one H200, 15 minutes in all,
at most 10 minutes a command, at most 8 files back: see results/README.md). `run` makes the most
of one such window:

* **priority order**: notebooks with no reference yet first (course order), then the one whose
  reference is oldest (`capture.json` in the reference folder says when each was captured);
* **a time budget**: a notebook starts only if its estimated full-profile time fits in what is
  left, and is stopped (SIGTERM to its runner's process group, which stops its kernel) when the
  budget runs out, so the command ends before the device tool's limit and what finished comes back;
* **nothing lost**: after each notebook, its records, executed copy and log are packed into
  `capture-<k>.tgz` under the output folder, rewritten atomically, a new pack being started before
  one would pass `PACK_LIMIT` bytes, so at most a handful of files come back whatever happens next.

All notebooks of one capture share one results folder, so notebook 00's ceilings, when it ran, are
reused by the others as in an ordinary run.

SIGINT (Ctrl-C) or SIGTERM is passed on to the running notebook's runner, which stops its worker and
kernel and writes what its notebook finished; every process below it is then sure to be gone. That
notebook is packed as "interrupted", the rest are "not run", the summary is printed, and the command
exits 130 or 143. A bad option value (`--budget-s nan`, an `--out` that cannot be written) is one line
and exit status 2, before anything runs.

`import` unpacks what came back into `results/<device>/`: the records, `capture.json` (per notebook:
date, measured seconds, estimate, status) and a README.md naming the GPU, driver, CUDA, torch and
Triton versions and the date (a torn or foreign pack is refused in one line naming it, exit status 1,
before anything is written); a `goals.json` beside the packs (`tools.capture.goals`, which
`scripts/gpu_capture.sh` runs first) is copied to `results/<device>/goals.json`. Commands::

    python -m tools.capture.capture plan  [--budget-s 540]          # the order and estimates, runs nothing; beside
                                                                     # each, the H200's measured seconds (flagged
                                                                     # when more than OFF_LIMIT apart)
    python -m tools.capture.capture run   --out DIR [--budget-s 540] [--profile full] [--notebooks-dir DIR] [NOTEBOOK ...]
    python -m tools.capture.capture import PACK.tgz [...] [goals.json] [--into results]
"""
from __future__ import annotations

import datetime as _dt
import functools
import io
import json
import re
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from helpers.course.processes import (Descendants, OneLineParser, Stop, end_group, folder_problem, positive_argument,
                                      write_problem)
from helpers.measure.params import is_finite_number
from helpers.measure.results import REPO_ROOT, device_slug, slug, write_atomic
from helpers.show.tables import table

NOTEBOOKS_DIR = REPO_ROOT / "notebooks"
PACK_LIMIT = 12 * 2**20   # bytes per pack; the device tool returns files of up to 16 MiB
MAX_PACKS = 4             # with gpu.txt, capture.log, goals.json and smoke.tgz (tools.capture.gpu_smoke): 8 files
MARGIN_S = 25.0           # kept back for packing and the tool's transfer
RUNNER_GRACE_S = 15.0     # a stopped runner's time to stop its worker and kernel and write its summary
ESTIMATED_ON = REPO_ROOT / "results" / "nvidia-h200"  # the GPU ESTIMATES are for; its capture.json holds measured s
OFF_LIMIT = 0.30          # an estimate further than this from a capture's measured seconds is flagged by `plan`

# Full-profile seconds on one H200, each with its basis: for a notebook a capture has measured, that time
# (results/nvidia-h200/capture.json) with 10% added, less the measured cost of what was cut since; otherwise
# the notebook's FLOP and byte counts against the H200's published rates (dense bf16 ~990 TFLOP/s, fp32
# ~67 TFLOP/s, 4.8 TB/s: NVIDIA H200 datasheet) plus start-up, training and compile time. A cold Inductor
# compile is counted in two parts: the Python work (Dynamo, AOT autograd, Inductor's lowering and scheduling)
# grows with the layers traced, ~1.2 s a layer forward only and about twice that with the backward (5.9, 9.7
# and 18.5 s at 6, 12 and 24 layers of a decode step profiled on a 2-core CPU); each distinct Triton kernel is
# compiled (and, under coordinate-descent tuning, tuned) once per process and cache, ~1 s, 16 at a time on the
# H200's host, so a second graph that shares most of its kernels with one compiled before pays mostly the
# Python part. The whole course does not fit one 540 s call: the capture takes the notebooks without a
# reference first, so successive calls complete it (CALLS, `call_plan`). `python -m tools.capture.capture
# plan` prints them.
ESTIMATES: dict[str, tuple[float, str]] = {
    "00": (22.0, "the H200 capture's 20.1 s, plus 10%; matmul sweep 512..16384 in 4 formats x 20 reps: 2n^3 FLOPs "
                 "each, ~0.4 s of GPU work at the datasheet rates; copies up to 4 GiB x reps at 4.8 TB/s ~ 1 s; the "
                 "rest is start-up, warm-up and the timing-mistakes demos"),
    "01": (19.0, "the H200 capture's 17.2 s, plus 10%; ops at n=8192: each a few hundred MB of traffic or 1e12 FLOPs,"
                 " milliseconds each; start-up and FlopCounterMode checks dominate"),
    "02": (82.0, "the H200 capture's 83.6 s at 20 reps a point, less the 10 reps cut since: 10 x 0.77 s (one step of "
                 "all nine training points in that capture: small10m, gpt2 and gpt2-medium at B 8-32, 10 ms to 274 ms"
                 " each) and 10 x 0.11 s of the sub-block sweep's 15 points ~ 8.8 s, ~75 s, plus 10%; meta-device "
                 "FLOP checks and the ceilings"),
    "03": (88.0, "the H200 capture's 100.2 s at 200 steps, less the 80 steps cut since: 80 x 256 ms (the six "
                 "variants' steps measured there: fp32 111 ms, fp16 28, with our scaler 40, with GradScaler 28, bf16 "
                 "autocast 24, bf16 weights with fp32 master 25) = 20.5 s, ~80 s, plus 10%; gpt2 for 120 steps per "
                 "variant at 16x512 tokens"),
    "04": (72.0, "the H200 capture's 65.0 s, plus 10%; checkpointing strategies on gpt2 at 8x1024 (53-73 ms a step "
                 "there), a few dozen steps each, memory probes"),
    "05": (45.0, "gpt2 at T=1024, 32 sequences per optimizer step, micro-batches 1..32, 3 warm-up + 7 timed rounds: a"
                 " round is 32x1, 16x2, ..., 1x32 micro-steps ~ 1.3 s at this H200's measured gpt2 steps (02's "
                 "record: 39 ms at 8x1024, 138 ms at 32x1024; ~15 ms launch-bound at 1x1024), 10 rounds ~13 s; a "
                 "memory probe per size ~2 s; the profiler's two steps and their traces ~5 s; the bf16 ceiling to "
                 "16384^3 (8.8e12 FLOPs, ~11 ms a call) ~2 s; start-up ~12 s (01's whole capture: 17 s); no compile; "
                 "~36 s, plus 25% for what 02-04's captures ran over estimates counted this way"),
    "07": (89.0, "start-up with torchao ~12 s; CPU-side checks (formats, casts, scales, linear parity, blockwise) and"
                 " torchao's probes ~6 s; training, launch-bound as 02 measured small10m steps on this H200 (10-11 ms"
                 " at 8-32 x 256, whatever the batch), 100 steps at 32x256: the baseline twice ~2 s, six FP8 variants"
                 " at their aten ops per step counted against the baseline's (tensorwise 2.2x, delayed 1.9x, rowwise "
                 "3.0x, blockwise 6.3x, torchao's 2.2-2.5x: ~180 ms a step in all) ~18 s, capture, error tables and "
                 "evaluations ~6 s; speed: bf16 and fp8 matmuls to 8192^3 (1.1e12 FLOPs, ~2 ms) and five linears "
                 "eager (6n^3 = 3.3e12 FLOPs at 8192, ~5 ms) x 4 sizes x 23 calls ~6 s, profile and protocol headline"
                 " ~6 s; the small10m GPT step with each block compiled (regional) for bf16, our rowwise and "
                 "torchao's rowwise: one block's forward and backward a variant, ~5 s in bf16 and ~7 s with FP8's "
                 "amax, scale and cast ops, plus Inductor's start-up ~5 s, and 23 timed steps each ~1 s: ~25 s; the "
                 "rest ~5 s: ~83 s (~66 s where torchao cannot run), plus 7%"),
    "08": (105.0, "start-up with bitsandbytes and torchao ~15 s; trains small10m for the capture (the first of 05, "
                  "08, 10, 11 to need it; 10 and 11 load it): 2000 steps of 64x256 at ~12 ms (02's measured launch-"
                  "bound small10m steps on this H200: 10-11 ms, plus clipping) ~25 s; error tables and grid on the "
                  "CPU (30 block weights, 10.6M values; 5.8 s and 2.2 s on a 2-core CPU) ~8 s; GPTQ's column loops (6"
                  " layers x 3072 columns x ~12 launches ~ 2 s per model and width, x 4) and AWQ ~10 s; ~40 held-out "
                  "evaluations of 8x16 windows and 3 x 100 fine-tuning steps at 8x64 ~10 s; 1.3b decode: the int8 "
                  "linear alone compiled with dynamic shapes (prefills run uncompiled), one graph at batch 1 and one "
                  "at 64, each ~1 s of Python and one or two kernels compiled and tuned ~2 s: ~6 s, 3 Triton int4 "
                  "compiles ~5 s, torchao ~5 s, 5 variants x 2 batches x 35 steps of ~6 ms (24 launch-bound layers; "
                  "the 2.6 GB of weights take 0.55 ms at 4.8 TB/s) ~2 s; the rest ~5 s: ~91 s, plus 15%"),
    "11": (66.0, "start-up ~12 s; loads small10m (08 trains it; +25 s when 11 runs without 08) and trains the one-"
                 "layer draft for the capture (its only user): 2000 steps at ~4 ms ~8 s; greedy exactness, 2 drafts x"
                 " 4 gammas x 96 tokens ~3 s; 2 x 1e6 chi-square draws on the CPU (0.2 s) and the step costs (40 "
                 "rounds x 6 calls of ~2.5 ms) ~2 s; the grid: 5 rounds x 2 temperatures (0 and 1) x (2 plain and 1 "
                 "draft-alone generations of 96 tokens at ~2.5 / 0.7 ms a token ~0.5 s, and 8 speculative "
                 "configurations ~0.3 s each: passes of gamma draft steps, one verification and the rule) ~29 s; the "
                 "bandwidth-bound target, panel and records ~6 s; no compile: ~60 s, plus 10%"),
    "13": (76.0, "CPU work: 8 gloo ranks x 2 threads on the host's 16 cores, forked from a preloaded server (~1 s a "
                 "launch, 8 launches); start-up ~12 s; collectives to 16 MiB, 15-30 rounds (16 MiB: ~1.75 x 16 MiB "
                 "per rank at ~1-2 GB/s, 15-30 ms per all-reduce, two of them, and a ping-pong) ~3 s; DDP on an 8 x "
                 "1024^2 tower (34 MB of gradients, ~50-100 ms an all-reduce) at 16 and 128 rows (0.8 and 6.4 GFLOP a"
                 " step at ~100 GFLOP/s a rank), 4 modes x 3 warm-up + 5-15 rounds of ~0.26 and ~0.48 s (~13 s), the "
                 "all-reduce alone and bucket copies (~1 s), and no_sync against syncing 4 micro-steps (~0.44 s x "
                 "6-16 rounds, ~3 s) ~17 s; the overlap demo, 4 layers of 10 ms against 5/10/20 ms all-reduces, ~0.48"
                 " s x 6 rounds (timed waits separate at the first check, as in smoke) ~3 s; ZeRO memory at 2 and 4 "
                 "ranks, tensor parallel and DDP checks ~8 s; the pipeline, 8 stages, m = 1, 4, 16, GPipe and 1F1B, "
                 "(m + 7) x 30 ms each (10 ms forward, 20 ms backward waits): 2.5 s a round x 5 rounds after one m = "
                 "1 warm-up run per schedule (0.5 s) ~14 s (16.4 s measured for 8 ranks on a 2-core host); torchrun's"
                 " two launchers ~8 s; the rest ~3 s; no compile: ~76 s"),
    "09": (112.0, "start-up ~10 s; Dynamo-only sections (explain, CompileCounter, logs, fullgraph) ~4 s; 10 Inductor "
                  "compiles: three workloads at 8192x4096 bf16 (~3 s each plus Inductor's start-up ~8 s), their "
                  "protocol timing (64 MiB passes, ~30 us at 4.8 TB/s) and kernel counts ~24 s; cold and warm compile"
                  " of the chain ~6 s; the training step of small10m cut to 3 of its 6 layers (N_LAYER) at 16x256 "
                  "under bf16 autocast, one compile of forward and backward ~13 s (a whole-model compile grows with "
                  "the layers it traces: counted as ~8 s fixed and ~2 s a layer, ~20 s at 6), 40 rounds of ~8 ms "
                  "steps and the matmul profile ~5 s; regional compilation of all 6 layers traced with aot_eager ~5 "
                  "s; the 3-layer one-token forward in default and reduce-overhead ~6 s + ~5 s and their timing ~2 s "
                  "(max-autotune, tuning Triton matmul templates per shape, left out: +40-60 s) ~13 s; softmax sweep "
                  "at 256, 4096 (reused) and 16384, 2 static compiles ~3 s each and 2 Triton kernels ~1 s each, and "
                  "the Triton checks ~13 s; the rest ~4 s: ~97 s, plus 15%"),
    "10": (88.0, "start-up ~12 s; loads small10m (08 trains it; +25 s when 10 runs without 08); cache checks and "
                 "examples (~1,000 small10m decode steps at ~2.5 ms) ~3 s; per-position and prefill/decode "
                 "comparisons (20-40 rounds of ms calls) and the ceilings ~8 s; the decode sweep, 3 presets and 1.3b "
                 "at 4 more batches (4, 16, 64, 256), 20-40 steps each of at most ~10 ms (1.3b at batch 256 reads 2.6"
                 " GB of weights and 25.8 GB of cache, 6 ms at 4.8 TB/s) after prefills of up to 131k tokens (3.4e14 "
                 "FLOPs, ~0.5 s), ~1 s a case ~7 s; latent ranks and variant speeds ~5 s; one Inductor compile of the"
                 " 1.3b-wide static-cache step with 8 of its 24 layers, CUDA graphs, ~21 s (of the 24-layer ~40 s, "
                 "~28 s grows with the layers: Dynamo, AOT and Inductor's lowering and scheduling, 5.9/9.7/18.5 s of "
                 "Python at 6/12/24 layers in a compile measured on a 2-core CPU; ~12 s, each distinct kernel "
                 "compiled and coordinate-descent tuned once, does not), then its steps ~1.5 s; the paged section, 3 "
                 "block sizes = 3 Triton compiles (~1.5 s each) and their timing ~6 s; prefix sharing, chunked "
                 "prefill and waste counts ~5 s; continuous batching, 48 requests x 7 served runs (static 348, "
                 "continuous 154, tight 154 iterations) ~1,660 iterations at ~4 ms, and one request in four alone (12"
                 " requests, ~470 steps at ~2.5 ms), with admissions and tables ~11 s; the rest ~3 s: ~82.5 s, plus "
                 "7%"),
    "12": (79.0, "start-up ~12 s; 40,000 documents and the packing checks ~4 s; the loader sweep, 8 sources a round "
                 "(4 worker counts, 2 more prefetch factors, 1 more batch size, memmap), each a fresh loader, warm-up"
                 " and 20 steps of 12-45 ms (small10m at 64x256 ~12 ms, launch-bound as 02 measured; no workers wait "
                 "64 x 0.5 ms = 32 ms a batch; 256 rows on 8 workers 16 ms) and its workers' start (~0.4 s a loader, "
                 "6 with workers) ~6 s a round, plus the batches each loader's workers prefetched, drained before its"
                 " warm-up (workers x prefetch factor: 4 to 64 steps, ~150 in all at 12-45 ms) ~2.5 s a round, 3 "
                 "rounds (the 10 s budget ends after the third) ~26 s; persistent workers, 3 warm-up calls and 5 "
                 "rounds (6 s budget) of 2 epochs with 8 workers restarted (~1 s) or kept (~0.5 s) ~12 s; two forked "
                 "readers over 60,000 documents ~4 s; pinned copies to 256 MiB x 20 reps x 3 kinds ~3 s; packing "
                 "against padding (20-40 rounds of two ~12 ms steps) and its profile ~5 s; varlen check, masks, "
                 "sampler, the panel's 8-worker loader ~6 s; no compile: ~72 s, plus 10%"),
    "14": (132.0, "counted: start-up, imports and the two matmul ceilings ~10 s; the training ladder, each technique "
                  "alone and the leave-one-out runs, ~27 runs x 16 steps of small10m at 16x512 (6.5e11 FLOPs a step: "
                  "~30 ms in fp32 with naive attention for ~7 runs, ~12 ms launch-bound in bf16 for ~20) ~6 s; 8 "
                  "distinct regional compiles (the compile, fp8 and checkpoint rungs, compile alone in fp32 with "
                  "naive attention, the stack without bf16, without sdpa and without fp8, and the Triton attention "
                  "row; the other stacks and every rebuilt rung reuse a graph compiled before), one small10m block's "
                  "forward and backward each: the first ~6 s (~2.5 s of Python and the ~20 kernels the variants "
                  "share), each later one ~2.5 s of Python and a few new kernels ~3.5 s: ~31 s; the step profiles of "
                  "9 rungs ~4 s; the Triton attention row's kernels, 4 from the H200 shortlist at ~1.2 s, and its "
                  "steps beside sdpa's (32 in all) ~6 s; the serving ladder on the small10m target and draft cached "
                  "earlier in the capture by 08 and 11 (+30 s when they were not): three compiled decode steps of the"
                  " 6-layer model with CUDA graphs and coordinate-descent tuning, bf16 first (~7 s of Python, ~25 "
                  "kernels compiled and tuned ~11 s) ~18 s, then int8 and int4, which share its attention, norm and "
                  "rope kernels (~7 s of Python and their dequantising matvecs ~3 s) ~10 s each: ~38 s; the "
                  "protocol's timing of the seven rungs (6 s budget plus warm-up) ~10 s, three techniques alone (5 s "
                  "budget) ~8 s, exactness, held-out loss and batching ~10 s: ~123 s, plus 7%"),
    "06": (98.0, "a Triton kernel compile ~1.2 s all-in (results/nvidia-h200/partial-06: 101 s from the memory-wall "
                 "record to the correctness record for ~67 compiles and little else; flash_check/log.txt: ~50 cold "
                 "compiles in ~50 s); start-up ~10 s; 29 kernel compiles (one per kernel, dtype, head dim, causal "
                 "flag, tile config and Triton's divisible-by-16 specialisation of H, N and strides): the "
                 "availability probes 3 (bf16 at d=64, the 2 forward tiles of flash_triton.SHORTLIST, which the GPT "
                 "step's forward reuses; fp32, which the GQA check reuses; no fp16 probe), the memory wall 5 (bf16, "
                 "d=128, 16 heads: 2 forward tiles, dK/dV, dQ, D, reused by the correctness table and the speed "
                 "sweep), the fp32 Triton check 7 (16 x 16 tiles at N=1000, reused by the correctness table's fp32 "
                 "row), the compiler report 3 (in the notebook's process on a GPU: the shortlist's 2 forward tiles "
                 "and the 4-warp one), the correctness table 4 (bf16 causal; flash_triton in fp16 left out), the "
                 "traffic sweep 4 (fixed tiles 16..128 at d=64), the GPT step 3 (bf16 d=64 backward), the speed sweep"
                 " none ~35 s; memory wall to N=32768 (on the H200 naive ran out of memory at 32768; 3.5 x 4BHN^2d ~ "
                 "3.1e13 FLOPs fwd+bwd there, ~80 ms a call at 400 TFLOP/s, 3 calls each for sdpa and Triton and ~8 "
                 "per autotuned forward config) ~3 s; speed sweep N=256, 1024, 4096, 16384 at 16k tokens ~16 s; "
                 "correctness of 8 implementations x 3 dtypes x 2, less flash_triton in fp16 ~8 s; build checks, GQA,"
                 " profiler and traffic sweep ~10 s; the GPT step per kernel (gpt2 at 8x1024, ~13 steps each for "
                 "naive, sdpa and Triton, 6 for the PyTorch-tiled one at ~0.5 s a step) ~10.5 s; the rest ~5 s: ~98 s"),
}


@dataclass
class Outcome:
    """What one notebook of a capture did."""

    notebook: str
    status: str                      # ok | failed | stopped (budget) | skipped (budget) | interrupted | not run
    seconds: float = 0.0
    estimate_s: float | None = None
    records: list[str] = field(default_factory=list)
    note: str = ""


# ---------------------------------------------------------------- which notebooks, in which order

def available_notebooks(folder: Path = NOTEBOOKS_DIR) -> list[str]:
    """Two-digit numbers of the notebooks that exist, in course order."""
    return sorted({p.name[:2] for p in Path(folder).glob("[0-9][0-9]_*.ipynb")})


def load_index(reference_dir: Path) -> dict[str, dict]:
    """`capture.json` of a reference folder ({notebook: {"date": ..., ...}}); {} when absent or unreadable."""
    path = Path(reference_dir) / "capture.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): v for k, v in data.get("notebooks", {}).items() if isinstance(v, dict)} \
        if isinstance(data, dict) else {}


def priority(notebooks: Iterable[str], index: dict[str, dict]) -> list[str]:
    """Notebooks without a reference first (course order), then oldest reference first."""
    notebooks = sorted(set(notebooks))
    missing = [nb for nb in notebooks if not index.get(nb, {}).get("date")]
    dated = sorted((nb for nb in notebooks if nb not in missing), key=lambda nb: (str(index[nb]["date"]), nb))
    return missing + dated


def against_measured(index: dict[str, dict], estimates: dict[str, tuple[float, str]] | None = None,
                     limit: float = OFF_LIMIT) -> dict[str, dict]:
    """Each estimate beside the seconds a capture measured for its notebook (`index`: `load_index` of the folder of
    the GPU the estimates are for, `ESTIMATED_ON`): {notebook: {"estimate_s", "measured_s" (None where no capture
    finished it), "date", "off" (estimate / measured - 1, or None), "flagged" (|off| > `limit`)}}."""
    out = {}
    for nb, (est, _) in sorted((estimates if estimates is not None else ESTIMATES).items()):
        seconds = index.get(nb, {}).get("seconds")
        measured = float(seconds) if isinstance(seconds, (int, float)) and seconds > 0 else None
        off = None if measured is None else est / measured - 1
        out[nb] = {"estimate_s": est, "measured_s": measured, "date": index.get(nb, {}).get("date"), "off": off,
                   "flagged": off is not None and abs(off) > limit}
    return out


def plan_line(nb: str, estimates: dict[str, tuple[float, str]], checked: dict[str, dict]) -> str:
    """`plan`'s line for one notebook: its estimate, the measured seconds beside it where a capture measured it
    (and a flag when they are more than OFF_LIMIT apart), then the estimate's basis."""
    est, basis = estimates.get(nb, (None, "no estimate"))
    c = checked.get(nb)
    if est is None:
        head = f"{nb}: ? s"
    elif c is None or c["measured_s"] is None:
        head = f"{nb}: {est:.0f} s estimated, not measured yet ({ESTIMATED_ON.name})"
    else:
        head = (f"{nb}: {est:.0f} s estimated, {c['measured_s']:.1f} s measured ({ESTIMATED_ON.name}, "
                f"{str(c['date'])[:10]}): estimate {c['off']:+.0%}"
                + (f" OFF BY MORE THAN {OFF_LIMIT:.0%}: fix the estimate" if c["flagged"] else ""))
    return f"{head}  ({basis})"


# The calls that capture the course on lent GPUs of 15 minutes each (results/README.md): per call, the seconds
# `run` gets for references. Window 1: start-up (~60 s), call 1 the smoke pass and the goals (540 s, none left for
# references), call 2 what the window has left; window 2: start-up, then a whole call and what is left.
CALLS: tuple[tuple[str, float], ...] = (("window 1, call 2", 260.0), ("window 2, call 1", 540.0),
                                        ("window 2, call 2", 260.0))
COURSE_LIMIT_S = 1200.0   # the whole course's full profiles on one H200, estimated


def call_plan(order: list[str], estimates: dict[str, tuple[float, str]], budgets: Iterable[float],
              margin_s: float = MARGIN_S) -> tuple[list[list[str]], list[str]]:
    """What successive `run` calls would take if every notebook took its estimate: per call (budget in seconds),
    as `capture` does, each notebook of `order` still waiting that fits in what is left (budget less `margin_s`
    less the estimates already started), in order, skipping one that does not. A notebook a call takes has its
    reference from then on, so it leaves the queue. Returns (the notebooks of each call, those no call took).
    A notebook without an estimate is never started (as `capture` would start it on a budget, the plan cannot)."""
    waiting, calls = list(order), []
    for budget in budgets:
        left, took = float(budget) - margin_s, []
        for nb in waiting:
            est = estimates.get(nb, (None, ""))[0]
            if est is not None and est <= left:
                took.append(nb)
                left -= est
        waiting = [nb for nb in waiting if nb not in took]
        calls.append(took)
    return calls, waiting


def call_plan_lines(order: list[str], estimates: dict[str, tuple[float, str]],
                    calls: tuple[tuple[str, float], ...] = CALLS) -> list[str]:
    """`plan`'s closing lines: each call of `calls` with the notebooks it would take and their estimated seconds,
    then what no call takes (or that every notebook in `order` is taken)."""
    taken, left = call_plan(order, estimates, [b for _, b in calls])
    out = []
    for (name, budget), nbs in zip(calls, taken):
        secs = sum(estimates[nb][0] for nb in nbs)
        out.append(f"{name} ({budget:.0f} s for references): {' '.join(nbs) or 'none'}"
                   + (f", {secs:.0f} s estimated" if nbs else ""))
    out.append(f"left for a later window: {' '.join(left)}" if left else
               f"every notebook above is captured in these {len(calls)} calls")
    return out


# ---------------------------------------------------------------- packing what finished

class Packer:
    """Keeps `capture-<k>.tgz` files in `out` up to date: each rewrite is atomic (temp file, rename)."""

    def __init__(self, out: Path, work: Path, limit: int = PACK_LIMIT, max_packs: int = MAX_PACKS):
        self.out, self.work, self.limit, self.max_packs = Path(out), Path(work), limit, max_packs
        self.packs: list[list[tuple[Path, str]]] = [[]]  # per pack: (file, name inside the archive)

    def _write(self, k: int) -> Path:
        buf = io.BytesIO()  # a pack is at most about `limit` bytes, so it is built in memory
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            for path, arcname in self.packs[k]:
                tar.add(path, arcname=arcname)
        return write_atomic(self.out / f"capture-{k + 1}.tgz", buf.getvalue(), mode=0o644)  # readable by all

    def add(self, files: list[tuple[Path, str]], manifest: dict) -> Path:
        """Add one notebook's files (and the updated manifest) to the current pack, or start a new one."""
        size = sum(p.stat().st_size for p, _ in files)
        current = self.packs[-1]
        current_size = sum(p.stat().st_size for p, name in current if name != "manifest.json")
        if current and current_size + size > self.limit and len(self.packs) < self.max_packs:
            self.packs.append([])
        manifest_path = self.work / "manifest.json"
        manifest_path.write_text(json.dumps(manifest, indent=2))
        pack = [item for item in self.packs[-1] if item[1] != "manifest.json"] + files
        self.packs[-1] = pack + [(manifest_path, "manifest.json")]
        return self._write(len(self.packs) - 1)


# ---------------------------------------------------------------- running one notebook

def _records(work: Path) -> list[Path]:
    """The records a runner wrote under `work` (its run folder's results/)."""
    return sorted(p for p in Path(work).rglob("results/*.json") if p.is_file())


def run_notebook(nb: str | list[str], work: Path, profile: str, limit_s: float, log: Callable[[str], None] = print,
                 notebooks_dir: Path = NOTEBOOKS_DIR, stop: Stop | None = None, jobs: int = 1) -> tuple[str, str]:
    """Run one notebook (or a list of them, `jobs` at a time) through the course runner (`--out work`) in its
    own process group, stopped after `limit_s` seconds, or when `stop.why` names a signal (passed on to the
    runner).

    A stopped runner gets RUNNER_GRACE_S to stop its worker and kernel and write its summary; then
    whatever is left of its group, and every process ever seen below it, is killed.
    Returns (status, note): "ok", "failed" (the runner's exit status), "stopped" (over the limit) or
    "interrupted" (a signal).
    """
    cmd = [sys.executable, "-m", "helpers.course.run", *([nb] if isinstance(nb, str) else nb), "--profile", profile,
           "--out", str(work), "--notebooks-dir", str(notebooks_dir)]
    if not isinstance(nb, str):  # a pass over several notebooks (gpu_smoke) wants their statuses, not a report
        cmd += ["--no-report", "--jobs", str(jobs)]
    with open(work / "run.log", "w") as fh:
        proc = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    seen, start, next_watch = Descendants(proc.pid), time.monotonic(), 0.0
    result = None
    try:
        while proc.poll() is None and result is None:
            if time.monotonic() >= next_watch:  # a /proc scan, once a second: the worker and kernel
                seen.watch()
                next_watch = time.monotonic() + 1.0
            if stop is not None and stop.why:
                result = "interrupted", f"interrupted by {stop.why}; see run.log"
                signum = stop.signum
            elif time.monotonic() - start > max(1.0, limit_s):
                result = "stopped", f"stopped after {limit_s:.0f} s: the budget ran out"
                signum = signal.SIGTERM
            else:
                time.sleep(0.2)
        if result is not None:  # the runner stops its workers and kernels on SIGINT and SIGTERM
            seen.watch()
            proc.send_signal(signum)
            try:
                proc.wait(timeout=RUNNER_GRACE_S)
            except subprocess.TimeoutExpired:
                pass
    finally:  # whatever of the group is left, and every process seen below the runner
        seen.watch()
        end_group(proc.pid, lambda: proc.poll() is None, 0.0)
        proc.wait()
        seen.kill()
    if result is not None:
        return result
    return ("ok", "") if proc.returncode == 0 else ("failed", f"runner exit status {proc.returncode}; see run.log")


def capture(notebooks: list[str], out: Path, budget_s: float, *, profile: str = "full",
            estimates: dict[str, tuple[float, str]] = ESTIMATES,
            runner: Callable[..., tuple[str, str]] = run_notebook,
            clock: Callable[[], float] = time.monotonic, log: Callable[[str], None] = print,
            margin_s: float = MARGIN_S, work: Path | None = None, stop: Stop | None = None) -> list[Outcome]:
    """Run `notebooks` in the given order within `budget_s`, packing each as it finishes into `out`.

    `work` (default: a new temporary folder) holds the runs themselves; only packs go into `out`,
    so the device tool's file limit is never passed by the run folders. Each notebook runs in its
    own run folder and so measures its own ceilings, under the conditions of its own run. Once
    `stop.why` names a signal (the runner, given the same `stop`, has stopped its notebook), the
    notebooks not started are "not run".
    """
    start = clock()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(work) if work is not None else Path(tempfile.mkdtemp(prefix="capture-"))
    work.mkdir(parents=True, exist_ok=True)
    packer = Packer(out, work)
    outcomes: list[Outcome] = []
    packed = 0  # how many notebooks the manifest in the packs names
    manifest = {"started": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                "profile": profile, "budget_s": budget_s, "gpu": gpu_facts(), "notebooks": {}}
    cannot_pack = ""  # why a pack could not be written (a full --out): the notebooks after it are not run
    for nb in notebooks:
        estimate = estimates.get(nb, (None, ""))[0]
        left = budget_s - margin_s - (clock() - start)
        if cannot_pack or (stop is not None and stop.why):
            o = Outcome(nb, "not run", 0.0, estimate, note=f"not run ({stop.why if stop and stop.why else 'no pack could be written'})")
            outcomes.append(o)
            manifest["notebooks"][nb] = asdict(o)
            continue
        if left <= 0 or (estimate is not None and estimate > left):
            note = f"estimated {estimate:.0f} s > {max(left, 0):.0f} s left" if estimate is not None else "no time left"
            o = Outcome(nb, "skipped", 0.0, estimate, note=note)
            log(f"{nb}: skipped, {note}")
            outcomes.append(o)
            manifest["notebooks"][nb] = asdict(o)
            continue
        nb_work = work / nb
        nb_work.mkdir(parents=True, exist_ok=True)
        log(f"{nb}: running (estimate {'?' if estimate is None else f'{estimate:.0f}'} s, {left:.0f} s left)")
        t0 = clock()
        status, note = runner(nb, nb_work, profile, left, log=log)
        seconds = clock() - t0
        records = _records(nb_work)
        o = Outcome(nb, status, round(seconds, 1), estimate, [p.stem for p in records], note)
        outcomes.append(o)
        manifest["notebooks"][nb] = asdict(o)
        files = [(p, f"{nb}/results/{p.name}") for p in records]
        files += [(p, f"{nb}/{p.relative_to(nb_work)}") for p in sorted(nb_work.rglob("*"))
                  if p.is_file() and p.suffix in (".ipynb", ".log", ".md") and ".ipynb_checkpoints" not in p.parts]
        try:
            pack = packer.add(files, manifest)
        except OSError as err:  # the run is kept in `work` and named; nothing more is started
            cannot_pack = write_problem(err, out / f"capture-{len(packer.packs)}.tgz", work)
            log(f"{nb}: {status} in {seconds:.1f} s; {cannot_pack}")
            continue
        packed = len(manifest["notebooks"])
        est = f"{estimate:.0f} s estimated" if estimate is not None else "no estimate"
        log(f"{nb}: {status} in {seconds:.1f} s ({est}); {len(records)} record(s) -> {pack.name}"
            + (f"; {note}" if note else ""))
    if packer.packs[-1] and packed < len(manifest["notebooks"]) and not cannot_pack:
        packer.add([], manifest)  # the last pack's manifest names the notebooks skipped or not run after it too
    log(summary(outcomes))
    if cannot_pack:
        log(cannot_pack)
        for o in outcomes:
            if o.status == "ok":
                o.note = (o.note + "; " if o.note else "") + "not packed"
                o.status = "not packed"
    return outcomes


def summary(outcomes: list[Outcome]) -> str:
    """A table of a capture: notebook, status, measured and estimated seconds, records."""
    return table(["notebook", "status", "measured s", "estimated s", "records", "note"],
                 [[o.notebook, o.status, f"{o.seconds:.1f}", "-" if o.estimate_s is None else f"{o.estimate_s:.0f}",
                   len(o.records), o.note] for o in outcomes])


def gpu_facts() -> dict[str, str]:
    """GPU name, driver, CUDA, torch, Triton and Python versions of this machine (what is knowable)."""
    facts = {"python": sys.version.split()[0]}
    try:
        import torch  # optional: the capture's own machinery runs without torch (gpu_facts says what is there)

        facts["torch"] = torch.__version__
        facts["cuda"] = torch.version.cuda or "none"
        facts["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none (CPU)"
    except ImportError:
        pass
    try:
        import triton  # optional: not installed on every machine (macOS, CPU-only wheels)

        facts["triton"] = triton.__version__
    except ImportError:
        facts["triton"] = "not installed"
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        if smi.returncode == 0 and smi.stdout.strip():
            driver, memory = (s.strip() for s in smi.stdout.splitlines()[0].split(",", 1))
            facts["driver"], facts["memory"] = driver, memory
    except (OSError, subprocess.SubprocessError, ValueError):
        pass
    return facts


# ---------------------------------------------------------------- importing what came back

def slug_of_gpu(device: str) -> str:
    """'NVIDIA H200' -> 'nvidia-h200', any CPU -> 'cpu' (as results.device_slug names this machine's folder)."""
    return "cpu" if device.startswith("CPU") else slug(device)


class BadPack(ValueError):
    """A pack that cannot be read: not a gzip'd tar, cut short, or holding torn JSON (the message names it)."""


RECORD_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,200}")


def record_name(name, where: str) -> str:
    """`name` when it is a plain record name (letters, digits, '.', '_', '-'; no folder, no '..'), which a
    reference folder may join to its own path; else BadPack naming `where`."""
    if not isinstance(name, str) or not RECORD_NAME.fullmatch(name) or ".." in name:
        raise BadPack(f"{where}: {name!r} is not a record name (a plain file name); nothing imported")
    return name


def checked_manifest(manifest: dict, where: str) -> dict:
    """The manifest when everything the import uses is there and well-formed: `started` (text), and per notebook
    (two digits) a `status`, and for an ok one `seconds` (a number), `estimate_s` (a number or null) and
    `records` (plain names). Else BadPack naming the first fault, before anything is written."""
    if not isinstance(manifest.get("started"), str):
        raise BadPack(f"{where}: manifest.json has no 'started' time; nothing imported")
    for nb, info in manifest["notebooks"].items():
        if not (isinstance(nb, str) and len(nb) == 2 and nb.isdigit()) or not isinstance(info, dict):
            raise BadPack(f"{where}: manifest.json names {nb!r}, not a notebook's two digits; nothing imported")
        if info.get("status") != "ok":
            continue
        number = is_finite_number
        if not number(info.get("seconds")) or not (info.get("estimate_s") is None or number(info["estimate_s"])):
            raise BadPack(f"{where}: manifest.json gives notebook {nb} no 'seconds' (or a bad 'estimate_s'); "
                          "nothing imported")
        if not isinstance(info.get("records"), list):
            raise BadPack(f"{where}: manifest.json lists no records for notebook {nb}; nothing imported")
        for name in info["records"]:
            record_name(name, f"{where}: manifest.json, notebook {nb}")
    return manifest


def read_pack(pack: Path) -> dict[str, bytes]:
    """The regular files of one capture pack, {name inside the archive: bytes}, without absolute or '..' names.

    Raises BadPack naming the file and what is wrong (not gzip'd, cut short, not a tar archive)."""
    members = {}
    if not Path(pack).is_file():
        raise BadPack(f"{pack}: no such file")
    try:
        with tarfile.open(pack, "r:gz") as tar:
            for m in tar.getmembers():
                if not m.isfile() or m.name.startswith("/") or ".." in Path(m.name).parts:
                    continue
                members[m.name] = tar.extractfile(m).read()
    except EOFError as err:
        raise BadPack(f"{pack}: cut short, not a whole capture pack ({err})") from None
    except (tarfile.TarError, OSError, zlib.error) as err:  # gzip.BadGzipFile is an OSError
        raise BadPack(f"{pack}: not a capture pack (a gzip'd tar archive): {err}") from None
    return members


def import_packs(packs: list[Path], into: Path = REPO_ROOT / "results") -> Path:
    """Unpack capture packs into `into/<device>/`: records, capture.json and README.md. Returns that folder.

    A notebook's older records are replaced by the new ones as a unit; notebooks that did not
    finish ok keep their previous reference. Every pack is read and checked before anything is
    written. Raises BadPack for a pack that cannot be read (cut short, not gzip'd, torn JSON inside),
    ValueError when the packs hold no manifest or no records, or records from more than one device.
    """
    manifest, records = None, {}
    for pack in packs:
        for name, data in read_pack(pack).items():
            try:
                doc = json.loads(data) if name == "manifest.json" or "/results/" in name else None
            except ValueError as err:
                raise BadPack(f"{pack}: {name} is not valid JSON ({err})") from None
            if name == "manifest.json":
                if not isinstance(doc, dict) or not isinstance(doc.get("notebooks"), dict):
                    raise BadPack(f"{pack}: manifest.json is not a capture manifest (no notebooks)")
                if manifest is None or len(doc["notebooks"]) >= len(manifest["notebooks"]):
                    manifest = doc
            elif doc is not None:
                records[name] = doc
    if manifest is None:
        raise ValueError(f"no manifest.json in {', '.join(map(str, packs))}: not a capture pack")
    devices = {r.get("device") for r in records.values() if isinstance(r, dict)}
    if not records:
        raise ValueError("the packs hold no records: nothing finished")
    if len(devices) != 1:
        raise ValueError(f"records from {len(devices)} devices ({devices}); import one device at a time")
    device = devices.pop()
    checked_manifest(manifest, ", ".join(map(str, packs)))
    for name in records:  # a record lands as its own file name: a record's, never the folder's own files
        base = record_name(Path(name).name, f"{name} in the packs")
        if not base.endswith(".json") or base in ("capture.json", "goals.json", "gpu-smoke.json"):
            raise BadPack(f"{name} in the packs: not a record's file name; nothing imported")
    if not isinstance(device, str):
        raise BadPack(f"the records name no device ({device!r}); nothing imported")
    target = Path(into) / slug_of_gpu(device)  # ValueError for a name that gives no folder
    index = load_index(target)
    for nb, info in index.items():  # names the import may delete: an edited capture.json reaches no further
        for old in info.get("records", []):
            record_name(old, f"{target / 'capture.json'}, notebook {nb}")
    target.mkdir(parents=True, exist_ok=True)
    for nb, info in manifest["notebooks"].items():
        if info.get("status") != "ok":
            continue
        for old in index.get(nb, {}).get("records", []):
            (target / f"{old}.json").unlink(missing_ok=True)
        for name, rec in records.items():
            if name.startswith(f"{nb}/results/"):
                write_atomic(target / Path(name).name, json.dumps(rec, indent=2) + "\n")
        index[nb] = {"date": manifest["started"], **{k: info[k] for k in ("seconds", "estimate_s", "records")}}
    facts = manifest.get("gpu", {})
    write_atomic(target / "capture.json", json.dumps({"device": device, "gpu": facts, "notebooks": index},
                                                     indent=2, sort_keys=True) + "\n")
    write_atomic(target / "README.md", _readme(device, facts, manifest, index) + kept_sections(target / "README.md"))
    return target


SMOKE_MARK = "<!-- the smoke pass: tools.capture.gpu_smoke import writes from here on -->"
GOALS_MARK = "<!-- the goals: tools.capture.capture import writes from here on -->"
MARKS = (SMOKE_MARK, GOALS_MARK)  # the generated sections at a reference README's end, in this order


def _split_sections(text: str) -> tuple[str, dict[str, str]]:
    """A README's text before its first mark, and each marked section (from its mark to the next mark)."""
    found = sorted((text.find(m), m) for m in MARKS if m in text)
    if not found:
        return text, {}
    ends = [at for at, _ in found[1:]] + [len(text)]
    return text[:found[0][0]], {m: text[at:end].rstrip("\n") + "\n" for (at, m), end in zip(found, ends)}


def kept_sections(readme: Path) -> str:
    """What a reference folder's README.md holds from its first mark on (the smoke pass's table, which
    `tools.capture.gpu_smoke.import_smoke` writes, and the goals', which `goals_record.import_goals` writes), so that
    rewriting the README keeps them; "" when none."""
    try:
        text = Path(readme).read_text()
    except OSError:
        return ""
    _, sections = _split_sections(text)
    return "".join("\n" + sections[m] for m in MARKS if m in sections)


def earlier_record(path: Path, key: str, kind: type) -> dict | None:
    """The record already imported at `path` (a gpu-smoke.json or goals.json), for a later import to merge over:
    None when it is absent, torn, or has no `key` of type `kind` (such a record is replaced, not merged)."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get(key), kind) else None


def set_section(readme: Path, mark: str, section: str, title: str) -> None:
    """Write `section` (which starts with `mark`) into README.md at `readme`, in place of the section under that
    mark, keeping the rest; a README that is not there starts with `title`."""
    text = readme.read_text() if readme.is_file() else f"{title}\n"
    head, sections = _split_sections(text)
    sections[mark] = section
    write_atomic(readme, head.rstrip("\n") + "\n" + "".join("\n" + sections[m] for m in MARKS if m in sections))


def _readme(device: str, facts: dict, manifest: dict, index: dict) -> str:
    """The README.md of a reference folder: the GPU and its software, and per notebook when it was captured."""
    rows = [[nb, info["date"], f"{info.get('seconds', 0):.0f}",
             "-" if info.get("estimate_s") is None else f"{info['estimate_s']:.0f}", len(info.get("records", []))]
            for nb, info in sorted(index.items())]
    return (f"# Reference: {device}\n\n"
            f"Records of the course notebooks in the `{manifest.get('profile', 'full')}` profile, captured with "
            f"`python -m tools.capture.capture` and imported with `python -m tools.capture.capture import`.\n\n"
            f"- GPU: {facts.get('gpu', device)}, {facts.get('memory', 'memory not read')}\n"
            f"- driver {facts.get('driver', 'not read')}, CUDA {facts.get('cuda', '?')}, torch {facts.get('torch', '?')}, "
            f"Triton {facts.get('triton', '?')}, Python {facts.get('python', '?')}\n"
            f"- last capture started {manifest.get('started')}\n\n"
            "Per notebook: when it was captured, its measured seconds and the estimate the capture planned with.\n\n"
            "```\n" + table(["notebook", "captured", "seconds", "estimated s", "records"], rows) + "\n```\n")


# ---------------------------------------------------------------- command line

def main(argv: list[str] | None = None) -> int:
    """`plan`, `run` or `import` (see the module docstring); exit status 0, 1 (a notebook failed or was
    stopped, an import failed), 2 (a usage error), 130 / 143 (SIGINT / SIGTERM stopped the capture)."""
    prog = "python -m tools.capture.capture"
    parser = OneLineParser(prog=prog, description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("plan", "run"):
        p = sub.add_parser(name)
        p.add_argument("notebooks", nargs="*", help="two-digit numbers (default: every notebook)")
        p.add_argument("--budget-s", type=positive_argument(float), default=540.0,
                       help=f"wall-clock budget in seconds, above {MARGIN_S:.0f} (default 540)")
        p.add_argument("--references", type=Path, default=None,
                       help="reference folder whose capture.json sets the order (default: results/<this device> "
                            f"for run, results/{ESTIMATED_ON.name} for plan)")
        p.add_argument("--notebooks-dir", type=Path, default=NOTEBOOKS_DIR,
                       help="where the notebooks are (default: notebooks/)")
        if name == "run":
            p.add_argument("--out", type=Path, required=True, help="folder for the packs (the device tool's $OUT)")
            p.add_argument("--profile", default="full", choices=("smoke", "full"))
    p = sub.add_parser("import")
    p.add_argument("packs", nargs="+", type=Path, help="capture-*.tgz; a goals.json beside them (or named here) "
                   "is copied to results/<gpu>/goals.json")
    p.add_argument("--into", type=Path, default=REPO_ROOT / "results")
    args = parser.parse_args(argv)
    if args.command == "import":
        return _import(args)
    known = available_notebooks(args.notebooks_dir)
    if not known:
        print(f"{prog} {args.command}: no notebooks (NN_*.ipynb) in {args.notebooks_dir}", file=sys.stderr)
        return 2
    bad = [nb for nb in args.notebooks if nb not in known]
    if bad:
        print(f"unknown notebook(s) {bad}; these exist: {' '.join(known)}")
        return 2
    if args.budget_s <= MARGIN_S:
        print(f"{prog} {args.command}: --budget-s {args.budget_s:g} must exceed the {MARGIN_S:.0f} s kept for packing",
              file=sys.stderr)
        return 2
    if args.references is None:  # plan: for the GPU the estimates are for; run: for the GPU it runs on
        args.references = ESTIMATED_ON if args.command == "plan" else REPO_ROOT / "results" / device_slug()
    order = priority(args.notebooks or known, load_index(args.references))
    if args.command == "plan":
        checked = against_measured(load_index(ESTIMATED_ON))
        for nb in order:
            print(plan_line(nb, ESTIMATES, checked))
        total = sum(ESTIMATES.get(nb, (0.0, ""))[0] for nb in order)
        flagged = [nb for nb in order if checked.get(nb, {}).get("flagged")]
        print(f"total {total:.0f} s of these notebooks, against one call's budget of {args.budget_s:.0f} s "
              f"({MARGIN_S:.0f} s kept for packing)"
              + (f"; estimates off their measured seconds by more than {OFF_LIMIT:.0%}: {' '.join(flagged)}"
                 if flagged else ""))
        course = sum(est for est, _ in ESTIMATES.values())
        print(f"the whole course: {course:.0f} s estimated, limit {COURSE_LIMIT_S:.0f} s")
        for line in call_plan_lines(order, ESTIMATES):
            print(line)
        return 0
    problem = folder_problem(args.out)
    if problem:
        print(f"{prog} run: --out {args.out} cannot be written: {problem}", file=sys.stderr)
        return 2
    try:
        work = Path(tempfile.mkdtemp(prefix="capture-"))
    except OSError as err:
        print(f"{prog} run: cannot make a temporary folder for the runs: {err.strerror or err}", file=sys.stderr)
        return 2
    with Stop("the running notebook's runner, its worker and kernel") as stop:
        runner = functools.partial(run_notebook, notebooks_dir=args.notebooks_dir, stop=stop)
        outcomes = capture(order, args.out, args.budget_s, profile=args.profile, runner=runner, work=work, stop=stop)
    return stop.code(exit_status(outcomes))


def _import(args) -> int:
    """`import`: the packs (all read and checked before anything is written), then the goals.json."""
    for pack in args.packs:
        if not pack.is_file():
            print(f"no such pack: {pack}")
            return 2
    goals = [p for p in args.packs if p.name == "goals.json"]
    packs = [p for p in args.packs if p.name != "goals.json"]
    goals = goals or [p.parent / "goals.json" for p in packs[:1] if (p.parent / "goals.json").is_file()]
    target, status = None, 0
    try:
        if packs:
            target = import_packs(packs, args.into)
            print(f"imported into {target}")
    except BadPack as err:  # a torn pack: nothing is imported, the goals neither
        print(f"import failed: {err}; nothing imported")
        return 1
    except ValueError as err:  # no notebook finished: the goals may still have
        print(f"import failed: {err}")
        status = 1
    except OSError as err:
        print(f"import failed: cannot write {err.filename or args.into}: {err.strerror or err}")
        return 1
    from tools.capture.goals_record import import_goals  # it imports this module: here, not at the top
    try:
        for g in goals:
            print(f"goals imported into {import_goals(g, args.into, None if target is None else target.name)}")
    except ValueError as err:
        print(f"goals import failed: {err}")
        status = 1
    except OSError as err:
        print(f"goals import failed: cannot write {err.filename or args.into}: {err.strerror or err}")
        status = 1
    return status


def exit_status(outcomes: list[Outcome]) -> int:
    """0 when every notebook finished ok or was skipped for the budget (by design: a later call takes it),
    1 when one failed or was stopped."""
    return 0 if all(o.status in ("ok", "skipped") for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
