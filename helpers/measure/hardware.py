"""What the device is and what it can do on paper: its name, capabilities, library versions, datasheet
peaks with their sources, and the matmul each format runs as. What it does in practice is `ceilings`."""
from __future__ import annotations

# torch is imported inside the functions that need it (heavy): the runner's worker processes import
# this module and never load torch.

import importlib.util
import os
import platform
import re
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

MATMUL_DTYPES = ("fp32", "tf32", "fp16", "bf16", "fp8")


@dataclass(frozen=True)
class Peak:
    """Dense datasheet peaks in TFLOP/s (None: no such unit) and memory bandwidth in GB/s."""

    name: str
    fp32: float | None
    tf32: float | None
    fp16: float | None
    bf16: float | None
    fp8: float | None
    bandwidth_gbs: float
    memory_gb: float
    source: str
    note: str = ""

    def tflops(self, dtype: str) -> float | None:
        """The dense peak for a dtype name from MATMUL_DTYPES."""
        return getattr(self, dtype)

    def ridge_point(self, dtype: str) -> float | None:
        """FLOPs per byte at which the roofline turns from memory- to compute-bound."""
        peak = self.tflops(dtype)
        return None if peak is None else peak * 1e12 / (self.bandwidth_gbs * 1e9)


_SPARSE_NOTE = "tensor-core figures are dense (half of the datasheet's 'with sparsity' numbers)"

# pattern on the lowercased CUDA device name -> datasheet row
PEAKS: dict[str, Peak] = {
    r"h200": Peak("NVIDIA H200 SXM", 67.0, 494.7, 989.4, 989.4, 1978.9, 4800, 141,
                  "NVIDIA H200 Tensor Core GPU datasheet (2024)", _SPARSE_NOTE),
    r"h100.*pcie": Peak("NVIDIA H100 PCIe", 51.0, 378.0, 756.0, 756.0, 1513.0, 2000, 80,
                        "NVIDIA H100 Tensor Core GPU datasheet (2023)", _SPARSE_NOTE),
    r"h100": Peak("NVIDIA H100 SXM", 67.0, 494.7, 989.4, 989.4, 1978.9, 3350, 80,
                  "NVIDIA H100 Tensor Core GPU datasheet (2023)", _SPARSE_NOTE),
    r"a100.*40gb": Peak("NVIDIA A100 SXM 40GB", 19.5, 156.0, 312.0, 312.0, None, 1555, 40,
                        "NVIDIA A100 Tensor Core GPU datasheet (2021)", _SPARSE_NOTE),
    r"a100": Peak("NVIDIA A100 SXM 80GB", 19.5, 156.0, 312.0, 312.0, None, 2039, 80,
                  "NVIDIA A100 Tensor Core GPU datasheet (2021)",
                  _SPARSE_NOTE + "; the 80GB PCIe card has 1935 GB/s"),
    r"\bl4\b": Peak("NVIDIA L4", 30.3, 60.0, 121.0, 121.0, 242.5, 300, 24,
                    "NVIDIA L4 Tensor Core GPU datasheet (2023)", _SPARSE_NOTE),
    r"\bt4\b": Peak("NVIDIA T4", 8.1, None, 65.0, None, None, 320, 16,
                    "NVIDIA T4 Tensor Core GPU datasheet (2019)",
                    "fp16 is mixed-precision tensor-core peak; Turing has no bf16, tf32 or fp8 units"),
    r"a10g": Peak("NVIDIA A10G", 35.0, None, 70.0, 70.0, None, 600, 24,
                  "Baseten, 'NVIDIA A10 vs A10G for ML model inference' (2023); secondary",
                  "AWS publishes no NVIDIA datasheet for this variant; tf32 not stated there"),
    r"4090": Peak("NVIDIA GeForce RTX 4090", 82.6, 82.6, 165.2, 165.2, 330.3, 1008, 24,
                  "NVIDIA Ada Lovelace GPU architecture whitepaper v2.1, appendix A",
                  "tensor figures with fp32 accumulate (fp16 accumulate doubles them)"),
}


