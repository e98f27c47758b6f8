"""heap.keep_freed_memory: glibc's thresholds set through mallopt, nothing changed elsewhere, and its effect: no
page faults when a freed tensor's size is allocated again."""
import subprocess
import sys
import textwrap

import pytest

from helpers.measure import heap


class FakeMallopt:
    def __init__(self, answer):
        self.calls, self.answer = [], answer

    def __call__(self, param, value):
        self.calls.append((param, value))
        return self.answer


class FakeLibc:
    def __init__(self, glibc=True, answer=1):
        if glibc:
            self.gnu_get_libc_version = lambda: b"2.36"
        self.mallopt = FakeMallopt(answer)

    @property
    def calls(self):
        return self.mallopt.calls


def test_both_thresholds_are_set_on_glibc_mmap_first():
    libc = FakeLibc()
    assert heap._set_thresholds("linux", load=lambda _: libc) is True
    assert libc.calls == [(heap.M_MMAP_THRESHOLD, heap.KEEP_BELOW), (heap.M_TRIM_THRESHOLD, heap.KEEP_BELOW)]
    assert (heap.M_MMAP_THRESHOLD, heap.M_TRIM_THRESHOLD) == (-3, -1)  # malloc.h's numbers


@pytest.mark.parametrize("platform, libc", [("darwin", FakeLibc()), ("win32", FakeLibc()), ("linux", FakeLibc(glibc=False))])
def test_nothing_is_changed_off_glibc(platform, libc):
    assert heap._set_thresholds(platform, load=lambda _: libc) is False
    assert libc.calls == []


def test_a_refused_value_says_so():
    assert heap._set_thresholds("linux", load=lambda _: FakeLibc(answer=0)) is False


def test_an_unloadable_c_library_says_so():
    def load(_):
        raise OSError("no C library")
    assert heap._set_thresholds("linux", load=load) is False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc is Linux's")
def test_freed_tensors_come_back_without_page_faults():
    # In a fresh process the mmap threshold is first pinned at 128 KiB, so every 1 MiB tensor gets a mapping of its
    # own and is handed back when freed: 256 page faults each time. After keep_freed_memory, once the heap has grown to
    # hold it, none should remain.
    code = textwrap.dedent("""
        import ctypes, resource, torch
        from helpers.measure import heap
        libc = ctypes.CDLL(None)
        try:
            libc.gnu_get_libc_version
        except AttributeError:
            print("not glibc"); raise SystemExit
        libc.mallopt(heap.M_MMAP_THRESHOLD, 128 * 1024)
        def faults(n=40):
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            for _ in range(n):
                torch.empty(256 * 1024).fill_(1.0)
            return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
        faults(5)
        before = faults()
        kept = heap.keep_freed_memory()
        faults(20)  # the heap grows to hold the block once (a few calls still fault while it does)
        print(before, kept, faults())
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True).stdout
    if out.strip() == "not glibc":
        pytest.skip("this Linux's C library is not glibc")
    before, kept, after = out.split()
    assert kept == "True"
    assert int(before) >= 40 * 200  # the pinned threshold: about 256 faults per 1 MiB tensor
    assert int(after) < 40 * 10  # kept: the freed block is reused
