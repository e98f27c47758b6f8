"""Notebook 06's measurements: the parameters, correctness against fp32 naive attention, the traffic sentence,
the course GPT per kernel and the panel (the speed sweep and the memory wall are `flash_speed_lab`'s).

* `resolve_parameters`: every parameter of the notebook validated at once, None meaning "the profile's
  default" (MEMORY_BUDGET_GB keeps its own documented values, see there); `use_autotune`: which
  configurations the Triton kernels' autotuner tries (fewer configurations, fewer compiles).
* `outputs_and_grads`, `compare`, `RULE`, `FP32_TOL`: one implementation's O, dQ, dK, dV against naive
  attention in fp32, by flash-attn's test rule; `correctness`: every implementation x precision x
  causal flag so, and the combinations that could *not* be checked here, each with its reason.
* `NO_TRITON`: stands in for `triton` where it is not installed, so the notebook's kernel cells still define them.
* `traffic_verdict`: the sentence about the tile-size crossover, generated from the run's numbers.
* `gpt_kernels`: one training step of the course GPT per attention kernel (loss, time, bytes kept).
* `flash_panel`: the instructor panel (traffic against tile size, memory kept against N).

The method itself is `helpers.attention.kernels` (and `flash_triton` for the Triton kernels);
the maintainers' `python -m tools.capture.gpu_check` runs `compare`, `speed` and `goal` at a GPU's sizes.
"""
from __future__ import annotations

import numbers
from typing import Any

import torch

from helpers.attention import kernels
from helpers.gpt.model import PRESETS, naive_attention
from helpers.measure import bench, hardware, memory, params
from helpers.show import plots
from helpers.show.tables import table

DTYPE_NAMES = ("fp32", "fp16", "bf16")


def _head_dims(name: str, values: Any) -> list:
    values = params.positives(name, values)
    for d in values:
        if not 16 <= d <= 128:
            raise ValueError(f"{name}={values!r}: entry {d!r} is not allowed; the kernels take ints from 16 to 128")
    return values


def _budget(value: Any, device: str) -> float | None:
    """MEMORY_BUDGET_GB: "auto" -> 0.05 GiB on a CPU (never fill the machine's RAM), None on CUDA (run to
    the out-of-memory error); None -> no budget anywhere; a positive number (not NaN) -> that many GiB."""
    if value == "auto":
        return 0.05 if device == "cpu" else None
    if value is None:
        return None
    value = float(params.positive("MEMORY_BUDGET_GB", value, numbers.Real))
    if value != value:  # NaN: every comparison with it is False, so nothing would be held back
        raise ValueError("MEMORY_BUDGET_GB=nan is not a number of GiB; give a positive number, or None for no budget")
    return value


def triton_compiled(device: str) -> bool:
    """Whether the traffic sweep tiles with the compiled Triton kernel here (a CUDA device, Triton installed and
    not interpreted); otherwise it tiles with the PyTorch version, which takes any positive tile size."""
    return device == "cuda" and not kernels.TRITON_MISSING and not kernels.flash_triton.INTERPRETED


def _block_sizes(device: str):
    """BLOCK_SIZES: positive ints; where the compiled Triton kernel tiles, powers of two from 16 (tl.arange
    spans a power of two, and tl.dot needs at least 16 rows)."""
    def check(name: str, values: Any) -> list:
        values = params.positives(name, values)
        if triton_compiled(device):
            for b in values:
                if b < 16 or b & (b - 1):
                    raise ValueError(f"{name}={values!r}: entry {b!r} cannot be a query tile of the compiled Triton "
                                     "kernel, whose tiles are powers of two from 16 (16, 32, 64, 128)")
        return values
    return check


