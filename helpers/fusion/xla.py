"""XLA through JAX: the course GPT's forward written as a pure JAX function of its weights, compiled by XLA with
`jax.jit` on the CPU, and the fusions XLA's optimized HLO holds: notebook 09.

JAX traces a Python function of arrays into a graph and hands it to XLA, which fuses and compiles it as a whole
(Frostig, Johnson and Leary, 2018, *Compiling machine learning programs via high-level tracing*, SysML). The
forward here is `helpers.gpt.model.GPT`'s with no cache and no dropout (eval): token + position embeddings,
pre-LayerNorm blocks with grouped-query causal attention and a tanh-GELU MLP, a final LayerNorm and the head (the
token table itself when `tie_embeddings`). `weights` turns the torch state_dict into jnp arrays, `jax_gpt_forward`
is a pure function of them and the token ids, `compile_forward` lowers and compiles it once for the shapes given
and keeps XLA's optimized HLO, and `fusions` reads the fusion instructions out of that text.

One thread: jax 0.10's CPU client runs a compiled call on a pool of worker threads sized from the CPUs the process
may use, and dispatches asynchronously. XLA_FLAGS=--xla_cpu_multi_thread_eigen=false does not stop that (the
pool still runs the work), so `one_thread` instead dispatches synchronously and creates the client while the
process may use one CPU: the pool has one thread and the work runs on the calling thread, which the course's
thread clock then counts (`thread_share` checks it).

jax is imported inside each function that needs it, not at the top: it is optional, and importing it takes
seconds, so importing this module (or `helpers.fusion`) never imports jax.
"""
from __future__ import annotations

import functools
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from typing import Any, Callable

import torch

from helpers.measure import bench, clock, protocol
from helpers.measure.params import positive


def missing() -> str | None:
    """Why jax cannot run here (one sentence), or None when it can be imported."""
    if importlib.util.find_spec("jax") is None:
        return "jax is not installed here (pip install 'jax[cpu]'), so XLA through JAX is skipped."
    return None


def _backend_started() -> bool:
    from jax._src import xla_bridge  # private, but the only way to ask without starting the backend

    return bool(getattr(xla_bridge, "_backends", {}))


def one_thread() -> dict[str, Any]:
    """Make jax run each compiled CPU call on the calling thread, for the rest of the process: synchronous
    dispatch (`jax_cpu_enable_async_dispatch=False`), and the CPU client created while this process may use one
    CPU (its worker pool then has one thread; the affinity is restored at once). Call it before jax's CPU backend
    starts (before the first jax array or jit call); afterwards it changes nothing. Returns {"started_here": bool,
    "pinned": bool} (pinned: the affinity could be narrowed; not on a system without `os.sched_setaffinity`)."""
    import jax  # here, not at the top: see the module's docstring

    if _backend_started():
        return {"started_here": False, "pinned": False}
    # the CPU alone: where jax has a GPU plugin (the H200 image's has CUDA's), its default device is the GPU, where an
    # fp32 matmul may run in TF32 (logits 5e-4 off eager's there) and jax takes most of the GPU's memory at start
    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_cpu_enable_async_dispatch", False)  # a call returns when its work is done
    can_pin = hasattr(os, "sched_setaffinity")
    saved = os.sched_getaffinity(0) if can_pin else None
    try:
        if can_pin:
            os.sched_setaffinity(0, {min(saved)})  # the client sizes its pool from the CPUs it may use
        jax.devices("cpu")  # starts the CPU client
    finally:
        if can_pin:
            os.sched_setaffinity(0, saved)
    return {"started_here": True, "pinned": can_pin}


def thread_share(fn: Callable[[], Any], calls: int = 20) -> float:
    """This thread's CPU seconds over the whole process's during `calls` calls of fn: about 1.0 when the work runs
    on the calling thread (what the thread clock needs), near 0 when other threads do it. Raises ValueError for
    calls < 1."""
    positive("calls", calls)
    proc = time.process_time_ns()
    with clock.Stopwatch(tally=False) as sw:
        for _ in range(calls):
            fn()
    spent = (time.process_time_ns() - proc) / 1e9
    return min(1.0, sw.cpu / spent) if spent > 0 else 1.0


