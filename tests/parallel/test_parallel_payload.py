"""What travels between the launcher and its ranks: results pickled by value (tensors as CPU copies), and a
function the ranks could not load refused at once with a sentence saying where to define it (a notebook
cell's function runs by value when cloudpickle is installed)."""
import pickle
import sys
import types

import pytest
import torch

from helpers.parallel import launch, payload
from parallel_support import fail_on


def test_results_are_pickled_by_value_on_the_cpu():
    t = torch.arange(3.0)
    got = pickle.loads(payload.result_bytes({"t": t, "p": torch.nn.Parameter(t.clone())}))
    assert torch.equal(got["t"], t) and got["t"].data_ptr() != t.data_ptr() and got["t"].device.type == "cpu"
    assert type(got["p"]) is torch.nn.Parameter and got["p"].requires_grad


def _notebook_main(monkeypatch):
    """Makes `__main__` look like a notebook's (no file, no spec) and returns a function defined in it."""
    main = types.ModuleType("__main__")

    def cell_fn(rank, world):
        return rank * 10

    cell_fn.__module__, cell_fn.__qualname__ = "__main__", "cell_fn"
    main.cell_fn = cell_fn
    monkeypatch.setitem(sys.modules, "__main__", main)
    return cell_fn


def test_a_notebook_function_is_refused_at_once_saying_where_to_define_it(monkeypatch):
    cell_fn = _notebook_main(monkeypatch)
    monkeypatch.setattr(payload, "by_value_pickler", lambda: None)  # as without cloudpickle
    started = []
    monkeypatch.setattr(launch, "_context", lambda module: started.append(module))
    with pytest.raises(ValueError, match=r"fn=cell_fn is defined in __main__ \(a notebook cell .*\), which the "
                                         r"ranks cannot import: define it in a .py file .*install cloudpickle"):
        launch.run_on_ranks(cell_fn, 2)
    with pytest.raises(ValueError, match=r"fn=.*<lambda> cannot be sent to the ranks .*top level of a module"):
        launch.run_on_ranks(lambda r, w: r, 2)
    with pytest.raises(ValueError, match=r"args\[1\] \(a generator\) cannot be sent to the ranks"):
        launch.run_on_ranks(fail_on, 2, 0, (i for i in range(2)))
    assert not started  # refused before any rank was started


@pytest.mark.ranks
@pytest.mark.skipif(payload.by_value_pickler() is None, reason="cloudpickle is not installed")
def test_a_notebook_function_runs_by_value_with_cloudpickle(monkeypatch):
    cell_fn = _notebook_main(monkeypatch)
    assert launch.run_on_ranks(cell_fn, 2) == [0, 10]
