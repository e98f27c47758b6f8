import math
import warnings

import pytest
import torch

from helpers.measure import bench, memory


@pytest.mark.filterwarnings("ignore::helpers.measure.bench.ImplausibleTiming")  # empty bodies, on purpose
def test_benchmark_honours_warmup_and_reps():
    calls = []
    t = bench.benchmark(lambda: calls.append(1), warmup=3, reps=7, device="cpu")
    assert len(calls) == 10
    assert len(t.samples) == 7 and t.warmup == 3
    assert t.q25 <= t.median <= t.q75
    assert sorted(t.samples)[3] == t.median


@pytest.mark.filterwarnings("ignore::helpers.measure.bench.ImplausibleTiming")  # empty bodies, on purpose
def test_benchmark_flush_and_bad_arguments():
    calls = []
    t = bench.benchmark(lambda: calls.append(1), warmup=0, reps=2, flush_l2=True, device="cpu")
    assert len(calls) == 2 and t.median >= 0
    with pytest.raises(ValueError):
        bench.benchmark(lambda: None, reps=0)
    with pytest.raises(ValueError):
        bench.benchmark(lambda: None, warmup=-1)


def test_benchmark_measures_time():
    import time

    t = bench.benchmark(lambda: time.sleep(0.01), warmup=0, reps=3, device="cpu", clock="wall")
    assert t.median >= 0.009 and "ms" in str(t) and t.clock == "wall"


def test_throughput_arithmetic():
    assert bench.tflops(2e12, 2.0) == 1.0
    assert bench.gbps(3e9, 1.5) == 2.0


def test_saved_bytes_equal_the_tensors_a_known_function_saves():
    x = torch.randn(64, 32, requires_grad=True)
    w = torch.randn(32, 16, requires_grad=True)
    # sin saves its input; matmul saves both operands; the sum saves nothing
    saved = memory.saved_tensors(lambda: (torch.sin(x) @ w).sum())
    sin_x_bytes = 64 * 32 * 4  # sin(x) is a new tensor saved by the matmul
    assert saved.nbytes == x.nbytes + sin_x_bytes + w.nbytes
    assert saved.count == 3
    assert memory.saved_tensor_bytes(lambda: (torch.sin(x) @ w).sum(), ignore=[w]) == x.nbytes + sin_x_bytes


def test_saved_bytes_count_a_storage_once():
    x = torch.randn(100, requires_grad=True)
    assert memory.saved_tensor_bytes(lambda: x * x) == x.nbytes  # x saved twice, one storage


def test_saved_bytes_of_a_linear_layer_ignore_parameters():
    layer = torch.nn.Linear(8, 4)
    x = torch.randn(5, 8)
    # no input grad needed and parameters ignored: only x is kept (for the weight gradient)
    assert memory.saved_tensor_bytes(lambda: layer(x), ignore=layer.parameters()) == x.nbytes


def test_peak_cuda_memory_is_none_without_cuda():
    if torch.cuda.is_available():
        assert memory.peak_cuda_memory(lambda: torch.empty(2**20, device="cuda")) >= 4 * 2**20
    else:
        assert memory.peak_cuda_memory(lambda: None) is None


# ---------------------------------------------------------------- timings that cannot be measurements

def test_a_function_that_does_nothing_warns_and_gives_no_tflops(monkeypatch):
    # the timer's overhead is measured once per process: measure it now, in this test's conditions (in one
    # CI run a value cached earlier in the session was below what empty calls took by the time of this test)
    monkeypatch.setattr(bench, "_OVERHEAD", {})
    with pytest.warns(bench.ImplausibleTiming, match="measures the timer"):
        t = bench.benchmark(lambda: None, warmup=1, reps=21, device="cpu")
    assert t.below_resolution and "not a measurement" in str(t)
    with pytest.warns(bench.ImplausibleTiming, match="below what the timer can resolve"):
        assert math.isnan(bench.tflops(2 * 4096**3, t))  # was ~3,300 TFLOP/s, printed without a word
    with pytest.warns(bench.ImplausibleTiming):
        assert math.isnan(bench.gbps(2**30, t))


def test_a_real_op_is_above_the_resolution_and_keeps_its_rate():
    x = torch.randn(256, 256)
    with warnings.catch_warnings():
        warnings.simplefilter("error", bench.ImplausibleTiming)
        t = bench.benchmark(lambda: x @ x, warmup=1, reps=3, device="cpu")
        assert not t.below_resolution and t.resolution > 0
        assert bench.tflops(2 * 256**3, t) == pytest.approx(2 * 256**3 / t.median / 1e12)
        assert bench.tflops(2e12, 2.0) == 1.0  # a float that is a plausible timing


