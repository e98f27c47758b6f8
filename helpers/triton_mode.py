"""Where the course's Triton kernels run: compiled on a GPU, or in Triton's interpreter without one.

Triton builds some of its helpers in one mode or the other when it is first imported, so the switch
(TRITON_INTERPRET=1) must be set before anything imports triton. Each module with a kernel calls
`use_interpreter_without_gpu(...)` at its top, before its own `import triton`:

    INTERPRETED = not torch.cuda.is_available()
    BROKEN = triton_mode.use_interpreter_without_gpu("helpers.quant_linear", INTERPRETED)

`BROKEN` is then a sentence saying why the kernels cannot run in this process (triton was imported
earlier in compiled mode, or is not installed), or None. The interpreter runs kernels in numpy: slow,
for correctness only (https://triton-lang.org/main/programming-guide/chapter-3/debugging.html).
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
    broken = None
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        broken = (f"triton was imported before {module} switched its interpreter on; restart the kernel and "
                  "import the course's helpers (or set TRITON_INTERPRET=1) before anything else imports triton")
    os.environ["TRITON_INTERPRET"] = "1"
    return broken