def _on_cpu(array):
    """`array` committed to jax's CPU device, so that a jit of it compiles for the CPU even where jax's default
    device is a GPU (a jax started before `one_thread` could narrow it to the CPU)."""
    import jax  # here, not at the top: see the module's docstring

    return jax.device_put(array, jax.devices("cpu")[0])


def weights(model: torch.nn.Module) -> dict[str, Any]:
    """The model's state_dict as float32 jnp arrays on the CPU, keyed as in the state_dict. A tied head is left out:
    `jax_gpt_forward` reads the token table in its place, as the torch model does."""
    import jax.numpy as jnp  # here, not at the top: see the module's docstring

    state = dict(model.state_dict())
    if model.config.tie_embeddings:
        state.pop("lm_head.weight", None)
    return {k: _on_cpu(jnp.asarray(v.detach().to("cpu", torch.float32).numpy())) for k, v in state.items()}


def jax_layer_norm(x, weight, bias, eps: float = 1e-5):
    """LayerNorm over the last axis, as torch's nn.LayerNorm: (x - mean) / sqrt(var + eps) * weight + bias, with
    the biased variance. x (..., d); weight (d,); bias (d,) or None."""
    mean = x.mean(-1, keepdims=True)                 # (..., 1): one reduction over the row
    var = ((x - mean) ** 2).mean(-1, keepdims=True)  # (..., 1): biased (divides by d), as torch's
    y = (x - mean) * (var + eps) ** -0.5 * weight    # elementwise: XLA fuses these into one loop
    return y if bias is None else y + bias


def jax_causal_attention(q, k, v):
    """softmax(q kᵀ / sqrt(head_dim), causal) v, as the course GPT's `naive_attention`: key j is kept for
    query i when j <= i. q, k, v (B, H, T, head_dim) -> (B, H, T, head_dim)."""
    import jax  # here, not at the top: see the module's docstring

    T = q.shape[-2]
    # q is scaled before q kᵀ, as SDPA (scaled dot-product attention, torch's F.scaled_dot_product_attention) does
    scores = (q * q.shape[-1] ** -0.5) @ k.swapaxes(-1, -2)     # (B, H, T, T)
    keep = jax.numpy.tril(jax.numpy.ones((T, T), dtype=bool))   # (T, T): the lower triangle
    scores = jax.numpy.where(keep, scores, -jax.numpy.inf)      # masked scores get no weight
    return jax.nn.softmax(scores, axis=-1) @ v                  # (B, H, T, head_dim)