def resolve_parameters(S: params.Setup, *, DTYPE, SEQ_LENS, HEAD_DIMS, TOKENS, D_MODEL, MEMORY_SEQ_LENS,
                       MEMORY_BUDGET_GB, BLOCK_SIZES, PYTORCH_MAX_N, GPT_PRESET, GPT_BATCH, REPS,
                       AUTOTUNE) -> dict:
    """Validate every parameter of notebook 06 (ValueError naming the first bad one) and fill in defaults:
    {NAME: value} for every parameter, plus TORCH_DTYPE (DTYPE's torch dtype), BF16_OK (whether this device has
    bf16 units) and WARMUP (untimed calls per point, by profile).

    DTYPE "auto" is bf16 on CUDA (fp16 on a GPU without bf16 units), fp32 on a CPU; bf16 asked for on a
    GPU without bf16 units becomes fp16, with a printed sentence. Where the compiled Triton kernel tiles
    the traffic sweep (`triton_compiled`), BLOCK_SIZES must be powers of two from 16. AUTOTUNE names the
    autotuner's configuration lists (`use_autotune` applies it).
    """
    params.choose("DTYPE", DTYPE, ("auto", *DTYPE_NAMES))
    bf16_ok = hardware.capabilities()["bf16"]
    cuda = S.device == "cuda"
    dtype = {"auto": ("bf16" if bf16_ok else "fp16") if cuda else "fp32"}.get(DTYPE, DTYPE)
    if dtype == "bf16" and cuda and not bf16_ok:
        print("this GPU has no bf16 units (a T4?), so the sweeps run in fp16 instead of the requested bf16")
        dtype = "fp16"
    gib = torch.cuda.get_device_properties(0).total_memory / 2**30 if cuda else None
    R = S.resolve
    return dict(
        DTYPE=dtype, TORCH_DTYPE=hardware.torch_dtype(dtype), BF16_OK=bf16_ok,
        # full: N four-fold apart, from short sequences (naive's N x N matrices small) to the FlashAttention-2
        # paper's longest, so the sweep shows where the fused kernels pull ahead; the goal's N >= 2048: 4096, 16384
        SEQ_LENS=R("SEQ_LENS", SEQ_LENS, smoke=[64, 128, 256], full=[256, 1024, 4096, 16384], check=params.positives),
        # full: d=128 only (the head dim of the kernel's goal), so the whole course fits one lent-GPU
        # window; HEAD_DIMS=[64, 128] adds the paper's other head dim at about twice the compile time
        # smoke on a GPU at 128 too: the 128 class has kernels of its own (8-warp tiles); 64 is checked elsewhere
        HEAD_DIMS=R("HEAD_DIMS", HEAD_DIMS, smoke=[128] if cuda else [64], full=[128], check=_head_dims),
        TOKENS=R("TOKENS", TOKENS, smoke=512, full=16384, check=params.positive),
        D_MODEL=R("D_MODEL", D_MODEL, smoke=256, full=2048, check=params.positive),
        MEMORY_SEQ_LENS=R("MEMORY_SEQ_LENS", MEMORY_SEQ_LENS, smoke=[256, 512, 1024, 2048], full=wall_sizes(gib),
                          check=params.positives),
        MEMORY_BUDGET_GB=_budget(MEMORY_BUDGET_GB, S.device),
        BLOCK_SIZES=R("BLOCK_SIZES", BLOCK_SIZES, smoke=[16, 32, 64, 128, 256], full=[16, 32, 64, 128],
                      check=_block_sizes(S.device)),
        PYTORCH_MAX_N=R("PYTORCH_MAX_N", PYTORCH_MAX_N, smoke=256, full=1024, check=params.positive),
        GPT_PRESET=R("GPT_PRESET", GPT_PRESET, smoke="tiny", full="gpt2",
                     check=lambda name, v: params.choose(name, v, PRESETS)),
        GPT_BATCH=R("GPT_BATCH", GPT_BATCH, smoke=2, full=8 if gib is None or gib >= 24 else 2,  # 2 on a T4
                    check=params.positive),
        REPS=R("REPS", REPS, smoke=5, full=10, check=params.positive),  # >= 3 rounds: a median and quartiles
        WARMUP=S.pick(smoke=1, full=3),
        AUTOTUNE=R("AUTOTUNE", AUTOTUNE, smoke="shortlist", full="shortlist",
                   check=lambda name, v: params.choose(name, v, AUTOTUNE_CHOICES)),
    )


AUTOTUNE_CHOICES = ("shortlist", "all")  # the keys of flash_triton.CONFIG_LISTS
WALL_GIB = 150  # GPU memory above which naive attention may pass N = 32768 (16 heads, bf16), so the wall needs 65536


def wall_sizes(gib: float | None) -> list[int]:
    """The full profile's memory-wall sizes for a GPU with `gib` GiB (None: no GPU): N doubling from 4096 to
    32768, where each N x N buffer of 16 bf16 heads is 32 GiB and naive's forward and backward ran out of an
    H200's 140 GiB (results/nvidia-h200/partial-06); a GPU with more than WALL_GIB adds 65536, past any GPU."""
    return [4096, 8192, 16384, 32768] + ([65536] if gib is not None and gib > WALL_GIB else [])


