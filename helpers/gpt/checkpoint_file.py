"""A checkpoint file on disk: why it cannot be read, the digest that finds damage inside its weights, and the
lock under which one process at a time finds, trains and saves it (`helpers.gpt.pretrained` uses all three)."""
from __future__ import annotations

import hashlib
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch

try:  # POSIX only: without it (Windows) checkpoints are found and written without a lock
    import fcntl
except ImportError:  # pragma: no cover - not on the course's Linux machines
    fcntl = None


def read_error(path: Path, err: Exception) -> str:
    """Why torch.load could not read `path`, in words."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(64)
    except OSError:
        head = b""
    if head.startswith(b"version https://git-lfs"):
        return "could not be read: it is a Git LFS pointer, not the weights (fetch them with `git lfs pull`)"
    first = (str(err).strip().splitlines() or [""])[0][:160]
    return f"could not be read ({type(err).__name__}{': ' + first if first else ''}; a torn or truncated file?)"


def weights_digest(state: dict) -> str:
    """SHA-256 over a state dict's names, dtypes, shapes and bytes, in key order: stored beside the weights so
    that damage inside a tensor (which torch.load does not notice) is found when they are loaded."""
    h = hashlib.sha256()
    for name in sorted(state):
        t = state[name].detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def listed_sums(sums: Path) -> dict[str, str]:
    """{file name: SHA-256 of the file} from a `sha256sum` listing ({} when absent)."""
    try:
        lines = Path(sums).read_text().splitlines()
    except OSError:
        return {}
    return {name: digest for digest, name in (line.split(None, 1) for line in lines if line.strip())}


def lock_path(path: Path) -> Path:
    """The lock file beside the checkpoint `path` (`<name>.lock`)."""
    return path.with_name(path.name + ".lock")


@contextmanager
def checkpoint_lock(path: Path, preset: str = "", quiet: bool = True) -> Iterator[bool]:
    """Hold an exclusive `fcntl.flock` on `lock_path(path)` for the block; yields whether a lock is held.

    When another process holds it, says so (unless quiet), naming its PID, and waits for it. No lock (False)
    without fcntl or where the lock file cannot be created (a read-only cache). The lock ends with the block,
    or with the process; the lock file stays (removing it would let a third process lock another file).
    """
    if fcntl is None:
        yield False
        return
    lock = lock_path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError:
        yield False
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not quiet:
                owner = os.pread(fd, 32, 0).decode(errors="replace").strip()
                print(f"pretrained {preset}: another process{f' (PID {owner})' if owner.isdigit() else ''} is "
                      f"training or loading {path.name} (it holds {lock.name}); waiting for it, then loading what "
                      f"it wrote.", flush=True)
            fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield True
    finally:
        os.close(fd)  # releases the lock
