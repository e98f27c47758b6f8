"""What Dynamo captures, and when it captures again (notebook 09): graph breaks and their fixes, guards and
recompilation, the logs TORCH_LOGS would print, and fullgraph=True.

* `BREAKS`: three planted graph breaks (a print, an `.item()`, a Python `if` on a tensor's value), each
  with its fix; `explain` counts the graphs and breaks Dynamo makes of a function, with their reasons;
* `fresh_copy` gives a function a new code object, so Dynamo's caches start from nothing for it;
  `count_compiles` counts the compilations of one function called on a sequence of sizes (static,
  automatic dynamic, marked dynamic, a recompile limit);
* `captured_logs` captures what TORCH_LOGS would print (graph breaks, recompiles, output code) and
  `log_entries` sorts its lines by artifact; `fullgraph_refusal` shows fullgraph=True refusing a break.

Everything here runs Dynamo without Inductor (`explain`, a counting backend, backend="eager"), so it is
cheap. Importing Dynamo imports triton, so this module switches Triton's interpreter on where there is no
GPU (`helpers.measure.triton_mode`) first: a Triton kernel of the course imported later still runs.
"""
from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import types
from typing import Any, Callable

import torch

from helpers.measure import triton_mode

triton_mode.use_interpreter_without_gpu(__name__, not torch.cuda.is_available())  # before Dynamo imports triton

# ------------------------------------------------------------------------------------------ graph breaks


def with_print(x):
    """Planted break: print is a Python side effect Dynamo does not put in a graph."""
    y = torch.relu(x) * 2
    print("scaled the input")
    return y + 1


def with_item(x):
    """Planted break: .item() makes a Python float out of a tensor (data the graph does not know)."""
    peak = x.abs().max().item()
    return x / peak


def with_branch(x):
    """Planted break: a Python `if` on a tensor's value (which branch runs depends on the data)."""
    if x.sum() > 0:
        return x * 2
    return x - 1


def fixed_print(x):
    """The print moved out: the function is pure tensor work."""
    return torch.relu(x) * 2 + 1


def fixed_item(x):
    """The peak stays a 0-dim tensor, so the division stays in the graph."""
    return x / x.abs().max()


def fixed_branch(x):
    """Both branches computed, the data picks with torch.where: no Python control flow on values."""
    return torch.where(x.sum() > 0, x * 2, x - 1)


BREAKS = {"print": (with_print, fixed_print), "item": (with_item, fixed_item), "branch": (with_branch, fixed_branch)}


@contextlib.contextmanager
def _quiet_dynamo():
    """Dynamo's graph-break warnings go to its logger; the notebook prints its own summary instead."""
    logger = logging.getLogger("torch._dynamo")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def explain(fn: Callable, *args) -> dict[str, Any]:
    """torch._dynamo.explain(fn)(*args) in short: {"graphs", "breaks", "reasons" (first line of each)}.

    Dynamo only traces (no Inductor, no C++ compiler), so this is cheap. `fn` runs, side effects included.
    """
    with _quiet_dynamo(), contextlib.redirect_stdout(open(os.devnull, "w")):
        out = torch._dynamo.explain(fn)(*args)
    reasons = [str(getattr(r, "reason", r)).strip().splitlines()[0] for r in out.break_reasons]
    return {"graphs": out.graph_count, "breaks": out.graph_break_count, "reasons": reasons}


# ------------------------------------------------------------------------------------------ recompilation


def _shapes_fn(x):
    return torch.relu(x) * 2 + 1


_fresh_ids = iter(range(1, 10**9))


def fresh_copy(fn: Callable) -> Callable:
    """`fn` with a new code object of a new name: Dynamo's caches and its memory of which dimensions
    changed before are keyed by code, so a fresh copy starts from nothing (without torch._dynamo.reset(),
    which would throw away every other compiled function too)."""
    name = f"{fn.__name__}_fresh{next(_fresh_ids)}"
    code = fn.__code__.replace(co_name=name, co_qualname=name)
    return types.FunctionType(code, fn.__globals__, name, fn.__defaults__, fn.__closure__)


