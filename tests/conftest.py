import matplotlib
import pytest

matplotlib.use("Agg")  # tests draw off-screen; notebook kernels choose their own backend


@pytest.fixture
def results_tmp(tmp_path):
    """Point helpers.results at a fresh folder for the test, and restore the default after."""
    from helpers import results

    folder = results.configure(tmp_path / "results", profile="smoke")
    yield folder
    results._state.update({"dir": None, "profile": None})
