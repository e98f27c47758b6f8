"""helpers.gpt.pretrained: checkpoints are cached per recipe and retrained when torn or of another recipe, the
shipped weights load on any corpus and are copied into the cache, and the shipped smoke models are committed;
unusable shipped weights are named with what training costs, a checkpoint without its loss has it measured again,
and two processes asking for one model train it once (the lock beside the checkpoint)."""
from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
import torch

from helpers.gpt import checkpoint_file, pretrained


@pytest.mark.slow
def test_pretrained_caches_and_retrains(tmp_path, capsys):
    kw = dict(cache_dir=tmp_path, device="cpu", progress=False, n_layer=1, d_model=32, d_ff=64, n_head=2)
    first = pretrained.pretrained("tiny", 3, **kw)
    assert first.trained_now and first.path.is_file()
    assert first.perplexity == pytest.approx(torch.tensor(first.val_loss).exp().item())
    second = pretrained.pretrained("tiny", 3, **kw)
    assert not second.trained_now
    for a, b in zip(first.model.state_dict().values(), second.model.state_dict().values()):
        assert torch.equal(a, b)
    assert pretrained.pretrained("tiny", 4, **kw).path != first.path  # steps are part of the key
    first.path.write_bytes(b"torn")
    capsys.readouterr()
    third = pretrained.pretrained("tiny", 3, **kw)
    assert third.trained_now and "could not be read" in capsys.readouterr().out
    payload = torch.load(first.path, weights_only=True)
    payload["key"]["format"] = -1
    torch.save(payload, first.path)
    assert pretrained.pretrained("tiny", 3, **kw).trained_now
    assert "another configuration" in capsys.readouterr().out
    with pytest.raises(ValueError, match="steps"):
        pretrained.pretrained("tiny", 0, **kw)
    with pytest.raises(ValueError, match="preset"):
        pretrained.pretrained("nope", 3, **kw)