def use_autotune(which: str) -> str:
    """Have the course Triton kernels' autotuner try flash_triton.CONFIG_LISTS[which] ("shortlist" or "all")
    from now on, and say what it tries, in one sentence (or why nothing is autotuned here). Raises ValueError
    for another name."""
    params.choose("AUTOTUNE", which, AUTOTUNE_CHOICES)
    if kernels.TRITON_MISSING:
        return f"Triton's autotuner: not used ({kernels.TRITON_MISSING})"
    ft = kernels.flash_triton
    if not ft.use_configs(which):
        return "Triton's autotuner: not used here (the interpreter runs each kernel with fixed tiles)"
    count = lambda lists: {k: len(lists[k][128]) for k in ("forward", "dkdv", "dq")}  # noqa: E731
    n, every = count(ft.CONFIG_LISTS[which]), count(ft.AUTOTUNE)
    text = (f"Triton's autotuner tries {n['forward']} forward, {n['dkdv']} dK/dV and {n['dq']} dQ tile configuration(s) "
            f"per head-dim class, so each (dtype, head dim, causal flag) compiles {sum(n.values())} kernels")
    if which == "shortlist":
        text += (f": flash_triton.SHORTLIST, the tiles an H200 picked at every shape it tuned; AUTOTUNE=\"all\" tries "
                 f"every configuration of flash_triton.AUTOTUNE ({sum(every.values())} kernels per case)")
    return text


# ---------------------------------------------------------------- the kernel cells without Triton

class _NoTriton:
    """Stands in for `triton` and `triton.language` where Triton is not installed, so that notebook 06's kernel
    cells still define their functions (never launched there): `jit` returns the function unchanged and every
    other attribute (`constexpr` in the signatures) is None."""

    @staticmethod
    def jit(fn):
        return fn

    def __getattr__(self, name: str) -> None:
        return None


NO_TRITON = _NoTriton()


# ---------------------------------------------------------------- correctness

RULE = ("fp16/bf16: each of O, dQ, dK, dV has a max error at most 2x that of naive attention in the same "
        "precision, plus 1e-5 (the flash-attn test suite's rule); fp32: within rtol=1e-5, atol=2e-5 of the reference")
FP32_TOL = dict(rtol=1e-5, atol=2e-5)


def outputs_and_grads(fn, q, k, v, do) -> list[torch.Tensor]:
    """[fn(q, k, v), dq, dk, dv] for the upstream gradient do, computed on fresh leaves."""
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = fn(q, k, v)
    return [out, *torch.autograd.grad(out, (q, k, v), do.to(out.dtype))]


def compare(impl: str, q, k, v, do, is_causal: bool) -> dict:
    """Max errors of `impl`'s O, dQ, dK, dV against naive attention in fp32, and whether they pass RULE.

    For fp16/bf16 inputs `naive` holds naive attention's own errors in that precision, the yardstick.
    """
    up = [t.float() for t in (q, k, v, do)]
    ref = outputs_and_grads(lambda q, k, v: naive_attention(q, k, v, is_causal), *up)
    got = outputs_and_grads(lambda q, k, v: kernels.attention(q, k, v, impl, is_causal), q, k, v, do)
    errors = [(a.float() - b).abs().max().item() for a, b in zip(got, ref)]
    if q.dtype == torch.float32:
        ok = all(torch.allclose(a, b, **FP32_TOL) for a, b in zip(got, ref))
        return {"errors": errors, "naive": None, "passed": ok}
    mine = outputs_and_grads(lambda q, k, v: naive_attention(q, k, v, is_causal), q, k, v, do)
    naive = [(a.float() - b).abs().max().item() for a, b in zip(mine, ref)]
    return {"errors": errors, "naive": naive, "passed": all(e <= 2 * b + 1e-5 for e, b in zip(errors, naive))}


OURS = ("naive", "flash_pytorch", "flash_triton")  # the course's own code: a failure stops the notebook


