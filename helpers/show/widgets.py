"""Instructor panels that also run headless, and progress bars that stay quiet in CI.

The pattern (see COURSE_STYLE.md): an `update(**values)` callback is a plain function that
prints and plots; `panel` wires it to ipywidgets controls. Tests call `update` directly, without a
kernel; a notebook only displays the panel when INTERACTIVE is True.
"""
from __future__ import annotations

import os
import threading
from typing import Any, Callable, Iterable, Sequence

from tqdm.auto import tqdm

HEADLESS_ENV = "COURSE_HEADLESS"
# JupyterLab 4.6 delivers widget messages on a kernel subshell (another thread), while ipykernel
# redraws open figures after each message: panels draw one at a time, with interactive mode off.
_DRAW_LOCK = threading.Lock()


def headless() -> bool:
    """True when the headless runner (or CI) executes the notebook."""
    return os.environ.get(HEADLESS_ENV) == "1" or os.environ.get("CI") == "true"


def progress(iterable: Iterable, **kwargs: Any):
    """A tqdm progress bar (notebook-aware) that is silent in headless runs."""
    kwargs.setdefault("disable", headless())
    return tqdm(iterable, **kwargs)


def dropdown(options: Sequence[Any], value: Any = None, description: str = ""):
    """A dropdown over `options`."""
    import ipywidgets  # optional: only a panel needs it (the lent GPU's image has no ipywidgets)

    return ipywidgets.Dropdown(options=list(options), value=options[0] if value is None else value,
                      description=description, style={"description_width": "initial"})


def choice_slider(options: Sequence[Any], value: Any = None, description: str = ""):
    """A slider over a list of values (e.g. powers of two); updates on release, not while dragging."""
    import ipywidgets  # optional: as in dropdown

    return ipywidgets.SelectionSlider(options=list(options), value=options[0] if value is None else value,
                             description=description, continuous_update=False,
                             style={"description_width": "initial"})


def int_slider(lo: int, hi: int, value: int | None = None, step: int = 1, description: str = ""):
    """An integer slider that updates on release."""
    import ipywidgets  # optional: as in dropdown

    return ipywidgets.IntSlider(min=lo, max=hi, step=step, value=lo if value is None else value,
                       description=description, continuous_update=False,
                       style={"description_width": "initial"})


def checkbox(value: bool = False, description: str = ""):
    """A checkbox (a technique on or off)."""
    import ipywidgets  # optional: as in dropdown

    return ipywidgets.Checkbox(value=bool(value), description=description, indent=False)


# Whether panels are shown to someone: the notebook's INTERACTIVE, set by `helpers.measure.params.setup`.
_INTERACTIVE = {"on": True}


def set_interactive(on: bool) -> None:
    """Tell `panel` whether the notebook shows its panels (params.setup passes INTERACTIVE here)."""
    _INTERACTIVE["on"] = bool(on)


def panel(update: Callable[..., Any], controls: dict[str, Any], title: str = ""):
    """Controls on top, the output of `update(**values)` below; redrawn whenever a control changes.

    Drawn once on creation when the notebook is interactive. Headless (INTERACTIVE=False: papermill,
    the runner) nobody can see it or move a control and the notebook has drawn its static figure
    already, so it is drawn only if a control changes: nothing is drawn into an Output widget that
    nobody displays, which can stall nbclient.
    """
    import ipywidgets  # optional: as in dropdown
    import matplotlib.pyplot as plt  # heavy: params (and so every notebook and the runner) imports this module

    def draw(**values: Any) -> None:
        with _DRAW_LOCK, plt.ioff():
            update(**values)
            plt.show()

    for control in controls.values():
        if hasattr(control, "continuous_update"):
            control.continuous_update = False
    if _INTERACTIVE["on"]:
        out = ipywidgets.interactive_output(draw, controls)
    else:
        out = ipywidgets.Output()

        def redraw(_change: Any) -> None:
            with out:
                out.clear_output(wait=True)
                draw(**{name: control.value for name, control in controls.items()})

        for control in controls.values():
            control.observe(redraw, names="value")
    header = [ipywidgets.HTML(f"<b>{title}</b>")] if title else []
    row = ipywidgets.HBox(list(controls.values()), layout=ipywidgets.Layout(flex_flow="row wrap"))
    box = ipywidgets.VBox(header + [row, out])
    box.add_class("course-panel")
    return box
