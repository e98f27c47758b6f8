"""A corpus every machine already has: the Python standard library's own source, as byte tokens.

The `*.py` files under `sysconfig.get_paths()["stdlib"]` (test packages, site-packages and
build-configuration files left out) are read in sorted order and concatenated. Each byte is one
token, so the vocabulary is 256 and `decode` is `bytes(...).decode()`. A file belongs to the
validation split when a stable hash of its relative path says so (about `VAL_PERCENT`% of the
files), so the split never changes between runs or machines with the same Python release, and no
file is in both. The tokenized splits are cached (see `resolve_cache_dir`), keyed by the Python version and
every file's path, size and modification time, so a second load is a single file read.
"""
from __future__ import annotations

import hashlib
import os
import sys
import sysconfig
import tempfile
from pathlib import Path

import torch

VAL_PERCENT = 8  # share of files (by hash of the relative path) in the validation split
SPLITS = ("train", "val")
CACHE_ENV_VAR = "COURSE_CACHE_DIR"
CACHE_VERSION = 1  # bump when the tokenization or the file selection changes

# A directory with one of these names is skipped with everything below it.
_SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}


def stdlib_root() -> Path:
    """Where this interpreter's standard library source lives (it may be absent on slim installs)."""
    return Path(sysconfig.get_paths()["stdlib"])


def _skip_dir(name: str) -> bool:
    return name in _SKIP_DIRS or name.startswith("config-")  # config-3.x-<platform>: build files


def _skip_file(name: str) -> bool:
    # _sysconfigdata_*.py is generated at build time and differs from machine to machine
    return not name.endswith(".py") or name.startswith("_sysconfigdata")


def corpus_files(root: str | os.PathLike | None = None) -> list[Path]:
    """Every corpus file under `root` (default: the stdlib), sorted by relative path."""
    base = Path(root) if root is not None else stdlib_root()
    if not base.is_dir():
        raise FileNotFoundError(
            f"corpus root {str(base)!r} does not exist or is not a directory (looked for the Python "
            f"standard library source via sysconfig.get_paths()['stdlib']); pass root=<a folder of .py files>")
    found: list[Path] = []
    for folder, dirnames, filenames in os.walk(base):  # does not follow symlinked folders
        dirnames[:] = sorted(d for d in dirnames if not _skip_dir(d))  # prune in place
        found.extend(Path(folder) / f for f in filenames if not _skip_file(f))
    if not found:
        raise FileNotFoundError(
            f"no .py files under {str(base)!r} (some minimal Python installs ship only bytecode); "
            f"pass root=<a folder of .py files>")
    return sorted(found, key=lambda p: p.relative_to(base).as_posix())


def split_of(relative_path: str) -> str:
    """'val' or 'train' for a path relative to the corpus root, from a stable hash of the path."""
    digest = hashlib.sha256(relative_path.encode("utf-8")).digest()
    return "val" if int.from_bytes(digest[:8], "big") % 100 < VAL_PERCENT else "train"


def _split_files(split: str, root: str | os.PathLike | None) -> tuple[Path, list[Path]]:
    if split not in SPLITS:
        raise ValueError(f"split={split!r} is not allowed; choose one of {', '.join(map(repr, SPLITS))}")
    base = Path(root) if root is not None else stdlib_root()
    files = [p for p in corpus_files(base) if split_of(p.relative_to(base).as_posix()) == split]
    return base, files


def resolve_cache_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    """The cache folder: the argument, else $COURSE_CACHE_DIR, else ~/.cache/llm-efficiency-course."""
    if cache_dir is not None:
        return Path(cache_dir)
    if os.environ.get(CACHE_ENV_VAR):
        return Path(os.environ[CACHE_ENV_VAR])
    xdg = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(xdg) / "llm-efficiency-course"


