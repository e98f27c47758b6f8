import os
from pathlib import Path

import matplotlib
import pytest
import torch

if not torch.cuda.is_available():  # Triton kernels run in its interpreter; set before triton is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

matplotlib.use("Agg")  # tests draw off-screen; notebook kernels choose their own backend


def pytest_collection_modifyitems(config, items):
    """The files of the browser suite first, every other file after them in collection order, each file's tests kept
    together and in order. `make test` hands whole files to its two workers in collection order (--dist loadfile
    --no-loadscope-reorder), and a long file that starts late decides when the suite ends: the browser suite runs
    every notebook with a panel in JupyterLab, about ten minutes on one core, so it starts at once and the other
    worker takes the rest."""
    browser = {item.nodeid.split("::")[0] for item in items if item.get_closest_marker("browser")}
    items.sort(key=lambda item: item.nodeid.split("::")[0] not in browser)  # stable: each file stays in one piece


@pytest.fixture
def results_tmp(tmp_path):
    """Point helpers.measure.results at a fresh folder for the test, and restore the default after."""
    from helpers.measure import results

    folder = results.configure(tmp_path / "results", profile="smoke")
    yield folder
    results._state.update({"dir": None, "profile": None})


@pytest.fixture
def check_keeps_only_qkv_o_lse():
    """check(apply, q, k, v, is_causal): a FlashAttention Function keeps q, k, v, O and L = logsumexp(S), nothing N x N."""
    def check(apply, q, k, v, is_causal):
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
            out = apply(q, k, v, is_causal)
        n_q, n_k = q.shape[-2], k.shape[-2]
        assert [tuple(t.shape) for t in saved] == [q.shape, k.shape, v.shape, q.shape, q.shape[:-1]]
        assert saved[0] is q and saved[1] is k and saved[2] is v and saved[3] is out
        assert not any(t.shape[-2:] == (n_q, n_k) for t in saved if t.dim() >= 2)
        scores = q @ k.mT / q.shape[-1] ** 0.5
        if is_causal:
            scores = scores.masked_fill(~torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).tril(), float("-inf"))
        torch.testing.assert_close(saved[4], torch.logsumexp(scores, -1), rtol=1e-5, atol=2e-5)  # L
    return check


@pytest.fixture(scope="session")
def quiet_smoke(tmp_path_factory):
    """A folder where each notebook test that runs a notebook in smoke keeps its headline and claim records
    (`notebook_support.keep_quiet`), so that tests/course/test_course_under_load.py compares a loaded run with
    them instead of running every notebook quietly a second time. $COURSE_QUIET_SMOKE names a folder to share
    between two pytest runs instead (make test leaves it unset: its serial part runs the quiet side alone)."""
    shared = os.environ.get("COURSE_QUIET_SMOKE")
    if shared:
        Path(shared).mkdir(parents=True, exist_ok=True)
        return Path(shared)
    return tmp_path_factory.mktemp("quiet-smoke")

