"""A second compiler for the course GPT's forward: exported to ONNX and run in ONNX Runtime, beside eager and
torch.compile (Inductor), for notebook 09's "The same model, three compilers".

`export_to_onnx_runtime` is the technique (on stage in the notebook): `torch.onnx.export(..., dynamo=True)`
captures the forward with torch.export (Dynamo, one graph, no break allowed) and translates each ATen op to ONNX
(onnxscript's function library); ONNX Runtime then rewrites the graph (`ORT_ENABLE_ALL`: constant folding, op
fusions such as MatMul+Add into Gemm, a residual Add with its LayerNorm into SkipLayerNormalization) and runs it
one node at a time on the calling thread. `graph_counts` reads both graphs with `onnx` and names the op types
ORT's rewrites introduced; `inductor_forward` compiles the same forward with Inductor and counts the kernels it
wrote (`helpers.fusion.compiler.fused_kernels`) and the library matmul calls it left in its wrapper;
`compare_forwards` checks every variant against eager's logits and times them all by `compiler_lab.timed` (the
protocol's interleaved rounds, one thread and its clock on a CPU); `rank_sentence` ranks only what separated.

onnxruntime, onnx and onnxscript are optional: they are imported inside the functions that need them, so that
importing `helpers.fusion` never loads them; `missing()` names what this environment lacks.
"""
from __future__ import annotations

import contextlib
import importlib.util
import io
import logging
import os
import re
import warnings
from collections import Counter
from typing import Any, Callable

import torch

from helpers.fusion import compiler, compiler_lab
from helpers.measure import clock, protocol
from helpers.measure.profiling import quiet_stderr

PACKAGES = ("onnxruntime", "onnx", "onnxscript")  # what the ONNX path needs (onnxscript: torch's exporter)
TOLERANCE = 1e-5  # max |logits - eager logits| allowed in fp32: the same ops, summed in another order
EXPORT_LOGGERS = ("torch.onnx", "torch.export", "torch._dynamo", "torch.fx.experimental.symbolic_shapes")


def missing() -> str:
    """"" when onnxruntime, onnx and onnxscript can be imported here; else one sentence naming the missing ones."""
    gone = [p for p in PACKAGES if importlib.util.find_spec(p) is None]
    return f"{', '.join(gone)} not installed (pip install {' '.join(gone)})" if gone else ""


def providers(device: str) -> list:
    """ONNX Runtime execution providers for `device`, best first: CUDA's (TF32 off, so fp32 matmuls stay fp32
    and the logits compare with eager's within TOLERANCE) when device is "cuda" and this onnxruntime build has
    it, then the CPU's, which runs any node the first cannot."""
    import onnxruntime as ort  # optional dependency: only where the ONNX section runs

    cuda = device == "cuda" and "CUDAExecutionProvider" in ort.get_available_providers()
    return ([("CUDAExecutionProvider", {"use_tf32": "0"})] if cuda else []) + ["CPUExecutionProvider"]


def forward_device(device: str) -> str:
    """Where the three-way forward runs: "cuda" only when the notebook runs on CUDA and ONNX Runtime can use it
    too; else "cpu", so that the three variants run on the same device."""
    if device != "cuda" or missing():
        return "cpu"
    import onnxruntime as ort  # optional dependency: only where the ONNX section runs

    return "cuda" if "CUDAExecutionProvider" in ort.get_available_providers() else "cpu"


@contextlib.contextmanager
def quiet():
    """Keep the exporter's chatter out of the output: its progress lines (stdout), Python warnings, log records
    below ERROR of torch's export loggers, and what native code writes to stderr."""
    saved = {name: logging.getLogger(name).level for name in EXPORT_LOGGERS}
    try:
        for name in EXPORT_LOGGERS:
            logging.getLogger(name).setLevel(logging.ERROR)
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), quiet_stderr():
            warnings.simplefilter("ignore")
            yield
    finally:
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)


