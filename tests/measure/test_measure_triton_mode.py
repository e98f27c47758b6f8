"""helpers.measure.triton_mode: the interpreter switch every module with a Triton kernel shares."""
import os
import subprocess
import sys

import pytest
import torch

from helpers.measure import triton_mode


def _fresh(code: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)  # ~30 s alone; a generous limit beside the other worker
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


@pytest.mark.slow
def test_switch_before_triton_is_imported_sets_the_interpreter_and_reports_nothing():
    out = _fresh("import os, sys\nfrom helpers.measure import triton_mode\n"
                 "print(triton_mode.use_interpreter_without_gpu('m', True), os.environ.get('TRITON_INTERPRET'),"
                 " triton_mode._PROBE)")
    assert out == "None 1 [None]"  # the probe kernel ran in the interpreter


@pytest.mark.slow
def test_triton_imported_first_in_compiled_mode_is_named_with_the_module():
    out = _fresh("import triton\nfrom helpers.measure import triton_mode\n"
                 "print(triton_mode.use_interpreter_without_gpu('helpers.x', True))")
    assert out.startswith("triton was imported before helpers.x switched its interpreter on")


@pytest.mark.slow
def test_once_triton_was_imported_in_compiled_mode_every_later_switch_says_so():
    out = _fresh("import triton\nfrom helpers.measure import triton_mode\n"
                 "triton_mode.use_interpreter_without_gpu('helpers.a', True)\n"
                 "print(triton_mode.use_interpreter_without_gpu('helpers.b', True))")
    assert out.startswith("triton was imported before helpers.b switched its interpreter on")


@pytest.mark.slow
def test_interpreter_set_after_triton_was_imported_is_caught_by_the_probe():
    out = _fresh("import os, triton\nos.environ['TRITON_INTERPRET'] = '1'\nfrom helpers.measure import triton_mode\n"
                 "print(triton_mode.use_interpreter_without_gpu('m', True))")
    assert out.startswith("triton was imported in compiled mode before TRITON_INTERPRET=1 was set")


def test_on_a_gpu_nothing_is_switched(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert triton_mode.use_interpreter_without_gpu("m", False) is None
    assert "TRITON_INTERPRET" not in os.environ


@pytest.mark.slow
@pytest.mark.parametrize("module", ["helpers.fusion.triton_softmax", "helpers.attention.flash_triton", "helpers.lowbit.quant_linear"])
def test_kernel_modules_switch_before_their_import_of_triton(module):
    out = _fresh(f"import importlib, os\nm = importlib.import_module({module!r})\n"
                 "print(m.BROKEN, m.INTERPRETED, os.environ.get('TRITON_INTERPRET'))")
    assert out == "None True 1"


# every module of notebooks 06 and 09 that launches Triton kernels or makes torch import triton (Inductor)
FIRST = ["helpers.attention.kernels", "helpers.attention.flash_lab", "tools.capture.gpu_check",
         "helpers.fusion.compiler", "helpers.fusion.dynamo", "helpers.fusion.compiler_lab", "helpers.fusion.compiler_model_lab"]


@pytest.mark.slow
@pytest.mark.parametrize("module", FIRST)
def test_whichever_module_comes_first_the_kernels_imported_after_triton_still_run(module):
    """Import order is irrelevant: each of these modules switches the interpreter on itself, so triton
    imported right after it (as Inductor imports it) is in interpreted mode and the kernels still run."""
    if torch.cuda.is_available():
        pytest.skip("without a GPU only: on a GPU nothing is switched")
    out = _fresh(f"import importlib, os\nimportlib.import_module({module!r})\nimport triton\n"
                 "from helpers.fusion import triton_softmax\nfrom helpers.attention import flash_triton\n"
                 "import torch\nx = torch.randn(3, 40)\n"
                 "assert torch.allclose(triton_softmax.softmax(x, 16), torch.softmax(x, -1), atol=1e-6)\n"
                 "print(triton_softmax.BROKEN, flash_triton.BROKEN, os.environ.get('TRITON_INTERPRET'))")
    assert out == "None None 1"


def test_a_failing_interpreter_probe_is_reported_once_with_versions(monkeypatch):
    monkeypatch.setattr(triton_mode, "_PROBE", [])
    import triton

    def broken_jit(fn):
        raise TypeError("only 0-dimensional arrays can be converted to Python scalars")

    monkeypatch.setattr(triton, "jit", broken_jit)
    msg = triton_mode.interpreter_problem()
    assert msg.startswith(f"Triton {triton.__version__} with NumPy") and "0-dimensional" in msg
    assert triton_mode.interpreter_problem() is msg  # cached: the probe runs once per process


# Imports every module of helpers/ alone, each in a child forked from a process that has imported torch
# (and nothing of the course), and prints the modules after whose import triton is loaded in compiled mode.
_EVERY_MODULE = r"""
import importlib, os, pkgutil, sys
import torch
import helpers
names = sorted(m.name for m in pkgutil.walk_packages(helpers.__path__, "helpers."))
bad = []
for name in names:
    pid = os.fork()
    if pid == 0:
        importlib.import_module(name)
        compiled = "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1"
        os._exit(3 if compiled else 0)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code:
        bad.append(f"{name} ({'loads triton in compiled mode' if code == 3 else f'exit {code}'})")
print(len(names), bad)
"""


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "fork") or torch.cuda.is_available(), reason="without a GPU, on a system with fork")
def test_no_module_of_the_course_loads_triton_before_switching_its_interpreter():
    """The family of the import-order rule: whichever course module a learner imports first, triton is
    either not loaded by it or loaded only after the switch, so any kernel module imported later runs."""
    out = _fresh(_EVERY_MODULE)
    count, bad = out.split(" ", 1)
    assert int(count) > 60 and bad == "[]", out
