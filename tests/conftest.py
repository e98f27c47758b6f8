import os

import matplotlib
import pytest
import torch

if not torch.cuda.is_available():  # Triton kernels run in its interpreter; set before triton is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

matplotlib.use("Agg")  # tests draw off-screen; notebook kernels choose their own backend


@pytest.fixture
def results_tmp(tmp_path):
    """Point helpers.results at a fresh folder for the test, and restore the default after."""
    from helpers import results

    folder = results.configure(tmp_path / "results", profile="smoke")
    yield folder
    results._state.update({"dir": None, "profile": None})