def export_to_onnx_runtime(model: torch.nn.Module, tokens: torch.Tensor, folder: str, *, providers: list):
    """Export `model`'s forward on `tokens` (B, T) to ONNX and open it in ONNX Runtime on one thread.

    Returns (session, path of the exported model, path of the graph ORT optimized). Files go to `folder`.
    """
    import onnxruntime as ort  # optional dependency: imported only where an ONNX section runs

    # 1. Capture and translate: torch.export runs the forward once under Dynamo, as torch.compile does, but must
    #    record it as one graph (a graph break is an error here). Each ATen op is then written as ONNX ops, and the
    #    exporter's own optimizer folds constants and drops unused nodes. GPT returns (logits, None): the None is
    #    dropped, so the graph has one output, the logits.
    program = torch.onnx.export(model.eval(), (tokens,), dynamo=True, verbose=False)
    exported = os.path.join(folder, "model.onnx")
    program.save(exported)  # the graph, with the weights as initializers, in one protobuf file
    # 2. Options: one node at a time, each on the calling thread (no intra-op pool, so the thread's clock sees all
    #    the work; no inter-op pool running independent nodes side by side), after every rewrite ORT knows
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL  # folding, fusions, layouts
    options.optimized_model_filepath = os.path.join(folder, "model.optimized.onnx")  # the rewritten graph, saved
    options.log_severity_level = 3  # errors only: ORT warns that an ENABLE_ALL graph is tuned for this machine
    # 3. Build: ORT loads the graph, rewrites it (and saves the result), and gives each node to the first provider
    #    in `providers` that has a kernel for it
    session = ort.InferenceSession(exported, options, providers=providers)
    return session, exported, options.optimized_model_filepath


def ort_runner(session, tokens: torch.Tensor) -> Callable[[], torch.Tensor]:
    """A call of `session` on `tokens` returning the logits as a torch tensor on tokens' device (the input is
    copied to a NumPy array once, here; ORT returns NumPy, so each call copies the logits back on CUDA)."""
    feed = {session.get_inputs()[0].name: tokens.detach().cpu().numpy()}

    def run() -> torch.Tensor:
        return torch.from_numpy(session.run(None, feed)[0]).to(tokens.device)
    return run


def op_counts(path: str) -> Counter:
    """{op type (prefixed by its domain when not the ONNX standard's, e.g. "com.microsoft.FusedMatMul"): nodes}
    of the main graph of the ONNX model at `path` (read with onnx, weights left on disk)."""
    import onnx  # optional dependency: only where an ONNX section runs

    graph = onnx.load(path, load_external_data=False).graph
    return Counter(f"{n.domain}.{n.op_type}" if n.domain not in ("", "ai.onnx") else n.op_type for n in graph.node)


def graph_counts(exported: str, optimized: str) -> dict[str, Any]:
    """The nodes of the exported graph and of ORT's optimized one: {"exported", "optimized": node counts;
    "exported_ops", "optimized_ops": Counters by op type; "introduced": {op type: nodes} of the types ORT's
    rewrites put in that the export did not have (its fused ops); "removed": the types it took out entirely;
    "put_in", "took_out": {op type: nodes} of every type whose count rose, or fell, and by how many, so that
    exported + sum(put_in) - sum(took_out) == optimized}."""
    before, after = op_counts(exported), op_counts(optimized)
    return {"exported": sum(before.values()), "optimized": sum(after.values()), "exported_ops": before,
            "optimized_ops": after, "introduced": {k: v for k, v in after.items() if k not in before},
            "removed": sorted(k for k in before if k not in after),
            "put_in": dict(sorted(((k, after[k] - before[k]) for k in after if after[k] > before[k]), key=lambda kv: -kv[1])),
            "took_out": dict(sorted(((k, before[k] - after[k]) for k in before if before[k] > after[k]), key=lambda kv: -kv[1]))}


def change_sentence(counts: dict[str, Any]) -> str:
    """ORT's rewrite both ways, from `graph_counts`: the nodes it put in and took out, by op type, adding up from
    the exported count to the optimized one."""
    put, took = counts["put_in"], counts["took_out"]

    def listed(d: dict[str, int]) -> str:
        return ", ".join(f"{k} {v}" for k, v in d.items()) or "none"
    return (f"ONNX Runtime's rewrites changed the exported graph's {counts['exported']} nodes to {counts['optimized']}: "
            f"they put in {sum(put.values())} node(s) ({listed(put)}) and took out {sum(took.values())} ({listed(took)}); "
            f"{counts['exported']} + {sum(put.values())} - {sum(took.values())} = {counts['optimized']}.")


