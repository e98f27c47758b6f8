"""Recording measurements: one JSON file per record, written atomically, read back by the report."""
from __future__ import annotations

import datetime as _dt
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
ENV_VAR = "COURSE_RESULTS_DIR"

_state: dict[str, Any] = {"dir": None, "profile": None}


def device_slug() -> str:
    """A short folder-safe name for the current device: 'cpu' or e.g. 'nvidia-h200'."""
    import torch

    if torch.cuda.is_available():
        name = torch.cuda.get_device_name(0).lower()
    else:
        name = "cpu"
    return "".join(c if c.isalnum() else "-" for c in name).strip("-").replace("--", "-")


def configure(results_dir: str | os.PathLike | None = None, profile: str | None = None) -> Path:
    """Set where `record` writes (default: $COURSE_RESULTS_DIR or runs/interactive-<device>)."""
    if results_dir is None:
        results_dir = os.environ.get(ENV_VAR) or REPO_ROOT / "runs" / f"interactive-{device_slug()}"
    folder = Path(results_dir)
    folder.mkdir(parents=True, exist_ok=True)
    _state["dir"], _state["profile"] = folder, profile
    return folder


def results_dir() -> Path:
    """The folder `record` writes to, configuring the default one on first use."""
    return _state["dir"] or configure()


def _plain(value: Any) -> Any:
    """Turn tensors, numpy values, dtypes and paths into JSON-friendly values."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if hasattr(value, "tolist"):  # torch tensors and numpy arrays or scalars
        return _plain(value.tolist())
    return str(value)


def versions() -> dict[str, str]:
    """Versions of the libraries whose behaviour the numbers depend on, and the CUDA runtime."""
    import torch

    from .hardware import library_versions

    return {**library_versions(), "cuda": torch.version.cuda or "none"}


def device_name() -> str:
    """Human-readable name of the device the run used."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    from .hardware import cpu_model

    return f"CPU: {cpu_model()}"


def record(name: str, metrics: dict, *, dtype: Any = None, folder: str | os.PathLike | None = None,
           quiet: bool = False) -> None:
    """Write `metrics` with device, dtype, versions, date and profile to `<results dir>/<name>.json`.

    The file is written to a temporary name and renamed into place, so a crash never leaves half a
    file behind.
    """
    if not name or any(c in name for c in "/\\") or name.startswith("."):
        raise ValueError(f"record name {name!r} must be a plain file name")
    target_dir = Path(folder) if folder is not None else results_dir()
    target_dir.mkdir(parents=True, exist_ok=True)
    payload = {
        "name": name,
        "metrics": _plain(metrics),
        "device": device_name(),
        "dtype": None if dtype is None else str(dtype).replace("torch.", ""),
        "profile": _state["profile"],
        "versions": versions(),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    text = json.dumps(payload, indent=2, sort_keys=False)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=target_dir)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        path = target_dir / f"{name}.json"
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if not quiet:
        print(f"recorded {name} -> {path}")


def load_results(folder: str | os.PathLike) -> dict[str, dict]:
    """Read every record in `folder` back, keyed by record name (an absent folder gives {})."""
    folder = Path(folder)
    out: dict[str, dict] = {}
    if not folder.is_dir():
        return out
    for path in sorted(folder.glob("*.json")):
        with open(path) as fh:
            data = json.load(fh)
        out[data.get("name", path.stem)] = data
    return out
