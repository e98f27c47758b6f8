"""helpers.measure.triton_mode: the interpreter switch every module with a Triton kernel shares."""
import os
import subprocess
import sys

import pytest

from helpers.measure import triton_mode


def _fresh(code: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


def test_switch_before_triton_is_imported_sets_the_interpreter_and_reports_nothing():
    out = _fresh("import os, sys\nfrom helpers.measure import triton_mode\n"
                 "print(triton_mode.use_interpreter_without_gpu('m', True), os.environ.get('TRITON_INTERPRET'),"
                 " triton_mode._PROBE)")
    assert out == "None 1 [None]"  # the probe kernel ran in the interpreter


def test_triton_imported_first_in_compiled_mode_is_named_with_the_module():
    out = _fresh("import triton\nfrom helpers.measure import triton_mode\n"
                 "print(triton_mode.use_interpreter_without_gpu('helpers.x', True))")
    assert out.startswith("triton was imported before helpers.x switched its interpreter on")


def test_on_a_gpu_nothing_is_switched(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert triton_mode.use_interpreter_without_gpu("m", False) is None
    assert "TRITON_INTERPRET" not in os.environ


@pytest.mark.parametrize("module", ["helpers.fusion.triton_softmax", "helpers.attention.flash_triton", "helpers.lowbit.quant_linear"])
def test_kernel_modules_switch_before_their_import_of_triton(module):
    out = _fresh(f"import importlib, os\nm = importlib.import_module({module!r})\n"
                 "print(m.BROKEN, m.INTERPRETED, os.environ.get('TRITON_INTERPRET'))")
    assert out == "None True 1"


def test_a_failing_interpreter_probe_is_reported_once_with_versions(monkeypatch):
    monkeypatch.setattr(triton_mode, "_PROBE", [])
    import triton

    def broken_jit(fn):
        raise TypeError("only 0-dimensional arrays can be converted to Python scalars")

    monkeypatch.setattr(triton, "jit", broken_jit)
    msg = triton_mode.interpreter_problem()
    assert msg.startswith(f"Triton {triton.__version__} with NumPy") and "0-dimensional" in msg
    assert triton_mode.interpreter_problem() is msg  # cached: the probe runs once per process
