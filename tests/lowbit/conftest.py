"""What the lowbit tests share: one torch thread, the cached "tiny" course GPT and GPTQ's calibration windows."""
import pytest
import torch

from helpers.lowbit import gptq


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Small CPU matmuls and column loops: one thread is faster than two fighting a busy machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny():
    """The cached "tiny" course GPT (trained once per machine), on the CPU."""
    from helpers.gpt.pretrained import pretrained

    return pretrained("tiny", quiet=True, device="cpu").model


@pytest.fixture(scope="module")
def calib():
    """Four calibration windows of 128 tokens from the training split, as notebook 08 takes them."""
    return gptq.calibration_tokens(4, 128, seed=0)
