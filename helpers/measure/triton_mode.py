"""Where the course's Triton kernels run: compiled on a GPU, or in Triton's interpreter without one.

Triton builds some of its helpers in one mode or the other when it is first imported (the
standard library's `@triton.jit` functions, such as `tl.max`, cannot be called from an interpreted
kernel when triton was imported in compiled mode), so the switch (TRITON_INTERPRET=1) must be set
before anything imports triton. Each course module that defines or launches Triton kernels, or that
makes torch import triton (Dynamo and Inductor do), calls `use_interpreter_without_gpu(...)` itself at
its top, before its own `import triton`, so that the course's modules may be imported in any order:

    INTERPRETED = not torch.cuda.is_available()
    BROKEN = triton_mode.use_interpreter_without_gpu(__name__, INTERPRETED)

`BROKEN` is then a sentence saying why the kernels cannot run in this process (triton was imported
earlier in compiled mode, by something outside the course, or is not installed, or this Triton's
interpreter fails on this machine), or None. The interpreter runs kernels in numpy: slow, for
correctness only (https://triton-lang.org/main/programming-guide/chapter-3/debugging.html).

Before answering None in interpreted mode, `interpreter_problem()` runs a tiny probe kernel (once per
process, a few milliseconds): a loop bounded by a runtime integer argument, as every course kernel has.
Some pairs of Triton and NumPy cannot run it: Triton 3.6's interpreter turns such an argument into a
one-element array and calls int() on it, which NumPy 2.5 refuses; Triton 3.9 squeezes the array first.
"""
from __future__ import annotations

import importlib.util
import os
import sys


def use_interpreter_without_gpu(module: str, interpreted: bool) -> str | None:
    """Switch Triton's interpreter on when `interpreted` (no GPU); return why `module`'s kernels
    cannot run in this process, or None when they can.

    module: the calling module's name, for the sentence; interpreted: whether this process runs
    kernels in the interpreter (normally `not torch.cuda.is_available()`). Raises nothing.
    """
    if importlib.util.find_spec("triton") is None:  # pragma: no cover - triton ships with torch's Linux wheels
        return "triton is not installed (pip install triton)"
    if not interpreted:
        return None
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        _IMPORTED_COMPILED.append(module)
    os.environ["TRITON_INTERPRET"] = "1"
    if _IMPORTED_COMPILED:  # once imported in compiled mode, triton stays so for the whole process
        return (f"triton was imported before {module} switched its interpreter on; restart the kernel and "
                "import the course's helpers (or set TRITON_INTERPRET=1) before anything else imports triton")
    return interpreter_problem()


_IMPORTED_COMPILED: list = []  # the module that found triton imported in compiled mode, if one did
_PROBE: list = []  # the probe's answer, once per process
COMPILED_MODE_ERROR = "outside of the scope of a kernel"  # what an interpreted kernel raises then


def interpreter_problem() -> str | None:
    """Run a tiny kernel in Triton's interpreter; return a sentence saying why it failed, or None.

    The kernel loops up to a runtime int and calls one of Triton's library functions (`tl.max`), as
    the course's kernels do; the second fails when triton was imported before TRITON_INTERPRET=1 was
    set. Call with TRITON_INTERPRET=1 set (`use_interpreter_without_gpu` does). The answer is computed
    once per process. Raises nothing."""
    if _PROBE:
        return _PROBE[0]
    try:  # heavy, and triton only now, after the switch
        import numpy as np
        import torch
        import triton
        import triton.language as tl

        @triton.jit
        def _count(out_ptr, n):
            acc = 0
            for _ in range(0, n):  # bounded by a runtime int, like the course's kernels' loops over K or keys
                acc += 1
            tl.store(out_ptr, tl.max(tl.full((2,), acc, tl.int32), axis=0))  # a library @triton.jit function

        out = torch.zeros(1, dtype=torch.int32)
        _count[(1,)](out, 3)
        problem = None if int(out.item()) == 3 else f"its probe kernel counted {int(out.item())} instead of 3"
    except Exception as err:  # noqa: BLE001 - any failure means the kernels cannot run here
        problem = f"{type(err).__name__}: {err}"
    if problem is not None and COMPILED_MODE_ERROR in problem:
        problem = ("triton was imported in compiled mode before TRITON_INTERPRET=1 was set; restart the kernel "
                   "and import the course's helpers (or set TRITON_INTERPRET=1) before anything else imports triton")
    elif problem is not None:
        try:
            versions = f"Triton {triton.__version__} with NumPy {np.__version__}"
        except Exception:  # noqa: BLE001
            versions = "this Triton"
        problem = (f"{versions} cannot run the course's kernels in the interpreter ({problem[:160]}); "
                   "pip install 'numpy<2.5' (or a newer triton) to run them on a CPU")
    _PROBE.append(problem)
    return problem