def jax_gpt_forward(w: dict, tokens, cfg):
    """The course GPT's logits (B, T, vocab_size) for token ids (B, T), from `weights(model)` and the model's
    GPTConfig. A pure function (no state, no randomness): `jax.jit` traces it once per shape and XLA compiles
    the whole graph."""
    import jax  # here, not at the top: see the module's docstring

    B, T = tokens.shape
    H, H_kv, hd = cfg.n_head, cfg.n_kv_head, cfg.head_dim

    def linear(x, name):  # x Wᵀ + b, as nn.Linear (no b when cfg.bias is False)
        y = x @ w[name + ".weight"].T
        return y + w[name + ".bias"] if cfg.bias else y

    def norm(x, name):  # a LayerNorm whose weights are stored under `name`
        return jax_layer_norm(x, w[name + ".weight"], w.get(name + ".bias"))

    x = w["wte.weight"][tokens] + w["wpe.weight"][:T]  # (B, T, d): a token row plus a position row
    for i in range(cfg.n_layer):  # a Python loop: traced once per block, so XLA sees every block unrolled
        p = f"blocks.{i}."
        h = norm(x, p + "ln_1")
        q = linear(h, p + "attn.q_proj").reshape(B, T, H, hd).transpose(0, 2, 1, 3)  # (B, H, T, hd)
        k, v = linear(h, p + "attn.kv_proj").reshape(B, T, 2, H_kv, hd).transpose(2, 0, 3, 1, 4)  # (B, H_kv, T, hd)
        k, v = k.repeat(H // H_kv, axis=1), v.repeat(H // H_kv, axis=1)  # each kv head serves H // H_kv heads
        y = jax_causal_attention(q, k, v).transpose(0, 2, 1, 3).reshape(B, T, H * hd)  # (B, T, d)
        x = x + linear(y, p + "attn.out_proj")  # the residual: x + attn(LN(x))
        u = jax.nn.gelu(linear(norm(x, p + "ln_2"), p + "mlp.up"), approximate=True)  # tanh GELU, GPT-2's
        x = x + linear(u, p + "mlp.down")  # the residual: x + MLP(LN(x))
    head = w["wte.weight"] if cfg.tie_embeddings else w["lm_head.weight"]  # tied: the token table again
    return norm(x, "ln_f") @ head.T  # (B, T, vocab_size)


def tokens_for_jax(tokens: torch.Tensor):
    """Token ids as a jnp int32 array on the CPU (jax keeps 32-bit integers unless x64 is switched on)."""
    import jax.numpy as jnp  # here, not at the top: see the module's docstring

    return _on_cpu(jnp.asarray(tokens.detach().to("cpu", torch.int32).numpy()))


def compile_forward(forward: Callable, w: dict, tokens, cfg) -> dict[str, Any]:
    """`jax.jit(forward)` with cfg bound, lowered and compiled by XLA for these shapes:
    {"fn": the compiled callable (w, tokens) -> logits, "hlo": the optimized HLO text, "compile_s": CPU seconds of
    the whole process (XLA compiles on its own threads too, which the thread clock would miss), "compile_wall_s"}.
    forward(w, tokens, cfg): `jax_gpt_forward` or the notebook's copy of it."""
    import jax  # here, not at the top: see the module's docstring

    proc = time.process_time_ns()
    with clock.Stopwatch(tally=False) as sw:
        compiled = jax.jit(functools.partial(forward, cfg=cfg)).lower(w, tokens).compile()
    return {"fn": compiled, "hlo": compiled.as_text(), "compile_s": (time.process_time_ns() - proc) / 1e9,
            "compile_wall_s": sw.wall}


def time_calls(fns: dict[str, Callable[[], Any]], reps: int, *, on_thread: bool) -> protocol.Comparison:
    """The variants by the protocol (warm-up until steady, then exactly `reps` interleaved rounds) with torch on one
    thread. On the thread's clock when XLA's work runs on this thread (`on_thread`, from `thread_share`), else on
    the wall clock (the thread clock would miss XLA's worker threads). Each fn must wait for its result (a jax
    call: block_until_ready)."""
    positive("reps", reps)
    with bench.cpu_threads("cpu", 1):
        return protocol.compare(fns, device="cpu", min_reps=reps, max_reps=reps, budget_s=3.0,
                                timing_clock="auto" if on_thread else "wall")


def paired_sentence(comparison: protocol.Comparison, eager: str = "eager", other: str = "XLA (jax.jit)") -> str:
    """One sentence on `other` against `eager` timed in the same rounds: the median of the per-round ratios of
    eager's time to other's, with their quartiles, ranked only when that range leaves out 1."""
    r = protocol.paired_ratio(comparison[eager], comparison[other])
    of_medians = comparison[eager].median / comparison[other].median
    head = (f"Timed again beside {eager} in the same {comparison.rounds} rounds, {eager}'s time over {other}'s was {r} "
            f"(the median of the {comparison.rounds} per-round ratios; the ratio of the two medians is {of_medians:.2f}x)")
    if not r.separated:
        return head + ": within the noise, so this run cannot rank the two."
    return head + f": {other} was {'faster' if r.value > 1 else 'slower'} than {eager} round by round."


# ------------------------------------------------------------------------------------------ the optimized HLO

_FUSION = re.compile(r"^\s*(?:ROOT )?%(?P<name>[\w.\-]+) = (?P<shape>\S+) fusion\(.*?kind=(?P<kind>k\w+), "
                     r"calls=%(?P<calls>[\w.\-]+)(?P<rest>.*)$", re.M)
_COMPUTATION = re.compile(r"^%(?P<name>[\w.\-]+) \(.*?\{\n(?P<body>.*?)\n\}", re.M | re.S)
_OPCODE = re.compile(r"= \S+ (?P<op>[a-z][\w\-]*)\(")
_LIBRARY = re.compile(r'"kind":"(__\w+)"')
KIND_WORDS = {"kLoop": "loop", "kInput": "input (a reduction fed by elementwise work)",
              "kOutput": "output (elementwise work fed by a matmul)", "kCustom": "handed to a library"}


def fusions(hlo: str) -> list[dict[str, Any]]:
    """The fusion instructions of an optimized HLO module's text (`compiled.as_text()`), in order: each
    {"name", "shape" (its result), "kind" (kLoop, kInput, kOutput or kCustom), "library" (a kCustom fusion's
    target, such as __ynn_fusion, else ""), "ops" (the opcodes of the computation it calls, parameters
    left out)}. One fusion is one kernel XLA runs: its ops read their inputs once and write one result."""
    bodies = {m["name"]: m["body"] for m in _COMPUTATION.finditer(hlo)}
    out = []
    for m in _FUSION.finditer(hlo):
        ops = [o for o in _OPCODE.findall(bodies.get(m["calls"], "")) if o != "parameter"]
        lib = _LIBRARY.search(m["rest"])
        out.append({"name": m["name"], "shape": m["shape"].split("{")[0], "kind": m["kind"],
                    "library": lib.group(1) if lib else "", "ops": ops})
    return out


def kind_counts(found: list[dict[str, Any]]) -> dict[str, int]:
    """{kind: how many fusions of that kind} (a kCustom fusion counted under its library's name)."""
    counts: dict[str, int] = {}
    for f in found:
        key = f"{f['kind']} ({f['library'].strip('_')})" if f["library"] else f["kind"]
        counts[key] = counts.get(key, 0) + 1
    return counts


_PLUMBING = ("constant", "broadcast", "bitcast")  # ops that move no data through memory of their own


def fusion_rows(found: list[dict[str, Any]], most: int = 6) -> list[list]:
    """Table rows (fusion, kind, result, what it fuses) of the `most` fusions with the most ops (constants,
    broadcasts and bitcasts not counted), each op with how many times it occurs (multiply×3)."""
    def work(f):
        return [o for o in f["ops"] if o not in _PLUMBING]

    rows = []
    for f in sorted(found, key=lambda f: -len(work(f)))[:most]:
        ops = work(f)
        said = ", ".join(o + (f"×{ops.count(o)}" if ops.count(o) > 1 else "") for o in dict.fromkeys(ops))
        rows.append([f["name"], f["kind"] + (f" {f['library']}" if f["library"] else ""), f["shape"], said])
    return rows


def fusion_sentence(found: list[dict[str, Any]], inductor_kernels: int | None, library_calls: int | None = None,
                    aten_calls: list[str] | None = None) -> str:
    """XLA's fusion count beside Inductor's kernel count, generated from the counts, with what each counts; with
    Inductor's library matmul calls and the ATen ops its wrapper calls as they are (`inductor_forward`), the
    matmuls of the two are set side by side."""
    lib = [f for f in found if f["library"]]
    own, dots = len(found) - len(lib), sum(1 for f in lib if "dot" in f["ops"])
    mixed = sum(1 for f in lib if set(f["ops"]) - {"dot", "reduce", *_PLUMBING})
    text = (f"XLA's optimized HLO runs {len(found)} fusions: {own} are loops XLA generated itself (chains of "
            f"elementwise ops with their broadcasts and layout changes folded in) and {len(lib)} are handed to a "
            f"library ({dots} matmuls and {len(lib) - dots} reductions; {mixed} of these {len(lib)} with elementwise "
            "work fused in)")
    if inductor_kernels is None:
        return text + "."
    text += (f". Inductor generated {inductor_kernels} kernel{'s' * (inductor_kernels != 1)} for the same forward and "
             f"calls a library for its matmuls without counting them as kernels, so its {inductor_kernels} compare with "
             f"XLA's {own} generated loops (plus the {len(lib) - dots} reductions XLA gives its library)")
    if library_calls is None:
        return text + "."
    text += f". Matmuls: Inductor's wrapper calls the library {library_calls} time(s) (extern_kernels), XLA's HLO {dots}"
    if aten_calls:
        text += (f"; Inductor's wrapper also makes {len(aten_calls)} call(s) to ATen ops as they are, uncompiled "
                 f"({', '.join(dict.fromkeys(aten_calls))}): "
                 "its attention, whose matmuls run inside that op, while the JAX forward writes attention's two "
                 "matmuls (q kᵀ, then the weights times v) as ops of its own, which XLA then counts")
    return text + "."


def across_rounds_sentence(xla_row: dict[str, Any], others: list[dict[str, Any]]) -> str:
    """XLA's row against rows timed in other rounds (the three-compiler table's), each ranked only where the IQRs
    do not overlap (`protocol.rank_sentence`); said to be across rounds, so that it is read as weaker than the
    paired ratio of `paired_sentence`."""
    if not others:
        return ""
    return ("Across rounds (XLA's median from its own rounds, each other's from the table above's rounds): "
            + "; ".join(protocol.rank_sentence(xla_row["backend"], xla_row["timing"], r["backend"], r["timing"],
                                               "time per forward") for r in others) + ".")


def measured_sentence(rows: list[dict[str, Any]], pair: protocol.Comparison | None, library_calls: int,
                      aten_calls: int = 0, eager: str = "eager", xla: str = "XLA (jax.jit)") -> str:
    """What the three-compiler comparison measured, and only that: each compiler's work units against its time
    beside eager in the same rounds (ONNX Runtime and Inductor: the table's rounds, its medians' IQR-bounded ratio,
    as `onnx_backend.rank_sentence`; XLA: its own rounds, the paired ratio, as `paired_sentence`),
    and that the counts do not say where the time went (this run does not profile the three forwards), with the
    profilers that would say it, for the compilers that ran.

    rows: the table's rows (backend, timing, units, unit_kind), eager first; pair: XLA's paired timing with eager,
    or None where XLA did not run; library_calls, aten_calls: Inductor's library matmul calls and its calls to ATen
    ops it did not compile (`onnx_backend.inductor_forward`)."""
    base = next(r for r in rows if r["backend"] == eager)
    said = []
    for r in rows:
        if r["backend"] == eager:
            continue
        ratio = protocol.ratio(base["timing"], r["timing"])  # as the table's rank sentence computes it
        extra = (f" plus {library_calls} library matmul call(s)" + (f" and {aten_calls} call(s) to uncompiled ATen ops"
                 if aten_calls else "")) if r["backend"] == "Inductor" else ""
        where = ("its time was within the noise of eager's" if not ratio.separated else
                 f"it was {'faster' if ratio.value > 1 else 'slower'} than eager ({eager}/{r['backend']} {ratio})")
        said.append(f"{r['backend']} ran {r['units']} {r['unit_kind']}{extra}, and {where}")
    if pair is not None:
        ratio = protocol.paired_ratio(pair[eager], pair[xla])
        where = ("within the noise of eager's time" if not ratio.separated else
                 f"{'faster' if ratio.value > 1 else 'slower'} than eager ({eager}/{xla} {ratio}, the median of its own "
                 "rounds' per-round ratios)")
        said.append(f"{xla} was {where}")
    tools = ["torch.profiler over eager's and Inductor's calls, as for the layernorm above"]  # what would say why
    if any(r["backend"] == "ONNX Runtime" for r in rows):
        tools.append("ONNX Runtime's SessionOptions.enable_profiling for its time per node")
    if pair is not None:
        tools.append("jax.profiler for the jitted forward")
    return (f"What this run measured: eager called {base['units']} {base['unit_kind']}; " + "; ".join(said)
            + ". A work unit is not the same amount of work in each compiler, so fewer units need not mean less "
            "time. This run times the forwards and counts their units; it does not profile where each one's time "
            "goes, so it does not say why one is faster than another. To find out, profile each forward at this size "
            f"({'; '.join(tools)}) and set the matmuls' and the attention's times side by side, then time them again "
            "at more sequences or tokens, where any fixed cost per call weighs less.")


# ------------------------------------------------------------------------------------------ sharding: the all-reduce

_SHARDED_MLP = """
import json, sys
import numpy as np
import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
n, rows, d, hidden = map(int, sys.argv[1:5])
mesh = Mesh(np.array(jax.devices("cpu")[:n]), ("tp",))
rng = np.random.default_rng(0)
x = rng.standard_normal((rows, d), dtype=np.float32)
w_up = rng.standard_normal((d, hidden), dtype=np.float32) / d ** 0.5
w_down = rng.standard_normal((hidden, d), dtype=np.float32) / hidden ** 0.5
def mlp(x, w_up, w_down):
    return jax.nn.gelu(x @ w_up, approximate=True) @ w_down
whole = NamedSharding(mesh, P())
split = jax.jit(mlp, in_shardings=(whole, NamedSharding(mesh, P(None, "tp")), NamedSharding(mesh, P("tp", None))),
                out_shardings=whole).lower(x, w_up, w_down).compile()
got, want = np.asarray(split(x, w_up, w_down)), np.asarray(jax.jit(mlp)(x, w_up, w_down))
print(json.dumps({"devices": len(jax.devices("cpu")), "hlo": split.as_text(),
                  "max_abs_err": float(np.abs(got - want).max())}))
"""


def sharded_mlp(devices: int, rows: int, d: int, hidden: int, timeout_s: float = 120.0) -> dict[str, Any]:
    """An MLP y = gelu(x W_up) W_down with its hidden dimension split over `devices` host CPU devices by
    jax.sharding (W_up by columns, W_down by rows, x and y whole: Megatron's split), compiled by XLA in a child
    process, since XLA_FLAGS=--xla_force_host_platform_device_count must be set before jax starts and this process's
    jax keeps its one device. Returns {"devices", "collectives": the all-reduce lines of the compiled HLO,
    "local": the per-device shapes of the entry's parameters, "max_abs_err" (against the unsplit MLP),
    "cpu_s": the child's CPU seconds}. Raises ValueError when hidden is not divisible by devices, RuntimeError
    when the child fails."""
    positive("devices", devices)
    if hidden % devices:
        raise ValueError(f"hidden={hidden} must be divisible by devices={devices}")
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}", "JAX_PLATFORMS": "cpu"}
    with clock.Stopwatch(children=True, tally=False) as sw:
        done = subprocess.run([sys.executable, "-c", _SHARDED_MLP, str(devices), str(rows), str(d), str(hidden)],
                              env=env, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode:
        raise RuntimeError(f"the sharded MLP's process failed: {done.stderr.strip()[-500:]}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    entry = out["hlo"].split("ENTRY", 1)[1].split("\n", 1)[0]
    return {"devices": out["devices"], "max_abs_err": out["max_abs_err"], "cpu_s": sw.cpu,
            "collectives": [ln.strip() for ln in out["hlo"].splitlines() if re.search(r" all-reduce(-start)?\(", ln)],
            "local": re.findall(r"\w+\[[\d,]*\]", entry.split("->")[0])}
