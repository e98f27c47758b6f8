"""What the device does in practice: its measured matmul throughput and copy bandwidth, and the ceilings
notebook 00 records for the later notebooks (the best of that record and a measurement made now)."""
from __future__ import annotations

import torch

from helpers.measure.bench import benchmark
from helpers.measure.hardware import capabilities, matmul_fn, matmul_unsupported
from helpers.measure.results import device_name, load_results, results_dir


def measure_matmul_tflops(n: int, dtype: str = "fp32", device: str | None = None,
                          reps: int = 10, warmup: int = 3, *, m: int | None = None,
                          k: int | None = None) -> float | None:
    """Measured TFLOP/s of an n×n×n matmul in `dtype` ((m×k)@(k×n) when m or k is given, as `matmul_fn`);
    None where the dtype cannot run here."""
    device = device or ("cuda" if capabilities()["cuda"] else "cpu")
    if matmul_unsupported(dtype, device):
        return None
    fn, flops = matmul_fn(n, dtype, device, m=m, k=k)
    t = benchmark(fn, warmup=warmup, reps=reps, device=device)
    return flops / t.median / 1e12


def measure_copy_bandwidth(nbytes: int = 2**28, device: str | None = None,
                           reps: int = 10, warmup: int = 3) -> float:
    """Measured GB/s of a device-to-device copy (bytes read plus bytes written)."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    t = benchmark(lambda: dst.copy_(src), warmup=warmup, reps=reps, device=device)
    return 2 * src.numel() * 4 / t.median / 1e9


CEILINGS_RECORD = "hardware_ceilings"


def load_ceilings(folder=None) -> dict | None:
    """The ceilings notebook 00 recorded for *this* device in the results folder, or None."""
    rec = load_results(folder or results_dir()).get(CEILINGS_RECORD)
    if rec is None or rec.get("device") != device_name():
        return None
    return rec["metrics"]


def _measure_shape(size, dtype: str, device: str | None, reps: int) -> float | None:
    """TFLOP/s of one matmul: `size` is n (square n x n x n) or (m, k, n); None where dtype cannot run."""
    m, k, n = (size, size, size) if isinstance(size, int) else size
    return measure_matmul_tflops(n, dtype, device, reps=reps, warmup=min(reps, 3), m=m, k=k)


def _shape_name(size) -> str:
    return f"n={size}" if isinstance(size, int) else "({}x{})@({}x{})".format(size[0], size[1], size[1], size[2])


def matmul_ceiling(dtype: str, sizes, device: str | None = None, reps: int = 5) -> tuple[float | None, str]:
    """(TFLOP/s, where it came from): the best of notebook 00's recorded ceiling for this device and
    the matmuls over `sizes` measured now (each an int n for n x n x n, or an (m, k, n) shape such as
    a model's own GEMMs). A ceiling is the best of every measurement available: a lower one would make
    fractions of it exceed 100%. None (with the reason as source) where `dtype` cannot run here.
    """
    recorded = load_ceilings()
    best_rec = recorded["matmul_tflops"].get(dtype) if recorded else None
    measured = [(t, s) for t, s in ((_measure_shape(s, dtype, device, reps), s) for s in sizes) if t is not None]
    now = max(measured, key=lambda ts: ts[0]) if measured else None
    shapes = ", ".join(_shape_name(s) for s in sizes)
    if best_rec is None:
        if now is None:
            return None, f"{dtype} matmul cannot run on this device"
        return now[0], (f"measured just now at {shapes}" if len(sizes) == 1 else
                        f"measured just now: the best of {shapes}, reached at {_shape_name(now[1])}")
    if now is None or best_rec >= now[0]:
        return best_rec, (f"notebook 00, this results folder (best of that record and {shapes} measured now"
                          + (f", {now[0]:.4g} TFLOP/s)" if now else ")"))
    return now[0], (f"measured just now: the best of {shapes}, reached at {_shape_name(now[1])}, above notebook "
                    f"00's record of {best_rec:.4g} TFLOP/s in this results folder")


def bandwidth_ceiling(copy_bytes: int, device: str | None = None, reps: int = 5) -> tuple[float, str]:
    """(GB/s, where it came from): the best of notebook 00's recorded copy bandwidth for this device and
    a `copy_bytes` copy measured now (a ceiling is the best of every measurement available)."""
    recorded = load_ceilings()
    rec = recorded.get("copy_gbps") if recorded else None
    now = measure_copy_bandwidth(copy_bytes, device, reps=reps)
    size = f"{copy_bytes / 2**20:g} MiB copy"
    if not rec:
        return now, f"measured just now ({size})"
    if rec >= now:
        return rec, f"notebook 00, this results folder (best of that record and a {size} measured now, {now:.4g} GB/s)"
    return now, f"measured just now ({size}), above notebook 00's record of {rec:.4g} GB/s in this results folder"