def correctness(device: str, shape: tuple, bf16_ok: bool, seed: int = 2, *, shapes: dict | None = None,
                skip: dict | None = None) -> tuple[list, dict, list]:
    """compare() every implementation that runs here, per precision and causal flag, on `shape` (B, H, N, d).

    shapes: {dtype name: (B, H, N, d)} for the precisions checked on another problem than `shape`.
    skip: {(impl, dtype name): reason} for combinations this run leaves out; they are not tried (for a
    Triton kernel that means not compiled) and are listed as not checked, with the reason.
    Returns (table rows, {(impl, dtype, causal): max error} of those that passed, and
    [(impl, dtype, reason)] for every implementation x precision that could not be checked here).
    Raises AssertionError when one of the course's own implementations breaks the rule.
    """
    rows, checked, not_checked = [], {}, []
    shapes, skip = shapes or {}, skip or {}
    for dname in DTYPE_NAMES:
        dt = hardware.torch_dtype(dname)
        if dname == "bf16" and not bf16_ok:
            not_checked += [(impl, dname, "this GPU has no bf16 units") for impl in kernels.IMPLEMENTATIONS]
            continue
        left_out = [impl for impl in kernels.IMPLEMENTATIONS if (impl, dname) in skip]
        not_checked += [(impl, dname, skip[(impl, dname)]) for impl in left_out]
        tried = kernels.availability(device, dt, [i for i in kernels.IMPLEMENTATIONS if i not in left_out])
        not_checked += [(impl, dname, why) for impl, why in tried.items() if why]
        q, k, v = kernels.make_qkv(*shapes.get(dname, shape), dt, device, seed=seed)
        do = torch.randn(q.shape, device=device).to(dt)
        for causal in (False, True):
            for impl in [i for i, why in tried.items() if why is None]:
                try:
                    r = compare(impl, q, k, v, do, causal)
                except RuntimeError as err:  # a library kernel that refuses this case: reported, not fatal
                    status = bench.recoverable_failure(err)
                    if impl in OURS or not status:
                        raise
                    rows.append([impl, dname, causal, None, None, None, None, status[:60]])
                    continue
                assert r["passed"] or impl not in OURS, f"{impl} {dname} causal={causal}: {r['errors']}, naive's {r['naive']}"
                if r["passed"]:
                    checked[(impl, dname, causal)] = max(r["errors"])
                naive = r["naive"] or [None] * 4
                rows.append([impl, dname, causal, r["errors"][0], naive[0], max(r["errors"][1:]),
                             naive[1] and max(naive[1:]), "pass" if r["passed"] else "FAIL"])
    return rows, checked, not_checked


def correctness_table(rows: list) -> str:
    """The rows of `correctness` as a table."""
    return table(["impl", "dtype", "causal", "|O err|", "naive |O err|", "max |grad err|", "naive's", "verdict"], rows)


def not_checked_sentence(not_checked: list, only: tuple = ("flash_pytorch", "flash_triton", "sdpa_flash")) -> str:
    """One line per implementation of `only` with the precisions not checked in this run, grouped by the reason."""
    lines = []
    for impl in only:
        by_reason: dict[str, list[str]] = {}
        for i, d, why in not_checked:
            if i == impl:
                by_reason.setdefault(why, []).append(d)
        if by_reason:
            lines.append(f"{impl}: not checked " + "; ".join(f"in {', '.join(ds)} ({why})"
                                                             for why, ds in by_reason.items()))
    return "; ".join(lines) if lines else "every course kernel and SDPA's flash kernel was checked in fp32, fp16 and bf16"


# ---------------------------------------------------------------- traffic

def traffic_verdict(traffic: list, naive_bytes: int, d: int) -> str:
    """Which query tiles moved more bytes than naive in this run's model, and why (2d/B_r against 4)."""
    more = [r["block"] for r in traffic if r["bytes"] > naive_bytes]
    less = [r["block"] for r in traffic if r["bytes"] <= naive_bytes]
    cross = kernels.traffic_crossover(d)
    text = (f"the tiled forward's quadratic term is 2d/B_r N² elements (K and V re-read once per query tile), naive's "
            f"is 4N²; at d={d} they are equal at B_r = d/2 = {cross:g}. ")
    if more:
        text += (f"In this run B_r = {', '.join(map(str, more))} moved MORE predicted bytes than naive: with so few "
                 f"query rows per tile, K and V are re-read so often that the re-reads outweigh the N x N matrices "
                 f"naive writes and reads. ")
    if less:
        text += f"B_r = {', '.join(map(str, less))} moved fewer."
    return text


# ---------------------------------------------------------------- the course GPT

