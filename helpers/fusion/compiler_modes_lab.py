"""Notebook 09's one-token forward of the course GPT under each torch.compile mode, and CUDA graphs two ways:
`mode="reduce-overhead"` (Inductor's fused kernels, recorded as a CUDA graph and replayed in one launch) and
`backend="cudagraphs"` (the same recording, by Inductor's CUDA-graph trees, around AOTAutograd's graph of ATen
ops run one by one, without Inductor's code generation: CUDA graphs without fusion). Both need CUDA; on a CPU
`cuda_graphs_note` is the one sentence that says so.

The timings are `helpers.fusion.compiler_lab.timed`'s (the protocol's warm-up and interleaved rounds); each
compile is timed over its first three calls on the CPU clock with the compiler processes it waited for
(`clock.Stopwatch(children=True)`), with the wall time beside it.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from helpers.fusion import compiler_lab
from helpers.gpt.model import GPT
from helpers.measure import bench, clock, protocol

CUDAGRAPHS = "backend=cudagraphs"  # the row of torch.compile(model, backend="cudagraphs") beside the modes'


def compile_kwargs(variant: str) -> dict[str, str]:
    """torch.compile's keyword arguments for one variant: a mode of `compiler_lab.ALL_MODES`, or CUDAGRAPHS.
    Raises ValueError for anything else."""
    if variant == CUDAGRAPHS:
        return {"backend": "cudagraphs"}
    if variant not in compiler_lab.ALL_MODES:
        raise ValueError(f"mode {variant!r}; choose one of {', '.join(map(repr, compiler_lab.ALL_MODES))}")
    return {"mode": variant}


def variants(modes: list[str], device: str, cudagraphs: bool | None = None) -> list[str]:
    """The variants `one_token_forward` compiles: `modes`, then CUDAGRAPHS when `cudagraphs` (None: whenever
    "reduce-overhead" is among the modes, so that CUDA graphs with and without Inductor's fusion stand side by side).
    Raises ValueError for an unknown mode, and for a mode other than "default" or the cudagraphs backend off CUDA."""
    for mode in modes:
        compile_kwargs(mode)
        if mode != "default" and device != "cuda":
            raise ValueError(f"mode {mode!r} needs CUDA (CUDA graphs / GPU autotuning)")
    if cudagraphs is None:
        cudagraphs = "reduce-overhead" in modes
    if cudagraphs and device != "cuda":
        raise ValueError("backend='cudagraphs' needs CUDA (it records CUDA graphs)")
    return list(modes) + ([CUDAGRAPHS] if cudagraphs else [])


def cuda_graphs_note(modes: list[str], device: str) -> str:
    """The one sentence a run without CUDA prints for this section: neither way to CUDA graphs can run, and what
    does ("" on CUDA)."""
    if device == "cuda":
        return ""
    text = ("CUDA graphs need CUDA: on this CPU neither mode=\"reduce-overhead\" (Inductor's fused kernels recorded "
            "as one CUDA graph) nor backend=\"cudagraphs\" (the same recording around AOTAutograd's unfused ATen ops, "
            "no Inductor) can run")
    if not modes:
        return text + (", and this profile times no mode, so nothing is measured in this section. MODES=['default'] "
                       "would time eager against Inductor's default mode on the one-token forward: fused kernels, "
                       "no CUDA graphs.")
    return text + "; only the default mode is timed (fused kernels, no CUDA graphs)."


def modes_note(modes: list[str], device: str) -> str:
    """The sentence saying which of `compiler_lab.ALL_MODES` a CUDA run does not time on the one-token forward,
    why the full profile leaves max-autotune out, and how to time them all; "" when every mode runs, or off CUDA
    (where only "default" can run)."""
    left = [m for m in compiler_lab.ALL_MODES if m not in modes]
    if device != "cuda" or not left:
        return ""
    text = f"Not timed in this run: {', '.join(left)}."
    if "max-autotune" in left:
        text += (" The full profile, sized for a few minutes of one GPU, leaves max-autotune out: its compile also "
                 "benchmarks Triton matmul templates for every matrix shape of the model (torch.compile's documentation: "
                 "it \"leverages Triton or template based matrix multiplications\").")
    return text + f" MODES={list(compiler_lab.ALL_MODES)!r} times all {len(compiler_lab.ALL_MODES)}."


def one_token_forward(config, modes: list[str], *, device: str = "cpu", reps: int = 20, seed: int = 0,
                      cudagraphs: bool | None = None) -> dict[str, dict]:
    """A batch-1, one-token forward of the course GPT (the shape of a decode step; no KV cache here),
    eager and under each torch.compile mode, and with backend="cudagraphs" (`variants`: by default beside
    "reduce-overhead"): {variant: {"compile_s" (the first three calls' CPU seconds, `clock.Stopwatch`'s with
    children), "compile_wall_s", "timing"}} with "eager" first. Each variant's logits must equal eager's within
    rtol 1e-4, atol 1e-4.

    "reduce-overhead" (CUDA graphs), "max-autotune" and the cudagraphs backend need CUDA: asked for on a CPU they
    raise ValueError (`variants`).
    """
    names = variants(modes, device, cudagraphs)
    torch.manual_seed(seed)
    model = GPT(config).to(device).eval()
    idx = torch.zeros(1, 1, dtype=torch.long, device=device)  # (B=1, T=1)
    fns: dict[str, Callable] = {"eager": model}
    out: dict[str, dict] = {"eager": {"compile_s": 0.0, "compile_wall_s": 0.0}}
    with torch.no_grad():
        want = model(idx)[0]
        for name in names:
            fn = torch.compile(model, dynamic=False, **compile_kwargs(name))  # one shape: no symbolic sizes
            with clock.Stopwatch(children=True) as sw:
                for _ in range(3):  # CUDA graphs record on a later call than the first
                    got = fn(idx)[0]
                bench.sync(device)
            out[name] = {"compile_s": sw.cpu, "compile_wall_s": sw.wall}
            torch.testing.assert_close(got.float(), want.float(), rtol=1e-4, atol=1e-4)
            fns[name] = fn
        timings = compiler_lab.timed({k: (lambda f=f: f(idx)) for k, f in fns.items()}, device=device, reps=reps).timings
    for k, t in timings.items():
        out[k]["timing"] = t
    return out


def cudagraphs_sentence(decode: dict[str, Any]) -> str:
    """What fusion adds on top of CUDA graphs, from `one_token_forward`'s rows: reduce-overhead (fused kernels in
    the graph) against backend="cudagraphs" (unfused ATen ops in the graph), ranked only when their IQRs do not
    overlap; "" when the run did not time both."""
    if "reduce-overhead" not in decode or CUDAGRAPHS not in decode:
        return ""
    return ("Both replay one CUDA graph per call, so what separates them is fusion: "
            + protocol.rank_sentence("reduce-overhead (Inductor's kernels)", decode["reduce-overhead"]["timing"],
                                     "backend=cudagraphs (ATen's kernels)", decode[CUDAGRAPHS]["timing"],
                                     "time per one-token forward") + ".")
