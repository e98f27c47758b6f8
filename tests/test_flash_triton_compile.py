"""The course's Triton kernels compile for an H100/H200 (sm_90) ahead of time, with no GPU.

The other Triton tests run the kernels in Triton's interpreter, which accepts code the compiler
rejects (a module-level float read inside a kernel, for one). Here a subprocess, with the
interpreter off, runs Triton's real compiler down to ptxas on the largest tiles the autotuner may
pick, in bf16 and fp16, and checks that each fits in the 227 KiB of shared memory an H100/H200 block may use.
"""
import json
import os
import subprocess
import sys

import pytest

SM90_MAX_SHARED = 232448  # bytes of shared memory one block may opt into on H100/H200

SCRIPT = r"""
import json, sys
import triton
try:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
except ImportError as err:
    print(f"this triton has no ahead-of-time compile API: {err}"); sys.exit(3)
from helpers import flash_triton as ft

F32 = "*fp32"
D = 128  # head dim: the largest tiles


def compile_kernel(kernel, args, meta, num_warps, num_stages):
    signature = {name: ("constexpr" if name in meta else args[name]) for name in kernel.arg_names}
    # as the JIT specialises them: torch's pointers and the row strides are multiples of 16
    aligned = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(kernel.arg_names)
               if name not in meta and (args[name].startswith("*") or name.startswith("s_"))}
    compiled = triton.compile(ASTSource(kernel, signature, meta, aligned), target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": num_warps, "num_stages": num_stages})
    return compiled.metadata.shared


strides = {f"s_{t}{a}": "i32" for t in "qko" for a in "bhn"}
sizes = {"H": "i32", "N_Q": "i32", "N_K": "i32", "sm_scale": "fp32"}
base = {"HEAD_DIM": D, "D_PAD": D, "PREC": "tf32"}
out = {}
for P in ("*bf16", "*fp16"):
    for causal in (False, True):
        meta = base | {"IS_CAUSAL": causal}
        for bm, bn, w, s in ft.FWD_CONFIGS:
            args = dict(Q=P, K=P, V=P, O=P, L=F32) | strides | sizes
            out[f"fwd {P[1:]} {bm}x{bn} warps={w} stages={s} causal={causal}"] = compile_kernel(
                ft._fwd_kernel, args, meta | {"BLOCK_M": bm, "BLOCK_N": bn}, w, s)
        for name, kernel, configs, extra in (("dkdv", ft._dkdv_kernel, ft.DKDV_CONFIGS, {"DK": P, "DV": P}),
                                             ("dq", ft._dq_kernel, ft.DQ_CONFIGS, {"DQ": P})):
            bm, bn, w, s = max(configs, key=lambda c: c[0] * c[1])  # the largest tiles: the most shared memory
            args = dict(Q=P, K=P, V=P, DO=P, L=F32, Delta=F32) | extra | strides | sizes
            out[f"{name} {P[1:]} {bm}x{bn} causal={causal}"] = compile_kernel(
                kernel, args, meta | {"BLOCK_M": bm, "BLOCK_N": bn}, w, s)
args = dict(O="*bf16", DO="*bf16", Delta=F32, H="i32", N_Q="i32")
args |= {k: "i32" for k in ("s_qb", "s_qh", "s_qn", "s_ob", "s_oh", "s_on")}
out["preprocess"] = compile_kernel(ft._bwd_preprocess, args, {"HEAD_DIM": D, "D_PAD": D, "BLOCK_M": 64}, 4, 1)
print(json.dumps(out))
"""


@pytest.mark.notebook  # slow-ish (a compile per kernel), like the notebook runs
def test_triton_kernels_compile_for_sm90_within_shared_memory():
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"COURSE_TRITON_AOT": "1"}
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=900)
    if done.returncode == 3:
        pytest.skip(done.stdout.strip())
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    shared = json.loads(done.stdout.strip().splitlines()[-1])
    from helpers.flash_triton import FWD_CONFIGS

    assert len(shared) == 2 * 2 * (len(FWD_CONFIGS) + 2) + 1  # bf16 and fp16, causal or not, fwd configs + 2 bwd
    too_big = {k: v for k, v in shared.items() if v > SM90_MAX_SHARED}
    assert not too_big, f"kernels that would not launch on an H100/H200: {too_big}"
