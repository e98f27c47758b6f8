"""torch.compile, taken apart: fusion and the bytes it saves, the kernels it launches, the code Inductor
writes, regional compilation (notebook 09). What Dynamo captures (graph breaks, recompilations, its logs)
is `helpers.fusion.dynamo`.

The workloads are written the way a learner would write them, as separate PyTorch ops, so that eager
mode runs one kernel per op and reads and writes every intermediate from memory:

* `pointwise_chain`: gelu(x + bias) * scale, optionally followed by dropout;
* `layer_norm_ops`: LayerNorm from mean, subtract, square, mean, rsqrt, multiply, add;
* `softmax_ops`: exp(x - max) / sum, as in Triton's fused-softmax tutorial's "naive" version.

Each has a library line (`F.gelu` chain has none; `F.layer_norm`, `torch.softmax`) that PyTorch already
fuses by hand. `eager_bytes` counts what eager mode moves (every op's tensor inputs read once and its
outputs written once, counted by a TorchDispatchMode as the ops run); `fused_bytes` is the ideal of one
fused kernel: the function's inputs read once and its outputs written once. `kernel_launches` counts the
kernels a call runs; `generated_code`, `fused_kernels` and `kernel_excerpt` read what Inductor wrote;
`compile_blocks` is regional compilation (each transformer block compiled, one compiled code shared by all
of them); `fx_cache_counts` reads Inductor's FX-graph cache hits and misses, and `cache_note` says in words
whether a compile's graphs came from that cache.

On a CPU Inductor writes C++ (with OpenMP loops when torch has more than one thread); on a GPU, Triton. Inductor imports triton, so this module
switches Triton's interpreter on where there is no GPU (`helpers.measure.triton_mode`) before anything it
runs imports triton: a Triton kernel of the course imported later still runs. It changes no global
Inductor setting: `compile_counted` compiles one function with Inductor's `cpp.enable_kernel_profile`
option, so that its C++ kernels appear by name in `torch.profiler` (they are otherwise invisible there,
and could not be counted); every other compile in the process is left as is.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode

from helpers.measure import params, triton_mode
from helpers.measure.profiling import quiet_stderr

triton_mode.use_interpreter_without_gpu(__name__, not torch.cuda.is_available())  # before Inductor imports triton

# ------------------------------------------------------------------------------------------ workloads


def pointwise_chain(x: torch.Tensor, bias: torch.Tensor, scale: float = 0.5, p: float = 0.0) -> torch.Tensor:
    """gelu(x + bias) * scale, then dropout with probability p (p=0: none). x (rows, cols), bias (cols,)."""
    t = x + bias                    # read x (and the small bias), write t
    g = F.gelu(t)                   # read t, write g
    y = g * scale                   # read g, write y: three passes where one fused kernel needs one
    return F.dropout(y, p, training=True) if p > 0 else y  # p > 0: a fourth pass (read y, write the result)


def layer_norm_ops(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """LayerNorm over the last dim from separate ops (what F.layer_norm computes). x (rows, cols).

    Each comment says what eager mode moves through memory for that line; fused, x is read once and y written once.
    """
    mean = x.mean(-1, keepdim=True)                     # read x
    centred = x - mean                                  # read x, write centred
    var = (centred * centred).mean(-1, keepdim=True)    # read centred, write its square; read that
    normed = centred * torch.rsqrt(var + eps)           # read centred, write normed
    return normed * weight + bias                       # read normed, write; read that, write y


def layer_norm_library(x, weight, bias, eps: float = 1e-5):
    """F.layer_norm: PyTorch's own hand-fused kernel (the library line)."""
    return F.layer_norm(x, x.shape[-1:], weight, bias, eps)


