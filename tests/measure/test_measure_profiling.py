"""The profiler helper ranks ops by self time, writes a trace Perfetto can open, and degrades on a CPU."""
import json

import pytest
import torch

from helpers.measure import profiling


def test_profile_ranks_ops_and_saves_a_chrome_trace(tmp_path):
    a = torch.randn(128, 128)

    def work():
        (a @ a).relu().sum()

    prof = profiling.profile(work, steps=2, trace_dir=tmp_path, name="mm")
    names = [r[0] for r in prof.rows]
    assert "aten::mm" in names and prof.rows[0][1] >= prof.rows[-1][1]
    mm = next(r for r in prof.rows if r[0] == "aten::mm")
    assert mm[2] == 1  # one matmul per step
    assert 0 < sum(r[3] for r in prof.rows) <= 1 + 1e-9
    trace = json.loads((tmp_path / "mm.json").read_text())
    assert any(e.get("name") == "aten::mm" for e in trace["traceEvents"])
    assert "aten::mm" in prof.table() and str(tmp_path / "mm.json") in prof.table()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left behind


def test_bad_arguments_and_memory_snapshot_without_cuda(tmp_path, capsys):
    with pytest.raises(ValueError, match="steps=0"):
        profiling.profile(lambda: None, steps=0, trace_dir=tmp_path)
    if not torch.cuda.is_available():
        assert profiling.memory_snapshot(lambda: None, tmp_path / "s.pickle") is None
        assert "no CUDA device" in capsys.readouterr().out


def test_is_matmul_counts_gemm_ops_and_kernels_once():
    for op in ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "sm90_xmma_gemm_bf16",
               "nvjet_hsh_128x256_64x4_2x1_v_bz_coopB_TNT", "nvjet_tst_128x256_64x4",
               "cublasLt::splitKreduce_kernel", "cutlass_80_tensorop_s1688gemm"):
        assert profiling.is_matmul(op), op
    for op in ("aten::linear", "aten::matmul", "aten::gelu", "aten::add_", "aten::mul",
               "fmha_cutlassF_f32_aligned_64x64_rf_sm80", "pytorch_flash::flash_fwd_kernel"):
        assert not profiling.is_matmul(op), op
