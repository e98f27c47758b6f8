"""Recording measurements: one JSON file per record, written atomically, read back by the report."""
from __future__ import annotations

# torch is imported inside the functions that need it (heavy): the runner's worker processes import
# this module and never load torch.

import datetime as _dt
import json
import math
import os
import secrets
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from helpers.measure import clock
from helpers.measure.hardware import cpu_model, library_versions

REPO_ROOT = Path(__file__).resolve().parents[2]
ENV_VAR = "COURSE_RESULTS_DIR"


def runs_root(repo_root: Path = REPO_ROOT) -> Path:
    """Where runs go: the clone's runs/ folder, or runs/ in the working folder where the course is an installed
    package (a notebook opened alone on Colab or Kaggle), never inside site-packages."""
    return repo_root / "runs" if (repo_root / "pyproject.toml").is_file() else Path.cwd() / "runs"

_state: dict[str, Any] = {"dir": None, "profile": None}


def slug(name: str) -> str:
    """A folder-safe form of a device name: lower case, each run of other characters one '-' ('NVIDIA H200' -> 'nvidia-h200').

    Raises ValueError for a name with no letter or digit ('!!!'), whose folder would be the parent folder itself.
    """
    out = "-".join(filter(None, "".join(c if c.isascii() and c.isalnum() else "-" for c in str(name).lower()).split("-")))
    if not out:
        raise ValueError(f"the device name {name!r} has no letter or digit to name a folder with")
    return out


def device_slug() -> str:
    """A short folder-safe name for the current device: 'cpu' or e.g. 'nvidia-h200' (see `slug`)."""
    import torch

    return slug(torch.cuda.get_device_name(0)) if torch.cuda.is_available() else "cpu"


def configure(results_dir: str | os.PathLike | None = None, profile: str | None = None) -> Path:
    """Set where `record` writes (default: $COURSE_RESULTS_DIR or runs/interactive-<device>)."""
    if results_dir is None:
        results_dir = os.environ.get(ENV_VAR) or runs_root() / f"interactive-{device_slug()}"
    folder = Path(results_dir)
    folder.mkdir(parents=True, exist_ok=True)
    _state["dir"], _state["profile"] = folder, profile
    return folder


def results_dir() -> Path:
    """The folder `record` writes to, configuring the default one on first use."""
    return _state["dir"] or configure()


def _plain(value: Any) -> Any:
    """Turn tensors, numpy values, dtypes and paths into JSON-friendly values."""
    if isinstance(value, Mapping):
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

    return {**library_versions(), "cuda": torch.version.cuda or "none"}