def peaks_for(device_name: str | None = None) -> Peak | None:
    """The datasheet row for a device name (default: the current CUDA device); None if unknown."""
    if device_name is None:
        import torch

        if not torch.cuda.is_available():
            return None
        device_name = torch.cuda.get_device_name(0)
    lowered = device_name.lower()
    for pattern, peak in PEAKS.items():
        if re.search(pattern, lowered):
            return peak
    return None


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, or what platform knows."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


@dataclass(frozen=True)
class DeviceInfo:
    """The device a notebook runs on."""

    kind: str  # "cuda" or "cpu"
    name: str
    memory_gb: float | None = None
    sm_count: int | None = None
    compute_capability: tuple[int, int] | None = None
    cores: int | None = None
    l2_cache_mb: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def detect() -> DeviceInfo:
    """Describe the current CUDA device, or the CPU when there is none."""
    import torch

    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        return DeviceInfo("cuda", p.name, round(p.total_memory / 2**30, 1), p.multi_processor_count,
                          (p.major, p.minor), None, round(getattr(p, "L2_cache_size", 0) / 2**20, 1))
    total = None
    try:
        total = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        pass
    return DeviceInfo("cpu", cpu_model(), total, None, None, os.cpu_count(), None,
                      {"torch_threads": torch.get_num_threads()})


def _importable(module: str) -> bool:
    try:
        __import__(module)
        return True
    except Exception:  # a broken install counts as absent, whatever it raises
        return False


EMULATED_SLOWER = 2.0  # a format whose matmul runs more than 2x slower than fp32's has no units of its own here
_EMULATED: dict[str, str | None] = {}


def emulated(dtype: str, device: str = "cpu") -> str | None:
    """One sentence saying that `dtype` ("bf16" or "fp16") is emulated on `device`, or None where it runs natively.

    On a GPU: bf16 without bf16 units (compute capability below 8.0; fp16 has units on every GPU the course runs).
    On a CPU it is measured, once per process: a 256x256x256 matmul in `dtype` against fp32 on one torch thread,
    the best of three calls each on the thread's own clock; more than EMULATED_SLOWER times fp32's time means the
    CPU converts and computes in fp32 (an AVX2 CPU without AVX512-BF16 or AMX), and the sentence gives the ratio.
    An emulated format is left out of rankings, MFU and products: its time measures the emulation."""
    import torch

    from helpers.measure import clock  # the course's CPU clock (it imports nothing heavy)

    if dtype not in ("bf16", "fp16"):
        raise ValueError(f"dtype={dtype!r}; emulation is measured for 'bf16' and 'fp16'")
    if device == "cuda" or str(device).startswith("cuda"):
        if dtype == "bf16" and not torch.cuda.is_bf16_supported(including_emulation=False):
            return "this GPU has no bf16 units, so bf16 is emulated"
        return None
    if dtype not in _EMULATED:
        before = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            best = {}
            for name in ("fp32", dtype):
                a, b = matmul_operands(256, name, "cpu")
                a @ b
                times = []
                for _ in range(3):
                    with clock.Stopwatch(tally=False) as sw:
                        a @ b
                    times.append(sw.cpu)
                best[name] = max(min(times), 1e-9)
        finally:
            torch.set_num_threads(before)
        ratio = best[dtype] / best["fp32"]
        _EMULATED[dtype] = (None if ratio <= EMULATED_SLOWER else
                            f"{dtype} is emulated on this CPU (a {dtype} matmul ran {ratio:.0f}x slower than fp32's, so "
                            f"it has no {dtype} units): {dtype} runs, but its times are left out of rankings and MFU")
    return _EMULATED[dtype]