def _cache_key(base: Path, files: list[Path]) -> tuple[str, int]:
    """A hash of everything the tokens depend on, and the number of bytes the split must have."""
    h = hashlib.sha256(f"v{CACHE_VERSION}|{sys.version}|{base.resolve()}|{VAL_PERCENT}".encode())
    total = 0
    for p in files:
        st = p.stat()
        total += st.st_size
        h.update(f"|{p.relative_to(base).as_posix()}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:20], total


def _locate(split: str, root: str | os.PathLike | None,
            cache_dir: str | os.PathLike | None) -> tuple[list[Path], Path, int]:
    """The split's files, its cache file and the number of bytes that file must hold."""
    base, files = _split_files(split, root)
    key, expected = _cache_key(base, files)
    return files, resolve_cache_dir(cache_dir) / f"stdlib-{split}-{key}.bin", expected


def cache_path(split: str = "train", root: str | os.PathLike | None = None,
               cache_dir: str | os.PathLike | None = None) -> Path:
    """The file `load_corpus(split, root, cache_dir)` reads from or writes to."""
    return _locate(split, root, cache_dir)[1]


def _write_atomically(path: Path, payload: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(payload)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_corpus(split: str = "train", root: str | os.PathLike | None = None,
                cache_dir: str | os.PathLike | None = None) -> torch.Tensor:
    """The split's bytes as a 1-D uint8 tensor (one token per byte), from the cache when valid."""
    files, path, expected = _locate(split, root, cache_dir)
    payload = None
    if path.is_file() and path.stat().st_size == expected:  # a wrong size means a stale or torn file
        payload = path.read_bytes()
    if payload is None:
        payload = b"".join(p.read_bytes() for p in files)
        try:
            _write_atomically(path, payload)
        except OSError:  # a read-only home is no reason to fail; the next load just reads again
            pass
    return torch.frombuffer(bytearray(payload), dtype=torch.uint8)


def encode(text: str) -> torch.Tensor:
    """UTF-8 bytes of `text` as a 1-D int64 tensor of token ids (ready for the model)."""
    return torch.tensor(list(text.encode("utf-8")), dtype=torch.long)


def decode(tokens: torch.Tensor | list[int]) -> str:
    """Token ids (bytes) back to text; byte sequences that are not valid UTF-8 become U+FFFD."""
    values = tokens.tolist() if isinstance(tokens, torch.Tensor) else list(tokens)
    return bytes(values).decode("utf-8", errors="replace")


def get_batch(data: torch.Tensor, batch_size: int, seq_len: int, device: str | torch.device = "cpu",
              generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Random windows of `data`: inputs x and next-token targets y, both int64 (batch_size, seq_len)."""
    if data.dim() != 1:
        raise ValueError(f"data must be 1-D, got shape {tuple(data.shape)}")
    if len(data) < seq_len + 1:
        raise ValueError(f"data has {len(data)} tokens; a window of seq_len={seq_len} needs {seq_len + 1}")
    starts = torch.randint(len(data) - seq_len, (batch_size,), generator=generator)  # (B,)
    offsets = starts[:, None] + torch.arange(seq_len + 1)  # (B, T+1)
    window = data[offsets.to(data.device)].long()  # (B, T+1)
    x, y = window[:, :-1].contiguous(), window[:, 1:].contiguous()  # (B, T) each, y is x shifted by one
    if torch.device(device).type == "cuda" and not x.is_cuda:  # pinned memory: the copy can overlap compute
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return x.to(device), y.to(device)


def corpus_stats(root: str | os.PathLike | None = None) -> dict:
    """Files and bytes of the whole corpus and of each split (from file sizes; nothing is read)."""
    base = Path(root) if root is not None else stdlib_root()
    stats = {"root": str(base), "python": sys.version.split()[0], "val_percent": VAL_PERCENT,
             "files": 0, "bytes": 0, "train_files": 0, "train_bytes": 0, "val_files": 0, "val_bytes": 0}
    for p in corpus_files(base):
        size = p.stat().st_size
        split = split_of(p.relative_to(base).as_posix())
        stats["files"] += 1
        stats["bytes"] += size
        stats[f"{split}_files"] += 1
        stats[f"{split}_bytes"] += size
    return stats