def gpt_kernels(gpt, idx, tgt, impls: list, *, device: str, reps: int, autocast, interpreted: set,
                reps_of: dict | None = None) -> dict:
    """One training step of `gpt` per attention kernel: loss, step time, bytes kept for backward, peak CUDA.

    Each kernel's step is timed over `reps` repetitions, or over reps_of[kernel] where given (for a slow one).
    Kernels in `interpreted` (Triton in its interpreter) are run but not timed: their time would be
    Python's. An out-of-memory error or a library kernel's refusal skips that kernel with a sentence.
    """
    def step():
        gpt.zero_grad(set_to_none=True)
        with autocast():
            loss = gpt(idx, tgt)[1]
        loss.backward()
        return loss

    def forward_keeping_loss(out):
        with autocast():
            out.append(gpt(idx, tgt)[1])

    rows = {}
    for impl in impls:
        gpt.attn_impl = impl
        gpt.zero_grad(set_to_none=True)
        out = []
        try:
            kept = memory.saved_tensors(lambda: forward_keeping_loss(out), ignore=gpt.parameters())  # one step, counted
            out[0].backward()
            n = (reps_of or {}).get(impl, reps)
            t = None if impl in interpreted else bench.benchmark(step, warmup=1, reps=n, device=device)
            rows[impl] = {"loss": out[0].item(), "step_ms": t and t.ms, "spread": t and t.spread,
                          "reps": t and len(t.samples), "saved_bytes": kept.nbytes,
                          "peak_bytes": memory.peak_cuda_memory(step), "interpreted": impl in interpreted}
        except RuntimeError as err:  # out of memory on a small GPU, or a library kernel's refusal
            status = bench.recoverable_failure(err)
            if not status:
                raise
            print(f"{impl}: not measured ({status})")
        out = kept = None
        memory.release_memory()
    return rows


# ---------------------------------------------------------------- the panel

def flash_panel(block_size: int, seq_len: int, *, head_dim: int = 64, batch_heads: int = 32, itemsize: int = 2,
                is_causal: bool = False, bandwidth_gbs: float | None = None,
                block_sizes=(16, 32, 64, 128, 256)):
    """Instructor panel: HBM traffic against block size, and memory kept for backward against N."""

    kw = dict(d=head_dim, batch_heads=batch_heads, itemsize=itemsize, is_causal=is_causal)
    naive = kernels.naive_traffic_bytes(seq_len, **kw)
    tiled = kernels.tiled_traffic_bytes(seq_len, block_q=block_size, **kw)
    mem = {impl: kernels.saved_bytes(impl, seq_len, head_dim, batch_heads, itemsize, is_causal)
           for impl in ("naive", "tiled")}
    ratio = f"{naive / tiled:.1f}x less" if naive >= tiled else f"{tiled / naive:.1f}x more"
    line = (f"N={seq_len}, block {block_size}: naive moves {naive / 1e9:.3g} GB, tiled {tiled / 1e9:.3g} GB "
            f"({ratio}); kept for backward: naive {mem['naive'] / 2**20:.4g} MiB, "
            f"tiled {mem['tiled'] / 2**20:.4g} MiB")
    if bandwidth_gbs:
        line += (f"; memory-bound floors at {bandwidth_gbs:.0f} GB/s (model, not measured): naive "
                 f"{naive / bandwidth_gbs / 1e6:.3g} ms, tiled {tiled / bandwidth_gbs / 1e6:.3g} ms")
    print(line)
    fig, (ax1, ax2) = plots.figure(2, figsize=(11, 4))
    blocks = sorted(set(block_sizes) | {block_size})
    plots.sweep(blocks, {"naive": [naive / 1e9] * len(blocks),
                         "tiled": [kernels.tiled_traffic_bytes(seq_len, block_q=b, **kw) / 1e9 for b in blocks]},
                xlabel="query block size", ylabel="HBM traffic, forward (GB)", logx=True,
                title=f"traffic at N={seq_len}", ax=ax1)
    ax1.scatter([block_size], [tiled / 1e9], s=90, color="black", zorder=3)
    ns = [2**i for i in range(8, max(15, seq_len.bit_length() + 1))]
    plots.sweep(ns, {impl: [kernels.saved_bytes(impl, n, head_dim, batch_heads, itemsize, is_causal) / 2**20 for n in ns]
                     for impl in ("naive", "tiled")},
                xlabel="sequence length N", ylabel="kept for backward (MiB)", logx=True, logy=True,
                title="memory", ax=ax2)
    ax2.axvline(seq_len, color="black", lw=1)
    fig.tight_layout()
    return fig
