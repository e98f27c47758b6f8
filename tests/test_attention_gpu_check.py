"""helpers.attention.gpu_check: the one-command GPU check, exercised on the CPU (interpreter, no timing of Triton)."""
import json

import pytest
import torch

from helpers.attention import kernels as A
from helpers.attention import gpu_check as fc
from helpers.gpt.model import naive_attention


def _problem(dtype):
    q, k, v = A.make_qkv(1, 2, 33, 16, dtype, "cpu", seed=4)
    return q, k, v, torch.randn(q.shape, generator=torch.Generator().manual_seed(5)).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_compare_passes_a_correct_implementation(dtype):
    result = fc.compare("flash_pytorch", *_problem(dtype), causal=True)
    assert result["passed"] and len(result["errors"]) == 4
    assert (result["naive"] is None) == (dtype == torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_compare_fails_an_implementation_that_is_slightly_off(monkeypatch, dtype):
    monkeypatch.setattr(fc.A, "attention", lambda q, k, v, impl, causal: naive_attention(q, k, v, causal) * 1.01)
    result = fc.compare("flash_pytorch", *_problem(dtype), causal=False)
    assert not result["passed"]


def test_speed_rows_have_positive_tflops_for_every_point():
    rows = fc.speed("cpu", ["sdpa_math", "flash_pytorch"], head_dims=[16], seq_lens=[32, 64], tokens=64, d_model=32,
                    reps=1, warmup=0)
    assert len(rows) == 2 * 2 * 2 * 2  # causal x N x impl x pass
    assert all(r["status"] == "ok" and r["tflops"] > 0 for r in rows)
    assert {(r["n"], r["head_dim"]) for r in rows} == {(32, 16), (64, 16)}


def test_goal_takes_d128_forward_at_n_of_2048_and_up():
    rows = [{"impl": impl, "pass": p, "head_dim": d, "causal": c, "n": n, "tflops": t}
            for impl, t in (("flash_triton", 300.0), ("sdpa_flash", 250.0))
            for p in ("fwd", "fwd+bwd") for d in (64, 128) for c in (False, True) for n in (1024, 2048, 4096)]
    got = fc.goal(rows)
    assert [(r["n"], r["causal"]) for r in got] == [(2048, False), (4096, False), (2048, True), (4096, True)]
    assert all(r["ratio"] == pytest.approx(1.2) for r in got)


@pytest.mark.skipif(A.TRITON_MISSING is not None, reason=str(A.TRITON_MISSING))
def test_main_on_cpu_checks_the_interpreted_kernels_and_writes_the_record(tmp_path):
    assert fc.main(["--out", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "flash_check_correctness.json").read_text())
    rows = record["metrics"]["rows"]
    assert rows and all(r["passed"] for r in rows)
    assert {r["dtype"] for r in rows} == {"fp32", "fp16"} and {r["head_dim"] for r in rows} == {16, 80}
    assert not (tmp_path / "flash_check_speed.json").exists()  # nothing is timed without a GPU
