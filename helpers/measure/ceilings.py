"""What the device does in practice: its measured matmul throughput and copy bandwidth, and the ceilings
notebook 00 records for the later notebooks (the best of that record and a measurement made now)."""
from __future__ import annotations

import torch

from helpers.measure.bench import benchmark, cpu_threads
from helpers.measure.hardware import capabilities, last_level_cache, matmul_fn, matmul_unsupported
from helpers.measure.params import positive
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


COPY_CEILINGS: dict[tuple, tuple[float, str]] = {}  # this process's copy ceilings, by (device, threads, folder)


def copy_size(device: str | None = None) -> int:
    """Bytes of the source buffer of a copy-bandwidth ceiling: on a GPU 1 GiB; on a CPU the smallest power of
    two at or above its last-level cache, at least 64 MiB (also when the cache size is unknown) and at most
    1 GiB, so that the copy's traffic (source and destination, at least twice the cache) streams from memory."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if torch.device(device).type != "cpu":
        return 2 ** 30
    llc = last_level_cache("cpu")[0] or 2 ** 26
    return min(2 ** 30, 1 << max(26, (llc - 1).bit_length()))


def _recorded_copy_mb() -> float | None:
    """The largest copy (MiB) of notebook 00's copy sweep in this results folder (its `copy_gbps` is that copy's
    bandwidth), or None without that record."""
    sweep = load_results(results_dir()).get("hardware_copy_sweep")
    sizes = (sweep or {}).get("metrics", {}).get("sizes_mb") if isinstance(sweep, dict) else None
    return float(sizes[-1]) if sizes else None


def bandwidth_ceiling(device: str | None = None, *, threads: int | None = None, reps: int = 5
                      ) -> tuple[float, str]:
    """(GB/s, where it came from): the copy bandwidth every GB/s of the course is set against, the one rule.

    Made once per process (a notebook run) for each (device, threads, results folder) and reused
    (`COPY_CEILINGS`). It is notebook 00's recorded `copy_gbps` for this device (its largest copy; the
    source names the copy's size when the sweep's record is there) when the results folder holds one and
    `threads` is None; otherwise one copy of `copy_size(device)` bytes measured now (read + write, GB = 1e9 B,
    `reps` timed copies after one warm-up), on `threads` torch intra-op threads on a CPU (None: the current
    count, the whole machine as notebook 00 measures it; a count is for a step timed on as many threads, and
    notebook 00's whole-machine record does not apply to it). The source states the size and thread count."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    cpu = torch.device(device).type == "cpu"
    if threads is not None:
        positive("threads", threads)
    key = (device, threads if cpu else None, str(results_dir()))
    if key in COPY_CEILINGS:
        return COPY_CEILINGS[key]
    recorded = load_ceilings()
    if recorded and recorded.get("copy_gbps") and (threads is None or not cpu):
        mb = _recorded_copy_mb()
        size = "its largest copy" if mb is None else f"its largest copy, {mb:g} MiB"
        out = float(recorded["copy_gbps"]), f"notebook 00's record for this device ({size}), this results folder"
    else:
        nbytes = copy_size(device)
        n = (threads or torch.get_num_threads()) if cpu else None
        with cpu_threads(device, n or 1):  # on a GPU it changes nothing
            gbps = measure_copy_bandwidth(nbytes, device, reps=reps, warmup=1)
        llc, name = last_level_cache(device)
        where = ("" if not llc else
                 f", {'past' if 2 * nbytes > llc else 'inside'} the {llc / 2**20:g} MiB {name} cache")
        on = f" on {n} thread{'s' if n != 1 else ''}" if cpu else ""
        why = ("notebook 00's whole-machine record does not apply to a step timed on fewer threads"
               if recorded and recorded.get("copy_gbps") else
               "notebook 00 has no record for this device in this results folder")
        out = gbps, f"measured just now: one {nbytes / 2**20:g} MiB copy{on}{where}; {why}"
    COPY_CEILINGS[key] = out
    return out
