"""tools.capture.gpu_check: the one-command GPU check, exercised on the CPU (interpreter, no timing of Triton)."""
import json

import pytest

from helpers.attention import kernels
from tools.capture import gpu_check

pytestmark = pytest.mark.tooling


@pytest.mark.skipif(kernels.TRITON_MISSING is not None, reason=str(kernels.TRITON_MISSING))
def test_main_on_cpu_checks_the_interpreted_kernels_and_writes_the_record(tmp_path):
    assert gpu_check.main(["--out", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "flash_check_correctness.json").read_text())
    rows = record["metrics"]["rows"]
    assert rows and all(r["passed"] for r in rows)
    assert {r["dtype"] for r in rows} == {"fp32", "fp16"} and {r["head_dim"] for r in rows} == {16, 80}
    assert not (tmp_path / "flash_check_speed.json").exists()  # nothing is timed without a GPU
