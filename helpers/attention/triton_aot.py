"""Compile the course's Triton kernels for a GPU that need not be here, and read what the compiler made.

`triton.compile` with a target (here sm_90, an H100/H200) runs Triton's real compiler down to
NVIDIA's ptxas without a GPU. `cuobjdump`, shipped inside Triton's package, then reports each
kernel's registers per thread and stack frame, and lists its machine code (SASS), where we count:

- spills: STL/LDL, stores to and loads from local memory, which happen when registers run out;
- tensor-core matrix instructions: HGMMA (Hopper's warpgroup MMA, "wgmma") or HMMA (mma.sync,
  the Ampere-style instruction that Hopper also runs, at a lower rate);
- MUFU.EX2, the hardware exp2 the kernels use for the softmax.

No GPU is needed, but Triton's interpreter must be off in the compiling process, so from a
notebook or test (where it may be on) call `survey_in_subprocess`, or `survey_here_or_in_subprocess`,
which compiles in the calling process where that process compiles the course's kernels (a GPU).
`python -m helpers.attention.triton_aot` prints the table for every configuration the kernels can launch with.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

from helpers.show.tables import table

SM90_MAX_SHARED = 232448  # bytes of shared memory one block may opt into on an H100/H200 (CUDA guide, sm_90)
POINTER = {"bf16": "*bf16", "fp16": "*fp16", "fp32": "*fp32"}
_OUTPUTS = {"forward": ("O",), "dkdv": ("DK", "DV"), "dq": ("DQ",)}


def _flash_triton():
    """helpers.attention.flash_triton in compile-only mode (it must not switch Triton's interpreter on)."""
    import torch  # heavy: this module's command and its subprocess survey start without it

    if "helpers.attention.flash_triton" not in sys.modules and not torch.cuda.is_available():
        os.environ["COURSE_TRITON_AOT"] = "1"  # on a GPU the module stays as it is: autotuned and runnable
    from helpers.attention import flash_triton  # after COURSE_TRITON_AOT is set: flash_triton reads it on import

    if flash_triton.INTERPRETED:
        raise RuntimeError("Triton's interpreter is on in this process; use triton_aot.survey_in_subprocess()")
    return flash_triton


def signature(kernel: str, dtype: str) -> dict[str, str]:
    """Triton's type for each runtime argument of one of the kernels, with tensors in `dtype`."""
    p, f32 = POINTER[dtype], "*fp32"
    strides = {f"s_{t}{a}": "i32" for t in "qko" for a in "bhn"}
    sizes = {"H": "i32", "N_Q": "i32", "N_K": "i32", "sm_scale": "fp32"}
    if kernel == "forward":
        return dict(Q=p, K=p, V=p, O=p, L=f32) | strides | sizes
    if kernel == "preprocess":
        return dict(O=p, DO=p, Delta=f32, H="i32", N_Q="i32") | {f"s_{t}{a}": "i32" for t in "qo" for a in "bhn"}
    outputs = {name: p for name in _OUTPUTS[kernel]}
    return dict(Q=p, K=p, V=p, DO=p, L=f32, Delta=f32) | outputs | strides | sizes


def compile_kernel(kernel: str, dtype: str = "bf16", head_dim: int = 128, is_causal: bool = False,
                   config: tuple[int, int, int, int] = (128, 64, 8, 3), arch: int = 90):
    """Triton's compiled kernel for one (BLOCK_M, BLOCK_N, num_warps, num_stages) config on sm_<arch>."""
    import triton  # optional: a Linux-only dependency (compiling needs no GPU and no interpreter)
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    ft = _flash_triton()
    fn, args = ft.KERNELS[kernel], signature(kernel, dtype)
    bm, bn, warps, stages = config
    meta = {"HEAD_DIM": head_dim, "D_PAD": ft.padded_head_dim(head_dim), "IS_CAUSAL": is_causal,
            "PREC": "ieee" if dtype == "fp32" else "tf32", "BLOCK_M": bm, "BLOCK_N": bn}
    meta = {name: value for name, value in meta.items() if name in fn.arg_names}  # the preprocess kernel has fewer
    types = {name: ("constexpr" if name in meta else args[name]) for name in fn.arg_names}
    # as the JIT specialises them at run time: torch's pointers and our row strides are multiples of 16
    aligned = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names)
               if name not in meta and (args[name].startswith("*") or name.startswith("s_"))}
    source = ASTSource(fn, types, meta, aligned)
    return triton.compile(source, target=GPUTarget("cuda", arch, 32),
                          options={"num_warps": warps, "num_stages": stages})


def cuobjdump() -> str:
    """The cuobjdump that ships with Triton (or one on PATH)."""
    import triton  # optional: a Linux-only dependency

    bundled = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    found = bundled if os.path.exists(bundled) else shutil.which("cuobjdump")
    if not found:
        raise FileNotFoundError("no cuobjdump: neither in Triton's package nor on PATH")
    return found


def opcode_counts(sass: str) -> dict[str, int]:
    """How often each opcode (the part before the first '.') occurs in a cuobjdump -sass listing."""
    counts: dict[str, int] = {}
    for op in re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", sass):
        counts[op] = counts.get(op, 0) + 1
    return counts


