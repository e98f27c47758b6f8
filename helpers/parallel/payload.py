"""What travels between the launcher and its ranks: the function and its arguments out, the results back.

`rank_payload(fn, args)` pickles `(fn, args)` for the ranks: by reference (plain pickle) when the ranks
can import everything in it, by value with cloudpickle (`by_value_pickler`, when installed) for a
function or class defined in a notebook cell, and otherwise refused with one sentence naming the
culprit. `result_bytes(value)` pickles a rank's result by value, tensors as copies in CPU memory, so the
result stays loadable after the rank has exited. Used by `helpers.parallel.launch.run_on_ranks`.
"""
from __future__ import annotations

import importlib.util
import io
import pickle
import sys
import types
from typing import Any, Callable

import torch


def by_value_pickler():
    """The cloudpickle module when it is installed (it pickles a notebook's functions by value), else None."""
    if importlib.util.find_spec("cloudpickle") is None:
        return None
    import cloudpickle  # optional: only a function defined in a notebook cell needs it
    return cloudpickle


def _main_is_importable() -> bool:
    """Whether a fork-server child re-imports `__main__` (a script run by path or with -m: multiprocessing's
    own rule), so that the ranks can load its functions by name; a notebook's or a prompt's cannot be."""
    main = sys.modules.get("__main__")
    return bool(getattr(getattr(main, "__spec__", None), "name", None) or getattr(main, "__file__", None))


class _Scan(pickle.Pickler):
    """A pickler that notes every function and class from `__main__` it pickles by reference."""

    def __init__(self, file):
        super().__init__(file, pickle.HIGHEST_PROTOCOL)
        self.from_main: list = []

    def reducer_override(self, obj):
        if isinstance(obj, (type, types.FunctionType)) and getattr(obj, "__module__", None) == "__main__":
            self.from_main.append(obj)
        return NotImplemented


def fn_name(fn) -> str:
    """`fn`'s qualified name, as the launcher's messages name it (its repr when it has none)."""
    return getattr(fn, "__qualname__", None) or repr(fn)


def rank_payload(fn: Callable, args: tuple) -> bytes:
    """`(fn, args)` pickled for the ranks; ValueError (one sentence naming the culprit) when they can't load it.

    By reference (plain pickle) when the ranks can import everything in it; by value with cloudpickle,
    when installed, for a function or class defined in a notebook cell or a lambda; refused otherwise.
    """
    buf = io.BytesIO()
    scan = _Scan(buf)
    try:
        scan.dump((fn, args))
        err = None
    except Exception as e:  # noqa: BLE001  PicklingError, TypeError, AttributeError ("local object"), ...
        err = e
    stranded = [] if _main_is_importable() else scan.from_main
    if err is None and not stranded:
        return buf.getvalue()
    cp = by_value_pickler()
    if cp is not None:
        try:
            return cp.dumps((fn, args), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:  # noqa: BLE001
            err, stranded = e, []
    where = ("define it in a .py file (beside the notebook) and import it from there"
             + ("" if cp is not None else ", or install cloudpickle, which sends it by value"))
    if stranded:
        obj = stranded[0]
        what = f"fn={fn_name(fn)}" if obj is fn else f"{fn_name(obj)} (used by the arguments)"
        raise ValueError(f"run_on_ranks: {what} is defined in __main__ (a notebook cell or the interactive "
                         f"prompt), which the ranks cannot import: {where}")
    dumps = (cp or pickle).dumps
    try:
        dumps(fn, pickle.HIGHEST_PROTOCOL)
    except Exception as e:  # noqa: BLE001
        raise ValueError(f"run_on_ranks: fn={fn_name(fn)} cannot be sent to the ranks ({type(e).__name__}: {e}): "
                         f"use a function defined with def at the top level of a module; {where}") from None
    for i, a in enumerate(args):
        try:
            dumps(a, pickle.HIGHEST_PROTOCOL)
        except Exception as e:  # noqa: BLE001
            raise ValueError(f"run_on_ranks: args[{i}] (a {type(a).__name__}) cannot be sent to the ranks "
                             f"({type(e).__name__}: {e}): pass numbers, strings, lists, dicts or tensors") from None
    raise ValueError(f"run_on_ranks: the arguments cannot be sent to the ranks ({type(err).__name__}: {err})")


class _ResultPickler(pickle.Pickler):
    """Plain pickle (by value, no shared memory) that moves GPU tensors to CPU memory first."""

    def reducer_override(self, obj):
        if (type(obj) in (torch.Tensor, torch.nn.Parameter) and obj.device.type not in ("cpu", "meta")
                and (obj.is_leaf or not obj.requires_grad)):
            with torch.no_grad():
                moved = obj.detach().cpu()
            moved = torch.nn.Parameter(moved, obj.requires_grad) if type(obj) is torch.nn.Parameter \
                else moved.requires_grad_(obj.requires_grad)
            return moved.__reduce_ex__(pickle.HIGHEST_PROTOCOL)
        return NotImplemented


def result_bytes(value: Any) -> bytes:
    """`value` pickled by value as a rank sends it back: tensors become copies in CPU memory, so the bytes
    stay loadable after the rank exits. Raises what pickle raises for what cannot be pickled."""
    buf = io.BytesIO()
    _ResultPickler(buf, pickle.HIGHEST_PROTOCOL).dump(value)
    return buf.getvalue()
