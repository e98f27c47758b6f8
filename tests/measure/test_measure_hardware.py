import math

import pytest
import torch

from helpers.measure import ceilings, hardware


def test_every_peak_row_has_a_source_and_bandwidth():
    assert len(hardware.PEAKS) >= 9
    for pattern, peak in hardware.PEAKS.items():
        assert peak.source.strip(), pattern
        assert peak.bandwidth_gbs > 0 and peak.fp32 > 0
        assert peak.fp16 is not None


@pytest.mark.parametrize("name, expected", [
    ("NVIDIA H200", "NVIDIA H200 SXM"), ("NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM"),
    ("NVIDIA H100 PCIe", "NVIDIA H100 PCIe"), ("NVIDIA A100-SXM4-40GB", "NVIDIA A100 SXM 40GB"),
    ("NVIDIA A100-SXM4-80GB", "NVIDIA A100 SXM 80GB"), ("NVIDIA L4", "NVIDIA L4"), ("Tesla T4", "NVIDIA T4"),
    ("NVIDIA A10G", "NVIDIA A10G"), ("NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 4090")])
def test_peaks_for_matches_cuda_names(name, expected):
    assert hardware.peaks_for(name).name == expected


def test_unknown_device_gets_none_not_a_default():
    assert hardware.peaks_for("Some Future GPU X1") is None
    assert hardware.peaks_for("NVIDIA L40S") is None  # must not fall into the L4 row


def test_ridge_point_is_peak_over_bandwidth():
    h100 = hardware.PEAKS["h100"]
    assert math.isclose(h100.ridge_point("bf16"), 989.4e12 / 3350e9)
    assert hardware.PEAKS[r"\bt4\b"].ridge_point("bf16") is None


def test_detect_and_capabilities_on_this_machine():
    info = hardware.detect()
    caps = hardware.capabilities()
    assert info.kind == ("cuda" if torch.cuda.is_available() else "cpu")
    assert set(caps) >= {"cuda", "bf16", "fp8", "tf32", "flash_attn", "triton", "triton_interpreter"}
    if not torch.cuda.is_available():
        assert info.cores and not caps["fp8"] and not caps["flash_attn"] and not caps["triton"]


def test_measurements_on_cpu_are_positive_and_skip_gpu_formats():
    assert ceilings.measure_matmul_tflops(64, "fp32", "cpu", reps=2, warmup=1) > 0
    assert ceilings.measure_matmul_tflops(24, "fp32", "cpu", reps=2, warmup=1, m=16, k=8) > 0  # (16x8)@(8x24)
    assert ceilings.measure_matmul_tflops(64, "fp8", "cpu", reps=2) is None
    assert ceilings.measure_matmul_tflops(64, "tf32", "cpu", reps=2) is None
    assert ceilings.measure_copy_bandwidth(2**20, "cpu", reps=2, warmup=1) > 0
    with pytest.raises(ValueError, match="dtype"):
        ceilings.measure_matmul_tflops(64, "fp64", "cpu")


def test_matmul_fn_counts_flops_and_computes_the_product():
    fn, flops = hardware.matmul_fn(8, "fp32", "cpu", m=4, k=6)
    assert flops == 2 * 4 * 8 * 6
    assert fn().shape == (4, 8)
    a, b = hardware.matmul_operands(5, "fp32", "cpu")
    torch.testing.assert_close(hardware.matmul(a, b, "fp32"), a @ b)


def test_describe_prints_device_and_versions(capsys):
    hardware.describe()
    out = capsys.readouterr().out
    assert "device" in out and "versions" in out and "torch" in out and "flash-attn" in out


@pytest.mark.slow
def test_ceilings_recorded_for_another_device_are_ignored(results_tmp):
    from helpers.measure.results import record

    record(ceilings.CEILINGS_RECORD, {"matmul_tflops": {"fp32": 1.0}, "copy_gbps": 1.0}, quiet=True)
    assert ceilings.load_ceilings()["copy_gbps"] == 1.0
    path = results_tmp / f"{ceilings.CEILINGS_RECORD}.json"
    path.write_text(path.read_text().replace('"device": "', '"device": "elsewhere '))
    assert ceilings.load_ceilings() is None
    tflops, source = ceilings.matmul_ceiling("fp32", [16, 32], "cpu", reps=1)
    assert tflops > 0 and source.startswith("measured just now")
    assert ceilings.matmul_ceiling("fp8", [32], "cpu", reps=1)[0] is None
    ceilings.COPY_CEILINGS.clear()
    gbps, source = ceilings.bandwidth_ceiling("cpu", reps=1)
    assert gbps > 0 and source.startswith("measured just now") and "no record" in source
    ceilings.COPY_CEILINGS.clear()


