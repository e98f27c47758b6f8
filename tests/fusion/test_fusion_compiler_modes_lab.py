"""helpers.fusion.compiler_modes_lab: which torch.compile variants a device can run (the modes, and the cudagraphs
backend beside reduce-overhead), the one sentence a CPU prints for CUDA graphs, and the sentences' guards."""
import pytest

from helpers.fusion import compiler_lab, compiler_model_lab, compiler_modes_lab
from helpers.measure import bench


def test_variants_put_the_cudagraphs_backend_beside_reduce_overhead_on_cuda():
    assert compiler_modes_lab.variants(["default", "reduce-overhead"], "cuda") == ["default", "reduce-overhead",
                                                                                  compiler_modes_lab.CUDAGRAPHS]
    assert compiler_modes_lab.variants(["default"], "cuda") == ["default"]
    assert compiler_modes_lab.variants(["default"], "cuda", cudagraphs=True)[-1] == compiler_modes_lab.CUDAGRAPHS
    assert compiler_modes_lab.variants(["reduce-overhead"], "cuda", cudagraphs=False) == ["reduce-overhead"]
    assert compiler_modes_lab.variants(["default"], "cpu") == ["default"] and compiler_modes_lab.variants([], "cpu") == []
    assert compiler_modes_lab.compile_kwargs(compiler_modes_lab.CUDAGRAPHS) == {"backend": "cudagraphs"}
    assert compiler_modes_lab.compile_kwargs("reduce-overhead") == {"mode": "reduce-overhead"}


def test_variants_refuse_unknown_modes_and_cuda_graphs_on_a_cpu():
    with pytest.raises(ValueError, match="choose one of"):
        compiler_modes_lab.variants(["fast"], "cuda")
    with pytest.raises(ValueError, match="needs CUDA"):
        compiler_modes_lab.variants(["reduce-overhead"], "cpu")
    with pytest.raises(ValueError, match="backend='cudagraphs' needs CUDA"):
        compiler_modes_lab.variants(["default"], "cpu", cudagraphs=True)
    with pytest.raises(ValueError, match="needs CUDA"):  # refused before any model is built
        compiler_modes_lab.one_token_forward(None, ["max-autotune"], device="cpu")


def test_the_cpu_sentence_names_both_ways_to_cuda_graphs():
    none = compiler_modes_lab.cuda_graphs_note([], "cpu")
    assert none.startswith("CUDA graphs need CUDA") and 'mode="reduce-overhead"' in none and 'backend="cudagraphs"' in none
    assert "nothing is measured in this section" in none and none.endswith("fused kernels, no CUDA graphs.")
    assert compiler_modes_lab.cuda_graphs_note(["default"], "cpu").endswith(
        "only the default mode is timed (fused kernels, no CUDA graphs).")
    assert compiler_modes_lab.cuda_graphs_note(["default"], "cuda") == ""


def test_the_cudagraphs_sentence_needs_both_rows_and_ranks_only_when_apart():
    def row(ms):
        s = ms / 1e3
        return {"timing": bench.Timing(s, s * 0.95, s * 1.05, [s])}

    assert compiler_modes_lab.cudagraphs_sentence({"eager": row(1.0), "reduce-overhead": row(0.5)}) == ""
    text = compiler_modes_lab.cudagraphs_sentence({"reduce-overhead": row(0.5), compiler_modes_lab.CUDAGRAPHS: row(1.0)})
    assert text.startswith("Both replay one CUDA graph per call") and "reduce-overhead (Inductor's kernels) was 2.00x" in text


def test_the_model_lab_still_answers_for_the_moved_names():
    assert compiler_model_lab.one_token_forward is compiler_modes_lab.one_token_forward
    assert compiler_model_lab.modes_note(list(compiler_lab.ALL_MODES), "cuda") == ""