def default_dtype(device: str) -> str:
    """The format a notebook times by default: "bf16" on a GPU with bf16 units, "fp16" on one without (a T4, where
    bf16 would be emulated), "fp32" on a CPU (where the course measures 16-bit formats apart: `emulated`)."""
    if not str(device).startswith("cuda"):
        return "fp32"
    return "bf16" if emulated("bf16", "cuda") is None else "fp16"


def capabilities() -> dict[str, bool]:
    """What this machine can run: native bf16/fp16 (measured on a CPU: `emulated`), tf32/fp8 units, flash-attn,
    triton (compiled or interpreted)."""
    import torch

    cuda = torch.cuda.is_available()
    cc = torch.cuda.get_device_capability(0) if cuda else (0, 0)
    triton = importlib.util.find_spec("triton") is not None  # importing it would fix its interpreter mode
    return {
        "cuda": cuda,
        "bf16": emulated("bf16", "cuda" if cuda else "cpu") is None,
        "fp16": emulated("fp16", "cuda" if cuda else "cpu") is None,
        "tf32": cuda and cc >= (8, 0),
        "fp8": cuda and cc >= (8, 9) and hasattr(torch, "_scaled_mm"),
        "flash_attn": cuda and _importable("flash_attn"),
        "triton": cuda and triton,
        "triton_interpreter": triton,
        "bitsandbytes": importlib.util.find_spec("bitsandbytes") is not None,  # importing it is noisy
    }


def library_versions() -> dict[str, str]:
    """Installed versions of the course's libraries, or 'not installed'."""
    out = {"python": platform.python_version()}
    for pkg in ("torch", "triton", "numpy", "matplotlib", "bitsandbytes", "flash-attn", "papermill", "ipywidgets"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = "not installed"
    try:  # the build as torch names it ("2.11.0+cu130"): the package metadata drops the CUDA tag
        import torch
        out["torch"] = torch.__version__
    except ImportError:  # pragma: no cover - the course needs torch
        pass
    return out


def describe() -> DeviceInfo:
    """Print a short summary of device, datasheet peaks, capabilities and versions; return the info."""
    import torch

    info = detect()
    if info.kind == "cuda":
        cc = ".".join(map(str, info.compute_capability))
        print(f"device     : {info.name} (sm_{cc.replace('.', '')}, {info.sm_count} SMs, "
              f"{info.memory_gb} GiB, L2 {info.l2_cache_mb} MiB)")
    else:
        print(f"device     : CPU, {info.name}, {info.cores} cores, {info.memory_gb} GiB, "
              f"torch threads {torch.get_num_threads()}")
    peak = peaks_for(info.name) if info.kind == "cuda" else None
    if peak:
        dense = ", ".join(f"{d} {peak.tflops(d)}" for d in MATMUL_DTYPES if peak.tflops(d))
        print(f"datasheet  : {peak.name}: {dense} TFLOP/s; {peak.bandwidth_gbs:g} GB/s  [{peak.source}]")
    elif info.kind == "cuda":
        print("datasheet  : this GPU is not in helpers.measure.hardware.PEAKS; fractions of peak use the measured ceiling")
    else:
        print("datasheet  : none for CPUs; this course measures the CPU's ceilings instead")
    caps = capabilities()
    print("can run    : " + ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in caps.items()))
    for dtype in ("bf16", "fp16"):
        if emulated(dtype, info.kind):
            print(f"emulated   : {emulated(dtype, info.kind)}")
    print("versions   : " + ", ".join(f"{k} {v}" for k, v in library_versions().items()))
    print("conditions : " + run_conditions())
    return info


def run_conditions() -> str:
    """How this process shares the machine: the course runner's sentence (COURSE_RUN_CONDITIONS), else
    this process's torch threads and a note that nothing else on the machine is controlled."""
    import torch

    told = os.environ.get("COURSE_RUN_CONDITIONS", "").strip()
    if told:
        return f"{told} (set by the course runner)"
    return (f"{torch.get_num_threads()} torch thread(s) on {os.cpu_count()} core(s), not under the course "
            "runner: whatever else runs on this machine shares it and slows the timings")