_LIBRARY_CALL = re.compile(r"extern_kernels\.\w+\(")
_ATEN_CALL = re.compile(r"= torch\.ops\.aten\.(\w+)\.\w+\(")  # an ATen op the wrapper calls as it is (not compiled)


def inductor_forward(model: torch.nn.Module, tokens: torch.Tensor) -> dict[str, Any]:
    """torch.compile(model) (Inductor, static shapes) run once on `tokens` under no_grad, its first call timed on
    both clocks with the compiler processes it waited for: {"fn": a call returning the logits, "logits",
    "first_call": clock.Reading, "kernels": the kernels Inductor wrote (C++ on a CPU, Triton on a GPU),
    "kernel_names", "library_calls": the calls to library kernels (extern_kernels.mm, addmm...: the matmuls
    Inductor leaves to BLAS) in its wrapper code, "aten_calls": the names of the ATen ops its wrapper calls as
    they are, neither compiled nor a library matmul (on a CPU the attention, `_scaled_dot_product_flash_attention_for_cpu`)}."""
    compiled = torch.compile(model, dynamic=False)
    with clock.Stopwatch(children=True) as sw:
        out, codes = compiler.generated_code(compiled, tokens)
    names = [name for code in codes for name in compiler.fused_kernels(code)]
    calls = sum(len(_LIBRARY_CALL.findall(code)) for code in codes)
    aten = [name for code in codes for name in _ATEN_CALL.findall(code)]

    def run() -> torch.Tensor:
        return compiled(tokens)[0]
    return {"fn": run, "logits": out[0].detach(), "first_call": sw.reading, "kernels": len(names),
            "kernel_names": names, "library_calls": calls, "aten_calls": aten}


def eager_ops(model: torch.nn.Module, tokens: torch.Tensor) -> int:
    """What one eager forward launches, by `compiler.kernel_launches`: on a CPU the aten ops the model called
    (views and allocations left out), on CUDA the GPU kernels."""
    return compiler.kernel_launches(lambda x: model(x)[0], tokens)[0]


def compare_forwards(fns: dict[str, Callable[[], torch.Tensor]], eager_logits: torch.Tensor,
                     units: dict[str, tuple[int, str]], *, device: str, reps: int,
                     tolerance: float = TOLERANCE) -> list[dict[str, Any]]:
    """Check every variant's logits against eager's, then time them all together by `compiler_lab.timed`
    (interleaved rounds; one thread and its CPU clock on a CPU), under no_grad.

    fns: {backend: a call returning logits}; units: {backend: (count, what was counted)}. Returns one row per
    backend, in fns' order: {"backend", "timing" (bench.Timing), "units" (int), "unit_kind" (str),
    "max_abs_err" (float, against eager_logits)}. Raises AssertionError when a variant's largest error passes
    `tolerance`, ValueError when fns and units name different backends.
    """
    if set(fns) != set(units):
        raise ValueError(f"fns {sorted(fns)} and units {sorted(units)} must name the same backends")
    rows = []
    with torch.no_grad():
        for name, fn in fns.items():
            err = float((fn().float() - eager_logits.float()).abs().max())
            if not err <= tolerance:
                raise AssertionError(f"{name}: max |logits - eager| = {err:.3g}, above the tolerance {tolerance:g}")
            rows.append({"backend": name, "units": int(units[name][0]), "unit_kind": units[name][1], "max_abs_err": err})
        timings = compiler_lab.timed(dict(fns), device=device, reps=reps).timings
    for row in rows:
        row["timing"] = timings[row["backend"]]
    return rows


def rank_sentence(rows: list[dict[str, Any]]) -> str:
    """The fastest row (by median) set against each other one, ranked only where their IQRs do not overlap
    (`protocol.rank_sentence`)."""
    if len(rows) < 2:
        return "Only one variant ran: nothing to rank."
    first, *rest = sorted(rows, key=lambda r: r["timing"].median)
    return "; ".join(protocol.rank_sentence(first["backend"], first["timing"], r["backend"], r["timing"],
                                            "time per forward") for r in rest) + "."