@pytest.mark.slow
def test_shipped_weights_load_on_any_corpus_and_are_copied_into_the_cache(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(pretrained, "SHIPPED_DIR", tmp_path / "shipped")
    monkeypatch.setitem(pretrained.SCHEDULES, "tiny", dict(steps=3, batch=2, seq_len=16, lr=1e-3))
    small = dict(n_layer=1, d_model=32, d_ff=64, n_head=2)
    kw = dict(device="cpu", progress=False, **small)
    path = pretrained.ship("tiny", progress=False, **small)
    shipped = torch.load(path, weights_only=True)
    assert path.parent == tmp_path / "shipped" and "corpus" not in shipped["key"] and shipped["trained_on"]
    capsys.readouterr()
    got = pretrained.pretrained("tiny", cache_dir=tmp_path / "cache", **kw)
    assert not got.trained_now and "shipped with the course" in capsys.readouterr().out
    assert got.path.is_file() and got.path.is_relative_to(tmp_path / "cache")
    for name, value in shipped["state_dict"].items():
        assert torch.equal(value, got.model.state_dict()[name])
    assert not pretrained.pretrained("tiny", cache_dir=tmp_path / "cache", **kw).trained_now  # now from the cache
    assert "loaded" in capsys.readouterr().out
    real = pretrained.checkpoint_key  # another machine: the same recipe, another corpus key
    monkeypatch.setattr(pretrained, "checkpoint_key", lambda *a: {**real(*a), "corpus": "stdlib-train-elsewhere"})
    assert not pretrained.pretrained("tiny", cache_dir=tmp_path / "other", **kw).trained_now
    assert pretrained.pretrained("tiny", 4, cache_dir=tmp_path / "other", **kw).trained_now  # another recipe: not shipped


def test_the_shipped_smoke_models_are_in_the_repository():
    for preset, overrides in pretrained.SHIP:
        config = pretrained.GPTConfig.preset(preset, **overrides)
        sched = pretrained.schedule_for(preset, None, config)
        assert pretrained.shipped_path(pretrained.checkpoint_key(config, sched, 0)).is_file(), (preset, overrides)


# ---------------------------------------------------------------- unusable weights, torn checkpoints, two processes

SMALL = dict(n_layer=1, d_model=32, d_ff=64, n_head=2)
KW = dict(device="cpu", progress=False, **SMALL)


@pytest.fixture
def shipped(tmp_path, monkeypatch):
    """Shipped weights of a 3-step recipe in a tmp folder, recorded as trained in 1049.75 s."""
    monkeypatch.setattr(pretrained, "SHIPPED_DIR", tmp_path / "shipped")
    monkeypatch.setitem(pretrained.SCHEDULES, "tiny", dict(steps=3, batch=2, seq_len=16, lr=1e-3))
    path = pretrained.ship("tiny", progress=False, **SMALL)
    payload = torch.load(path, weights_only=True)
    torch.save({**payload, "seconds": 1049.75, "trained_on": "a test CPU"}, path)
    return path


@pytest.mark.slow
def test_torn_shipped_weights_are_named_with_what_training_costs(tmp_path, shipped, capsys):
    shipped.write_bytes(shipped.read_bytes()[:1000])  # torn: the zip's directory is gone
    capsys.readouterr()
    got = pretrained.pretrained("tiny", cache_dir=tmp_path / "cache", **KW)
    out = capsys.readouterr().out
    assert got.trained_now
    assert f"the shipped weights {shipped} could not be read (" in out and "a torn or truncated file?" in out
    assert "training 3 steps on cpu instead (how long the shipped run took is unknown" in out
    assert "no checkpoint" not in out


@pytest.mark.slow
def test_shipped_weights_that_do_not_fit_say_what_the_shipped_run_took(tmp_path, shipped, capsys):
    payload = torch.load(shipped, weights_only=True)
    payload["state_dict"].pop(next(iter(payload["state_dict"])))
    torch.save(payload, shipped)
    capsys.readouterr()
    assert pretrained.pretrained("tiny", cache_dir=tmp_path / "cache", **KW).trained_now
    out = capsys.readouterr().out
    assert f"the shipped weights {shipped} does not fit the model (RuntimeError); training 3 steps on cpu instead " \
           f"(the shipped run took 1050 s, 17 min on a test CPU; later runs load the result)." in out


@pytest.mark.slow
def test_a_git_lfs_pointer_is_named_as_such(tmp_path, shipped, capsys):
    shipped.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:0123\nsize 1794115\n")
    capsys.readouterr()
    assert pretrained.pretrained("tiny", cache_dir=tmp_path / "cache", **KW).trained_now
    assert "it is a Git LFS pointer, not the weights (fetch them with `git lfs pull`)" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.parametrize("val_loss", ["missing", float("nan"), "1.2"])
def test_a_cached_checkpoint_without_its_validation_loss_is_measured_again(tmp_path, capsys, val_loss):
    first = pretrained.pretrained("tiny", 3, cache_dir=tmp_path, **KW)
    payload = torch.load(first.path, weights_only=True)
    if val_loss == "missing":
        del payload["val_loss"]
    else:
        payload["val_loss"] = val_loss
    torch.save(payload, first.path)
    capsys.readouterr()
    again = pretrained.pretrained("tiny", 3, cache_dir=tmp_path, **KW)
    out = capsys.readouterr().out
    assert not again.trained_now and "holds the weights but no validation loss (a torn or partial write)" in out
    assert again.val_loss == pytest.approx(first.val_loss)  # the same weights on the same held-out windows
    assert torch.load(first.path, weights_only=True)["val_loss"] == again.val_loss  # and the file is whole again


RACER = r"""
import json, os, sys, time
from pathlib import Path

from helpers.gpt import checkpoint_file, pretrained

cache, flags = Path(sys.argv[1]), Path(sys.argv[2])
real = pretrained.train


def held(*args, **kwargs):  # training waits for the test's go, so that the other process arrives meanwhile
    (flags / f"training-{os.getpid()}").touch()
    deadline = time.monotonic() + 120
    while not (flags / "go").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return real(*args, **kwargs)


pretrained.train = held
got = pretrained.pretrained("tiny", 3, cache_dir=cache, device="cpu", progress=False, n_layer=1, d_model=32,
                            d_ff=64, n_head=2)
print(json.dumps({"pid": os.getpid(), "trained_now": got.trained_now, "path": str(got.path)}), flush=True)
"""


@pytest.mark.slow
def test_two_processes_asking_for_one_model_train_it_once(tmp_path):
    flags = tmp_path / "flags"
    flags.mkdir()
    cmd = [sys.executable, "-u", "-c", RACER, str(tmp_path / "cache"), str(flags)]
    root = Path(__file__).resolve().parents[2]
    lines: queue.Queue = queue.Queue()
    procs, readers = [], []

    def start():
        proc = subprocess.Popen(cmd, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        procs.append(proc)
        out = []
        readers.append(threading.Thread(target=lambda: [(out.append(ln), lines.put((proc.pid, ln)))
                                                        for ln in proc.stdout], daemon=True))
        readers[-1].start()
        return proc, out

    try:
        first, out_first = start()
        deadline = time.monotonic() + 180
        while not (flags / f"training-{first.pid}").exists():  # the first holds its training at the start
            assert first.poll() is None and time.monotonic() < deadline, "".join(out_first)
            time.sleep(0.05)
        second, out_second = start()
        while True:  # the second's first sentence: it waits for the lock (or, without one, trains as well)
            pid, line = lines.get(timeout=max(1.0, deadline - time.monotonic()))
            if pid == second.pid and ("waiting for it" in line or "no checkpoint" in line):
                break
        (flags / "go").touch()
        for proc in procs:
            assert proc.wait(timeout=180) == 0
    finally:
        (flags / "go").touch()
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)
    for reader in readers:  # each ends at its pipe's end, once it holds every line
        reader.join(timeout=30)
    results = [json.loads([ln for ln in out if ln.startswith("{")][-1]) for out in (out_first, out_second)]
    assert [r["trained_now"] for r in results] == [True, False], (out_first, out_second)  # exactly one trained
    assert results[0]["path"] == results[1]["path"]
    assert f"another process (PID {first.pid}) is training or loading" in "".join(out_second)
    assert not (flags / f"training-{second.pid}").exists()  # the second never started a training
    assert checkpoint_file.lock_path(Path(results[0]["path"])).is_file()
    mine = {p.pid for p in procs}
    assert not [c for c in psutil.Process().children(recursive=True) if c.pid in mine]


def _overwrite_largest_tensor(path, fill: bytes) -> None:
    """Overwrite 64 KiB (or the whole tensor, if smaller) inside the largest tensor of a torch.save zip, leaving
    the zip's structure as it was: damage torch.load does not notice."""
    import zipfile

    with zipfile.ZipFile(path) as z:
        info = max((i for i in z.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    raw = bytearray(path.read_bytes())
    name_len = int.from_bytes(raw[info.header_offset + 26:info.header_offset + 28], "little")
    extra_len = int.from_bytes(raw[info.header_offset + 28:info.header_offset + 30], "little")
    start = info.header_offset + 30 + name_len + extra_len
    n = min(64 * 1024, info.file_size)
    raw[start:start + n] = (fill * n)[:n]
    path.write_bytes(bytes(raw))


@pytest.mark.slow
@pytest.mark.parametrize("fill", [b"\xff", b"\x00"], ids=["NaN bytes", "zeroed"])
def test_a_cached_checkpoint_damaged_inside_a_tensor_is_found_and_trained_again(tmp_path, capsys, fill):
    first = pretrained.pretrained("tiny", 3, cache_dir=tmp_path, **KW)
    _overwrite_largest_tensor(first.path, fill)
    torch.load(first.path, weights_only=True)  # the damage loads without an error
    capsys.readouterr()
    again = pretrained.pretrained("tiny", 3, cache_dir=tmp_path, **KW)
    out = capsys.readouterr().out
    assert again.trained_now and "is damaged: its weights do not match the digest stored beside them" in out
    assert again.val_loss == pytest.approx(first.val_loss)  # the same recipe, trained again


def test_the_shipped_weights_match_their_listed_sums_and_damage_is_named(tmp_path, monkeypatch):
    import hashlib
    import shutil

    sums = checkpoint_file.listed_sums(pretrained.SHIPPED_DIR / "SHA256SUMS")
    files = sorted(p.name for p in pretrained.SHIPPED_DIR.glob("*.pt"))
    assert sorted(sums) == files
    for name in files:
        assert hashlib.sha256((pretrained.SHIPPED_DIR / name).read_bytes()).hexdigest() == sums[name], name
    copy = tmp_path / "shipped"
    shutil.copytree(pretrained.SHIPPED_DIR, copy)
    monkeypatch.setattr(pretrained, "SHIPPED_DIR", copy)
    config = pretrained.GPTConfig.preset("tiny", **pretrained.SHIP[1][1])
    key = pretrained.checkpoint_key(config, pretrained.schedule_for("tiny", None, config), 0)
    path = pretrained.shipped_path(key)
    bare = {k: v for k, v in key.items() if k != "corpus"}
    assert pretrained._load(path, bare, "cpu")[2] == ""
    _overwrite_largest_tensor(path, b"\x00")
    assert "is damaged: its SHA-256 differs" in pretrained._load(path, bare, "cpu")[2]