def resources(compiled) -> dict[str, int]:
    """Registers, stack, shared memory and the instruction counts described above, for one compiled kernel."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.cubin")
        with open(path, "wb") as f:
            f.write(compiled.asm["cubin"])
        usage = subprocess.run([cuobjdump(), "-res-usage", path], capture_output=True, text=True, check=True).stdout
        sass = subprocess.run([cuobjdump(), "-sass", path], capture_output=True, text=True, check=True).stdout
    found = re.search(r"REG:(\d+) STACK:(\d+)", usage)
    if not found:
        raise RuntimeError(f"cannot read registers from cuobjdump's report:\n{usage}")
    ops = opcode_counts(sass)
    return {"registers": int(found[1]), "stack_bytes": int(found[2]), "shared_bytes": compiled.metadata.shared,
            "spill_stores": ops.get("STL", 0), "spill_loads": ops.get("LDL", 0), "wgmma": ops.get("HGMMA", 0),
            "mma_sync": ops.get("HMMA", 0), "exp2": sass.count("MUFU.EX2"), "instructions": sum(ops.values())}


def launch_configs(kernel: str, head_dim: int, dtype: str,
                   autotuned: str | None = None) -> list[tuple[int, int, int, int]]:
    """Every config flash_triton may launch `kernel` with on a GPU: the autotuner's list, or the fixed one.

    autotuned: a name of flash_triton.CONFIG_LISTS ("shortlist", "all"): only the configs that list has the
    autotuner try (fp16/bf16; fp32 and the preprocess kernel are never autotuned and keep their one config)."""
    ft = _flash_triton()
    d_pad = ft.padded_head_dim(head_dim)
    if kernel == "preprocess":
        return [(ft.PREPROCESS_BLOCK, ft.PREPROCESS_BLOCK, 4, 3)]  # launched with Triton's defaults; BLOCK_N unused
    if dtype == "fp32":
        return [ft.fixed_config(None, None, d_pad, fp32=True)]
    if autotuned is not None:
        return list(ft.CONFIG_LISTS[autotuned][kernel][ft.head_dim_class(d_pad)])
    return ft.AUTOTUNE[kernel][ft.head_dim_class(d_pad)] + [ft.fixed_config(None, None, d_pad, fp32=False)]


def survey(kernels=("forward", "dkdv", "dq"), head_dims=(64, 128), dtypes=("bf16",), is_causal=(False, True),
           arch: int = 90, extra: dict | None = None, autotuned: str | None = None) -> list[dict]:
    """One row per (kernel, dtype, head dim, causal, config): the config and its `resources`.

    extra: {kernel: [config, ...]} compiled besides the ones flash_triton launches (marked launched=False).
    autotuned: as in `launch_configs` (None: every config flash_triton may launch).
    """
    rows = []
    for kernel in kernels:
        for dtype in dtypes:
            for d in head_dims:
                configs = [(c, True) for c in dict.fromkeys(launch_configs(kernel, d, dtype, autotuned))]
                configs += [(c, False) for c in (extra or {}).get(kernel, []) if (c, True) not in configs]
                for flag in is_causal:
                    for config, launched in configs:
                        compiled = compile_kernel(kernel, dtype, d, flag, config, arch)
                        rows.append({"kernel": kernel, "dtype": dtype, "head_dim": d, "causal": flag,
                                     "config": list(config), "launched": launched, "arch": arch,
                                     **resources(compiled)})
    return rows


def survey_in_subprocess(timeout: float = 900, **kwargs) -> list[dict]:
    """`survey(**kwargs)` run in a fresh Python with Triton's interpreter off; raises with its stderr if it fails."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"COURSE_TRITON_AOT": "1"}
    code = f"import json; from helpers.attention.triton_aot import survey; print(json.dumps(survey(**{kwargs!r})))"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"the compile survey failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def survey_here_or_in_subprocess(timeout: float = 900, **kwargs) -> list[dict]:
    """`survey(**kwargs)` in this process where the course's Triton kernels are compiled here (a GPU), which
    saves a Python start-up; elsewhere (Triton's interpreter on, or not yet known) `survey_in_subprocess`."""
    ft = sys.modules.get("helpers.attention.flash_triton")
    if ft is not None and not ft.INTERPRETED:
        return survey(**kwargs)
    return survey_in_subprocess(timeout, **kwargs)


def format_rows(rows: list[dict]) -> str:
    """The survey as a text table."""
    header = ["kernel", "dtype", "d", "causal", "BLOCK_M x BLOCK_N, warps, stages", "launched", "registers",
              "spill st/ld", "shared KiB", "wgmma", "mma.sync"]
    return table(header, [[r["kernel"], r["dtype"], r["head_dim"], r["causal"],
                           "{} x {}, {}, {}".format(*r["config"]), r["launched"], r["registers"],
                           f"{r['spill_stores']}/{r['spill_loads']}", r["shared_bytes"] / 1024, r["wgmma"],
                           r["mma_sync"]] for r in rows])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", nargs="+", default=["forward", "dkdv", "dq"], choices=["forward", "dkdv", "dq", "preprocess"])
    parser.add_argument("--head-dims", nargs="+", type=int, default=[64, 128])
    parser.add_argument("--dtypes", nargs="+", default=["bf16"], choices=sorted(POINTER))
    parser.add_argument("--arch", type=int, default=90, help="compute capability x 10 (90: H100/H200, 80: A100)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    args = parser.parse_args(argv)
    rows = survey(args.kernels, args.head_dims, args.dtypes, (False, True), args.arch)
    print(json.dumps(rows) if args.json else format_rows(rows))


if __name__ == "__main__":
    main()
