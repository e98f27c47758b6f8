"""The course's Triton kernels, compiled for an H100/H200 (sm_90) ahead of time, with no GPU.

The other Triton tests run the kernels in Triton's interpreter, which accepts code the compiler
rejects (a module-level float read inside a kernel, for one) and says nothing about speed. Here
helpers.attention.triton_aot runs Triton's real compiler down to ptxas for every configuration the kernels
can launch with on a GPU, and reads the machine code. We check what can be checked without running
it: each kernel fits in an H100/H200's shared memory; no fp16/bf16 configuration spills registers
to local memory; the matrix products use Hopper's warpgroup MMA (wgmma); fp32 uses no tensor cores.
"""
from concurrent.futures import ThreadPoolExecutor

import pytest

from helpers.attention.triton_aot import SM90_MAX_SHARED, opcode_counts

KERNELS = ("forward", "dkdv", "dq", "preprocess")
SPILLER = (128, 64, 4, 3)  # a forward config we left out at d=128: the check below must see it spill
THIN = (16, 64, 4, 3)  # a 16-row tile, as notebook 06's traffic sweep launches: too thin for wgmma


def test_opcode_counts_reads_a_sass_listing():
    sass = """
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0a50*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT ;
        /*0a60*/              @!P0 STL.64 [R1+0x8], R2 ;
        /*1a2b0*/             @UP1 LDL.LU R5, [R1+0x8] ;
        /*1a2c0*/                   MUFU.EX2 R7, R7 ;
        /*1a2d0*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8], R24 ;
    """
    assert opcode_counts(sass) == {"LDC": 1, "HGMMA": 2, "STL": 1, "LDL": 1, "MUFU": 1}


@pytest.fixture(scope="module")
def compiled():
    """Every launchable config, compiled for sm_90, in two processes side by side (about a minute each)."""
    pytest.importorskip("triton")
    pytest.importorskip("triton.backends.compiler", reason="this triton has no ahead-of-time compile API")
    from helpers.attention.triton_aot import survey_in_subprocess

    jobs = [dict(kernels=KERNELS, head_dims=(64, 128), dtypes=("bf16",), is_causal=(False, True),
                 extra={"forward": [SPILLER, THIN]}),
            dict(kernels=KERNELS, head_dims=(16, 80, 128), dtypes=("fp16",), is_causal=(True,)),
            dict(kernels=KERNELS, head_dims=(64, 128), dtypes=("fp32",), is_causal=(False, True))]
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda job: survey_in_subprocess(**job), jobs))
    return [row for rows in results for row in rows]


@pytest.mark.notebook  # slow-ish (a compile per configuration), like the notebook runs
def test_every_launchable_config_compiles_and_fits_in_shared_memory(compiled):
    from helpers.attention.flash_triton import AUTOTUNE

    forward_bf16 = [r for r in compiled if r["kernel"] == "forward" and r["dtype"] == "bf16" and r["launched"]]
    assert len(forward_bf16) == 2 * 2 * (len(AUTOTUNE["forward"][64]) + 1)  # d, causal, autotune list + fixed
    assert {r["head_dim"] for r in compiled if r["dtype"] == "fp16"} == {16, 80, 128}  # padded head dims too
    too_big = [(r["kernel"], r["dtype"], r["head_dim"], r["config"], r["shared_bytes"])
               for r in compiled if r["shared_bytes"] > SM90_MAX_SHARED]
    assert not too_big, f"kernels that would not launch on an H100/H200: {too_big}"


@pytest.mark.notebook
def test_no_fp16_or_bf16_config_spills_registers(compiled):
    spilled = [(r["kernel"], r["dtype"], r["head_dim"], r["causal"], r["config"], r["spill_stores"])
               for r in compiled if r["launched"] and r["dtype"] != "fp32" and r["spill_stores"] + r["spill_loads"]]
    assert not spilled, ("these configs spill registers on sm_90; pick others for flash_triton.AUTOTUNE "
                         f"(python -m helpers.attention.triton_aot shows the report): {spilled}")
    control = [r for r in compiled if tuple(r["config"]) == SPILLER and r["head_dim"] == 128]
    assert control and all(r["spill_stores"] > 0 for r in control), "the spill check cannot see spills"


@pytest.mark.notebook
def test_matrix_products_use_hopper_tensor_core_instructions(compiled):
    for r in compiled:
        where = (r["kernel"], r["dtype"], r["head_dim"], r["config"])
        if r["kernel"] == "preprocess":
            assert r["wgmma"] == r["mma_sync"] == 0, where  # no matrix product at all
        elif r["dtype"] == "fp32":
            assert r["wgmma"] == r["mma_sync"] == 0, where  # "ieee" fp32 products run on CUDA cores
        elif r["launched"]:
            assert r["wgmma"] > 0 and r["mma_sync"] == 0, where
        assert r["kernel"] == "preprocess" or r["exp2"] > 0, where  # softmax through the hardware exp2
    thin = [r for r in compiled if tuple(r["config"]) == THIN and r["dtype"] == "bf16"]
    assert thin and all(r["wgmma"] == 0 and r["mma_sync"] > 0 for r in thin)  # wgmma needs 64 rows a warpgroup


def test_the_report_compiles_in_process_only_where_the_kernels_are_compiled(monkeypatch):
    from helpers.attention import flash_triton, triton_aot

    monkeypatch.setattr(triton_aot, "survey", lambda **kw: ("here", kw))
    monkeypatch.setattr(triton_aot, "survey_in_subprocess", lambda timeout, **kw: ("subprocess", kw))
    assert triton_aot.survey_here_or_in_subprocess(head_dims=(128,))[0] == ("subprocess" if flash_triton.INTERPRETED
                                                                             else "here")
    monkeypatch.setattr(flash_triton, "INTERPRETED", False)
    assert triton_aot.survey_here_or_in_subprocess(head_dims=(128,)) == ("here", {"head_dims": (128,)})


@pytest.mark.slow
def test_launch_configs_can_name_only_what_the_autotuner_tries():
    import os
    import subprocess
    import sys

    pytest.importorskip("triton")
    code = ("from helpers.attention.triton_aot import launch_configs as c; "
            "print([c('forward', 128, 'bf16', 'shortlist'), c('forward', 128, 'bf16'), c('dq', 64, 'fp32', 'shortlist')])")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"COURSE_TRITON_AOT": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    shortlist, every, fp32 = eval(out)
    from helpers.attention.flash_triton import AUTOTUNE, SHORTLIST

    assert shortlist == SHORTLIST["forward"][128] and len(every) == len(AUTOTUNE["forward"][128]) + 1  # + the fixed one
    assert fp32 == [(16, 16, 4, 2)]  # fp32 is never autotuned: its one fixed config either way