def test_copy_size_exceeds_the_last_level_cache(monkeypatch):
    monkeypatch.setattr(ceilings, "last_level_cache", lambda device: (480 * 2 ** 20, "L3"))
    assert ceilings.copy_size("cpu") == 512 * 2 ** 20
    monkeypatch.setattr(ceilings, "last_level_cache", lambda device: (None, ""))
    assert ceilings.copy_size("cpu") == 2 ** 26 and ceilings.copy_size("cuda") == 2 ** 30
    monkeypatch.setattr(ceilings, "last_level_cache", lambda device: (2 ** 34, "L3"))
    assert ceilings.copy_size("cpu") == 2 ** 30


def test_the_copy_ceiling_is_notebook_00s_record_or_measured_once_per_run(results_tmp, monkeypatch):
    from helpers.measure.results import record

    monkeypatch.setattr(ceilings, "COPY_CEILINGS", {})
    monkeypatch.setattr(ceilings, "last_level_cache", lambda device: (32 * 2 ** 20, "L3"))
    measured = []

    def fake(nbytes, device, reps, warmup):
        measured.append((nbytes, torch.get_num_threads()))
        return 7.0

    monkeypatch.setattr(ceilings, "measure_copy_bandwidth", fake)
    gbps, source = ceilings.bandwidth_ceiling("cpu")
    assert gbps == 7.0 and measured == [(2 ** 26, torch.get_num_threads())]
    assert "one 64 MiB copy on" in source and "past the 32 MiB L3 cache" in source and "no record" in source
    assert ceilings.bandwidth_ceiling("cpu") == (gbps, source) and len(measured) == 1  # reused, not measured again
    monkeypatch.setattr(ceilings, "COPY_CEILINGS", {})
    record(ceilings.CEILINGS_RECORD, {"matmul_tflops": {"fp32": 1.0}, "copy_gbps": 11.6}, quiet=True)
    record("hardware_copy_sweep", {"sizes_mb": [1, 64, 1024], "gbps": [1, 2, 11.6]}, quiet=True)
    gbps, source = ceilings.bandwidth_ceiling("cpu")
    assert gbps == 11.6 and source.startswith("notebook 00's record") and "1024 MiB" in source and len(measured) == 1
    threads = torch.get_num_threads()
    gbps, source = ceilings.bandwidth_ceiling("cpu", threads=1)  # a one-thread step: the record does not apply
    assert gbps == 7.0 and measured[-1] == (2 ** 26, 1) and "on 1 thread," in source and "does not apply" in source
    assert torch.get_num_threads() == threads  # restored after
    with pytest.raises(ValueError, match="threads"):
        ceilings.bandwidth_ceiling("cpu", threads=0)


def test_last_level_cache_is_a_size_or_unknown(monkeypatch):
    size, name = hardware.last_level_cache("cpu")
    assert (size is None and name == "") or (size > 0 and name.startswith("L"))
    monkeypatch.setattr(hardware.os, "sysconf", lambda key: 0)  # no sysconf answer: the sysfs tree decides
    size2, name2 = hardware.last_level_cache("cpu")
    assert (size2 is None and name2 == "") or (size2 > 0 and name2.startswith("L"))


def test_the_default_format_is_bf16_with_bf16_units_fp16_without_and_fp32_on_a_cpu(monkeypatch):
    assert hardware.default_dtype("cpu") == "fp32"
    monkeypatch.setattr(hardware, "emulated", lambda dtype, device="cpu": None)
    assert hardware.default_dtype("cuda") == "bf16"
    monkeypatch.setattr(hardware, "emulated", lambda dtype, device="cpu": "no bf16 units" if dtype == "bf16" else None)
    assert hardware.default_dtype("cuda") == "fp16"