# ---------------------------------------------------------------------------------------------
# the matmuls the ceilings are measured with

def torch_dtype(name: str):
    """The torch dtype a course format name stands for (tf32 computes on fp32 tensors; fp8 is e4m3)."""
    import torch

    return {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16,
            "bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn}[name]


def matmul_unsupported(dtype: str, device: str) -> str | None:
    """Why a square matmul of this dtype cannot run here, or None if it can."""
    if dtype not in MATMUL_DTYPES:
        raise ValueError(f"dtype={dtype!r} is not allowed; choose one of {MATMUL_DTYPES}")
    caps = capabilities()
    if device == "cpu" and dtype in ("tf32", "fp8"):
        return f"{dtype} matmul needs NVIDIA tensor cores; CPUs have none"
    if device == "cuda":
        if dtype == "tf32" and not caps["tf32"]:
            return "tf32 needs compute capability 8.0 or newer"
        if dtype == "bf16" and not caps["bf16"]:
            return "this GPU has no bf16 tensor cores"
        if dtype == "fp8" and not caps["fp8"]:
            return "fp8 matmul (torch._scaled_mm) needs compute capability 8.9 or newer"
    return None


def matmul_operands(n: int, dtype: str, device: str, m: int | None = None, k: int | None = None):
    """Random (m×k) and (k×n) operands in `dtype` (fp8: e4m3, the second one column-major)."""
    import torch

    m, k = m or n, k or n
    tdt = torch_dtype(dtype)
    if dtype == "fp8":  # torch._scaled_mm wants the second operand column-major
        return torch.randn(m, k, device=device).to(tdt), torch.randn(n, k, device=device).to(tdt).t()
    return torch.randn(m, k, device=device, dtype=tdt), torch.randn(k, n, device=device, dtype=tdt)


def matmul(a, b, dtype: str):
    """a @ b the way `dtype` computes it: tf32 switched on only for 'tf32', fp8 via torch._scaled_mm."""
    import torch

    if dtype == "fp8":
        one = torch.ones((), device=a.device)
        out = torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        return out[0] if isinstance(out, tuple) else out  # torch 2.4 returned (out, amax)
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
    try:
        return a @ b
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


def matmul_fn(n: int, dtype: str, device: str, m: int | None = None, k: int | None = None):
    """A zero-argument callable computing an (m×k)@(k×n) product in `dtype`, and its FLOP count."""
    a, b = matmul_operands(n, dtype, device, m, k)
    return (lambda: matmul(a, b, dtype)), 2 * a.shape[0] * b.shape[1] * a.shape[1]


def last_level_cache(device: str = "cpu") -> tuple[int | None, str]:
    """(bytes, name) of the device's last-level cache: the GPU's L2 (torch's device properties) on CUDA, else
    the CPU's highest cache level from sysconf or /sys/devices/system/cpu/cpu0/cache; (None, "") where unknown."""
    if device == "cuda":
        import torch  # heavy: only a GPU's cache needs it

        if torch.cuda.is_available():
            size = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0)
            return (int(size), "L2") if size else (None, "")
    for level in (4, 3, 2):
        try:
            size = os.sysconf(f"SC_LEVEL{level}_CACHE_SIZE")
        except (ValueError, OSError, AttributeError):
            size = 0
        if size and size > 0:
            return int(size), f"L{level}"
    best: tuple[int | None, str] = (None, "")
    root = "/sys/devices/system/cpu/cpu0/cache"
    for entry in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        try:
            level = open(os.path.join(root, entry, "level")).read().strip()
            text = open(os.path.join(root, entry, "size")).read().strip()
        except OSError:
            continue
        m = re.fullmatch(r"(\d+)([KMG]?)", text)
        if m:
            size = int(m.group(1)) * {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}[m.group(2)]
            if best[0] is None or size > best[0]:
                best = (size, f"L{level}")
    return best