def device_name() -> str:
    """Human-readable name of the device the run used."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    return f"CPU: {cpu_model()}"


def write_atomic(path: str | os.PathLike, data: str | bytes, *, fsync: bool = True,
                 mode: int | None = None) -> Path:
    """Write `data` (text as UTF-8, or bytes) to `path` through a temporary file and a rename.

    Whoever reads `path` (or a crash, or a full disk) sees the old file or the new one, never half of
    one; the folder must exist. The new file's permission bits are `mode` whatever the umask, or by
    default 0o666 less the umask, as open() gives. Raises OSError (e.g. ENOSPC) after removing the
    temporary file, so a failure leaves what was there before intact.
    """
    path = Path(path)
    payload = data.encode() if isinstance(data, str) else data
    tmp = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask's usual mode, unlike mkstemp's 0600
    try:
        if mode is not None:
            os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as fh:
            fh.write(payload)
            fh.flush()
            if fsync:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(err, OSError):
            err.filename = str(path)  # name the file the caller asked for, not the temporary one
        raise
    return path


def record(name: str, metrics: Mapping, *, dtype: Any = None, folder: str | os.PathLike | None = None,
           quiet: bool = False) -> None:
    """Write `metrics` with device, dtype, versions, date and profile to `<results dir>/<name>.json`.

    `metrics` is a mapping of metric names to values (numbers, strings, lists, nested mappings,
    tensors); anything else (None, a list, a number) raises TypeError at once, because the report
    could not show it. The file is written to a temporary name and renamed into place, so a crash
    never leaves half a file behind. Raises ValueError for a name that is not a plain file name.
    """
    if not isinstance(name, str) or not name or any(c in name for c in "/\\") or name.startswith("."):
        raise ValueError(f"record name {name!r} must be a plain file name")
    if not isinstance(metrics, Mapping):
        raise TypeError(f"record({name!r}, ...): metrics must be a dict of metric name -> value, "
                        f"not {type(metrics).__name__}")
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
    path = write_atomic(target_dir / f"{name}.json", text + "\n")
    if not quiet:
        print(f"recorded {name} -> {path}")


def check_record(data: Any) -> str | None:
    """Why a parsed record file cannot be shown (not an object, metrics not a mapping...), or None."""
    if not isinstance(data, dict):
        return f"not a record: the file holds a JSON {type(data).__name__}, not an object"
    if not isinstance(data.get("metrics"), dict):
        return f"not a record: 'metrics' is {type(data.get('metrics')).__name__}, not an object"
    if "name" in data and not isinstance(data["name"], str):
        return f"not a record: 'name' is {type(data['name']).__name__}, not a string"
    return None


def read_records(folder: str | os.PathLike, skip: tuple[str, ...] = ()) -> tuple[list[tuple[Path, dict]],
                                                                                 list[tuple[Path, str]]]:
    """Every record file in `folder`: ([(path, record)...] readable, [(path, reason)...] unreadable).

    `skip` names JSON files that are not records and are left out (a reference folder's capture.json).

    A file is unreadable when it cannot be read, is empty or torn (invalid JSON), or is not a record
    (see `check_record`). An absent folder gives two empty lists. Files are in name order; nothing
    is dropped: two files with the same record name are both returned.
    """
    folder = Path(folder)
    good: list[tuple[Path, dict]] = []
    bad: list[tuple[Path, str]] = []
    if not folder.is_dir():
        return good, bad
    for path in sorted(p for p in folder.glob("*.json") if p.name not in skip):
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            bad.append((path, f"cannot read it: {err}"))
            continue
        if not text.strip():
            bad.append((path, "empty file"))
            continue
        try:
            data = json.loads(text)
        except ValueError as err:
            bad.append((path, f"torn or invalid JSON ({err})"))
            continue
        reason = check_record(data)
        if reason:
            bad.append((path, reason))
        else:
            good.append((path, data))
    return good, bad


def record_name(path: Path, data: dict) -> str:
    """The name a record goes by: its 'name' field, else its file name without .json."""
    return data.get("name") or Path(path).stem


def records_by_name(good: list[tuple[Path, dict]]) -> dict[str, dict]:
    """{name: record} of `read_records`' readable list, nothing dropped: when two files carry the same
    record name, the one whose file name matches keeps it and the other is keyed 'name [file.json]'."""
    out: dict[str, dict] = {}
    for path, data in sorted(good, key=lambda pd: Path(pd[0]).stem != record_name(*pd)):
        name = record_name(path, data)
        out[name if name not in out else f"{name} [{Path(path).name}]"] = data
    return out


def load_results(folder: str | os.PathLike) -> dict[str, dict]:
    """Read every record in `folder` back, keyed by record name (an absent folder gives {}).

    Unreadable files are skipped with a warning that names them; two files with the same record
    name are both kept (see `records_by_name`).
    """
    good, bad = read_records(folder)
    for path, reason in bad:
        warnings.warn(f"skipping {path}: {reason}", stacklevel=2)
    return records_by_name(good)


SUMMARY_PREFIX = "summary-"


def summary(notebook: str, sentence: str, headline: Mapping, *, noise: str | None = None,
            quiet: bool = True) -> None:
    """Record a notebook's summary for the report: what it measured and its 3-5 headline numbers.

    notebook: two digits ("02"); sentence: what the notebook measured, in one sentence;
    headline: {label: (value, unit)} or {label: (value, unit, (lo, hi))} with 1-6 entries, value a
    finite number (or a short string such as a verdict), unit a string ("TFLOP/s", "x", "%", "" for
    none) and (lo, hi) the value's spread (its IQR, or a ratio's IQR bounds) around it; the label must name the
    quantity and its condition ("fp32 matmul, best"), because the same label on a reference GPU is
    what the report sets beside it. noise: one line on the timing spread the notebook printed
    (e.g. "median IQR 6% of the step time"), or None when nothing was timed.
    Writes the ordinary record `summary-<notebook>` (with `clock.tally()`: how much of the wall time the thread
    ran while it was timed on its own clock, a sentence on which this function prints). Returns None, so that the
    notebook cell that ends with it shows that sentence and not a dict. Raises ValueError for a
    malformed notebook number, an empty sentence, an empty or too long headline, a value that is
    neither a finite number nor a string, a unit that is not a string, or a spread that does not hold
    the value.
    """
    if not isinstance(notebook, str) or len(notebook) != 2 or not notebook.isdigit():
        raise ValueError(f"notebook={notebook!r} must be a two-digit notebook number like '02'")
    if not isinstance(sentence, str) or not sentence.strip():
        raise ValueError("sentence must say in one non-empty sentence what the notebook measured")
    if not isinstance(headline, Mapping) or not 1 <= len(headline) <= 6:
        raise ValueError(f"headline must be a dict of 1 to 6 {{label: (value, unit)}}, got {headline!r:.80}")
    rows = {}
    for label, pair in headline.items():
        if not isinstance(label, str) or not label.strip():
            raise ValueError(f"headline label {label!r} must be a non-empty string")
        if not isinstance(pair, (tuple, list)) or len(pair) not in (2, 3):
            raise ValueError(f"headline[{label!r}] must be (value, unit) or (value, unit, (lo, hi)), got {pair!r:.80}")
        value, unit, spread = (*pair, None) if len(pair) == 2 else pair
        if hasattr(value, "item") and not isinstance(value, str):
            value = value.item()  # a tensor or numpy scalar
        if isinstance(value, bool) or not isinstance(value, (int, float, str)) or (
                isinstance(value, float) and not math.isfinite(value)):
            raise ValueError(f"headline[{label!r}] value {value!r} must be a finite number or a string")
        if not isinstance(unit, str):
            raise ValueError(f"headline[{label!r}] unit {unit!r} must be a string ('' for none)")
        row = {"value": value, "unit": unit}
        if spread is not None:
            ok = isinstance(spread, (tuple, list)) and len(spread) == 2 and all(
                isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in spread)
            if not ok or isinstance(value, str) or not spread[0] <= value <= spread[1]:
                raise ValueError(f"headline[{label!r}] spread {spread!r:.60} must be (lo, hi), finite numbers with "
                                 f"lo <= value <= hi around a numeric value")
            row["spread"] = [float(spread[0]), float(spread[1])]
        rows[label.strip()] = row
    if noise is not None and (not isinstance(noise, str) or not noise.strip()):
        raise ValueError("noise must be one line of text, or None when nothing was timed")
    metrics = {"notebook": notebook, "sentence": sentence.strip(), "headline": rows,
               "noise": None if noise is None else noise.strip(), "clock": clock.tally()}
    record(SUMMARY_PREFIX + notebook, metrics, quiet=True)
    if metrics["clock"]["timings"]:
        print(f"clock: {clock.sentence()}")
    if not quiet:
        print(f"{SUMMARY_PREFIX}{notebook} recorded: " + "; ".join(f"{k} {v['value']} {v['unit']}".strip() for k, v in rows.items()))