def test_rates_beyond_the_device_bound_are_refused():
    with pytest.warns(bench.ImplausibleTiming, match="beyond what this device can do"):
        assert math.isnan(bench.tflops(1e15, 1e-3, device="cpu"))  # 1,000,000 TFLOP/s on a CPU
    with pytest.warns(bench.ImplausibleTiming, match="GB/s is beyond"):
        assert math.isnan(bench.gbps(1e15, 1.0, limit=100.0))
    with pytest.warns(bench.ImplausibleTiming):
        assert math.isnan(bench.tflops(1.0, 0.0))
    with pytest.warns(bench.ImplausibleTiming):
        assert math.isnan(bench.tflops(1.0, float("nan")))


def test_plausible_bounds_per_device(monkeypatch):
    from helpers.measure import hardware

    monkeypatch.setattr(bench.os, "cpu_count", lambda: 2)
    assert bench.plausible_tflops("cpu") == pytest.approx(2 * 2048 * 6.5e9 / 1e12)
    assert bench.plausible_gbps("cpu") == pytest.approx(2 * 512 * 6.5)
    monkeypatch.setattr(bench, "resolve_device", lambda device: "cuda")
    monkeypatch.setattr(hardware, "peaks_for", lambda name=None: hardware.PEAKS["h100"])
    assert bench.plausible_tflops() == 2 * 1978.9  # twice the H100's highest dense peak (fp8)
    assert bench.plausible_gbps() == 10 * 3350
    monkeypatch.setattr(hardware, "peaks_for", lambda name=None: None)
    assert bench.plausible_tflops() == bench.GPU_UNKNOWN_TFLOPS


def test_timer_overhead_is_measured_once_and_positive():
    first = bench.timer_overhead("cpu")
    assert 0 < first < 1e-3 and bench.timer_overhead("cpu") == first


# ---------------------------------------------------------------- the devices the timer accepts

@pytest.mark.parametrize("name", ["cdua", "mps", "meta", "cpu:0", "CPU", "cuda:x", "cuda:-1", "", 0])
def test_a_device_the_course_does_not_support_is_refused_in_one_sentence(name):
    with pytest.raises(ValueError) as err:
        bench.resolve_device(name)
    text = str(err.value)
    assert text.startswith(f"device={name!r} is not a device") and "\n" not in text
    assert "'cpu', 'cuda', 'cuda:N'" in text and "None / 'auto'" in text
    with pytest.raises(ValueError, match="is not a device"):  # the timer itself refuses it before timing anything
        bench.benchmark(lambda: None, warmup=0, reps=1, device=name)


def test_the_supported_devices(monkeypatch):
    assert bench.resolve_device("cpu") == "cpu" and bench.resolve_device(torch.device("cpu")) == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench.resolve_device(None) == bench.resolve_device("auto") == "cpu"
    for name in ("cuda", "cuda:0", torch.device("cuda")):
        with pytest.raises(ValueError, match="this machine has no CUDA GPU"):
            bench.resolve_device(name)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert bench.resolve_device(None) == bench.resolve_device("cuda") == bench.resolve_device("cuda:1") == "cuda"
    with pytest.raises(ValueError, match=r"device='cuda:2' does not exist: this machine has 2 CUDA GPUs; .*'cuda:0' "
                                         r"to 'cuda:1'"):
        bench.resolve_device("cuda:2")



def test_cpu_threads_sets_the_count_on_a_cpu_only_and_restores_it():
    before = torch.get_num_threads()
    with bench.cpu_threads("cpu", 1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with bench.cpu_threads("meta", 1):
        assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError), bench.cpu_threads("cpu", 1):
        raise RuntimeError("inside")
    assert torch.get_num_threads() == before  # restored after an error too


def test_sync_waits_on_cuda_only(monkeypatch):
    calls = []
    monkeypatch.setattr(bench.torch.cuda, "synchronize", lambda device=None: calls.append(device))
    bench.sync("cpu")
    bench.sync(torch.device("cpu"))
    assert calls == []
    bench.sync("cuda:1")
    bench.sync(torch.device("cuda"))
    assert calls == ["cuda:1", torch.device("cuda")]