def count_compiles(sizes: list[int], *, dynamic: bool | None = None, mark_dynamic: bool = False,
                   limit: int | None = None, cols: int = 16) -> dict[str, Any]:
    """Call one compiled function on (n, cols) inputs for n in `sizes`; count Dynamo's compilations.

    dynamic: torch.compile's argument (None: automatic dynamic, static first and dynamic once a size
    changes; False: a graph per size). mark_dynamic: mark dim 0 dynamic on every input before the call.
    limit: torch._dynamo.config.recompile_limit for this experiment (past it Dynamo runs the function eagerly).
    Uses Dynamo's CompileCounter backend (no Inductor), so it is cheap.
    Returns {"compiles", "after_each" (the count after each call), "sizes"}.
    """
    from torch._dynamo.testing import CompileCounter  # heavy: Dynamo's test helpers, only for this count

    if not sizes or any(isinstance(n, bool) or not isinstance(n, int) or n < 2 for n in sizes):
        raise ValueError(f"sizes={sizes!r} must be a non-empty list of ints >= 2 (0 and 1 are always specialised)")
    counter = CompileCounter()
    fn = torch.compile(fresh_copy(_shapes_fn), backend=counter, dynamic=dynamic)
    after = []
    patch = torch._dynamo.config.patch(recompile_limit=limit) if limit is not None else contextlib.nullcontext()
    with patch, _quiet_dynamo():
        for n in sizes:
            x = torch.randn(n, cols)
            if mark_dynamic:
                torch._dynamo.mark_dynamic(x, 0)
            fn(x)
            after.append(counter.frame_count)
    return {"compiles": counter.frame_count, "after_each": after, "sizes": list(sizes)}


# ------------------------------------------------------------------------------------------ logs, fullgraph


@contextlib.contextmanager
def captured_logs(**artifacts: bool):
    """What TORCH_LOGS would print, captured: `torch._logging.set_logs(**artifacts)` inside the block (e.g.
    graph_breaks=True, recompiles=True, output_code=True, the same names as TORCH_LOGS="graph_breaks,..."),
    and yields a list that holds the logged lines once the block ends. The logging settings are reset to
    their defaults afterwards (`set_logs()`). Raises ValueError for an artifact torch does not know.

    torch's log handlers write to the stream that is sys.stderr when `set_logs` installs them, so they are
    installed while sys.stderr is a buffer: the lines go to the buffer, not to the notebook's stderr.
    """
    known = set(torch._logging._internal.log_registry.artifact_names)
    unknown = sorted(set(artifacts) - known)
    if unknown:
        raise ValueError(f"unknown log artifact(s) {unknown}; e.g. graph_breaks, recompiles, output_code")
    buf, lines = io.StringIO(), []
    with contextlib.redirect_stderr(buf):
        torch._logging.set_logs(**artifacts)
    try:
        yield lines
    finally:
        torch._logging.set_logs()
        lines.extend(buf.getvalue().splitlines())


_LOG_LINE = re.compile(r"^\S+ \S+ \d+ \S+\] (?:\[[^\]]*\] )?\[__(\w+)\] ?(.*)$")


def log_entries(lines: list[str]) -> dict[str, list[str]]:
    """{artifact: [message lines]} from torch's log lines ('V1202 00:28:58.359000 6218 torch/...py:5124] [0/0]
    [__graph_breaks] Graph break in user code ...'), the prefix dropped; lines of other loggers are left out."""
    out: dict[str, list[str]] = {}
    for line in lines:
        m = _LOG_LINE.match(line)
        if m:
            out.setdefault(m.group(1), []).append(m.group(2))
    return out


def clip(text: str, width: int = 110) -> str:
    """`text` cut to at most `width` characters at a word boundary, with " […]" where it was cut (the editor's mark
    for words left out, so that a clipped line does not read as the whole message; a text with no space before
    `width` is cut at `width`); a shorter text is returned as it is. Raises ValueError for width < 1."""
    if width < 1:
        raise ValueError(f"width must be >= 1, got {width}")
    if len(text) <= width:
        return text
    if width <= len(" […]"):  # no room for the mark: the first `width` characters
        return text[:width]
    head = text[:width - 4]
    return (head.rsplit(" ", 1)[0] if " " in head.strip() else head).rstrip() + " […]"


def fullgraph_refusal(fn: Callable, *args) -> str | None:
    """The first line of the error torch.compile(fn, fullgraph=True) raises on `fn(*args)` (a graph break is
    refused rather than split around), or None when fn compiles as one graph. Dynamo only (backend="eager")."""
    compiled = torch.compile(fresh_copy(fn), backend="eager", fullgraph=True)
    try:
        with _quiet_dynamo(), contextlib.redirect_stdout(io.StringIO()):
            compiled(*args)
    except torch._dynamo.exc.Unsupported as err:
        return f"{type(err).__name__}: " + str(err).strip().splitlines()[0]
    return None