def softmax_ops(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim from separate ops (Triton's tutorial's naive softmax). x (rows, cols).

    Eager: five passes over a (rows, cols) tensor (two reductions, three elementwise ops); fused: one read, one write.
    """
    z = x - x.amax(-1, keepdim=True)    # read x (max); read x, write z
    e = torch.exp(z)                    # read z, write e
    return e / e.sum(-1, keepdim=True)  # read e (sum); read e, write y


def softmax_library(x):
    """torch.softmax: PyTorch's own hand-fused kernel (the library line)."""
    return torch.softmax(x, dim=-1)


@dataclass(frozen=True)
class Workload:
    """A function to compile, its library counterpart (or None) and a maker of its inputs."""

    name: str
    fn: Callable[..., torch.Tensor]
    library: Callable[..., torch.Tensor] | None
    inputs: Callable[..., tuple]  # (rows, cols, dtype, device, generator) -> args


def _chain_inputs(rows, cols, dtype, device, g):
    return (torch.randn(rows, cols, generator=g).to(device, dtype), torch.randn(cols, generator=g).to(device, dtype))


def _ln_inputs(rows, cols, dtype, device, g):
    x = torch.randn(rows, cols, generator=g) * 3 + 1
    w, b = 1 + 0.1 * torch.randn(cols, generator=g), 0.1 * torch.randn(cols, generator=g)
    return tuple(t.to(device, dtype) for t in (x, w, b))


def _softmax_inputs(rows, cols, dtype, device, g):
    return ((torch.randn(rows, cols, generator=g) * 4).to(device, dtype),)


WORKLOADS: dict[str, Workload] = {
    "pointwise": Workload("pointwise", pointwise_chain, None, _chain_inputs),
    "layernorm": Workload("layernorm", layer_norm_ops, layer_norm_library, _ln_inputs),
    "softmax": Workload("softmax", softmax_ops, softmax_library, _softmax_inputs),
}


def make_inputs(name: str, rows: int, cols: int, *, dtype: torch.dtype = torch.float32, device: str = "cpu",
                seed: int = 0) -> tuple:
    """The arguments of workload `name` for a (rows, cols) activation. Raises ValueError for an unknown name
    or a non-positive size."""
    if name not in WORKLOADS:
        raise ValueError(f"workload {name!r} is unknown; choose one of {', '.join(map(repr, WORKLOADS))}")
    params.positive("rows", rows)
    params.positive("cols", cols)
    return WORKLOADS[name].inputs(rows, cols, dtype, device, torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------------------------------ bytes


def _tensors(obj) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for o in obj for t in _tensors(o)]
    if isinstance(obj, dict):
        return [t for o in obj.values() for t in _tensors(o)]
    return []


def _nbytes(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        if id(t) not in seen:
            seen.add(id(t))
            total += t.numel() * t.element_size()
    return total


class _ByteCounter(TorchDispatchMode):
    """Counts, for every aten op that moves data, its tensor inputs' bytes (read) and outputs' (written)."""

    def __init__(self):
        super().__init__()
        self.read = self.written = 0
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        returns = func._schema.returns
        if returns and all(r.alias_info is not None and not r.alias_info.is_write for r in returns):
            return out  # a view: no data moves
        self.read += _nbytes(_tensors(args) + _tensors(kwargs or {}))
        self.written += _nbytes(_tensors(out))
        self.ops.append(func.__name__ if hasattr(func, "__name__") else str(func))
        return out


def eager_bytes(fn: Callable, *args) -> dict[str, Any]:
    """What eager `fn(*args)` moves: {"read", "written", "total" (bytes), "ops" (the aten ops counted)}."""
    with torch.no_grad(), _ByteCounter() as counter:
        fn(*args)
    return {"read": counter.read, "written": counter.written, "total": counter.read + counter.written,
            "ops": counter.ops}


def fused_bytes(fn: Callable, *args) -> int:
    """Bytes one ideal fused kernel moves: every tensor argument read once, every output written once."""
    with torch.no_grad():
        out = fn(*args)
    return _nbytes(_tensors(args)) + _nbytes(_tensors(out))


def chain_bytes(rows: int, cols: int, n_ops: int, bytes_per_element: int, fused: bool) -> int:
    """Bytes of a chain of `n_ops` elementwise ops on a (rows, cols) tensor (a (cols,) bias read is ignored):
    eager reads and writes the full tensor once per op, a fused kernel once in all."""
    n = rows * cols * bytes_per_element
    return 2 * n if fused else 2 * n * n_ops


# ------------------------------------------------------------------------------------------ kernels

METADATA_OPS = {"aten::empty", "aten::empty_strided", "aten::empty_like", "aten::view", "aten::reshape",
                "aten::_reshape_alias", "aten::as_strided", "aten::t", "aten::transpose", "aten::expand",
                "aten::unsqueeze", "aten::squeeze", "aten::detach", "aten::alias", "aten::resolve_conj",
                "aten::resolve_neg", "aten::_unsafe_view", "aten::lift_fresh", "aten::slice", "aten::select",
                "aten::permute", "aten::result_type", "aten::set_", "aten::resize_"}


def _under_aten(event) -> bool:
    """True when an aten op called this one (then the caller, not this, is the op the code asked for)."""
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith("aten::"):
            return True
        parent = parent.cpu_parent
    return False


# Inductor's option that wraps each C++ kernel it writes in a profiler record (named graph_N_cpp_fused_...).
# It is read when a graph is compiled, and it is part of Inductor's cache key, so it is passed to one
# torch.compile at a time (see compile_counted) rather than set for the whole process.
KERNEL_PROFILE = {"cpp.enable_kernel_profile": True}


def compile_counted(fn: Callable, **kwargs) -> Callable:
    """torch.compile(fn, **kwargs) whose C++ kernels `kernel_launches` and torch.profiler can see by name.

    The option applies to this compiled function only, at its first compile and at every recompile; the
    process's Inductor configuration is not changed. On a GPU it changes nothing (Triton kernels are
    visible anyway). `mode` cannot be combined with it (torch.compile refuses mode and options together):
    a mode's function is compiled with plain torch.compile.
    """
    options = {**KERNEL_PROFILE, **(kwargs.pop("options", None) or {})}
    return torch.compile(fn, options=options, **kwargs)


def kernel_launches(fn: Callable, *args, steps: int = 1) -> tuple[int, dict[str, int]]:
    """(kernels per call, {kernel name: launches per call}) of `fn(*args)` seen by torch.profiler.

    On CUDA: device kernels (and memcpy/memset). On a CPU, where a "kernel" is one pass of C++ code: the
    aten ops the code itself called (not those an aten op called inside it), leaving out views and
    allocations, and Inductor's C++ kernels (named graph_N_cpp_...). A C++ kernel is visible only when its
    function was compiled with `compile_counted`; one from a plain torch.compile is not counted. Call `fn`
    once beforehand: the first call may compile.
    """
    on_cuda = torch.cuda.is_available() and any(t.is_cuda for t in _tensors(args))
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda else [])
    with quiet_stderr():
        prof = profile(activities=activities)
        prof.start()
    try:
        with torch.no_grad():
            for _ in range(steps):
                fn(*args)
        if on_cuda:
            torch.cuda.synchronize()
    finally:
        with quiet_stderr():
            prof.stop()
    counts: dict[str, int] = {}
    for e in prof.events():
        if on_cuda:
            keep = e.device_type == torch.autograd.DeviceType.CUDA
        else:
            keep = "cpp_fused" in e.name or (
                e.name.startswith("aten::") and e.name not in METADATA_OPS and not _under_aten(e))
        if keep:
            counts[e.name] = counts.get(e.name, 0) + 1
    counts = {k: v // steps for k, v in counts.items()}
    return sum(counts.values()), counts


# ------------------------------------------------------------------------------------------ generated code


def generated_code(compiled: Callable, *args) -> tuple[Any, list[str]]:
    """(output, [source of each module Inductor wrote]) for the first call of a torch.compile'd function.

    The call compiles (or loads from Inductor's caches) and returns what `run_and_get_code` captured.
    """
    from torch._inductor.utils import run_and_get_code  # heavy: Inductor, only when code is asked for

    with torch.no_grad():
        return run_and_get_code(compiled, *args)


_KERNEL = re.compile(r"^(\w+) = async_compile\.(cpp_pybinding|cpp|triton)\((.*?)^'''", re.S | re.M)


def fused_kernels(code: str) -> dict[str, str]:
    """{kernel name: its source} for every kernel in one module Inductor wrote (C++ on a CPU, Triton on a GPU)."""
    out = {}
    for name, _, rest in _KERNEL.findall(code):
        body = rest.split("'''", 1)[1] if "'''" in rest else rest
        out[name] = body.strip("\n")
    return out


def kernel_excerpt(body: str, lines: int = 30) -> str:
    """The kernel's body without #include and bookkeeping lines (a Triton kernel from its @triton.jit on),
    cut to `lines` lines."""
    lines_ = body.splitlines()
    if any(ln.startswith("@triton.jit") for ln in lines_):  # Triton: from the kernel's decorator on
        lines_ = lines_[next(i for i, ln in enumerate(lines_) if ln.startswith("@triton.jit")):]
    boiler = ("#include", "inductor_cpu_integer_div_error", "RAIIAtenRecordFunctionHandle")
    kept = [ln for ln in lines_ if ln.strip() and not any(b in ln for b in boiler)]
    more = len(kept) - lines
    return "\n".join(kept[:lines]) + (f"\n    ... ({more} more lines)" if more > 0 else "")

# ------------------------------------------------------------------------------------------ regions, caches


def compile_blocks(model: torch.nn.Module, **kwargs) -> int:
    """Regional compilation: `block.compile(**kwargs)` for every block in `model.blocks` (in place; the rest
    of the model stays eager). The blocks run the same code on parameters of the same shapes, so Dynamo
    compiles the first block's call and every other block reuses it (its parameters are graph inputs, not
    constants). Returns the number of blocks compiled. Raises ValueError for a model without blocks."""
    blocks = getattr(model, "blocks", None)
    if not blocks:
        raise ValueError("the model has no .blocks to compile one by one")
    for block in blocks:
        block.compile(**kwargs)
    return len(blocks)


def fx_cache_counts() -> dict[str, int]:
    """{"hit", "miss"}: Inductor's FX-graph cache lookups so far in this process (torch._dynamo.utils.counters);
    the difference over a compile says whether its graph was loaded from the on-disk cache or compiled."""
    from torch._dynamo.utils import counters  # Dynamo's process-wide counters

    return {"hit": counters["inductor"]["fxgraph_cache_hit"], "miss": counters["inductor"]["fxgraph_cache_miss"]}


def cache_note(cache: dict[str, int]) -> str:
    """Where a compile's graphs came from, in words, from Inductor's FX-graph cache lookups over it ({"hit",
    "miss"}: `fx_cache_counts` differences): loaded from the disk cache (a warm start: a break-even
    counted from it is a warm one), compiled, or some of each."""
    hit, miss = cache.get("hit", 0), cache.get("miss", 0)
    if hit and not miss:
        return (f"its {hit} graph(s) were loaded from Inductor's disk cache, so this is a warm start: a cold one (a "
                "fresh machine, or the cache cleared) compiles them, and its first step costs more")
    if miss and not hit:
        return f"its {miss} graph(s) were compiled (none was in Inductor's disk cache): a cold start"
    if hit and miss:
        return f"{hit} of its graphs were loaded from Inductor's disk cache and {miss} compiled: partly warm"
    return "Inductor's FX-graph cache was not consulted (it is off in this process), so it compiled"
